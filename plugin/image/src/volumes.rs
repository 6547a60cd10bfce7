//! [`ImageVolumes`]: images mounted as volumes, with every mount, snapshot and directory accounted for.
//!
//! - A read-only volume is a read-only bind of one shared mount of the image at
//!   `<state>/images/<key>/rootfs`, made by the store's `view` under key `inlet-ro-<image>` on the first
//!   such volume and taken down after the last: no disk is spent on a further read-only volume.
//! - A writable volume is its own overlay, made by the store's `prepare` under key `inlet-rw-<volume>`, and
//!   discarded when it is unpublished.
//! - With metadata, an extra lower dir holding `.image-metadata/{manifest,config,annotations}.json` is laid
//!   on top of the image's layers; the image's own files are unchanged.
//!
//! Each published target has a record (`<state>/volumes/<hash of target>.json`) written before anything is
//! mounted, so after a crash [`ImageVolumes::recover`] finds every target and key, rebuilds the counts from
//! the records, and removes what no record explains. Operations are serialized: they are short (the pull
//! happens before, outside the lock).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::store::{ImageStore, Mountable};
use inlet_host::error::{Error, IoContext, Result};
use inlet_host::mount::{MountFlags, MountLayer, Overlay};
use inlet_host::records::{Durability, load_records, remove_record, write_record};

/// The directory the metadata files are presented in, at the volume's root.
pub const METADATA_DIR: &str = ".image-metadata";

/// One volume to publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageVolume {
    /// The volume's id (a CSI volume id, or the kubelet's pod-scoped name); names a writable layer.
    pub volume_id: String,
    /// Where it is mounted.
    pub target: PathBuf,
    /// The reference the user wrote (for messages and reconstruction).
    pub image: String,
    /// The runtime's image id.
    pub image_id: String,
    /// A writable copy-on-write volume instead of the shared read-only one.
    pub writable: bool,
    /// Present the image's manifest, config and annotations under [`METADATA_DIR`].
    pub metadata: bool,
}

impl ImageVolume {
    /// The store key: shared by every read-only volume of an image (with or without metadata), unique to a
    /// writable volume.
    pub fn key(&self) -> String {
        // Keys name directories and snapshots: a runtime's hex id as it is, anything else hashed.
        let id = self.image_id.trim_start_matches("sha256:");
        let image = if id.chars().all(|c| c.is_ascii_hexdigit()) {
            id.to_string()
        } else {
            short_hash(id)
        };
        match (self.writable, self.metadata) {
            (true, _) => format!("inlet-rw-{}", short_hash(&self.volume_id)),
            (false, false) => format!("inlet-ro-{image}"),
            (false, true) => format!("inlet-ro-{image}-metadata"),
        }
    }
}

/// What is published on this node, and the means to publish more.
pub struct ImageVolumes {
    store: Arc<dyn ImageStore>,
    mounter: Arc<dyn MountLayer>,
    state_dir: PathBuf,
    records: Mutex<BTreeMap<String, ImageVolume>>,
}

