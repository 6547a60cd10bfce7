//! `vol_data.json`: what the kubelet writes beside a volume's `mount/` dir (and beside a staging dir), so
//! an unmounter and reconstruction after a restart know the driver and handle without the pod.
//! Keys as upstream's `volDataKey` (`csi_mounter.go`): one JSON object on one line, then a newline.

use std::collections::BTreeMap;
use std::path::Path;

/// The file's name.
pub const FILE_NAME: &str = "vol_data.json";

/// The key of the SELinux label a volume was mounted with.
const SELINUX_KEY: &str = "seLinuxMountContext";

/// The recorded facts of one volume.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolData {
    /// `specVolID`: the pod's volume name or the PV name.
    pub spec_vol_id: String,
    /// `volumeHandle`.
    pub volume_handle: String,
    /// `driverName`.
    pub driver_name: String,
    /// `nodeName`.
    pub node_name: String,
    /// `attachmentID`: csi-sha256(handle + driver + node).
    pub attachment_id: String,
    /// `volumeLifecycleMode`: `Ephemeral` or `Persistent`.
    pub lifecycle_mode: String,
    /// `seLinuxMountContext`: the label the volume was mounted with (`-o context=`), written only when
    /// there was one.
    pub selinux_mount_context: String,
}

/// One JSON object on one line, then a newline, as Go's `json.NewEncoder(file).Encode` writes it.
fn write_line(dir: &Path, map: &BTreeMap<&str, &str>) -> std::io::Result<()> {
    let mut line = serde_json::to_string(map).map_err(std::io::Error::other)?;
    line.push('\n');
    std::fs::write(dir.join(FILE_NAME), line)
}

impl VolData {
    /// Writes `dir/vol_data.json`.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        let mut map = BTreeMap::from([
            ("specVolID", self.spec_vol_id.as_str()),
            ("volumeHandle", &self.volume_handle),
            ("driverName", &self.driver_name),
            ("nodeName", &self.node_name),
            ("attachmentID", &self.attachment_id),
            ("volumeLifecycleMode", &self.lifecycle_mode),
        ]);
        if !self.selinux_mount_context.is_empty() {
            map.insert(SELINUX_KEY, &self.selinux_mount_context);
        }
        write_line(dir, &map)
    }

    /// Writes the record `MountDevice` keeps beside a staging dir: just `volumeHandle` and `driverName`
    /// (`csi_attacher.go`), all `UnmountDevice` needs, and the SELinux label it staged with, if any.
    pub fn save_staging(
        dir: &Path,
        volume_handle: &str,
        driver_name: &str,
        selinux_mount_context: &str,
    ) -> std::io::Result<()> {
        let mut map =
            BTreeMap::from([("volumeHandle", volume_handle), ("driverName", driver_name)]);
        if !selinux_mount_context.is_empty() {
            map.insert(SELINUX_KEY, selinux_mount_context);
        }
        write_line(dir, &map)
    }

    /// Reads `dir/vol_data.json` (keys it lacks read as empty).
    pub fn load(dir: &Path) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(dir.join(FILE_NAME))?;
        let map: BTreeMap<String, String> =
            serde_json::from_str(&text).map_err(std::io::Error::other)?;
        let get = |k: &str| map.get(k).cloned().unwrap_or_default();
        Ok(Self {
            spec_vol_id: get("specVolID"),
            volume_handle: get("volumeHandle"),
            driver_name: get("driverName"),
            node_name: get("nodeName"),
            attachment_id: get("attachmentID"),
            lifecycle_mode: get("volumeLifecycleMode"),
            selinux_mount_context: get(SELINUX_KEY),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_upstream_keys_on_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let data = VolData {
            spec_vol_id: "v".into(),
            volume_handle: "csi-x".into(),
            lifecycle_mode: "Ephemeral".into(),
            ..Default::default()
        };
        data.save(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap();
        assert!(text.ends_with("}\n") && text.lines().count() == 1);
        for key in [
            "specVolID",
            "volumeHandle",
            "driverName",
            "nodeName",
            "attachmentID",
            "volumeLifecycleMode",
        ] {
            assert!(
                text.contains(&format!("\"{key}\"")),
                "{key} missing in {text}"
            );
        }
        assert_eq!(VolData::load(dir.path()).unwrap(), data);
    }
}
