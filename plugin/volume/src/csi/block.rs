//! Raw block CSI volumes (`pkg/volume/csi/csi_block.go`): a PV of `volumeMode: Block` is staged with the
//! Block access type at `plugins/kubernetes.io/csi/volumeDevices/staging/<pv>` (SetUpDevice, run here as
//! the device mount), published to a device file at `.../volumeDevices/publish/<pv>/<pod uid>`
//! (MapPodDevice, run here as SetUp), and given to the pod as the symlink
//! `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>` to it (`MapBlockVolume`), which the container
//! config names as a device. The record of the volume is `volumeDevices/<pv>/data/vol_data.json`.
//!
//! Upstream also binds the device at a global map path and holds a loop device on it so the device
//! cannot be removed while mapped; that descriptor lock is left out (see `kep/upstream-differences.md`).

use std::path::{Path, PathBuf};

use super::PLUGIN_NAME;
use crate::VolumeHost;

/// `GetVolumeDevicePluginDir(CSIPluginName)`: `plugins/kubernetes.io/csi/volumeDevices`.
fn device_plugin_dir(host: &dyn VolumeHost) -> PathBuf {
    host.root_dir()
        .join("plugins")
        .join(PLUGIN_NAME)
        .join("volumeDevices")
}

/// `EscapeQualifiedName`: a `/` in a spec name becomes `~`.
fn escaped(spec_name: &str) -> String {
    spec_name.replace('/', "~")
}

/// `getStagingPath`: the directory NodeStageVolume is given.
pub(crate) fn staging_path(host: &dyn VolumeHost, spec_name: &str) -> PathBuf {
    device_plugin_dir(host)
        .join("staging")
        .join(escaped(spec_name))
}

/// `getPublishPath`: the device file NodePublishVolume creates for one pod (its parent is the kubelet's).
pub(crate) fn publish_path(host: &dyn VolumeHost, spec_name: &str, pod_uid: &str) -> PathBuf {
    device_plugin_dir(host)
        .join("publish")
        .join(escaped(spec_name))
        .join(pod_uid)
}

/// `getVolumeDeviceDataDir`: where the volume's `vol_data.json` is kept.
pub(crate) fn data_dir(host: &dyn VolumeHost, spec_name: &str) -> PathBuf {
    device_plugin_dir(host).join(spec_name).join("data")
}

/// `GetPodDeviceMapPath` joined with the volume's name: the symlink the container's device is.
pub(crate) fn pod_device_path(host: &dyn VolumeHost, pod_uid: &str, spec_name: &str) -> PathBuf {
    host.root_dir()
        .join("pods")
        .join(pod_uid)
        .join("volumeDevices")
        .join(PLUGIN_NAME.replace('/', "~"))
        .join(spec_name)
}

/// The spec name of a block staging path, or None for a filesystem one (`.../globalmount`).
pub(crate) fn staged_spec_name(host: &dyn VolumeHost, staging: &Path) -> Option<String> {
    let parent = staging.parent()?;
    (parent == device_plugin_dir(host).join("staging"))
        .then(|| staging.file_name()?.to_str().map(str::to_string))
        .flatten()
}

/// Removes what the kubelet made for a block volume's staging once it is unstaged: the staging dir, the
/// volume's record and its directories (never through a mount).
pub(crate) fn remove_staging(host: &dyn VolumeHost, spec_name: &str) {
    let staging = staging_path(host, spec_name);
    if host.mounter().is_mount_point(&staging).unwrap_or(true) {
        return;
    }
    let _ = std::fs::remove_dir(&staging);
    let data = data_dir(host, spec_name);
    let _ = std::fs::remove_file(data.join(super::vol_data::FILE_NAME));
    let _ = std::fs::remove_dir(&data);
    if let Some(volume_dir) = data.parent() {
        let _ = std::fs::remove_dir(volume_dir);
    }
}

/// Removes one pod's map of a block volume once unpublished: its symlink and the publish path's dirs
/// (the driver removes the device file itself; one it left that is not mounted goes too).
pub(crate) fn remove_pod_map(host: &dyn VolumeHost, spec_name: &str, pod_uid: &str) {
    let _ = std::fs::remove_file(pod_device_path(host, pod_uid, spec_name));
    let publish = publish_path(host, spec_name, pod_uid);
    if !host.mounter().is_mount_point(&publish).unwrap_or(true) {
        let _ = std::fs::remove_file(&publish);
    }
    if let Some(dir) = publish.parent() {
        let _ = std::fs::remove_dir(dir);
    }
}