impl ImageVolumes {
    /// The volumes recorded under `state_dir`.
    pub fn open(
        store: Arc<dyn ImageStore>,
        mounter: Arc<dyn MountLayer>,
        state_dir: &Path,
    ) -> Result<Self> {
        let dir = state_dir.join("volumes");
        std::fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            store,
            mounter,
            state_dir: state_dir.to_path_buf(),
            records: Mutex::new(load_records(&dir)?),
        })
    }

    /// The store volumes are made from.
    pub fn store(&self) -> &Arc<dyn ImageStore> {
        &self.store
    }

    /// Every published volume.
    pub async fn published(&self) -> Vec<ImageVolume> {
        self.records.lock().await.values().cloned().collect()
    }

    /// The record of the volume at `target`.
    pub async fn at(&self, target: &Path) -> Option<ImageVolume> {
        self.records.lock().await.get(&record_id(target)).cloned()
    }

    /// The record of the volume at `target`, read from disk (for callers outside the async runtime, such as
    /// volume reconstruction).
    pub fn record_on_disk(&self, target: &Path) -> Option<ImageVolume> {
        let path = self
            .records_dir()
            .join(format!("{}.json", record_id(target)));
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    /// How many volumes use `key`.
    pub async fn users(&self, key: &str) -> usize {
        let records = self.records.lock().await;
        records.values().filter(|v| v.key() == key).count()
    }

    /// Mounts `volume` at its target. Idempotent: the same volume again is OK; a different volume at the
    /// same target is ALREADY_EXISTS. On failure nothing of this call is left behind.
    pub async fn publish(&self, volume: &ImageVolume) -> Result<()> {
        let mut records = self.records.lock().await;
        let id = record_id(&volume.target);
        if let Some(existing) = records.get(&id) {
            if existing != volume {
                return Err(Error::AlreadyExists(format!(
                    "{} is already published with image {:?}{}",
                    volume.target.display(),
                    existing.image,
                    if existing.writable { " (writable)" } else { "" }
                )));
            }
            if self.is_mounted(&volume.target)? {
                return Ok(());
            }
        }
        // Not flushed: a record only matters while its target is mounted, and after a reboot nothing is
        // (`recover` forgets every record whose target is not a mount point, and removes the keys).
        write_record(&self.records_dir(), &id, volume, Durability::UntilReboot)?;
        inlet_host::crash::point("image.recorded");
        records.insert(id.clone(), volume.clone());
        if let Err(err) = self.mount(volume).await {
            records.remove(&id);
            self.release(volume, &records).await;
            let _ = remove_record(&self.records_dir(), &id);
            if !self.is_mounted(&volume.target).unwrap_or(true) {
                let _ = remove_dir(&volume.target);
            }
            return Err(err);
        }
        inlet_host::crash::point("image.mounted");
        tracing::info!(target = %volume.target.display(), image = %volume.image, key = volume.key(), "published image volume");
        Ok(())
    }

    /// Unmounts the volume at `target` and releases what it used. Idempotent: an unknown target that is
    /// not a mount point is unpublished.
    pub async fn unpublish(&self, target: &Path) -> Result<()> {
        let mut records = self.records.lock().await;
        let id = record_id(target);
        if self.is_mounted(target)? {
            self.mounter
                .unmount(target)
                .context(|| format!("unmounting {}", target.display()))?;
            inlet_host::crash::point("image.unmounted");
        }
        remove_dir(target)?;
        if let Some(volume) = records.remove(&id) {
            self.release(&volume, &records).await;
            remove_record(&self.records_dir(), &id)?;
            tracing::info!(target = %target.display(), image = %volume.image, "unpublished image volume");
        }
        Ok(())
    }

    /// After a restart: forgets records whose target is no longer mounted, and removes store keys, shared
    /// mounts and dirs no record explains (what a crash mid-operation left). Returns how many volumes
    /// remain published.
    pub async fn recover(&self) -> Result<usize> {
        let mut records = self.records.lock().await;
        let ids: Vec<String> = records.keys().cloned().collect();
        for id in ids {
            let volume = records[&id].clone();
            if !self.is_mounted(&volume.target)? {
                tracing::info!(target = %volume.target.display(), "forgetting an image volume that is no longer mounted");
                records.remove(&id);
                remove_record(&self.records_dir(), &id)?;
            }
        }
        let wanted: std::collections::BTreeSet<String> =
            records.values().map(ImageVolume::key).collect();
        for key in self.store.keys().await? {
            if !wanted.contains(&key) {
                tracing::info!(key, "removing a leftover image snapshot");
                self.store.remove(&key).await?;
            }
        }
        let images = self.state_dir.join("images");
        for entry in std::fs::read_dir(&images).into_iter().flatten().flatten() {
            let key = entry.file_name().to_string_lossy().into_owned();
            if !wanted.contains(&key) {
                self.remove_shared(&key)?;
            }
        }
        Ok(records.len())
    }

    fn records_dir(&self) -> PathBuf {
        self.state_dir.join("volumes")
    }

    fn shared_dir(&self, key: &str) -> PathBuf {
        self.state_dir.join("images").join(key)
    }

    fn is_mounted(&self, path: &Path) -> Result<bool> {
        self.mounter
            .is_mount_point(path)
            .context(|| format!("checking {}", path.display()))
    }

    async fn mount(&self, volume: &ImageVolume) -> Result<()> {
        let key = volume.key();
        create_dir(&volume.target)?;
        if volume.writable {
            let layers = self.store.prepare(&volume.image_id, &key).await?;
            let layers = self.with_metadata(volume, &key, layers).await?;
            return self.mount_layers(&layers, &volume.target);
        }
        let rootfs = self.shared_dir(&key).join("rootfs");
        if !self.is_mounted(&rootfs)? {
            let layers = self.store.view(&volume.image_id, &key).await?;
            let layers = self.with_metadata(volume, &key, layers).await?;
            create_dir(&rootfs)?;
            self.mount_layers(&layers, &rootfs)?;
        }
        let read_only = MountFlags {
            read_only: true,
            ..Default::default()
        };
        self.mounter
            .bind(&rootfs, &volume.target, read_only)
            .context(|| format!("bind-mounting {} read-only", volume.target.display()))
    }

    /// Lays the metadata dir on top of the image's layers when the volume asks for it.
    async fn with_metadata(
        &self,
        volume: &ImageVolume,
        key: &str,
        layers: Mountable,
    ) -> Result<Mountable> {
        if !volume.metadata {
            return Ok(layers);
        }
        let meta = self.store.metadata(&volume.image_id).await?;
        let dir = self.shared_dir(key).join("metadata");
        let files = dir.join(METADATA_DIR);
        create_dir(&files)?;
        let annotations = serde_json::from_slice::<serde_json::Value>(&meta.manifest)
            .ok()
            .and_then(|m| m.get("annotations").cloned())
            .unwrap_or_else(|| serde_json::json!({}));
        for (name, body) in [
            ("manifest.json", meta.manifest),
            ("config.json", meta.config),
            ("annotations.json", annotations.to_string().into_bytes()),
        ] {
            let path = files.join(name);
            std::fs::write(&path, body).context(|| format!("writing {}", path.display()))?;
        }
        let (mut lower, upper) = match layers {
            Mountable::Bind(dir) => (vec![dir], None),
            Mountable::Overlay(o) => (o.lower, o.upper),
        };
        lower.insert(0, dir);
        Ok(Mountable::Overlay(Overlay { lower, upper }))
    }

    fn mount_layers(&self, layers: &Mountable, target: &Path) -> Result<()> {
        let what = || format!("mounting image layers at {}", target.display());
        match layers {
            Mountable::Bind(source) => {
                let flags = MountFlags {
                    read_only: true,
                    ..Default::default()
                };
                self.mounter.bind(source, target, flags).context(what)
            }
            Mountable::Overlay(overlay) => self.mounter.overlay(overlay, target).context(what),
        }
    }

    /// Frees what `volume` used once no remaining record shares it. Errors are logged, not returned: the
    /// volume is gone either way, and `recover` retries what is left.
    async fn release(&self, volume: &ImageVolume, remaining: &BTreeMap<String, ImageVolume>) {
        let key = volume.key();
        if remaining.values().any(|v| v.key() == key) {
            return;
        }
        if let Err(e) = self.remove_shared(&key) {
            tracing::warn!(key, error = %e, "could not remove the shared mount");
            return;
        }
        if let Err(e) = self.store.remove(&key).await {
            tracing::warn!(key, error = %e, "could not remove the image snapshot");
        }
    }

    fn remove_shared(&self, key: &str) -> Result<()> {
        let dir = self.shared_dir(key);
        let rootfs = dir.join("rootfs");
        if self.is_mounted(&rootfs)? {
            self.mounter
                .unmount(&rootfs)
                .context(|| format!("unmounting {}", rootfs.display()))?;
        }
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).context(|| format!("removing {}", dir.display()))
            }
            _ => Ok(()),
        }
    }
}

