//! Real image content for cri-fake: pulls from OCI registries (oci-client) and imports from OCI image
//! layout directories, both into the containers/storage layout of [`crate::storage`].
//!
//! Which images are real is configured: references on a registry named with `--registry` (HTTPS) or
//! `--insecure-registry` (plain HTTP) are pulled; any other reference resolves to the image held under that
//! name (imported from a layout), else is recorded without content, so scenarios can name container images
//! no registry here has.
//!
//! Each pull uses a fresh registry client, so a token one caller's credentials earned is never reused for
//! another caller. Credentials are never logged. Layers are checked against the config's diff ids.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use flate2::read::GzDecoder;
use inlet_proto::runtime::v1 as cri;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::Status;

use crate::storage::{ImageEntry, LayerEntry, Storage, chain_id};

/// Registries cri-fake pulls real content from.
#[derive(Debug, Clone, Default)]
pub struct Registries {
    /// Pulled over HTTPS.
    pub secure: Vec<String>,
    /// Pulled over plain HTTP (`127.0.0.1:5000`).
    pub insecure: Vec<String>,
}

impl Registries {
    /// True when images of `registry` are pulled for real.
    pub fn serves(&self, registry: &str) -> bool {
        self.secure
            .iter()
            .chain(&self.insecure)
            .any(|r| r == registry)
    }

    fn client(&self) -> Client {
        new_client(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.insecure.clone()),
            ..Default::default()
        })
    }
}

/// A registry client. Installs ring as the process's TLS crypto provider first if none is (oci-client is
/// built without one, so it cannot clash with another library's choice).
pub fn new_client(config: ClientConfig) -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::new(config)
}

/// The registry auth a CRI `AuthConfig` carries.
pub fn registry_auth(auth: Option<&cri::AuthConfig>) -> RegistryAuth {
    let Some(auth) = auth else {
        return RegistryAuth::Anonymous;
    };
    if !auth.registry_token.is_empty() {
        return RegistryAuth::Bearer(auth.registry_token.clone());
    }
    if !auth.username.is_empty() {
        return RegistryAuth::Basic(auth.username.clone(), auth.password.clone());
    }
    if let Some((user, password)) = base64_decode(&auth.auth).and_then(|s| {
        s.split_once(':')
            .map(|(u, p)| (u.to_string(), p.to_string()))
    }) {
        return RegistryAuth::Basic(user, password);
    }
    RegistryAuth::Anonymous
}

fn base64_decode(value: &str) -> Option<String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// Pulls `reference` from its registry into `storage` and returns the image id.
pub async fn pull(
    storage: &Storage,
    registries: &Registries,
    reference: &Reference,
    auth: &RegistryAuth,
) -> Result<String, Status> {
    let client = registries.client();
    let name = reference.whole();
    let fail = |e: oci_client::errors::OciDistributionError| pull_error(&name, e);
    let (manifest, digest, config) = client
        .pull_manifest_and_config(reference, auth)
        .await
        .map_err(fail)?;
    let config = config.into_bytes();
    let diff_ids = diff_ids(&name, &config)?;
    let mut parent: Option<String> = None;
    for (index, layer) in manifest.layers.iter().enumerate() {
        let diff_id = diff_ids.get(index).ok_or_else(|| {
            Status::invalid_argument(format!(
                "failed to pull image {name:?}: the config lists fewer diff ids than the manifest's layers"
            ))
        })?;
        let id = chain_id(parent.as_deref(), diff_id);
        let stored = storage.has_layer(&id).map_err(|e| internal(&name, e))?;
        if !stored {
            let blob = storage.tmp_dir().join(layer.digest.replace(':', "-"));
            let mut file = tokio::fs::File::create(&blob)
                .await
                .map_err(|e| internal(&name, e))?;
            tracing::info!(image = %name, layer = %layer.digest, bytes = layer.size, "downloading layer");
            let downloaded = client.pull_blob(reference, layer, &mut file).await;
            drop(file);
            if let Err(e) = downloaded {
                let _ = std::fs::remove_file(&blob);
                return Err(fail(e));
            }
            let entry = layer_entry(&id, parent.as_deref(), layer, diff_id);
            let (storage2, blob2, media_type) =
                (storage.clone(), blob.clone(), layer.media_type.clone());
            let unpacked = tokio::task::spawn_blocking(move || {
                unpack_blob(&storage2, entry, &blob2, &media_type)
            })
            .await
            .map_err(|e| internal(&name, io::Error::other(e)))?;
            let _ = std::fs::remove_file(&blob);
            unpacked.map_err(|e| invalid_layer(&name, e))?;
        }
        parent = Some(id);
    }
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(|e| internal(&name, e.into()))?;
    record_image(storage, &name, &digest, &manifest_bytes, &config, parent)
}

