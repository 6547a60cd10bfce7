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
//! the records, and removes what no record explains.
//!
//! Locking: an operation holds its target's lock, then its store key's lock (the order is always that one),
//! so two calls for one target, or two volumes sharing one view, never interleave, while volumes of other
//! images go on beside a slow containerd call. The records map is behind a plain mutex, never held across
//! an await. Mounts and filesystem work run on the blocking pool ([`Host`]), off the async workers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::locks::KeyedLocks;
use super::store::{ImageMetadata, ImageStore, Mountable};
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
    host: Host,
    records: Mutex<BTreeMap<String, ImageVolume>>,
    locks: KeyedLocks,
}

impl ImageVolumes {
    /// The volumes recorded under `state_dir`.
    pub fn open(
        store: Arc<dyn ImageStore>,
        mounter: Arc<dyn MountLayer>,
        state_dir: &Path,
    ) -> Result<Self> {
        let host = Host {
            mounter,
            state_dir: state_dir.to_path_buf(),
        };
        let dir = host.records_dir();
        std::fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            store,
            records: Mutex::new(load_records(&dir)?),
            host,
            locks: KeyedLocks::default(),
        })
    }

    /// The store volumes are made from.
    pub fn store(&self) -> &Arc<dyn ImageStore> {
        &self.store
    }

    /// Every published volume.
    pub fn published(&self) -> Vec<ImageVolume> {
        self.records.lock().values().cloned().collect()
    }

    /// The record of the volume at `target`.
    pub fn at(&self, target: &Path) -> Option<ImageVolume> {
        self.records.lock().get(&record_id(target)).cloned()
    }

    /// The record of the volume at `target`, read from disk (for callers outside the async runtime, such as
    /// volume reconstruction).
    pub fn record_on_disk(&self, target: &Path) -> Option<ImageVolume> {
        let path = self
            .host
            .records_dir()
            .join(format!("{}.json", record_id(target)));
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    /// How many volumes use `key`.
    pub fn users(&self, key: &str) -> usize {
        self.records
            .lock()
            .values()
            .filter(|v| v.key() == key)
            .count()
    }

    /// Mounts `volume` at its target. Idempotent: the same volume again is OK; a different volume at the
    /// same target is ALREADY_EXISTS. On failure nothing of this call is left behind.
    pub async fn publish(&self, volume: &ImageVolume) -> Result<()> {
        let id = record_id(&volume.target);
        let _target = self.locks.lock(&format!("target/{id}")).await;
        let existing = self.records.lock().get(&id).cloned();
        if let Some(existing) = existing {
            if existing != *volume {
                return Err(Error::AlreadyExists(format!(
                    "{} is already published with image {:?}{}",
                    volume.target.display(),
                    existing.image,
                    if existing.writable { " (writable)" } else { "" }
                )));
            }
            let target = volume.target.clone();
            if self.host.run(move |h| h.is_mounted(&target)).await? {
                return Ok(());
            }
        }
        let key = volume.key();
        let _key = self.locks.lock(&format!("key/{key}")).await;
        // Not flushed: a record only matters while its target is mounted, and after a reboot nothing is
        // (`recover` forgets every record whose target is not a mount point, and removes the keys).
        let record = volume.clone();
        let rid = id.clone();
        self.host
            .run(move |h| write_record(&h.records_dir(), &rid, &record, Durability::UntilReboot))
            .await?;
        inlet_host::crash::point("image.recorded");
        self.records.lock().insert(id.clone(), volume.clone());
        if let Err(err) = self.mount(volume, &key).await {
            self.records.lock().remove(&id);
            self.release(&key).await;
            let target = volume.target.clone();
            let _ = self
                .host
                .run(move |h| {
                    let _ = remove_record(&h.records_dir(), &id);
                    if !h.is_mounted(&target).unwrap_or(true) {
                        let _ = remove_dir(&target);
                    }
                    Ok(())
                })
                .await;
            return Err(err);
        }
        inlet_host::crash::point("image.mounted");
        tracing::info!(target = %volume.target.display(), image = %volume.image, key, "published image volume");
        Ok(())
    }

    /// Unmounts the volume at `target` and releases what it used. Idempotent: an unknown target that is
    /// not a mount point is unpublished.
    pub async fn unpublish(&self, target: &Path) -> Result<()> {
        let id = record_id(target);
        let _target = self.locks.lock(&format!("target/{id}")).await;
        let path = target.to_path_buf();
        self.host
            .run(move |h| {
                if h.is_mounted(&path)? {
                    h.mounter
                        .unmount(&path)
                        .context(|| format!("unmounting {}", path.display()))?;
                    inlet_host::crash::point("image.unmounted");
                }
                remove_dir(&path)
            })
            .await?;
        let Some(volume) = self.at(target) else {
            return Ok(());
        };
        let key = volume.key();
        let _key = self.locks.lock(&format!("key/{key}")).await;
        self.records.lock().remove(&id);
        self.release(&key).await;
        let rid = id.clone();
        self.host
            .run(move |h| remove_record(&h.records_dir(), &rid))
            .await?;
        tracing::info!(target = %target.display(), image = %volume.image, "unpublished image volume");
        Ok(())
    }

    /// After a restart, before serving: forgets records whose target is no longer mounted, and removes
    /// store keys, shared mounts and dirs no record explains (what a crash mid-operation left). Returns how
    /// many volumes remain published.
    pub async fn recover(&self) -> Result<usize> {
        let records = self.published();
        let gone = self
            .host
            .run(move |h| {
                let mut gone = Vec::new();
                for volume in records {
                    if !h.is_mounted(&volume.target)? {
                        tracing::info!(target = %volume.target.display(), "forgetting an image volume that is no longer mounted");
                        let id = record_id(&volume.target);
                        remove_record(&h.records_dir(), &id)?;
                        gone.push(id);
                    }
                }
                Ok(gone)
            })
            .await?;
        let wanted: std::collections::BTreeSet<String> = {
            let mut records = self.records.lock();
            records.retain(|id, _| !gone.contains(id));
            records.values().map(ImageVolume::key).collect()
        };
        for key in self.store.keys().await? {
            if !wanted.contains(&key) {
                tracing::info!(key, "removing a leftover image snapshot");
                self.store.remove(&key).await?;
            }
        }
        self.host
            .run(move |h| {
                let images = h.state_dir.join("images");
                for entry in std::fs::read_dir(&images).into_iter().flatten().flatten() {
                    let key = entry.file_name().to_string_lossy().into_owned();
                    if !wanted.contains(&key) {
                        h.remove_shared(&key)?;
                    }
                }
                Ok(())
            })
            .await?;
        Ok(self.records.lock().len())
    }

    /// Makes the volume's layers (the store's calls are async) and mounts them (on the blocking pool).
    async fn mount(&self, volume: &ImageVolume, key: &str) -> Result<()> {
        let target = volume.target.clone();
        if volume.writable {
            let layers = self.store.prepare(&volume.image_id, key).await?;
            let layers = self.with_metadata(volume, key, layers).await?;
            return self
                .host
                .run(move |h| {
                    create_dir(&target)?;
                    h.mount_layers(&layers, &target)
                })
                .await;
        }
        let rootfs = self.host.shared_dir(key).join("rootfs");
        let path = rootfs.clone();
        if !self.host.run(move |h| h.is_mounted(&path)).await? {
            let layers = self.store.view(&volume.image_id, key).await?;
            let layers = self.with_metadata(volume, key, layers).await?;
            let path = rootfs.clone();
            self.host
                .run(move |h| {
                    create_dir(&path)?;
                    h.mount_layers(&layers, &path)
                })
                .await?;
        }
        self.host
            .run(move |h| {
                create_dir(&target)?;
                // Read-only, and not noexec: KEP-4639 asked runtimes for noexec until
                // kubernetes/enhancements#5354 dropped it (1.34), so tools shipped as images run from
                // their volumes (image_volumes.feature).
                let read_only = MountFlags {
                    read_only: true,
                    ..Default::default()
                };
                h.mounter
                    .bind(&rootfs, &target, read_only)
                    .context(|| format!("bind-mounting {} read-only", target.display()))
            })
            .await
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
        let dir = self.host.shared_dir(key).join("metadata");
        let files = dir.clone();
        self.host
            .run(move |_| write_metadata(&files.join(METADATA_DIR), meta))
            .await?;
        let (mut lower, upper) = match layers {
            Mountable::Bind(dir) => (vec![dir], None),
            Mountable::Overlay(o) => (o.lower, o.upper),
        };
        lower.insert(0, dir);
        Ok(Mountable::Overlay(Overlay { lower, upper }))
    }

    /// Frees `key`'s shared mount and snapshot once no record uses it; the caller holds the key's lock.
    /// Errors are logged, not returned: the volume is gone either way, and `recover` retries what is left.
    async fn release(&self, key: &str) {
        if self.users(key) > 0 {
            return;
        }
        let shared = key.to_string();
        if let Err(e) = self.host.run(move |h| h.remove_shared(&shared)).await {
            tracing::warn!(key, error = %e, "could not remove the shared mount");
            return;
        }
        if let Err(e) = self.store.remove(key).await {
            tracing::warn!(key, error = %e, "could not remove the image snapshot");
        }
    }
}

