//! containerd's native API as an image store (the `k8s.io` namespace, where its CRI plugin keeps images).
//!
//! An image volume is a snapshot on the image's top snapshot, the one named by the chain id of its
//! layers (`rootfs.diff_ids` in the config, combined as the OCI image spec's ChainID): `View` gives a
//! read-only snapshot (a bind of the layer dir, or a read-only overlay), `Prepare` a writable one (an overlay
//! with a fresh upper dir). Each snapshot is created under a lease of the same name, so containerd's garbage
//! collector keeps it and its parent chain until inlet deletes the lease, even if the image is removed
//! meanwhile. Snapshots carry the label `inlet.dev/managed`, so what a crash left behind can be listed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use inlet_proto::containerd::services::content::v1::{
    ListStatusesRequest, ReadContentRequest, content_client::ContentClient,
};
use inlet_proto::containerd::services::images::v1::{GetImageRequest, images_client::ImagesClient};
use inlet_proto::containerd::services::leases::v1::{
    CreateRequest, DeleteRequest, leases_client::LeasesClient,
};
use inlet_proto::containerd::services::snapshots::v1::{
    ListSnapshotsRequest, MountsRequest, PrepareSnapshotRequest, RemoveSnapshotRequest,
    ViewSnapshotRequest, snapshots_client::SnapshotsClient,
};
use inlet_proto::containerd::types::Mount;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use super::{ImageMetadata, ImageStore, Mountable, Progress, no_layers};
use inlet_host::error::{Error, Result};
use inlet_host::mount::Overlay;

/// The namespace containerd's CRI plugin uses.
pub const NAMESPACE: &str = "k8s.io";
/// The label on every snapshot inlet makes.
pub const MANAGED_LABEL: &str = "inlet.dev/managed";

/// The label naming which inlet instance made a snapshot.
pub const OWNER_LABEL: &str = "inlet.dev/owner";

/// containerd at one socket, for one inlet instance (several may share a containerd: a CSI driver and the
/// kubelet-side plugin, or the nodes of a simulation). Snapshot and lease names are `inlet/<owner>/<key>`.
#[derive(Debug, Clone)]
pub struct Containerd {
    channel: Channel,
    snapshotter: String,
    owner: String,
}

impl Containerd {
    /// Connects to containerd's socket (`/run/containerd/containerd.sock`, the same socket as its CRI), as
    /// the instance `owner`.
    pub async fn connect(socket: &Path, snapshotter: &str, owner: &str) -> Result<Self> {
        let channel = inlet_proto::uds::connect(socket)
            .await
            .map_err(|e| Error::Unavailable(format!("containerd at {}: {e}", socket.display())))?;
        Ok(Self {
            channel,
            snapshotter: snapshotter.to_string(),
            owner: owner.to_string(),
        })
    }

    fn name(&self, key: &str) -> String {
        format!("inlet/{}/{key}", self.owner)
    }

    /// The top snapshot's name (chain id) of the image the CRI knows as `image_id`.
    async fn chain_id(&self, image_id: &str) -> Result<String> {
        let config: ImageConfig = serde_json::from_slice(&self.config(image_id).await?.1)
            .map_err(|e| Error::FailedPrecondition(format!("image {image_id}: bad config: {e}")))?;
        let diff_ids = config.rootfs.diff_ids;
        let mut chain = diff_ids
            .first()
            .cloned()
            .ok_or_else(|| no_layers(image_id))?;
        for diff in &diff_ids[1..] {
            chain = format!(
                "sha256:{}",
                hex::encode(Sha256::digest(format!("{chain} {diff}").as_bytes()))
            );
        }
        Ok(chain)
    }

    /// The image's (manifest, config) bytes.
    async fn config(&self, image_id: &str) -> Result<(Vec<u8>, Vec<u8>)> {
        let image = ImagesClient::new(self.channel.clone())
            .get(request(
                GetImageRequest {
                    name: image_id.to_string(),
                },
                None,
            ))
            .await
            .map_err(|s| status_error(s, "image", image_id))?
            .into_inner()
            .image
            .ok_or_else(|| Error::not_found("image", image_id))?;
        let target = image
            .target
            .ok_or_else(|| Error::not_found("image", image_id))?;
        let mut manifest = self.read(&target.digest).await?;
        let parsed: ManifestOrIndex = serde_json::from_slice(&manifest).map_err(|e| {
            Error::FailedPrecondition(format!("image {image_id}: bad manifest: {e}"))
        })?;
        let manifest_config = match (parsed.config, parsed.manifests) {
            (Some(config), _) => config,
            (None, Some(manifests)) => {
                let chosen = manifests
                    .into_iter()
                    .find(|m| m.platform.as_ref().is_some_and(Platform::is_this_node))
                    .ok_or_else(|| {
                        Error::FailedPrecondition(format!(
                            "image {image_id} has no manifest for this platform"
                        ))
                    })?;
                manifest = self.read(&chosen.digest).await?;
                let parsed: ManifestOrIndex = serde_json::from_slice(&manifest).map_err(|e| {
                    Error::FailedPrecondition(format!("image {image_id}: bad manifest: {e}"))
                })?;
                parsed.config.ok_or_else(|| no_layers(image_id))?
            }
            (None, None) => return Err(no_layers(image_id)),
        };
        let config = self.read(&manifest_config.digest).await?;
        Ok((manifest, config))
    }

