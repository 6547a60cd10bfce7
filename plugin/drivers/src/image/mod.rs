//! The `image` CSI driver's services: Identity, Node, and a Controller that only answers
//! ControllerGetCapabilities (with nothing), so standard CSI test tools accept a node-only driver.
//!
//! NodePublishVolume, as warm-metal's driver reads a request:
//! - ephemeral inline (`volumeAttributes.image`, with optional `pullPolicy` or `pullAlways`), read-write
//!   unless the volume is read-only;
//! - persistent (a pre-provisioned PV whose `volumeHandle` is the image reference), read-only access modes
//!   only;
//! - credentials from the request's `secrets` (the volume's `nodePublishSecretRef`);
//! - `artifact: "true"` fetches an OCI artifact without the runtime (see [`inlet_image::artifact`]), read-only;
//! - `metadata: "true"` adds the manifest, config and annotations under `.image-metadata/`;
//! - a pull longer than the caller's deadline goes on in the background; the call answers ABORTED with the
//!   progress, and a retry mounts the volume.
//!
//! Requests are never logged whole: their `secrets` would reach the log.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use inlet_proto::csi::v1::volume_capability::{AccessType, access_mode::Mode};
use inlet_proto::csi::v1::{
    self as csi, controller_server::Controller, identity_server::Identity, node_server::Node,
};
use tonic::{Request, Response, Status};

use crate::keys::{EPHEMERAL_KEY, KUBERNETES_KEY_PREFIX};
use crate::server::reply;
use crate::validate;
use inlet_host::error::{Error, Result};
use inlet_image::auth::{self, Credentials};
use inlet_image::{
    ARTIFACT_ATTRIBUTE, Engine, IMAGE_ATTRIBUTE, ImageVolume, METADATA_ATTRIBUTE,
    PULL_ALWAYS_ATTRIBUTE, PULL_POLICY_ATTRIBUTE, PullPolicy, PullRequest, pull_wait,
};

/// How the image driver is set up (from `inlet-plugin serve --driver image` flags).
#[derive(Debug, Clone)]
pub struct ImageDriverConfig {
    /// The CSI driver name.
    pub name: String,
    /// This node's id.
    pub node_id: String,
    /// The kubelet dir target paths must be under.
    pub kubelet_dir: PathBuf,
    /// The driver's state dir (targets may not be inside it).
    pub state_dir: PathBuf,
    /// The longest a call waits for a pull (less when the caller's deadline is shorter).
    pub pull_wait: Duration,
}

/// The image driver behind the CSI services. Cheap to clone.
#[derive(Clone)]
pub struct ImageService {
    config: Arc<ImageDriverConfig>,
    engine: Arc<Engine>,
}

impl ImageService {
    /// Serves `engine` as configured.
    pub fn new(config: ImageDriverConfig, engine: Engine) -> Self {
        Self {
            config: Arc::new(config),
            engine: Arc::new(engine),
        }
    }

    /// The engine (tests inspect what is published; a kubelet counts its volumes' images as in use).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    async fn publish(&self, request: Request<csi::NodePublishVolumeRequest>) -> Result<()> {
        let deadline = grpc_timeout(request.metadata());
        let r = request.into_inner();
        let volume_id = validate::required("volume_id", &r.volume_id)?;
        let target = validate::host_path(
            "target_path",
            &r.target_path,
            &self.config.kubelet_dir,
            &self.config.state_dir,
        )?;
        let capability = r
            .volume_capability
            .as_ref()
            .ok_or_else(|| Error::invalid("volume_capability", "required"))?;
        if !matches!(capability.access_type, Some(AccessType::Mount(_))) {
            return Err(Error::invalid(
                "volume_capability",
                "unable to mount as a block device: image volumes are filesystems",
            ));
        }
        let mode = capability
            .access_mode
            .as_ref()
            .and_then(|m| Mode::try_from(m.mode).ok())
            .unwrap_or(Mode::Unknown);
        let reader_only = matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly);
        let attributes = &r.volume_context;
        known_attributes(attributes)?;
        let ephemeral = attributes.get(EPHEMERAL_KEY).is_some_and(|v| v == "true")
            || attributes.contains_key(IMAGE_ATTRIBUTE);
        let image = if ephemeral {
            attributes
                .get(IMAGE_ATTRIBUTE)
                .filter(|i| !i.is_empty())
                .ok_or_else(|| {
                    Error::invalid(
                        "volume_context",
                        "an ephemeral image volume needs the \"image\" attribute",
                    )
                })?
                .as_str()
        } else {
            if !reader_only {
                return Err(Error::invalid(
                    "volume_capability.access_mode",
                    "AccessMode of PV can be only ReadOnlyMany or ReadOnlyOnce",
                ));
            }
            volume_id
        };
        let reference = oci_client::Reference::try_from(image).map_err(|e| {
            Error::invalid(
                "volume_context.image",
                format!("{image:?} is not an image reference: {e}"),
            )
        })?;
        let policy = match pull_always(attributes)? {
            true => PullPolicy::Always,
            false => PullPolicy::parse(
                attributes
                    .get(PULL_POLICY_ATTRIBUTE)
                    .map_or("", String::as_str),
                &reference,
            )
            .map_err(|e| Error::invalid("volume_context.pullPolicy", e))?,
        };
        let metadata = flag(attributes, METADATA_ATTRIBUTE)?;
        let credentials = secret_credentials(&r.secrets, &reference.whole())?;
        let artifact = flag(attributes, ARTIFACT_ATTRIBUTE)?;
        if artifact {
            if !(r.readonly || reader_only) {
                return Err(Error::invalid(
                    "readonly",
                    "OCI artifact volumes are read-only: set readOnly: true on the volume",
                ));
            }
            let id = self
                .engine
                .artifacts
                .fetch(&reference, &credentials)
                .await?;
            let volume = ImageVolume {
                volume_id: volume_id.to_string(),
                target,
                image: reference.whole(),
                image_id: id,
                writable: false,
                metadata,
            };
            return self.engine.artifact_volumes.publish(&volume).await;
        }
        let pulled = self
            .engine
            .puller
            .ensure(&PullRequest {
                image: reference.whole(),
                policy,
                credentials,
                wait: pull_wait(deadline, self.config.pull_wait),
                sandbox: None,
            })
            .await?;
        let volume = ImageVolume {
            volume_id: volume_id.to_string(),
            target,
            image: reference.whole(),
            image_id: pulled.id,
            writable: ephemeral && !r.readonly && !reader_only,
            metadata,
        };
        self.engine.volumes.publish(&volume).await
    }
}

