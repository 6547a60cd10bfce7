//! A container's CRI mounts (`kubelet_pods.go` makeMounts): each volumeMount's volume dir from the volume
//! manager, or the bind of its subPath (or of its `subPathExpr`, expanded with the container's
//! environment), read-only when the mount or the volume says so; and its CRI devices, the block volumes
//! its volumeDevices name (makeBlockVolumes).

use std::path::{Component, Path, PathBuf};

use inlet_proto::runtime::v1 as cri;
use k8s_openapi::api::core::v1::Container;

use super::env::{Env, expand_sub_path};
use super::image_volumes::{ImageVolumes, Support, image_mount};
use super::{Kubelet, subpath};

impl Kubelet {
    /// The CRI mounts of a container (`kubelet_pods.go` makeMounts): each volumeMount's volume dir, or for a
    /// subPath the bind [`subpath::prepare`] makes of it; read-only when the volumeMount or the volume itself
    /// says so. An image volume the runtime mounts is its image, with the subPath as `image_sub_path`. The errors are upstream's texts; a subPath's details go to the log only, as upstream keeps
    /// host paths from the user.
    pub(super) fn container_mounts(
        &self,
        uid: &str,
        container: &Container,
        env: &Env,
        image_volumes: &ImageVolumes,
    ) -> Result<Vec<cri::Mount>, String> {
        let volumes = self.volumes.mounted_volumes_for_pod(uid);
        let pod_dir = self.config.root.join("pods").join(uid);
        let mut mounts = Vec::new();
        for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
            let volume = volumes.get(&mount.name).ok_or_else(|| {
                format!(
                    "cannot find volume {:?} to mount into container {:?}",
                    mount.name, container.name
                )
            })?;
            let dir = volume.path.clone();
            // A subPathExpr is the subPath its variables expand to, checked as one.
            let expanded = match mount.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
                Some(expr) => Some(expand_sub_path(expr, env)?),
                None => mount.sub_path.clone(),
            };
            let sub_path = expanded.as_deref().filter(|s| !s.is_empty());
            // An image volume the runtime mounts: the image, and the subPath as a path inside it.
            if let Some(image) = image_volumes.get(&mount.name) {
                if let Some(sub) = sub_path {
                    check_sub_path(sub)?;
                    // Sent all the same, as a 1.33+ kubelet sends it; the log says what will happen.
                    let (runtime, version) = (&self.cri.runtime_name, &self.cri.runtime_version);
                    if Support::of(runtime, version) == Support::ImagesOnly {
                        tracing::warn!(container = %container.name, volume = %mount.name, sub_path = sub,
                            "{runtime} {version} drops image_sub_path: the container gets the image's root");
                    }
                }
                mounts.push(image_mount(&mount.mount_path, image, sub_path));
                continue;
            }
            let host_path = match sub_path {
                None => dir,
                Some(sub) => {
                    check_sub_path(sub)?;
                    let request = subpath::SubPath {
                        volume_path: &dir,
                        sub_path: sub,
                        volume_name: &volume.spec_name,
                        container: &container.name,
                        index,
                        pod_dir: &pod_dir,
                    };
                    self.sub_path_mount(&request, &mount.name, volume.image)?
                }
            };
            let propagation = match mount.mount_propagation.as_deref() {
                Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
                Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
                _ => cri::MountPropagation::PropagationPrivate,
            };
            mounts.push(cri::Mount {
                container_path: mount.mount_path.clone(),
                host_path: host_path.display().to_string(),
                readonly: mount.read_only.unwrap_or(false) || volume.read_only,
                propagation: propagation as i32,
                ..Default::default()
            });
        }
        Ok(mounts)
    }

    /// The CRI devices of a container (`kubelet_pods.go` makeBlockVolumes): each volumeDevice is the
    /// pod's device symlink of its block volume, `mrw`, or `r` when the volume is read-only.
    pub(super) fn container_devices(
        &self,
        uid: &str,
        container: &Container,
    ) -> Result<Vec<cri::Device>, String> {
        let Some(devices) = container.volume_devices.as_ref().filter(|d| !d.is_empty()) else {
            return Ok(Vec::new());
        };
        let volumes = self.volumes.mounted_volumes_for_pod(uid);
        devices
            .iter()
            .map(|device| {
                let volume = volumes.get(&device.name).ok_or_else(|| {
                    format!(
                        "cannot find volume {:?} to pass into container {:?}",
                        device.name, container.name
                    )
                })?;
                Ok(cri::Device {
                    container_path: device.device_path.clone(),
                    host_path: volume.path.display().to_string(),
                    permissions: if volume.read_only { "r" } else { "mrw" }.into(),
                })
            })
            .collect()
    }

    /// The bind of one volumeMount's subPath; a missing subPath is created first in a writable volume, as the
    /// kubelet does, and must exist in an image volume (the CRI's `image_sub_path` rule).
    fn sub_path_mount(
        &self,
        request: &subpath::SubPath,
        name: &str,
        image_volume: bool,
    ) -> Result<PathBuf, String> {
        let (sub, cname, volume_path) = (request.sub_path, request.container, request.volume_path);
        if !volume_path.join(sub).exists() {
            if image_volume {
                return Err(format!(
                    "subPath {sub:?} does not exist in image volume {name:?}"
                ));
            }
            if let Err(e) = subpath::safe_make_dir(volume_path, sub) {
                tracing::warn!(container = %cname, volume_mount = %name, "Failed to create subPath directory: {e}");
                return Err(format!(
                    "failed to create subPath directory for volumeMount {name:?} of container {cname:?}"
                ));
            }
        }
        subpath::prepare(&*self.volumes.mounter(), request).map_err(|e| {
            tracing::warn!(container = %cname, volume_mount = %name, "Failed to prepare subPath: {e}");
            format!("failed to prepare subPath for volumeMount {name:?} of container {cname:?}")
        })
    }
}

/// A subPath must be relative and must not step out with `..` (`kubelet_pods.go` makeMounts, whose texts
/// these are).
fn check_sub_path(sub: &str) -> Result<(), String> {
    if Path::new(sub).is_absolute() {
        return Err(format!(
            "error SubPath `{sub}` must not be an absolute path"
        ));
    }
    if Path::new(sub)
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(format!(
            "unable to provision SubPath `{sub}`: must not contain '..'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_must_be_relative_without_backsteps() {
        check_sub_path("data/x").unwrap();
        check_sub_path("a..b").unwrap();
        assert_eq!(
            check_sub_path("/etc").unwrap_err(),
            "error SubPath `/etc` must not be an absolute path"
        );
        assert_eq!(
            check_sub_path("a/../../x").unwrap_err(),
            "unable to provision SubPath `a/../../x`: must not contain '..'"
        );
    }
}
