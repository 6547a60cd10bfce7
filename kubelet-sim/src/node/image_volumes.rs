//! Image volumes the runtime mounts (KEP-4639 as the kubelet does it since 1.31): the kubelet pulls each
//! `volumes[].image` through the image manager before the pod's containers start
//! (`kuberuntime_manager.go` getImageVolumes, in SyncPod), and makeMounts hands the runtime a CRI `Mount`
//! with `image` set (and `image_sub_path` for a subPath, 1.33) instead of a host path. The volume manager
//! only tracks the volume (`pkg/volume/image`, a stub).
//!
//! Which side mounts is the node's [`ImageVolumeMounts`]: upstream always asks the runtime; inlet's
//! kubelet-side plugin ([`inlet_volume::image`]) stays for runtimes that cannot. `auto` asks the runtime
//! for its version, because a runtime that predates a field cannot say so: protobuf drops what it does not
//! know. containerd 1.x drops `Mount.image` and would start the container without the volume; CRI-O 1.31
//! and 1.32 and containerd 2.1 mount images but drop `image_sub_path`, and mount the image's root where a
//! subPath asked for a directory of it (measured on the kit's CRI-O 1.32.13 and containerd 2.1.5; added in
//! CRI-O 1.33, cri-o#9050, and containerd 2.2, containerd#11578). So `auto` picks the runtime only where
//! it does all a 1.33+ kubelet asks.

use std::collections::HashMap;

use inlet_proto::runtime::v1 as cri;
use k8s_openapi::api::core::v1::Container;

use super::Kubelet;
use super::images::{ImageUser, pull_policy};
use super::kuberuntime::StartError;
use crate::api::ApiPod;

/// Who mounts a pod's `volumes[].image` (`--image-volume-mounts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ImageVolumeMounts {
    /// The runtime where its version mounts images with their sub paths (CRI-O 1.33+, containerd 2.2+),
    /// else the kubelet.
    #[default]
    Auto,
    /// Always the runtime (CRI `Mount.image`), as upstream's kubelet.
    Runtime,
    /// Always the kubelet side (inlet's engine; the container gets a read-only host path).
    Kubelet,
}

impl ImageVolumeMounts {
    /// True when the runtime named `name` at `version` (CRI Version) mounts image volumes on this node.
    pub fn by_runtime(self, name: &str, version: &str) -> bool {
        match self {
            Self::Runtime => true,
            Self::Kubelet => false,
            Self::Auto => Support::of(name, version) == Support::WithSubPaths,
        }
    }
}

/// What a runtime does with KEP-4639's CRI fields, by its CRI Version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// No `Mount.image` (containerd 1.x and 2.0, CRI-O before 1.31, any runtime not known here).
    None,
    /// `Mount.image`, but `image_sub_path` dropped: CRI-O 1.31 and 1.32, containerd 2.1.
    ImagesOnly,
    /// Both: CRI-O 1.33+, containerd 2.2+.
    WithSubPaths,
}

impl Support {
    /// The support of the runtime `name` (as CRI Version names it) at `version`.
    pub fn of(name: &str, version: &str) -> Self {
        let mut parts = version.trim_start_matches('v').split(['.', '-', '+']);
        let mut next = || parts.next().and_then(|p| p.parse::<u32>().ok());
        let (Some(major), Some(minor)) = (next(), next()) else {
            return Self::None;
        };
        let (images, sub_paths) = match name {
            "cri-o" => ((1, 31), (1, 33)),
            "containerd" => ((2, 1), (2, 2)),
            _ => return Self::None,
        };
        match (major, minor) {
            v if v >= sub_paths => Self::WithSubPaths,
            v if v >= images => Self::ImagesOnly,
            _ => Self::None,
        }
    }
}

/// Each image volume's image as the runtime is to mount it, or why it cannot be, by volume name
/// (`imageVolumePulls`).
#[derive(Debug, Default)]
pub struct ImageVolumes(HashMap<String, Result<cri::ImageSpec, StartError>>);