/// The attributes the driver reads (warm-metal's names, which it maps); the kubelet's own
/// `csi.storage.k8s.io/` keys and external-provisioner's `storage.kubernetes.io/` keys (on PVs it made)
/// are accepted too.
const KNOWN_ATTRIBUTES: [&str; 5] = [
    IMAGE_ATTRIBUTE,
    PULL_POLICY_ATTRIBUTE,
    PULL_ALWAYS_ATTRIBUTE,
    METADATA_ATTRIBUTE,
    ARTIFACT_ATTRIBUTE,
];

/// Prefixes of keys Kubernetes components add to a volume's context.
const KUBERNETES_PREFIXES: [&str; 2] = [KUBERNETES_KEY_PREFIX, "storage.kubernetes.io/"];

/// Refuses attributes the driver does not know with INVALID_ARGUMENT naming every one, rather than ignore
/// what the user meant (`readOnly: "true"` would otherwise mount a writable volume).
fn known_attributes(attributes: &std::collections::HashMap<String, String>) -> Result<()> {
    let mut unknown: Vec<&String> = attributes
        .keys()
        .filter(|k| !KNOWN_ATTRIBUTES.contains(&k.as_str()))
        .filter(|k| !KUBERNETES_PREFIXES.iter().any(|p| k.starts_with(p)))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort();
    let read_only = unknown
        .iter()
        .any(|k| ["readonly", "ro", "read-only"].contains(&k.to_ascii_lowercase().as_str()));
    let hint = if read_only {
        "; a volume is made read-only by the volume source's readOnly: true"
    } else {
        ""
    };
    let fields: Vec<String> = unknown
        .iter()
        .map(|k| format!("volume_context[{k:?}]"))
        .collect();
    let what = if unknown.len() == 1 {
        "unknown attribute"
    } else {
        "unknown attributes"
    };
    Err(Error::invalid(
        fields.join(", "),
        format!(
            "{what}; the image driver accepts {}{hint}",
            KNOWN_ATTRIBUTES.join(", ")
        ),
    ))
}

/// warm-metal's `pullAlways`: `"true"` or `"false"` in any case; anything else is refused, not read as
/// false (a `"sometimes"` would otherwise silently keep a stale image).
fn pull_always(attributes: &std::collections::HashMap<String, String>) -> Result<bool> {
    match attributes.get(PULL_ALWAYS_ATTRIBUTE) {
        None => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(Error::invalid(
            format!("volume_context.{PULL_ALWAYS_ATTRIBUTE}"),
            format!("{other:?} is not \"true\" or \"false\""),
        )),
    }
}

/// A `"true"` / `"false"` attribute; absent is false.
fn flag(attributes: &std::collections::HashMap<String, String>, key: &str) -> Result<bool> {
    match attributes.get(key).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Error::invalid(
            format!("volume_context.{key}"),
            format!("{other:?} is not \"true\" or \"false\""),
        )),
    }
}

/// The credentials in a CSI `secrets` map that apply to `image`.
fn secret_credentials(
    secrets: &std::collections::HashMap<String, String>,
    image: &str,
) -> Result<Vec<Credentials>> {
    let data: BTreeMap<String, Vec<u8>> = secrets
        .iter()
        .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
        .collect();
    let all = auth::from_secret_data(&data)
        .map_err(|e| Error::invalid(format!("secrets[{}]", e.key), e.reason))?;
    Ok(auth::for_image(&all, image))
}