/// The engine's host effects, run on the blocking pool: mount(2) and directory walks may take as long as
/// the kernel and the disk do.
#[derive(Clone)]
struct Host {
    mounter: Arc<dyn MountLayer>,
    state_dir: PathBuf,
}

impl Host {
    async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Host) -> Result<T> + Send + 'static,
    {
        let host = self.clone();
        tokio::task::spawn_blocking(move || f(&host))
            .await
            .map_err(|e| Error::Io {
                context: "image volume work stopped unexpectedly".into(),
                source: std::io::Error::other(e),
            })?
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

/// Writes the image's manifest, config and annotations into `files`.
fn write_metadata(files: &Path, meta: ImageMetadata) -> Result<()> {
    create_dir(files)?;
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
    Ok(())
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
        /// Held by a test to stall `view` of image "slow", as a containerd call that hangs.
        slow: tokio::sync::Mutex<()>,
    }

    #[async_trait::async_trait]
    impl ImageStore for FakeStore {
        fn kind(&self) -> &'static str {
            "fake"
        }
        async fn view(&self, image_id: &str, key: &str) -> Result<Mountable> {
            self.calls.lock().push(format!("view {image_id} {key}"));
            if image_id == "slow" {
                drop(self.slow.lock().await);
            }
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
        assert_eq!(volumes.users(&a.key()), 2);
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_image_holds_up_only_its_own_volumes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _, volumes) = engine(dir.path());
        let volumes = Arc::new(volumes);
        let stall = store.slow.lock().await;
        let slow = ImageVolume {
            image_id: "slow".into(),
            ..volume(dir.path(), "slow", false)
        };
        let stalled = tokio::spawn({
            let volumes = Arc::clone(&volumes);
            async move { volumes.publish(&slow).await }
        });
        while !store
            .calls
            .lock()
            .iter()
            .any(|c| c.starts_with("view slow"))
        {
            tokio::task::yield_now().await;
        }
        let other = volume(dir.path(), "other", false);
        tokio::time::timeout(std::time::Duration::from_secs(5), volumes.publish(&other))
            .await
            .expect("a volume of another image waited for the stalled one")
            .unwrap();
        assert!(!stalled.is_finished());
        drop(stall);
        stalled.await.unwrap().unwrap();
        assert_eq!(volumes.published().len(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_read_only_volumes_of_one_image_make_one_view() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mounter, volumes) = engine(dir.path());
        let volumes = Arc::new(volumes);
        let publishes: Vec<_> = (0..8)
            .map(|i| {
                let volumes = Arc::clone(&volumes);
                let v = volume(dir.path(), &format!("v{i}"), false);
                tokio::spawn(async move { volumes.publish(&v).await })
            })
            .collect();
        for p in publishes {
            p.await.unwrap().unwrap();
        }
        let views = store
            .calls
            .lock()
            .iter()
            .filter(|c| c.starts_with("view"))
            .count();
        assert_eq!(views, 1, "{:?}", store.calls.lock());
        let unpublishes: Vec<_> = (0..8)
            .map(|i| {
                let volumes = Arc::clone(&volumes);
                let target = dir.path().join("targets").join(format!("v{i}"));
                tokio::spawn(async move { volumes.unpublish(&target).await })
            })
            .collect();
        for u in unpublishes {
            u.await.unwrap().unwrap();
        }
        assert!(volumes.published().is_empty());
        assert_eq!(*store.keys.lock(), Vec::<String>::new());
        assert!(!mounter.anything_mounted_under(dir.path()));
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
        assert!(volumes.published().is_empty());
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
        assert_eq!(reopened.at(&a.target), Some(a));
        assert_eq!(reopened.at(&b.target), None);
    }
}