impl ImageVolumes {
    /// The image the runtime mounts for the volume `name`; None for a volume that is not an image volume
    /// the runtime mounts.
    pub fn get(&self, name: &str) -> Option<&cri::ImageSpec> {
        self.0.get(name)?.as_ref().ok()
    }

    /// The first failed pull among the volumes `container` mounts: it fails the container's start ("We
    /// fail late here to populate the ErrImagePull and ImagePullBackOff correctly", `kuberuntime_manager.go`
    /// start), while containers that mount none of them start.
    pub fn failed_for(&self, container: &Container) -> Option<StartError> {
        let mounts = container.volume_mounts.iter().flatten();
        mounts
            .filter_map(|m| self.0.get(&m.name)?.as_ref().err())
            .next()
            .cloned()
    }
}

impl Kubelet {
    /// getImageVolumes: every image volume of the pod made present per its pull policy (KEP-2535's checks
    /// included), once per sync before its containers start; empty when the kubelet side mounts them. A
    /// failed pull is kept for the containers that mount the volume ([`ImageVolumes::failed_for`]).
    pub(super) async fn image_volumes(
        &self,
        pod: &ApiPod,
        sandbox: &cri::PodSandboxConfig,
    ) -> ImageVolumes {
        let mut resolved = HashMap::new();
        if !self.runtime_mounts_images {
            return ImageVolumes(resolved);
        }
        for volume in pod.volumes() {
            let Some(source) = volume.image() else {
                continue;
            };
            let reference = source.reference.clone().unwrap_or_default();
            let policy = pull_policy(source.pull_policy.as_deref(), &reference);
            let ensured = self.images.ensure_image_exists(
                pod,
                ImageUser::Volume,
                &reference,
                policy,
                sandbox,
            );
            let result = Box::pin(ensured).await.map(|image_ref| cri::ImageSpec {
                image: image_ref,
                user_specified_image: reference,
                annotations: pod
                    .metadata
                    .annotations
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .collect(),
                ..Default::default()
            });
            let result = result.map_err(|e| StartError {
                reason: e.reason,
                message: e.message,
            });
            resolved.insert(volume.name().to_string(), result);
        }
        ImageVolumes(resolved)
    }
}

/// An image volume's CRI mount (makeMounts' image branch): read-only, the image the runtime mounts, and the
/// subPath as a path inside the image.
pub(super) fn image_mount(
    container_path: &str,
    image: &cri::ImageSpec,
    sub_path: Option<&str>,
) -> cri::Mount {
    cri::Mount {
        container_path: container_path.to_string(),
        readonly: true,
        image: Some(image.clone()),
        image_sub_path: sub_path.unwrap_or_default().to_string(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_asks_the_runtime_by_its_version() {
        for (name, version, support) in [
            ("cri-o", "1.33.0", Support::WithSubPaths),
            ("cri-o", "1.32.13", Support::ImagesOnly),
            ("cri-o", "1.31.0", Support::ImagesOnly),
            ("cri-o", "1.30.9", Support::None),
            ("containerd", "2.2.0-rc.1", Support::WithSubPaths),
            ("containerd", "v2.1.5", Support::ImagesOnly),
            ("containerd", "v2.0.4", Support::None),
            ("containerd", "v1.6.38", Support::None),
            ("cri-fake", "0.1.0", Support::None),
            ("containerd", "", Support::None),
        ] {
            assert_eq!(Support::of(name, version), support, "{name} {version}");
            assert_eq!(
                ImageVolumeMounts::Auto.by_runtime(name, version),
                support == Support::WithSubPaths,
                "{name} {version}"
            );
        }
        assert!(ImageVolumeMounts::Runtime.by_runtime("cri-fake", "0.1.0"));
        assert!(!ImageVolumeMounts::Kubelet.by_runtime("cri-o", "1.32.4"));
    }
}
