//! The `local` CSI driver: volumes are directories (or, for raw block, loop-attached files) under a state dir.
//!
//! It plays the role csi-driver-host-path plays upstream, a complete driver to exercise every CSI call,
//! with ephemeral inline volumes created on NodePublishVolume (KEP-596). Layout:
//! - `mod.rs`: [`LocalConfig`], [`LocalDriver`] (the synchronous core: one operation per volume at a time,
//!   controller calls alone) and the content helpers shared by controller and node code.
//! - `controller.rs`, `node.rs`: the CSI Controller and Node calls, as methods of [`LocalDriver`].
//! - `service.rs`: the tonic Identity/Controller/Node services that run those methods off the async runtime.
//! - `store.rs`: durable records; request checks are the crate's `validate.rs`, shared with the image driver.
//! - `content_mount.rs`: the content dir bound onto itself while the driver serves, so a publish costs the
//!   same however many volumes the node has.

pub mod content_mount;
mod controller;
mod node;
mod service;
pub mod store;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use crate::validate;
pub use service::LocalService;
use store::{AccessType, Store, VolumeRecord};

use inlet_host::error::{Error, IoContext, Result};
use inlet_host::mount::MountLayer;
use inlet_host::quantity::format_bytes;

/// The ephemeral-volume attribute that sets its size, as a Kubernetes quantity (`64Mi`).
pub const SIZE_ATTRIBUTE: &str = "size";

/// How the local driver is set up (from `inlet-plugin serve` flags).
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The CSI driver name (GetPluginInfo), in domain-name form: `local.inlet.dev`.
    pub name: String,
    /// This node's id (NodeGetInfo; the only node ControllerPublishVolume accepts).
    pub node_id: String,
    /// Where records and volume content live.
    pub state_dir: PathBuf,
    /// The kubelet dir target and staging paths must be under (`/var/lib/kubelet`).
    pub kubelet_dir: PathBuf,
    /// Total bytes all volumes together may allocate.
    pub capacity_bytes: u64,
    /// The largest single volume.
    pub max_volume_bytes: u64,
    /// The size of a volume whose request names none (CreateVolume without a capacity range, or an
    /// ephemeral volume without a `size` attribute).
    pub default_volume_bytes: u64,
    /// Offer ControllerPublish/Unpublish, and require it before NodeStage.
    pub enable_attach: bool,
    /// Treat a publish without the `csi.storage.k8s.io/ephemeral` key, without a staging path, of an
    /// unknown volume as ephemeral (csi-driver-host-path's `--ephemeral`): the kubelet sends the key only
    /// when the CSIDriver has `podInfoOnMount: true`.
    pub ephemeral_default: bool,
    /// Advertise VOLUME_MOUNT_GROUP: the driver, not the kubelet, gives a volume to the pod's fsGroup
    /// (the `volume_mount_group` of NodeStageVolume and NodePublishVolume).
    pub volume_mount_group: bool,
}

/// The driver's core: its config, its records and the mount layer. Methods are synchronous; [`LocalService`]
/// runs node calls on different volumes side by side and everything else alone (see `service.rs`).
#[derive(Debug)]
pub struct LocalDriver {
    config: LocalConfig,
    store: Store,
    mounter: Arc<dyn MountLayer>,
}

impl LocalDriver {
    /// Opens the state dir (loading what a previous run recorded) and checks the config.
    pub fn open(config: LocalConfig, mounter: Arc<dyn MountLayer>) -> Result<Self> {
        validate::required("name", &config.name)?;
        validate::required("node_id", &config.node_id)?;
        if config.max_volume_bytes > config.capacity_bytes {
            let reason = format!(
                "{} is larger than the capacity {}",
                format_bytes(config.max_volume_bytes),
                format_bytes(config.capacity_bytes)
            );
            return Err(Error::invalid("max_volume_size", reason));
        }
        let store = Store::open(&config.state_dir)?;
        let driver = Self {
            config,
            store,
            mounter,
        };
        driver.remove_orphans()?;
        Ok(driver)
    }

