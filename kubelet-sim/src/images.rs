//! Where a simulation's images come from and how long their pulls are waited for: shared by the
//! simulation (its in-process cri-fake, its nodes) and the in-process image drivers.

use std::path::PathBuf;
use std::time::Duration;

use inlet_image::allowlist::Allowlist;
use inlet_image::pull::VerificationPolicy;

use crate::node::{ImageGcPolicy, ImageVolumeMounts};

/// Images in a simulation.
#[derive(Debug, Clone)]
pub struct SimImages {
    /// OCI layouts the in-process cri-fake imports at start: `(repository, dir)`.
    pub layouts: Vec<(String, PathBuf)>,
    /// Registries the in-process cri-fake pulls real content from over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// How long one mount attempt of an image volume (in-tree, or the `image` driver's NodePublish) waits
    /// for its pull before retrying later while the pull goes on.
    pub pull_wait: Duration,
    /// Which cached images a pod must prove credentials for (the kubelet's
    /// `imagePullCredentialsVerificationPolicy`): container images, in-tree image volumes and the
    /// in-process image drivers alike.
    pub verification: VerificationPolicy,
    /// The images `NeverVerifyAllowlistedImages` exempts (`preloadedImagesVerificationAllowlist`).
    pub allowlist: Allowlist,
    /// Who mounts in-tree image volumes: the runtime (KEP-4639's CRI `Mount.image`) or the kubelet side.
    pub volume_mounts: ImageVolumeMounts,
    /// When each node's image garbage collector removes images.
    pub gc: ImageGcPolicy,
}

impl Default for SimImages {
    fn default() -> Self {
        Self {
            layouts: Vec::new(),
            insecure_registries: Vec::new(),
            // The kubelet's CSI timeout (two minutes) less the driver's margin.
            pull_wait: Duration::from_secs(100),
            verification: VerificationPolicy::default(),
            allowlist: Allowlist::default(),
            volume_mounts: ImageVolumeMounts::default(),
            gc: ImageGcPolicy::default(),
        }
    }
}