    /// A blob from the content store.
    async fn read(&self, digest: &str) -> Result<Vec<u8>> {
        let mut stream = ContentClient::new(self.channel.clone())
            .read(request(
                ReadContentRequest {
                    digest: digest.to_string(),
                    offset: 0,
                    size: 0,
                },
                None,
            ))
            .await
            .map_err(|s| status_error(s, "blob", digest))?
            .into_inner();
        let mut data = Vec::new();
        while let Some(chunk) = stream
            .message()
            .await
            .map_err(|s| status_error(s, "blob", digest))?
        {
            data.extend_from_slice(&chunk.data);
        }
        Ok(data)
    }

    /// Creates the lease `key` (an existing one is reused).
    async fn lease(&self, key: &str) -> Result<()> {
        let create = CreateRequest {
            id: key.to_string(),
            labels: HashMap::from([(MANAGED_LABEL.to_string(), "true".to_string())]),
        };
        match LeasesClient::new(self.channel.clone())
            .create(request(create, None))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => Ok(()),
            Err(s) => Err(status_error(s, "lease", key)),
        }
    }

    /// The mounts of the existing snapshot `key`.
    async fn mounts(&self, key: &str) -> Result<Mountable> {
        let mounts = SnapshotsClient::new(self.channel.clone())
            .mounts(request(
                MountsRequest {
                    snapshotter: self.snapshotter.clone(),
                    key: key.to_string(),
                },
                None,
            ))
            .await
            .map_err(|s| status_error(s, "snapshot", key))?
            .into_inner()
            .mounts;
        mountable(&mounts)
    }

    /// `Prepare` (writable) or `View` (read-only) the snapshot `key` on the image's top snapshot, under a
    /// lease of the same name; an existing one is reused.
    async fn snapshot(&self, image_id: &str, key: &str, writable: bool) -> Result<Mountable> {
        let parent = self.chain_id(image_id).await?;
        let key = &self.name(key);
        self.lease(key).await?;
        let (snapshotter, labels) = (self.snapshotter.clone(), self.labels(image_id));
        let mut client = SnapshotsClient::new(self.channel.clone());
        let made = if writable {
            let prepare = PrepareSnapshotRequest {
                snapshotter,
                key: key.to_string(),
                parent,
                labels,
            };
            client
                .prepare(request(prepare, Some(key)))
                .await
                .map(|r| r.into_inner().mounts)
        } else {
            let view = ViewSnapshotRequest {
                snapshotter,
                key: key.to_string(),
                parent,
                labels,
            };
            client
                .view(request(view, Some(key)))
                .await
                .map(|r| r.into_inner().mounts)
        };
        match made {
            Ok(mounts) => mountable(&mounts),
            Err(s) if s.code() == Code::AlreadyExists => self.mounts(key).await,
            Err(s) => Err(status_error(s, "snapshot", key)),
        }
    }

    fn labels(&self, image_id: &str) -> HashMap<String, String> {
        HashMap::from([
            (MANAGED_LABEL.to_string(), "true".to_string()),
            (OWNER_LABEL.to_string(), self.owner.clone()),
            ("inlet.dev/image".to_string(), image_id.to_string()),
        ])
    }
}