    /// Removes content no record owns: a crash between creating a volume's (or snapshot's) content and
    /// writing its record leaves it behind, and the next create of that id would trip over it. Content is
    /// always made before its record, and removed after it, so what has no record is nobody's.
    fn remove_orphans(&self) -> Result<()> {
        let owned = |dir: &str, id: &str| match dir {
            "volumes" => self.store.volume(id).is_some(),
            _ => self.store.snapshots().contains_key(id),
        };
        for dir in ["volumes", "snapshots"] {
            let path = self.store.root().join(dir);
            let entries = fs::read_dir(&path).context(|| format!("reading {}", path.display()))?;
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let id = name.strip_suffix(".img").unwrap_or(&name);
                if owned(dir, id) {
                    continue;
                }
                tracing::warn!(path = %entry.path().display(), "removing content no record owns (left by a crash)");
                if name.ends_with(".img") {
                    self.detach_loop(&entry.path())?;
                }
                remove_content(&entry.path())?;
            }
        }
        Ok(())
    }

    /// The driver's config.
    pub fn config(&self) -> &LocalConfig {
        &self.config
    }

    /// Every volume the driver owns, by id (the store is locked while the guard lives).
    pub fn volumes(
        &self,
    ) -> parking_lot::MappedMutexGuard<'_, std::collections::BTreeMap<String, VolumeRecord>> {
        self.store.volumes()
    }

    /// Bytes allocated to all volumes, ephemeral ones included.
    fn allocated_bytes(&self) -> u64 {
        self.store.allocated_bytes()
    }

    /// Bytes still free to allocate.
    fn available_bytes(&self) -> u64 {
        self.config
            .capacity_bytes
            .saturating_sub(self.allocated_bytes())
    }

    /// Checks a new allocation of `bytes` against the per-volume maximum and the remaining capacity.
    fn check_allocation(&self, bytes: u64) -> Result<()> {
        if bytes > self.config.max_volume_bytes {
            return Err(Error::OutOfRange(format!(
                "requested {} exceeds the maximum volume size {}",
                format_bytes(bytes),
                format_bytes(self.config.max_volume_bytes)
            )));
        }
        let free = self.available_bytes();
        if bytes > free {
            return Err(store::exhausted(bytes, free, self.config.capacity_bytes));
        }
        Ok(())
    }

    fn volume(&self, id: &str) -> Result<VolumeRecord> {
        self.store
            .volume(id)
            .ok_or_else(|| Error::not_found("volume", id))
    }

    /// The CSI volume condition: abnormal when the volume's content has gone missing from the state dir.
    fn condition(&self, volume: &VolumeRecord) -> inlet_proto::csi::v1::VolumeCondition {
        let data = self.store.volume_data(&volume.id, volume.access_type);
        let (abnormal, message) = match data.exists() {
            true => (false, "healthy".to_string()),
            false => (true, format!("content {} is missing", data.display())),
        };
        inlet_proto::csi::v1::VolumeCondition { abnormal, message }
    }

    /// Creates a volume's content: an empty directory, or a sparse file of its size for block.
    fn create_content(&self, volume: &VolumeRecord, from: Option<&Path>) -> Result<()> {
        let data = self.store.volume_data(&volume.id, volume.access_type);
        let created = match from {
            Some(source) => copy_tree(source, &data),
            None => match volume.access_type {
                // A leftover here has no record (the caller is creating one), so it is nobody's.
                AccessType::Mount => remove_content(&data).and_then(|()| {
                    fs::create_dir(&data).context(|| format!("creating {}", data.display()))
                }),
                AccessType::Block => create_sparse_file(&data, volume.capacity_bytes),
            },
        };
        if created.is_err() {
            // Leave nothing half-made behind (a partial copy, an empty file).
            let _ = remove_content(&data);
        }
        created?;
        if from.is_some() && volume.access_type == AccessType::Block {
            grow_file(&data, volume.capacity_bytes)?;
        }
        Ok(())
    }

    /// Deletes a volume's content and record, detaching its loop device first.
    fn delete_volume_data(&self, id: &str) -> Result<()> {
        let Some(volume) = self.store.volume(id) else {
            return Ok(());
        };
        let data = self.store.volume_data(id, volume.access_type);
        if volume.access_type == AccessType::Block {
            self.detach_loop(&data)?;
        }
        remove_content(&data)?;
        inlet_host::crash::point("volume.content-removed");
        self.store.remove_volume(id)
    }

    /// The loop device a block volume's file is attached to, attaching it if needed.
    fn ensure_loop(&self, file: &Path) -> Result<PathBuf> {
        let what = || format!("attaching {} to a loop device", file.display());
        match self.mounter.find_loop(file).context(what)? {
            Some(device) => Ok(device),
            None => self.mounter.attach_loop(file).context(what),
        }
    }

    fn detach_loop(&self, file: &Path) -> Result<()> {
        let what = || format!("detaching the loop device of {}", file.display());
        if let Some(device) = self.mounter.find_loop(file).context(what)? {
            self.mounter.detach_loop(&device).context(what)?;
        }
        Ok(())
    }
}

fn create_sparse_file(path: &Path, bytes: u64) -> Result<()> {
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path);
    file.and_then(|f| f.set_len(bytes))
        .context(|| format!("creating {}", path.display()))
}

fn grow_file(path: &Path, bytes: u64) -> Result<()> {
    let file = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .context(|| format!("opening {}", path.display()))?;
    let len = file
        .metadata()
        .context(|| format!("reading {}", path.display()))?
        .len();
    if len < bytes {
        file.set_len(bytes)
            .context(|| format!("growing {}", path.display()))?;
    }
    Ok(())
}

/// Copies a directory tree or file with `cp -a`, which keeps modes, owners, links and sparse files, and
/// shares blocks on filesystems that can (`--reflink=auto`), as csi-driver-host-path does for clones.
fn copy_tree(source: &Path, dest: &Path) -> Result<()> {
    let what = || format!("copying {} to {}", source.display(), dest.display());
    let out = Command::new("cp")
        .arg("-a")
        .arg("--reflink=auto")
        .arg(source)
        .arg(dest)
        .output()
        .context(what)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(std::io::Error::other(stderr)).context(what);
    }
    Ok(())
}

/// Removes a volume's or snapshot's content; a missing one is already removed.
fn remove_content(path: &Path) -> Result<()> {
    let removed = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    removed.context(|| format!("removing {}", path.display()))
}