/// The caller's deadline from the `grpc-timeout` header (`<digits><unit>`, unit one of `HMSmun`).
fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[tonic::async_trait]
impl Identity for ImageService {
    /// The configured name.
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.config.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    /// None: a node-only driver.
    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse::default()))
    }

    /// Ready when the runtime answers.
    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        let ready = self
            .engine
            .cri
            .clone()
            .image_fs_info(inlet_proto::runtime::v1::ImageFsInfoRequest {})
            .await
            .is_ok();
        Ok(Response::new(csi::ProbeResponse { ready: Some(ready) }))
    }
}

#[tonic::async_trait]
impl Controller for ImageService {
    /// Nothing: there is no controller work for image volumes.
    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(
            csi::ControllerGetCapabilitiesResponse::default(),
        ))
    }
}

#[tonic::async_trait]
impl Node for ImageService {
    /// Pulls as the volume's policy says, then mounts. Idempotent: the same volume at the same target is
    /// OK; a different one is ALREADY_EXISTS.
    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let outcome = self.publish(request).await;
        reply("NodePublishVolume", outcome.map(|()| Default::default()))
    }

    /// Unmounts and releases the image's snapshot after its last volume. A target that is not published is
    /// unpublished.
    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let outcome = async {
            validate::required("volume_id", &r.volume_id)?;
            let target = validate::host_path(
                "target_path",
                &r.target_path,
                &self.config.kubelet_dir,
                &self.config.state_dir,
            )?;
            match self.engine.artifact_volumes.at(&target) {
                Some(_) => self.engine.artifact_volumes.unpublish(&target).await,
                None => self.engine.volumes.unpublish(&target).await,
            }
        }
        .await;
        reply("NodeUnpublishVolume", outcome.map(|()| Default::default()))
    }

    /// No staging, no stats, no expansion.
    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::NodeGetCapabilitiesResponse::default()))
    }

    /// This node's id.
    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            ..Default::default()
        }))
    }
}

impl crate::metrics::PublishedVolumes for ImageService {
    /// An inline volume's id is the kubelet's ephemeral handle (`csi-` and a SHA-256 in hex,
    /// `makeVolumeHandle` in `pkg/volume/csi/csi_plugin.go`); a PV's is the image reference it names.
    fn published_modes(&self) -> Vec<&'static str> {
        let ephemeral = |id: &str| {
            id.strip_prefix("csi-")
                .is_some_and(|hash| hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
        };
        let engine = &self.engine;
        [&engine.volumes, &engine.artifact_volumes]
            .iter()
            .flat_map(|volumes| volumes.published())
            .map(|volume| match ephemeral(&volume.volume_id) {
                true => "ephemeral",
                false => "persistent",
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_grpc_timeouts() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        assert_eq!(grpc_timeout(&metadata), None);
        metadata.insert("grpc-timeout", "119999m".parse().unwrap());
        assert_eq!(
            grpc_timeout(&metadata),
            Some(Duration::from_millis(119_999))
        );
        metadata.insert("grpc-timeout", "2M".parse().unwrap());
        assert_eq!(grpc_timeout(&metadata), Some(Duration::from_secs(120)));
        metadata.insert("grpc-timeout", "x".parse().unwrap());
        assert_eq!(grpc_timeout(&metadata), None);
    }

    #[test]
    fn pull_always_is_true_or_false() {
        let with = |v: &str| {
            std::collections::HashMap::from([(PULL_ALWAYS_ATTRIBUTE.to_string(), v.to_string())])
        };
        assert!(pull_always(&with("TRUE")).unwrap());
        assert!(!pull_always(&with("false")).unwrap());
        assert!(!pull_always(&Default::default()).unwrap());
        let refused = Status::from(pull_always(&with("sometimes")).unwrap_err());
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(
            refused.message().contains("volume_context.pullAlways"),
            "{}",
            refused.message()
        );
    }

    #[test]
    fn refuses_unknown_attributes_by_name() {
        let attributes = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::HashMap<_, _>>()
        };
        let known = attributes(&[
            ("image", "x:1"),
            ("pullAlways", "true"),
            ("csi.storage.k8s.io/ephemeral", "true"),
        ]);
        assert!(known_attributes(&known).is_ok());
        let status =
            Status::from(known_attributes(&attributes(&[("readOnly", "true")])).unwrap_err());
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status
                .message()
                .contains("volume_context[\"readOnly\"]: unknown attribute")
        );
        assert!(status.message().contains("volume source's readOnly: true"));
        let other = Status::from(known_attributes(&attributes(&[("size", "1Gi")])).unwrap_err());
        assert!(
            !other.message().contains("read-only"),
            "{}",
            other.message()
        );
        let both = Status::from(
            known_attributes(&attributes(&[("size", "1Gi"), ("ro", "true")])).unwrap_err(),
        );
        assert!(
            both.message().starts_with(
                "volume_context[\"ro\"], volume_context[\"size\"]: unknown attributes;"
            ),
            "every unknown attribute is named: {}",
            both.message()
        );
        let provisioned = attributes(&[
            ("image", "x:1"),
            ("storage.kubernetes.io/csiProvisionerIdentity", "1-2-x"),
        ]);
        assert!(known_attributes(&provisioned).is_ok());
    }
}
