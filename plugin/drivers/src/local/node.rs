//! CSI Node calls of the local driver, including KEP-596 ephemeral inline volumes: a NodePublishVolume whose
//! volume context says `csi.storage.k8s.io/ephemeral: "true"` creates the volume on the spot (no staging, no
//! attach), and its last NodeUnpublishVolume deletes it.
//!
//! Order of a publish: validate, record the publication, then mount; a failed mount removes the record (and an
//! ephemeral volume it created), so nothing is left behind. A crash between the two leaves a record whose
//! mount may be missing: a repeated publish mounts it, a repeated unpublish tolerates its absence.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use csi::node_service_capability::{Rpc, Type as CapType, rpc::Type as Cap};
use csi::volume_capability::access_mode::Mode;
use inlet_proto::csi::v1 as csi;

use super::store::{AccessType, Publication, VolumeRecord};
use super::{LocalDriver, SIZE_ATTRIBUTE};
use crate::keys::{EPHEMERAL_KEY, KUBERNETES_KEY_PREFIX};
use crate::validate::{self, Capability};
use inlet_host::crash;
use inlet_host::error::{Error, IoContext, Result};
use inlet_host::host_path;
use inlet_host::mount::MountFlags;
use inlet_host::quantity::{format_bytes, parse_bytes};

impl LocalDriver {
    /// NodeGetCapabilities.
    pub fn node_capabilities(&self) -> Vec<csi::NodeServiceCapability> {
        let mut caps = vec![
            Cap::StageUnstageVolume,
            Cap::GetVolumeStats,
            Cap::ExpandVolume,
            Cap::VolumeCondition,
            Cap::SingleNodeMultiWriter,
        ];
        if self.config.volume_mount_group {
            caps.push(Cap::VolumeMountGroup);
        }
        caps.into_iter()
            .map(|c| csi::NodeServiceCapability {
                r#type: Some(CapType::Rpc(Rpc { r#type: c as i32 })),
            })
            .collect()
    }