#[async_trait]
impl ImageStore for Containerd {
    fn kind(&self) -> &'static str {
        "containerd"
    }

    async fn view(&self, image_id: &str, key: &str) -> Result<Mountable> {
        self.snapshot(image_id, key, false).await
    }

    async fn prepare(&self, image_id: &str, key: &str) -> Result<Mountable> {
        self.snapshot(image_id, key, true).await
    }

    async fn remove(&self, key: &str) -> Result<()> {
        let key = &self.name(key);
        let remove = RemoveSnapshotRequest {
            snapshotter: self.snapshotter.clone(),
            key: key.to_string(),
        };
        match SnapshotsClient::new(self.channel.clone())
            .remove(request(remove, None))
            .await
        {
            Ok(_) => {}
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => return Err(status_error(s, "snapshot", key)),
        }
        let delete = DeleteRequest {
            id: key.to_string(),
            sync: false,
        };
        match LeasesClient::new(self.channel.clone())
            .delete(request(delete, None))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(status_error(s, "lease", key)),
        }
    }

    async fn keys(&self) -> Result<Vec<String>> {
        let list = ListSnapshotsRequest {
            snapshotter: self.snapshotter.clone(),
            filters: vec![format!("labels.\"{OWNER_LABEL}\"=={}", self.owner)],
        };
        let mut stream = SnapshotsClient::new(self.channel.clone())
            .list(request(list, None))
            .await
            .map_err(|s| status_error(s, "snapshots", ""))?
            .into_inner();
        let mut keys = Vec::new();
        while let Some(page) = stream
            .message()
            .await
            .map_err(|s| status_error(s, "snapshots", ""))?
        {
            let prefix = self.name("");
            keys.extend(
                page.info
                    .into_iter()
                    .filter_map(|i| i.name.strip_prefix(&prefix).map(str::to_string)),
            );
        }
        Ok(keys)
    }

    async fn metadata(&self, image_id: &str) -> Result<ImageMetadata> {
        let (manifest, config) = self.config(image_id).await?;
        Ok(ImageMetadata { manifest, config })
    }

    /// The content store's active downloads.
    async fn progress(&self) -> Option<Progress> {
        let statuses = ContentClient::new(self.channel.clone())
            .list_statuses(request(ListStatusesRequest { filters: vec![] }, None))
            .await
            .ok()?
            .into_inner()
            .statuses;
        (!statuses.is_empty()).then(|| Progress {
            bytes_done: statuses.iter().map(|s| s.offset.max(0) as u64).sum(),
            bytes_total: statuses.iter().map(|s| s.total.max(0) as u64).sum(),
            layers_active: statuses.len(),
        })
    }
}

/// A request in the CRI's namespace, under `lease` when given.
fn request<T>(message: T, lease: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    let metadata = request.metadata_mut();
    metadata.insert("containerd-namespace", NAMESPACE.parse().expect("ascii"));
    if let Some(lease) = lease.and_then(|l| l.parse().ok()) {
        metadata.insert("containerd-lease", lease);
    }
    request
}

fn status_error(status: Status, kind: &'static str, id: &str) -> Error {
    match status.code() {
        Code::NotFound => Error::not_found(kind, id),
        Code::Unavailable => Error::Unavailable(format!("containerd: {}", status.message())),
        _ => Error::FailedPrecondition(format!("containerd {kind} {id}: {}", status.message())),
    }
}

/// containerd's mounts as the mount layer's: one bind, or one overlay.
fn mountable(mounts: &[Mount]) -> Result<Mountable> {
    let [mount] = mounts else {
        return Err(Error::FailedPrecondition(format!(
            "containerd returned {} mounts for a snapshot; expected one",
            mounts.len()
        )));
    };
    match mount.r#type.as_str() {
        "bind" | "rbind" => Ok(Mountable::Bind(PathBuf::from(&mount.source))),
        "overlay" => {
            let option = |name: &str| {
                mount
                    .options
                    .iter()
                    .find_map(|o| o.strip_prefix(&format!("{name}=")).map(str::to_string))
            };
            let lower = option("lowerdir")
                .unwrap_or_default()
                .split(':')
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .collect();
            let upper = option("upperdir")
                .zip(option("workdir"))
                .map(|(u, w)| (PathBuf::from(u), PathBuf::from(w)));
            Ok(Mountable::Overlay(Overlay { lower, upper }))
        }
        other => Err(Error::FailedPrecondition(format!(
            "containerd returned a {other} mount; only bind and overlay snapshots are supported"
        ))),
    }
}

#[derive(Deserialize)]
struct ImageConfig {
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

#[derive(Deserialize)]
struct ManifestOrIndex {
    config: Option<DescriptorRef>,
    manifests: Option<Vec<DescriptorRef>>,
}

#[derive(Deserialize)]
struct DescriptorRef {
    digest: String,
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    os: String,
    architecture: String,
}

impl Platform {
    /// linux on this machine's architecture, in OCI's names.
    fn is_this_node(&self) -> bool {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        self.os == "linux" && self.architecture == arch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_containerd_mounts() {
        let bind = Mount {
            r#type: "bind".into(),
            source: "/s/1/fs".into(),
            options: vec!["ro".into(), "rbind".into()],
            ..Default::default()
        };
        assert_eq!(
            mountable(&[bind]).unwrap(),
            Mountable::Bind("/s/1/fs".into())
        );
        let overlay = Mount {
            r#type: "overlay".into(),
            source: "overlay".into(),
            options: vec![
                "index=off".into(),
                "workdir=/s/3/work".into(),
                "upperdir=/s/3/fs".into(),
                "lowerdir=/s/2/fs:/s/1/fs".into(),
            ],
            ..Default::default()
        };
        assert_eq!(
            mountable(&[overlay]).unwrap(),
            Mountable::Overlay(Overlay {
                lower: vec!["/s/2/fs".into(), "/s/1/fs".into()],
                upper: Some(("/s/3/fs".into(), "/s/3/work".into())),
            })
        );
        assert!(mountable(&[]).is_err());
    }
}
