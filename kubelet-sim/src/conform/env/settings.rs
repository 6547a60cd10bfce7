//! What every check of a run shares ([`Conformance`]), and the inline volumes of a check's pods.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use inlet_host::mount::MountLayer;

use super::ClusterTarget;
use crate::conform::driver::{DriverInfo, DriverSetup};
use crate::conform::testdriver::{InlineDefinition, TestDriver};
use crate::sim::SimImages;

/// What every check of a run shares.
pub struct Conformance {
    /// The driver and how to (re)start it.
    pub setup: DriverSetup,
    /// What the driver says of itself, and its CSIDriver.
    pub info: DriverInfo,
    /// Each check runs under `<root>/<check>/`.
    pub root: PathBuf,
    /// `--testdriver`'s definition.
    pub testdriver: Option<TestDriver>,
    /// The inline volume definitions a pod's volumes cycle through (see [`Conformance::inline`]).
    pub inline_volumes: Vec<InlineDefinition>,
    /// How long one step waits.
    pub wait: Duration,
    /// Images for the in-process runtime.
    pub images: SimImages,
    /// The mount layer, and whether its mounts are real.
    pub mounter: (Arc<dyn MountLayer>, bool),
    /// `--kubeconfig`: the checks run on this real node instead of a simulated one.
    pub cluster: Option<ClusterTarget>,
}

impl Conformance {
    /// A pod's inline volume number `i`: `InlineVolumes[i % len]` of the test driver file, as e2e's
    /// `GetVolume` picks it, with the `--volume-attribute`s.
    pub fn inline(&self, i: usize) -> &InlineDefinition {
        &self.inline_volumes[i % self.inline_volumes.len()]
    }

    /// Whether the test driver file declares capability `name`.
    pub fn declares(&self, name: &str) -> bool {
        self.testdriver.as_ref().is_some_and(|t| t.has(name))
    }
}

/// The inline volume definitions: the test driver file's (none when it lists none), or one with the
/// `--volume-attribute`s; the flags' attributes are added to each.
pub fn inline_volumes(
    testdriver: Option<&TestDriver>,
    attributes: &BTreeMap<String, String>,
) -> Vec<InlineDefinition> {
    let listed = match testdriver {
        Some(t) => t.inline_volumes.clone(),
        None => vec![InlineDefinition::default()],
    };
    listed
        .into_iter()
        .map(|mut definition| {
            definition.attributes.extend(attributes.clone());
            definition
        })
        .collect()
}

/// An inline CSI volume of a check's pod.
#[derive(Debug, Clone, Default)]
pub struct InlineVolume {
    /// The pod volume's name.
    pub name: String,
    /// Attributes beyond the run's `--volume-attribute`s.
    pub extra_attributes: BTreeMap<String, String>,
    /// `csi.readOnly`.
    pub read_only: bool,
    /// `volumeMounts[].readOnly` (also set for a definition the driver mounts read-only only).
    pub mount_read_only: bool,
    /// `csi.nodePublishSecretRef.name`.
    pub secret: Option<String>,
    /// `csi.fsType`.
    pub fs_type: Option<String>,
}

impl InlineVolume {
    /// A volume named `name` with the run's attributes.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_string(),
            ..Default::default()
        }
    }
}