/// Imports every tagged image of the OCI layout at `dir` as `repository:<tag>` (the tag from the
/// `org.opencontainers.image.ref.name` annotation) and returns the names.
pub fn import_layout(storage: &Storage, dir: &Path, repository: &str) -> io::Result<Vec<String>> {
    let index: Index = serde_json::from_slice(&std::fs::read(dir.join("index.json"))?)
        .map_err(|e| io::Error::other(format!("{}: {e}", dir.join("index.json").display())))?;
    let blob = |digest: &str| dir.join("blobs").join(digest.replace(':', "/"));
    let mut names = Vec::new();
    for descriptor in index.manifests {
        let Some(tag) = descriptor
            .annotations
            .get("org.opencontainers.image.ref.name")
        else {
            continue;
        };
        let name = Reference::try_from(format!("{repository}:{tag}"))
            .map_err(|e| io::Error::other(format!("{repository}:{tag}: {e}")))?
            .whole();
        let manifest_bytes = std::fs::read(blob(&descriptor.digest))?;
        let manifest: OciImageManifest =
            serde_json::from_slice(&manifest_bytes).map_err(io::Error::other)?;
        let config = std::fs::read(blob(&manifest.config.digest))?;
        let diff_ids =
            diff_ids(&name, &config).map_err(|s| io::Error::other(s.message().to_string()))?;
        let mut parent: Option<String> = None;
        for (layer, diff_id) in manifest.layers.iter().zip(&diff_ids) {
            let id = chain_id(parent.as_deref(), diff_id);
            let entry = layer_entry(&id, parent.as_deref(), layer, diff_id);
            unpack_blob(storage, entry, &blob(&layer.digest), &layer.media_type)?;
            parent = Some(id);
        }
        record_image(
            storage,
            &name,
            &descriptor.digest,
            &manifest_bytes,
            &config,
            parent,
        )
        .map_err(|s| io::Error::other(s.message().to_string()))?;
        tracing::info!(image = %name, dir = %dir.display(), "imported image from an OCI layout");
        names.push(name);
    }
    Ok(names)
}

fn record_image(
    storage: &Storage,
    name: &str,
    digest: &str,
    manifest_bytes: &[u8],
    config: &[u8],
    top: Option<String>,
) -> Result<String, Status> {
    let id = hex::encode(Sha256::digest(config));
    let entry = ImageEntry {
        id: id.clone(),
        digest: digest.to_string(),
        names: vec![name.to_string()],
        layer: top.unwrap_or_default(),
        big_data_names: Vec::new(),
        big_data_sizes: Default::default(),
        big_data_digests: Default::default(),
        created: humantime::format_rfc3339(std::time::SystemTime::now()).to_string(),
    };
    storage
        .put_image(entry, manifest_bytes, config)
        .map_err(|e| internal(name, e))?;
    Ok(id)
}

fn layer_entry(id: &str, parent: Option<&str>, layer: &OciDescriptor, diff_id: &str) -> LayerEntry {
    LayerEntry {
        id: id.to_string(),
        parent: parent.unwrap_or_default().to_string(),
        created: humantime::format_rfc3339(std::time::SystemTime::now()).to_string(),
        compressed_diff_digest: layer.digest.clone(),
        compressed_size: layer.size.max(0) as u64,
        diff_digest: diff_id.to_string(),
        diff_size: 0,
        compression: if layer.media_type.ends_with("gzip") {
            2
        } else {
            0
        },
    }
}

/// Unpacks one layer blob (gzip or plain tar) into storage; the storage checks its diff id.
fn unpack_blob(
    storage: &Storage,
    entry: LayerEntry,
    blob: &Path,
    media_type: &str,
) -> io::Result<()> {
    let file = BufReader::new(File::open(blob)?);
    let tar: Box<dyn Read> = match media_type {
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Box::new(GzDecoder::new(file)),
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Box::new(file),
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unsupported layer media type {other:?}: not a container image layer"),
            ));
        }
    };
    storage.put_layer(entry, tar)
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<IndexEntry>,
}

#[derive(Deserialize)]
struct IndexEntry {
    digest: String,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Config {
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

fn diff_ids(name: &str, config: &[u8]) -> Result<Vec<String>, Status> {
    serde_json::from_slice::<Config>(config)
        .map(|c| c.rootfs.diff_ids)
        .map_err(|e| {
            Status::invalid_argument(format!(
                "failed to pull image {name:?}: its config is not an image config ({e}); OCI artifacts cannot be run"
            ))
        })
}

/// Sorts registry errors as containerd reports them: NOT_FOUND for an unknown image, UNKNOWN with the
/// registry's words otherwise (a refusal reads "401 Unauthorized").
fn pull_error(name: &str, error: oci_client::errors::OciDistributionError) -> Status {
    use oci_client::errors::OciDistributionError as E;
    match &error {
        E::AuthenticationFailure(_) | E::UnauthorizedError { .. } => Status::unknown(format!(
            "failed to pull and unpack image {name:?}: 401 Unauthorized"
        )),
        E::ImageManifestNotFoundError(_) => Status::not_found(format!(
            "failed to pull and unpack image {name:?}: not found"
        )),
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::NameUnknown
                        | oci_client::errors::OciErrorCode::NotFound
                )
            }) =>
        {
            Status::not_found(format!(
                "failed to pull and unpack image {name:?}: not found"
            ))
        }
        E::ServerError { code: 404, .. } => Status::not_found(format!(
            "failed to pull and unpack image {name:?}: not found"
        )),
        E::ServerError {
            code: 401 | 403, ..
        } => Status::unknown(format!(
            "failed to pull and unpack image {name:?}: 401 Unauthorized"
        )),
        _ => Status::unknown(format!("failed to pull and unpack image {name:?}: {error}")),
    }
}

fn internal(name: &str, e: io::Error) -> Status {
    Status::internal(format!("failed to store image {name:?}: {e}"))
}

fn invalid_layer(name: &str, e: io::Error) -> Status {
    Status::invalid_argument(format!("failed to pull and unpack image {name:?}: {e}"))
}