fn record_id(target: &Path) -> String {
    short_hash(&target.display().to_string())
}

fn short_hash(value: &str) -> String {
    hex::encode(&Sha256::digest(value.as_bytes())[..16])
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).context(|| format!("creating {}", dir.display()))
}

/// Removes the (now unmounted, empty) target dir, as CSI asks of NodeUnpublishVolume.
fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ImageMetadata;
    use inlet_host::mount::RecordingMounter;
    use parking_lot::Mutex as SyncMutex;

    /// A store that hands out one layer dir and records what it was asked.
    #[derive(Default)]
    struct FakeStore {
        calls: SyncMutex<Vec<String>>,
        keys: SyncMutex<Vec<String>>,
        fail: SyncMutex<bool>,
    }

    #[async_trait::async_trait]
    impl ImageStore for FakeStore {
        fn kind(&self) -> &'static str {
            "fake"
        }
        async fn view(&self, image_id: &str, key: &str) -> Result<Mountable> {
            self.calls.lock().push(format!("view {image_id} {key}"));
            if *self.fail.lock() {
                return Err(Error::FailedPrecondition("no such layers".into()));
            }
            self.keys.lock().push(key.into());
            Ok(Mountable::Bind("/layers/1".into()))
        }
        async fn prepare(&self, image_id: &str, key: &str) -> Result<Mountable> {
            self.calls.lock().push(format!("prepare {image_id} {key}"));
            self.keys.lock().push(key.into());
            Ok(Mountable::Overlay(Overlay {
                lower: vec!["/layers/1".into()],
                upper: Some(("/u".into(), "/w".into())),
            }))
        }
        async fn remove(&self, key: &str) -> Result<()> {
            self.calls.lock().push(format!("remove {key}"));
            self.keys.lock().retain(|k| k != key);
            Ok(())
        }
        async fn keys(&self) -> Result<Vec<String>> {
            Ok(self.keys.lock().clone())
        }
        async fn metadata(&self, _: &str) -> Result<ImageMetadata> {
            Ok(ImageMetadata::default())
        }
    }

    fn volume(dir: &Path, name: &str, writable: bool) -> ImageVolume {
        ImageVolume {
            volume_id: name.into(),
            target: dir.join("targets").join(name),
            image: "reg.example/data:v1".into(),
            image_id: "abc123".into(),
            writable,
            metadata: false,
        }
    }

    fn engine(dir: &Path) -> (Arc<FakeStore>, Arc<RecordingMounter>, ImageVolumes) {
        let store = Arc::new(FakeStore::default());
        let mounter = Arc::new(RecordingMounter::new());
        let volumes = ImageVolumes::open(store.clone(), mounter.clone(), dir).unwrap();
        (store, mounter, volumes)
    }

    #[tokio::test]
    async fn read_only_volumes_share_one_view_until_the_last_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mounter, volumes) = engine(dir.path());
        let (a, b) = (
            volume(dir.path(), "a", false),
            volume(dir.path(), "b", false),
        );
        volumes.publish(&a).await.unwrap();
        volumes.publish(&b).await.unwrap();
        volumes.publish(&b).await.unwrap();
        assert_eq!(
            store.calls.lock().len(),
            1,
            "one view: {:?}",
            store.calls.lock()
        );
        assert_eq!(volumes.users(&a.key()).await, 2);
        // The shared mount plus one bind per volume.
        assert_eq!(mounter.mounts().len(), 3);
        volumes.unpublish(&a.target).await.unwrap();
        assert_eq!(mounter.mounts().len(), 2, "the shared mount stays for b");
        volumes.unpublish(&b.target).await.unwrap();
        volumes.unpublish(&b.target).await.unwrap();
        assert!(mounter.mounts().is_empty());
        assert_eq!(store.calls.lock().last().unwrap(), "remove inlet-ro-abc123");
        assert!(crate::leftovers(dir.path()).is_empty());
    }

    #[tokio::test]
    async fn a_writable_volume_has_its_own_layer_and_a_target_holds_one_volume() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _, volumes) = engine(dir.path());
        let rw = volume(dir.path(), "rw", true);
        volumes.publish(&rw).await.unwrap();
        let other = ImageVolume {
            image: "reg.example/other:v1".into(),
            ..rw.clone()
        };
        let err = volumes.publish(&other).await.unwrap_err();
        assert!(matches!(err, Error::AlreadyExists(_)), "{err}");
        volumes.unpublish(&rw.target).await.unwrap();
        assert_eq!(
            *store.calls.lock(),
            [
                format!("prepare abc123 {}", rw.key()),
                format!("remove {}", rw.key())
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_publish_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mounter, volumes) = engine(dir.path());
        *store.fail.lock() = true;
        let a = volume(dir.path(), "a", false);
        assert!(volumes.publish(&a).await.is_err());
        assert!(volumes.published().await.is_empty());
        assert!(mounter.mounts().is_empty());
        assert!(!a.target.exists(), "the target dir it made is gone");
        assert!(crate::leftovers(dir.path()).is_empty());
    }

    #[tokio::test]
    async fn recovery_forgets_unmounted_volumes_and_removes_unexplained_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mounter, volumes) = engine(dir.path());
        let (a, b) = (
            volume(dir.path(), "a", false),
            volume(dir.path(), "b", true),
        );
        volumes.publish(&a).await.unwrap();
        volumes.publish(&b).await.unwrap();
        store.keys.lock().push("inlet-rw-from-a-crash".into());
        // b's mount went away while the driver was down (a node reboot, say).
        mounter.unmount(&b.target).unwrap();
        let reopened = ImageVolumes::open(store.clone(), mounter.clone(), dir.path()).unwrap();
        assert_eq!(reopened.recover().await.unwrap(), 1);
        assert_eq!(*store.keys.lock(), [a.key()]);
        assert_eq!(reopened.at(&a.target).await, Some(a));
        assert_eq!(reopened.at(&b.target).await, None);
    }
}