    /// NodeGetInfo: this node's id; no volume limit, no topology.
    pub fn node_info(&self) -> csi::NodeGetInfoResponse {
        csi::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }
    }

    /// NodeStageVolume: mounts a volume at its node-global staging path (block: attaches its loop device).
    /// Staging again at the same path is OK; at another path it is FAILED_PRECONDITION. With attach enabled the
    /// volume must have been ControllerPublished to this node first.
    pub fn node_stage(
        &self,
        req: csi::NodeStageVolumeRequest,
    ) -> Result<csi::NodeStageVolumeResponse> {
        let id = validate::id("volume_id", &req.volume_id)?;
        let staging = self.host_path("staging_target_path", &req.staging_target_path)?;
        let cap = validate::capability("volume_capability", req.volume_capability.as_ref())?;
        let volume = self.volume(id)?.clone();
        check_access_type(&volume, &cap)?;
        if volume.ephemeral {
            return Err(Error::FailedPrecondition(format!(
                "volume {id:?} is ephemeral and cannot be staged"
            )));
        }
        if self.config.enable_attach && !volume.attached_to.contains_key(&self.config.node_id) {
            return Err(Error::FailedPrecondition(format!(
                "volume {id:?} is not published to node {:?}: call ControllerPublishVolume first",
                self.config.node_id
            )));
        }
        match &volume.staged_at {
            Some(path) if *path != staging => {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id:?} is already staged at {}",
                    path.display()
                )));
            }
            Some(_) => {}
            None => {
                // A staging path mounted before this volume was staged there is another volume's, as a
                // publish's target is: never hand its content out as this volume.
                let mounted = self.mounter.is_mount_point(&staging);
                if mounted.context(|| format!("checking {}", staging.display()))? {
                    return Err(Error::AlreadyExists(format!(
                        "staging path {} already holds another mount",
                        staging.display()
                    )));
                }
                self.store.put_volume(VolumeRecord {
                    staged_at: Some(staging.clone()),
                    ..volume.clone()
                })?
            }
        }
        crash::point("stage.recorded");
        let data = self.store.volume_data(id, volume.access_type);
        let staged = match volume.access_type {
            AccessType::Mount => {
                self.mount_target(&data, &staging, AccessType::Mount, MountFlags::default())
            }
            AccessType::Block => {
                self.make_dirs(&staging)?;
                self.ensure_loop(&data).map(drop)
            }
        };
        let staged = staged.and_then(|()| self.apply_mount_group(&staging, &cap));
        if let Err(err) = staged {
            self.store.put_volume(VolumeRecord {
                staged_at: None,
                ..volume
            })?;
            return Err(err);
        }
        crash::point("stage.mounted");
        tracing::info!(volume_id = id, staging_target_path = %staging.display(), "staged volume");
        Ok(csi::NodeStageVolumeResponse {})
    }

    /// NodeUnstageVolume: unmounts the staging path. Not staged (or an unknown volume with nothing mounted
    /// there) is already unstaged: OK. Still published at a target is FAILED_PRECONDITION.
    pub fn node_unstage(
        &self,
        req: csi::NodeUnstageVolumeRequest,
    ) -> Result<csi::NodeUnstageVolumeResponse> {
        let id = validate::id("volume_id", &req.volume_id)?;
        let staging = self.host_path("staging_target_path", &req.staging_target_path)?;
        let Some(volume) = self.store.volume(id) else {
            self.release_unknown(id, &staging, AccessType::Mount)?;
            return Ok(csi::NodeUnstageVolumeResponse {});
        };
        if volume.staged_at.as_ref() != Some(&staging) {
            return Ok(csi::NodeUnstageVolumeResponse {});
        }
        if !volume.published.is_empty() {
            let targets: Vec<_> = volume
                .published
                .keys()
                .map(|p| p.display().to_string())
                .collect();
            return Err(Error::FailedPrecondition(format!(
                "volume {id:?} is still published at {targets:?}"
            )));
        }
        match volume.access_type {
            AccessType::Mount => self.unmount_target(&staging, AccessType::Mount)?,
            AccessType::Block => {
                self.detach_loop(&self.store.volume_data(id, AccessType::Block))?;
                remove_dir_if_empty(&staging)?;
            }
        }
        crash::point("unstage.unmounted");
        self.store.put_volume(VolumeRecord {
            staged_at: None,
            ..volume
        })?;
        crash::point("unstage.recorded");
        tracing::info!(volume_id = id, staging_target_path = %staging.display(), "unstaged volume");
        Ok(csi::NodeUnstageVolumeResponse {})
    }

    /// NodePublishVolume: bind-mounts the volume at the target, read-only when asked (or for a reader-only
    /// access mode). Publishing again with the same options is OK; different options at the same target are
    /// ALREADY_EXISTS. An ephemeral request creates the volume first.
    pub fn node_publish(
        &self,
        req: csi::NodePublishVolumeRequest,
    ) -> Result<csi::NodePublishVolumeResponse> {
        let id = validate::id("volume_id", &req.volume_id)?;
        let target = self.host_path("target_path", &req.target_path)?;
        let cap = validate::capability("volume_capability", req.volume_capability.as_ref())?;
        let flags = MountFlags {
            read_only: req.readonly || cap.flags.read_only || cap.read_only_mode(),
            ..cap.flags
        };
        let publication = Publication {
            flags,
            access_mode: cap.mode as i32,
        };

        let known = self.store.volume(id).is_some_and(|v| !v.ephemeral);
        let ephemeral = ephemeral_request(
            &req.volume_context,
            self.config.ephemeral_default,
            &req.staging_target_path,
            known,
        )?;
        let created = match ephemeral {
            true => {
                self.ensure_ephemeral(id, &cap, &req.volume_context, (&target, &publication))?
            }
            false => false,
        };
        let source = match self.publish_source(id, &cap, &req.staging_target_path) {
            Ok(source) => source,
            Err(err) => return Err(self.undo_ephemeral(id, created, err)),
        };
        let volume = self.volume(id)?.clone();
        let newly_recorded = match volume.published.get(&target) {
            Some(existing) if *existing != publication => {
                return Err(Error::AlreadyExists(format!(
                    "volume {id:?} is already published at {} with other options",
                    target.display()
                )));
            }
            Some(_) => false,
            None => {
                let single_writer =
                    |p: &Publication| p.access_mode == Mode::SingleNodeSingleWriter as i32;
                if !volume.published.is_empty()
                    && (single_writer(&publication) || volume.published.values().any(single_writer))
                {
                    let err = Error::FailedPrecondition(format!(
                        "volume {id:?} uses SINGLE_NODE_SINGLE_WRITER and is already published at another target"
                    ));
                    return Err(self.undo_ephemeral(id, created, err));
                }
                let mut volume = volume.clone();
                volume.published.insert(target.clone(), publication);
                if let Err(err) = self.store.put_volume(volume) {
                    return Err(self.undo_ephemeral(id, created, err));
                }
                crash::point("publish.recorded");
                true
            }
        };
        // A target mounted before this publication was recorded is someone else's mount: never hand it out
        // as this volume (a retried publication finds its own mount, and that is OK).
        let taken = || -> Result<()> {
            let mounted = self.mounter.is_mount_point(&target);
            match mounted.context(|| format!("checking {}", target.display()))? {
                true => Err(Error::AlreadyExists(format!(
                    "target {} already holds another mount",
                    target.display()
                ))),
                false => Ok(()),
            }
        };
        let fresh = newly_recorded || created;
        let mounted = (if fresh { taken() } else { Ok(()) })
            .and_then(|()| self.mount_target(&source, &target, volume.access_type, flags))
            .and_then(|()| self.apply_mount_group(&target, &cap));
        if let Err(err) = mounted {
            if newly_recorded {
                let mut volume = self.volume(id)?.clone();
                volume.published.remove(&target);
                self.store.put_volume(volume)?;
            }
            return Err(self.undo_ephemeral(id, created, err));
        }
        crash::point("publish.mounted");
        tracing::info!(volume_id = id, target_path = %target.display(), readonly = flags.read_only, ephemeral = created, "published volume");
        Ok(csi::NodePublishVolumeResponse {})
    }

    /// Gives the volume mounted at `path` to the capability's `volume_mount_group` (VOLUME_MOUNT_GROUP): its
    /// root dir gets the group, group read/write and the setgid bit, so files made there inherit the group.
    /// Through the mount layer, as every host effect (the recording fake records it).
    fn apply_mount_group(&self, path: &Path, cap: &Capability) -> Result<()> {
        let Some(gid) = cap.mount_group.filter(|_| self.config.volume_mount_group) else {
            return Ok(());
        };
        if cap.flags.read_only {
            return Ok(());
        }
        self.mounter
            .set_group(path, gid, 0o2070)
            .context(|| format!("giving {} to group {gid}", path.display()))
    }

    /// NodeUnpublishVolume: unmounts and removes the target; the last unpublish of an ephemeral volume deletes
    /// it. A target that is not published (or an unknown volume with nothing mounted at the target) is already
    /// unpublished: OK, so a repeat after an ephemeral volume was deleted still succeeds. An unknown volume with
    /// something mounted at the target is NOT_FOUND: the driver never unmounts what it did not mount.
    pub fn node_unpublish(
        &self,
        req: csi::NodeUnpublishVolumeRequest,
    ) -> Result<csi::NodeUnpublishVolumeResponse> {
        let id = validate::id("volume_id", &req.volume_id)?;
        let target = self.host_path("target_path", &req.target_path)?;
        let Some(mut volume) = self.store.volume(id) else {
            self.release_unknown(id, &target, AccessType::Mount)?;
            return Ok(csi::NodeUnpublishVolumeResponse {});
        };
        if volume.published.contains_key(&target) {
            self.unmount_target(&target, volume.access_type)?;
            crash::point("unpublish.unmounted");
            volume.published.remove(&target);
            // The last unpublish of an ephemeral volume deletes the record below; no need to rewrite it first.
            if !(volume.ephemeral && volume.published.is_empty()) {
                self.store.put_volume(volume.clone())?;
            }
            tracing::info!(volume_id = id, target_path = %target.display(), "unpublished volume");
        } else if !self
            .mounter
            .is_mount_point(&target)
            .context(|| format!("checking {}", target.display()))?
        {
            // Not published here (a retry, or a kubelet that lost track); clean up only an empty leftover
            // directory, as the kubelet would. Something mounted here is another volume's: left alone.
            remove_dir_if_empty(&target)?;
        }
        if volume.ephemeral && volume.published.is_empty() {
            self.delete_volume_data(id)?;
            tracing::info!(volume_id = id, "deleted ephemeral volume");
        }
        Ok(csi::NodeUnpublishVolumeResponse {})
    }

    /// NodeGetVolumeStats: bytes (allocated, used, available) and inodes for a path the volume is published or
    /// staged at; block volumes report their size. Any other path is NOT_FOUND.
    pub fn node_volume_stats(
        &self,
        req: csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse> {
        let id = validate::id("volume_id", &req.volume_id)?;
        validate::required("volume_path", &req.volume_path)?;
        // An unknown volume, or a path it is not published or staged at (outside the kubelet dir
        // included), is NOT_FOUND: the CSI spec's answer, which csi-sanity checks.
        let volume = self.volume(id)?;
        let at = |path: &Path| {
            volume.published.contains_key(path) || volume.staged_at.as_deref() == Some(path)
        };
        // The kubelet asks at the path it published at, which is recorded as given unless the kubelet dir
        // is a symlink: found as is, it needs no walk (the stats read only the driver's own content).
        // Any other spelling is checked as a publish checks its target.
        if !at(Path::new(&req.volume_path)) {
            let path = self
                .host_path("volume_path", &req.volume_path)
                .map_err(|_| Error::not_found("volume path", format!("{id} at that path")))?;
            if !at(&path) {
                return Err(Error::NotFound {
                    kind: "volume path",
                    id: format!("{id} at {}", path.display()),
                });
            }
        }
        let data = self.store.volume_data(id, volume.access_type);
        let total = i64::try_from(volume.capacity_bytes).unwrap_or(i64::MAX);
        let usage = |unit: csi::volume_usage::Unit, total, used: i64, available| csi::VolumeUsage {
            available,
            total,
            used,
            unit: unit as i32,
        };
        let mut usages = Vec::new();
        // A volume whose content went missing is still answered: its condition says what is wrong (the
        // kubelet's stats provider turns it into a VolumeConditionAbnormal event), not an error.
        if volume.access_type == AccessType::Block || !data.exists() {
            usages.push(usage(csi::volume_usage::Unit::Bytes, total, 0, 0));
        } else {
            let (used_bytes, used_inodes) = tree_usage(&data)?;
            let fs = nix::sys::statvfs::statvfs(&data)
                .map_err(io::Error::from)
                .context(|| format!("statvfs {}", data.display()))?;
            let used_bytes = i64::try_from(used_bytes).unwrap_or(i64::MAX);
            usages.push(usage(
                csi::volume_usage::Unit::Bytes,
                total,
                used_bytes,
                (total - used_bytes).max(0),
            ));
            usages.push(usage(
                csi::volume_usage::Unit::Inodes,
                fs.files() as i64,
                used_inodes as i64,
                fs.files_free() as i64,
            ));
        }
        Ok(csi::NodeGetVolumeStatsResponse {
            usage: usages,
            volume_condition: Some(self.condition(&volume)),
        })
    }

    /// NodeExpandVolume: after ControllerExpandVolume, makes a block volume's loop device see the new size.
    /// Directory volumes need nothing. Repeating it is harmless.
    pub fn node_expand(
        &self,
        req: csi::NodeExpandVolumeRequest,
    ) -> Result<csi::NodeExpandVolumeResponse> {
        let id = validate::id("volume_id", &req.volume_id)?;
        validate::required("volume_path", &req.volume_path)?;
        // An unknown volume is NOT_FOUND before its path is looked at (the CSI spec; csi-sanity).
        let volume = self.volume(id)?;
        self.host_path("volume_path", &req.volume_path)?;
        let required = req
            .capacity_range
            .as_ref()
            .map_or(0, |r| r.required_bytes.max(0) as u64);
        if required > volume.capacity_bytes {
            return Err(Error::OutOfRange(format!(
                "volume {id:?} has {}; call ControllerExpandVolume to grow it to {} first",
                format_bytes(volume.capacity_bytes),
                format_bytes(required)
            )));
        }
        if volume.access_type == AccessType::Block {
            let data = self.store.volume_data(id, AccessType::Block);
            if let Some(device) = self
                .mounter
                .find_loop(&data)
                .context(|| format!("finding loop of {}", data.display()))?
            {
                self.mounter
                    .refresh_loop(&device)
                    .context(|| format!("refreshing {}", device.display()))?;
            }
        }
        Ok(csi::NodeExpandVolumeResponse {
            capacity_bytes: volume.capacity_bytes as i64,
        })
    }

    /// Creates `dir` (below the kubelet dir) and its missing parents, never through a symlink.
    fn make_dirs(&self, dir: &Path) -> Result<()> {
        let what = || format!("creating {}", dir.display());
        match host_path::below(&self.config.kubelet_dir, dir).context(what)? {
            Some((root, relative)) => host_path::create_dirs(&root, &relative, 0o750).context(what),
            None => Err(Error::invalid("target_path", "outside the kubelet dir")),
        }
    }

    fn host_path(&self, field: &str, value: &str) -> Result<PathBuf> {
        validate::host_path(
            field,
            value,
            &self.config.kubelet_dir,
            &self.config.state_dir,
        )
    }

    /// Creates the ephemeral volume `id` if it does not exist yet, with its first publication already in the
    /// record so a new volume costs one record write; true when it was created by this call.
    fn ensure_ephemeral(
        &self,
        id: &str,
        cap: &Capability,
        context: &HashMap<String, String>,
        (target, publication): (&Path, &Publication),
    ) -> Result<bool> {
        if cap.access_type == AccessType::Block {
            return Err(Error::invalid(
                "volume_capability.access_type",
                "ephemeral inline volumes must use mount access",
            ));
        }
        let size = self.ephemeral_size(context)?;
        if let Some(existing) = self.store.volume(id) {
            if !existing.ephemeral {
                return Err(Error::AlreadyExists(format!(
                    "volume id {id:?} belongs to a persistent volume"
                )));
            }
            // The same id with another size is another volume (CSI: ALREADY_EXISTS for a volume that
            // exists but is incompatible), not this one silently kept at its old size.
            if existing.capacity_bytes != size {
                return Err(Error::AlreadyExists(format!(
                    "ephemeral volume {id:?} exists with size {}, not {}",
                    format_bytes(existing.capacity_bytes),
                    format_bytes(size)
                )));
            }
            return Ok(false);
        }
        self.check_allocation(size)?;
        let volume = VolumeRecord {
            id: id.to_string(),
            capacity_bytes: size,
            access_type: AccessType::Mount,
            parameters: BTreeMap::new(),
            content_source: None,
            ephemeral: true,
            attached_to: BTreeMap::new(),
            staged_at: None,
            published: litemap::LiteMap::from_iter([(target.to_path_buf(), publication.clone())]),
        };
        self.create_content(&volume, None)?;
        crash::point("volume.content-created");
        // Checked again with the write: another volume may have taken the space meanwhile.
        if let Err(err) = self
            .store
            .put_new_volume(volume, self.config.capacity_bytes)
        {
            let _ = super::remove_content(&self.store.volume_data(id, AccessType::Mount));
            return Err(err);
        }
        Ok(true)
    }

    /// Deletes an ephemeral volume this publish created, then hands back the error that made it necessary.
    fn undo_ephemeral(&self, id: &str, created: bool, err: Error) -> Error {
        if created {
            if let Err(cleanup) = self.delete_volume_data(id) {
                tracing::warn!(volume_id = id, error = %cleanup, "could not delete ephemeral volume after a failed publish");
            }
        }
        err
    }

    /// The `size` attribute of an ephemeral volume, or the default. Attributes the driver does not know are
    /// INVALID_ARGUMENT, naming the attribute; the kubelet's `csi.storage.k8s.io/` keys are accepted.
    fn ephemeral_size(&self, context: &HashMap<String, String>) -> Result<u64> {
        let mut size = self.config.default_volume_bytes;
        for (key, value) in context {
            if key == SIZE_ATTRIBUTE {
                let field = format!("volume_context[{SIZE_ATTRIBUTE:?}]");
                size = parse_bytes(value).map_err(|reason| Error::invalid(&field, reason))?;
                if size == 0 {
                    return Err(Error::invalid(field, "must be larger than zero"));
                }
            } else if !key.starts_with(KUBERNETES_KEY_PREFIX) {
                let reason =
                    format!("unknown attribute; the local driver accepts {SIZE_ATTRIBUTE:?}");
                return Err(Error::invalid(format!("volume_context[{key:?}]"), reason));
            }
        }
        Ok(size)
    }

    /// What a publish bind-mounts: an ephemeral volume's directory, a persistent volume's staging path, or a
    /// block volume's loop device. Persistent volumes must be staged first (the driver has STAGE_UNSTAGE).
    fn publish_source(&self, id: &str, cap: &Capability, staging: &str) -> Result<PathBuf> {
        let volume = self.volume(id)?;
        check_access_type(&volume, cap)?;
        if volume.ephemeral {
            return Ok(self.store.volume_data(id, AccessType::Mount));
        }
        let staging = self.host_path("staging_target_path", staging)?;
        if volume.staged_at.as_ref() != Some(&staging) {
            return Err(Error::FailedPrecondition(format!(
                "volume {id:?} must be staged at {} before publishing",
                staging.display()
            )));
        }
        match volume.access_type {
            AccessType::Mount => Ok(staging),
            AccessType::Block => self.ensure_loop(&self.store.volume_data(id, AccessType::Block)),
        }
    }

    /// Creates the target (a directory, or a file for block) and bind-mounts `source` on it, unless it is
    /// already a mount point. A target this call created is removed again if the mount fails.
    fn mount_target(
        &self,
        source: &Path,
        target: &Path,
        access: AccessType,
        flags: MountFlags,
    ) -> Result<()> {
        let what = || format!("mounting {} at {}", source.display(), target.display());
        if self.mounter.is_mount_point(target).context(what)? {
            return Ok(());
        }
        let existed = target.symlink_metadata().is_ok();
        match access {
            AccessType::Mount => self.make_dirs(target)?,
            AccessType::Block => {
                if let Some(parent) = target.parent() {
                    self.make_dirs(parent)?;
                }
                // O_NOFOLLOW: a symlink raced into the target's place is refused, not written through.
                fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .custom_flags(nix::libc::O_NOFOLLOW)
                    .open(target)
                    .map(drop)
                    .context(|| format!("creating {}", target.display()))?;
            }
        }
        if let Err(err) = self.mounter.bind(source, target, flags) {
            if !existed {
                let _ = remove_target(target);
            }
            return Err(err).context(what);
        }
        Ok(())
    }

    /// Unmounts the target if mounted, then removes it (an empty directory or the block target file).
    fn unmount_target(&self, target: &Path, access: AccessType) -> Result<()> {
        let what = || format!("unmounting {}", target.display());
        if self.mounter.is_mount_point(target).context(what)? {
            self.mounter.unmount(target).context(what)?;
        }
        match access {
            AccessType::Mount => remove_dir_if_empty(target),
            AccessType::Block => {
                remove_target(target).context(|| format!("removing {}", target.display()))
            }
        }
    }

    /// For a path the driver has no record of: nothing mounted there means "already released" and an empty
    /// leftover is removed; something mounted there is not the driver's to touch.
    fn release_unknown(&self, id: &str, path: &Path, access: AccessType) -> Result<()> {
        if self
            .mounter
            .is_mount_point(path)
            .context(|| format!("checking {}", path.display()))?
        {
            return Err(Error::NotFound {
                kind: "volume",
                id: format!("{id} (something else is mounted at {})", path.display()),
            });
        }
        match access {
            AccessType::Mount => remove_dir_if_empty(path),
            AccessType::Block => {
                remove_target(path).context(|| format!("removing {}", path.display()))
            }
        }
    }
}

