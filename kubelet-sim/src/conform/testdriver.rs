//! `--testdriver FILE`: the driver definition of Kubernetes' e2e external storage tests
//! (`test/e2e/storage/external/external.go`, `driverDefinition`), read as e2e reads it so an author's
//! existing file works unchanged: YAML or JSON, keys the Go field names, case-sensitive
//! (`UnmarshalCaseSensitivePreserveInts`). Where e2e ignores what it does not know, conform reports it:
//! a misspelt key or capability silently turns a test off in e2e.
//!
//! What conform takes from it: `DriverInfo.Name` (must be the driver's), `DriverInfo.Capabilities`,
//! `DriverInfo.SupportedFsType`, and `InlineVolumes[]` (attributes, `Shared`, `ReadOnly`), volume `i` of a
//! pod using `InlineVolumes[i % len]` as e2e's `GetVolume` does. The rest is read and kept out of the way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use super::ConformError;

/// e2e's `storageframework.Capability` values (`testsuites/testdriver.go`).
pub const CAPABILITIES: &[&str] = &[
    "persistence",
    "block",
    "fsGroup",
    "volumeMountGroup",
    "exec",
    "snapshotDataSource",
    "pvcDataSource",
    "offlineSnapshotClone",
    "multipods",
    "RWX",
    "controllerExpansion",
    "nodeExpansion",
    "offlineExpansion",
    "onlineExpansion",
    "volumeLimits",
    "singleNodeVolume",
    "topology",
    "capacity",
    "FSResizeFromSourceNotSupported",
    "readWriteOncePod",
    "multiplePVsSameID",
    "capReadOnlyMany",
];

/// One entry of `InlineVolumes`: what a pod's inline volume carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct InlineDefinition {
    /// `volumeAttributes`, passed as NodePublishVolumeRequest.volume_context.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    /// Two pods with this definition may see the same data.
    #[serde(default)]
    pub shared: bool,
    /// The driver cannot mount it read/write.
    #[serde(default)]
    pub read_only: bool,
}

/// The driver definition, as far as conform uses it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TestDriver {
    /// The file it came from.
    pub file: String,
    /// `DriverInfo.Name`.
    pub name: String,
    /// `DriverInfo.Capabilities`.
    pub capabilities: BTreeMap<String, bool>,
    /// `DriverInfo.SupportedFsType` (`""` is the default filesystem).
    pub supported_fs_type: BTreeSet<String>,
    /// `InlineVolumes`.
    pub inline_volumes: Vec<InlineDefinition>,
    /// What e2e would silently ignore: unknown keys (`DriverInfo.Capabilites`) and capabilities.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<String>,
}

// The file's shape, with the fields conform does not use kept as opaque values (so they are known, not
// reported as ignored).
#[derive(Deserialize)]
#[expect(
    dead_code,
    reason = "e2e's fields conform does not use are read only to be known"
)]
#[serde(rename_all = "PascalCase")]
struct Definition {
    #[serde(default)]
    driver_info: Info,
    storage_class: Option<serde_json::Value>,
    volume_attributes_class: Option<serde_json::Value>,
    snapshot_class: Option<serde_json::Value>,
    #[serde(default)]
    inline_volumes: Vec<InlineDefinition>,
    client_node_name: Option<serde_json::Value>,
    node_selectors: Option<serde_json::Value>,
    timeouts: Option<serde_json::Value>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
#[expect(
    dead_code,
    reason = "e2e's fields conform does not use are read only to be known"
)]
struct Info {
    #[serde(default)]
    name: String,
    #[serde(default)]
    capabilities: BTreeMap<String, bool>,
    supported_fs_type: Option<BTreeMap<String, serde_json::Value>>,
    in_tree_plugin_name: Option<serde_json::Value>,
    feature_tag: Option<serde_json::Value>,
    test_tags: Option<serde_json::Value>,
    max_file_size: Option<serde_json::Value>,
    supported_size_range: Option<serde_json::Value>,
    supported_mount_option: Option<serde_json::Value>,
    required_mount_option: Option<serde_json::Value>,
    required_access_modes: Option<serde_json::Value>,
    topology_keys: Option<serde_json::Value>,
    num_allowed_topologies: Option<serde_json::Value>,
    stress_test_options: Option<serde_json::Value>,
    volume_snapshot_stress_test_options: Option<serde_json::Value>,
    performance_test_options: Option<serde_json::Value>,
}