/// True when this publish is for an inline ephemeral volume: the kubelet says so
/// (`csi.storage.k8s.io/ephemeral: "true"`, sent only with podInfoOnMount), or, when the driver runs with
/// `ephemeral_default` (csi-driver-host-path's `--ephemeral`), the key is absent and the publish has no
/// staging path for a volume the driver does not know: a persistent volume is always staged first, since
/// this driver has STAGE_UNSTAGE_VOLUME.
fn ephemeral_request(
    context: &HashMap<String, String>,
    ephemeral_default: bool,
    staging_path: &str,
    known: bool,
) -> Result<bool> {
    match context.get(EPHEMERAL_KEY).map(String::as_str) {
        None => Ok(ephemeral_default && staging_path.is_empty() && !known),
        Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Error::invalid(
            format!("volume_context[{EPHEMERAL_KEY:?}]"),
            format!("{other:?} is not \"true\" or \"false\""),
        )),
    }
}

fn check_access_type(volume: &VolumeRecord, cap: &Capability) -> Result<()> {
    if volume.access_type != cap.access_type {
        let reason = format!(
            "volume {:?} is a {:?} volume",
            volume.id, volume.access_type
        );
        return Err(Error::invalid("volume_capability.access_type", reason));
    }
    Ok(())
}

/// Removes a directory only when it is empty: a target that still holds files was not unmounted, and the
/// driver never deletes data through it.
fn remove_dir_if_empty(dir: &Path) -> Result<()> {
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => {
            tracing::warn!(path = %dir.display(), "leaving a non-empty directory in place");
            Ok(())
        }
        Err(e) => Err(e).context(|| format!("removing {}", dir.display())),
    }
}

fn remove_target(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Bytes and inodes used by a directory tree (hard links counted once per path, as `du --apparent-size`).
fn tree_usage(dir: &Path) -> Result<(u64, u64)> {
    let mut bytes = 0;
    let mut inodes = 0;
    for entry in walkdir::WalkDir::new(dir) {
        let entry = entry
            .map_err(io::Error::from)
            .context(|| format!("reading {}", dir.display()))?;
        let meta = entry
            .metadata()
            .map_err(io::Error::from)
            .context(|| format!("reading {}", entry.path().display()))?;
        bytes += meta.len();
        inodes += 1;
    }
    Ok((bytes, inodes))
}