impl TestDriver {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<Self, ConformError> {
        let text = std::fs::read_to_string(path).map_err(ConformError::io(path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses a driver definition; `file` names it in messages.
    pub fn parse(text: &str, file: &str) -> Result<Self, ConformError> {
        let bad = |e: String| ConformError::Usage(format!("{file}: {e}"));
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| bad(e.to_string()))?;
        let mut ignored = Vec::new();
        let definition: Definition =
            serde_ignored::deserialize(value, |path| ignored.push(path.to_string()))
                .map_err(|e| bad(e.to_string()))?;
        let Definition {
            driver_info: info,
            inline_volumes,
            ..
        } = definition;
        if info.name.is_empty() {
            return Err(bad("DriverInfo.Name not set".into()));
        }
        ignored.extend(
            info.capabilities
                .keys()
                .filter(|c| !CAPABILITIES.contains(&c.as_str()))
                .map(|c| format!("DriverInfo.Capabilities.{c} (not a capability)")),
        );
        // e2e's post-processing: controller expansion implies online and offline expansion unless the
        // file says otherwise.
        let mut capabilities = info.capabilities;
        if capabilities.get("controllerExpansion") == Some(&true) {
            for implied in ["onlineExpansion", "offlineExpansion"] {
                capabilities.entry(implied.to_string()).or_insert(true);
            }
        }
        // e2e's defaults: the default filesystem only.
        let supported_fs_type = match info.supported_fs_type {
            Some(types) => types.into_keys().collect(),
            None => BTreeSet::from([String::new()]),
        };
        Ok(Self {
            file: file.to_string(),
            name: info.name,
            capabilities,
            supported_fs_type,
            inline_volumes,
            ignored,
        })
    }

    /// Whether the file declares capability `name` (e2e's `Capabilities[name]`).
    pub fn has(&self, name: &str) -> bool {
        self.capabilities.get(name).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTPATH: &str = "\
StorageClass:
  FromFile: /go/src/storageclass.yaml
SnapshotClass:
  FromName: true
DriverInfo:
  Name: hostpath.csi.k8s.io
  SupportedFsType: {ext4: {}, \"\": {}}
  Capabilities:
    block: true
    persistence: true
    singleNodeVolume: true
  SupportedSizeRange: {Min: 1Mi}
InlineVolumes:
- Attributes: {size: 1Mi}
- Shared: true
  ReadOnly: true
";

    #[test]
    fn an_e2e_driver_file_is_read_as_e2e_reads_it() {
        let driver = TestDriver::parse(HOSTPATH, "hostpath.yaml").unwrap();
        assert_eq!(driver.name, "hostpath.csi.k8s.io");
        assert!(driver.has("block") && !driver.has("exec"));
        let expanding = TestDriver::parse(
            "DriverInfo: {Name: d, Capabilities: {controllerExpansion: true, offlineExpansion: false}}\n",
            "d.yaml",
        )
        .unwrap();
        assert!(expanding.has("onlineExpansion") && !expanding.has("offlineExpansion"));
        assert_eq!(
            driver.supported_fs_type,
            BTreeSet::from(["".to_string(), "ext4".to_string()])
        );
        assert_eq!(driver.inline_volumes.len(), 2);
        assert_eq!(driver.inline_volumes[0].attributes["size"], "1Mi");
        assert!(driver.inline_volumes[1].shared && driver.inline_volumes[1].read_only);
        assert!(driver.ignored.is_empty(), "{:?}", driver.ignored);
    }

    #[test]
    fn what_e2e_would_ignore_is_reported() {
        let text = "DriverInfo:\n  Name: d\n  Capabilites: {block: true}\n  Capabilities: {fsgroup: true}\n\
                    InlineVolumes:\n- attributes: {a: b}\nTimeout: {}\n";
        let driver = TestDriver::parse(text, "d.yaml").unwrap();
        assert_eq!(
            driver.ignored,
            [
                "DriverInfo.Capabilites",
                "InlineVolumes.0.attributes",
                "Timeout",
                "DriverInfo.Capabilities.fsgroup (not a capability)"
            ]
        );
        assert_eq!(driver.supported_fs_type, BTreeSet::from([String::new()]));
    }

    #[test]
    fn a_file_without_a_name_or_not_a_definition_is_refused() {
        let err = TestDriver::parse("InlineVolumes: []\n", "d.yaml").unwrap_err();
        assert_eq!(err.to_string(), "d.yaml: DriverInfo.Name not set");
        let err = TestDriver::parse("DriverInfo: [1]\n", "d.yaml").unwrap_err();
        assert!(err.to_string().starts_with("d.yaml: "), "{err}");
    }
}
