//! OCI artifacts as volumes: content a runtime cannot pull (a model, a data set, a WASM module: manifests
//! whose config and layers are not a container image's), fetched by inlet itself with oci-client. This is
//! the one path where the runtime's registry configuration (mirrors, proxies, certificates) does not apply:
//! only the volume's credentials and this driver's `--artifact-insecure-registry` list do.
//!
//! Content is stored by digest and shared:
//! ```text
//! <state>/artifacts/blobs/sha256/<hex>     each layer blob, verified against its digest, read-only
//! <state>/artifacts/trees/<manifest hex>/  the artifact's files: hard links to the blobs, named by each
//!                                          layer's org.opencontainers.image.title (else its digest)
//! <state>/artifacts/manifests/<hex>.json   the manifest, for metadata
//! ```
//! A tree is built once per manifest and bind-mounted read-only; a further volume of it costs no disk. The
//! reference is resolved at the registry on every mount, with the caller's credentials, so a cached private
//! artifact is only ever handed to a caller the registry accepts.

use std::path::{Component, Path, PathBuf};

use async_trait::async_trait;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::auth::Credentials;
use super::store::{ImageMetadata, ImageStore, Mountable};
use inlet_host::error::{Error, IoContext, Result};

/// The annotation that names a layer's file (the ORAS convention).
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";

/// Artifacts fetched from registries, kept by digest under one dir.
#[derive(Debug, Clone)]
pub struct Artifacts {
    dir: PathBuf,
    insecure: Vec<String>,
}

impl Artifacts {
    /// Artifacts under `dir`, fetched over plain HTTP from the registries in `insecure`.
    pub fn new(dir: &Path, insecure: Vec<String>) -> Self {
        Self {
            dir: dir.to_path_buf(),
            insecure,
        }
    }

    /// Resolves `reference` at its registry with the first credential it accepts (anonymously when there
    /// are none), downloads what is not cached, builds the file tree, and returns the manifest digest's
    /// hex (the artifact's id).
    pub async fn fetch(
        &self,
        reference: &Reference,
        credentials: &[Credentials],
    ) -> Result<String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.insecure.clone()),
            ..Default::default()
        });
        let auths: Vec<RegistryAuth> = if credentials.is_empty() {
            vec![RegistryAuth::Anonymous]
        } else {
            credentials
                .iter()
                .map(|c| RegistryAuth::Basic(c.username.clone(), c.password.clone()))
                .collect()
        };
        let name = reference.whole();
        let mut last = None;
        for auth in &auths {
            match client
                .pull_manifest_raw(reference, auth, &[OCI_IMAGE_MEDIA_TYPE])
                .await
            {
                Ok((raw, digest)) => return self.store(&client, reference, &raw, &digest).await,
                Err(e) => last = Some(registry_error(&name, e)),
            }
        }
        Err(last.unwrap_or_else(|| Error::not_found("artifact", name)))
    }

    async fn store(
        &self,
        client: &Client,
        reference: &Reference,
        raw: &[u8],
        digest: &str,
    ) -> Result<String> {
        let artifact = reference.whole();
        let id = sha256_hex(digest)
            .ok_or_else(|| bad_digest(&artifact, "manifest", digest))?
            .to_string();
        let tree = self.tree(&id);
        if tree.exists() {
            return Ok(id);
        }
        let (manifest, files) = plan(raw, &artifact)?;
        let blobs = self.dir.join("blobs/sha256");
        let staging = self.dir.join("trees").join(format!("{id}.tmp"));
        let _ = std::fs::remove_dir_all(&staging);
        for d in [&blobs, &staging, &self.dir.join("manifests")] {
            std::fs::create_dir_all(d).context(|| format!("creating {}", d.display()))?;
        }
        for (layer, (blob_name, relative)) in manifest.layers.iter().zip(&files) {
            let blob = blobs.join(blob_name);
            if !blob.exists() {
                let partial = blob.with_extension("partial");
                let mut file = tokio::fs::File::create(&partial)
                    .await
                    .context(|| format!("creating {}", partial.display()))?;
                // oci-client checks the content against the layer's digest.
                let pulled = client.pull_blob(reference, layer, &mut file).await;
                drop(file);
                if let Err(e) = pulled {
                    let _ = std::fs::remove_file(&partial);
                    return Err(registry_error(&reference.whole(), e));
                }
                set_read_only(&partial)?;
                std::fs::rename(&partial, &blob)
                    .context(|| format!("storing {}", blob.display()))?;
            }
            let file = staging.join(relative);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)
                    .context(|| format!("creating {}", parent.display()))?;
            }
            std::fs::hard_link(&blob, &file).context(|| format!("linking {}", file.display()))?;
        }
        let manifest_file = self.dir.join("manifests").join(format!("{id}.json"));
        std::fs::write(&manifest_file, raw)
            .context(|| format!("writing {}", manifest_file.display()))?;
        std::fs::rename(&staging, &tree).context(|| format!("storing {}", tree.display()))?;
        tracing::info!(artifact = %reference.whole(), id, files = manifest.layers.len(), "fetched OCI artifact");
        Ok(id)
    }

    fn tree(&self, id: &str) -> PathBuf {
        self.dir.join("trees").join(id)
    }
}

#[async_trait]
impl ImageStore for Artifacts {
    fn kind(&self) -> &'static str {
        "oci-artifact"
    }

    async fn view(&self, image_id: &str, _key: &str) -> Result<Mountable> {
        let tree = self.tree(image_id);
        if !tree.is_dir() {
            return Err(Error::not_found("artifact", image_id));
        }
        Ok(Mountable::Bind(tree))
    }

    async fn prepare(&self, image_id: &str, _key: &str) -> Result<Mountable> {
        Err(Error::FailedPrecondition(format!(
            "artifact {image_id}: OCI artifact volumes are read-only; mount it with readOnly: true"
        )))
    }

    /// Nothing to remove: the content stays cached, as images stay in the runtime.
    async fn remove(&self, _key: &str) -> Result<()> {
        Ok(())
    }

    async fn keys(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    async fn metadata(&self, image_id: &str) -> Result<ImageMetadata> {
        let path = self.dir.join("manifests").join(format!("{image_id}.json"));
        let manifest = std::fs::read(&path).context(|| format!("reading {}", path.display()))?;
        Ok(ImageMetadata {
            manifest,
            config: Vec::new(),
        })
    }
}

/// A layer title as a path inside the tree: relative, without `..`.
/// An artifact's manifest as what to fetch: each layer's blob (the hex of its sha256 digest) and the file it
/// becomes in the volume (its title, else its digest). Everything a registry sends is checked before it
/// names a path: a digest that is not `sha256:` and 64 hex digits, or a title that is not a relative path
/// inside the volume, refuses the artifact.
pub fn plan(raw: &[u8], artifact: &str) -> Result<(OciImageManifest, Vec<(String, PathBuf)>)> {
    let manifest: OciImageManifest = serde_json::from_slice(raw).map_err(|e| {
        Error::FailedPrecondition(format!("artifact {artifact}: bad manifest: {e}"))
    })?;
    if manifest.layers.is_empty() {
        return Err(super::store::no_layers(artifact));
    }
    let mut files = Vec::with_capacity(manifest.layers.len());
    for layer in &manifest.layers {
        let blob = sha256_hex(&layer.digest)
            .ok_or_else(|| bad_digest(artifact, "layer", &layer.digest))?;
        let title = layer
            .annotations
            .as_ref()
            .and_then(|a| a.get(TITLE_ANNOTATION))
            .cloned()
            .unwrap_or_else(|| layer.digest.replace(':', "-"));
        files.push((blob.to_string(), safe_relative(&title, artifact)?));
    }
    Ok((manifest, files))
}

/// The 64 hex digits of a `sha256:` digest, or None when it is not one.
fn sha256_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    let valid = hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    valid.then_some(hex)
}

fn bad_digest(artifact: &str, what: &str, digest: &str) -> Error {
    Error::FailedPrecondition(format!(
        "artifact {artifact}: {what} digest {digest:?} is not a sha256 digest"
    ))
}

fn safe_relative(title: &str, artifact: &str) -> Result<PathBuf> {
    let path = Path::new(title);
    let ok = !title.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)));
    if !ok {
        return Err(Error::FailedPrecondition(format!(
            "artifact {artifact}: layer title {title:?} is not a relative path inside the volume"
        )));
    }
    Ok(path.to_path_buf())
}

fn set_read_only(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444))
        .context(|| format!("making {} read-only", path.display()))
}

fn registry_error(name: &str, error: oci_client::errors::OciDistributionError) -> Error {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode as C};
    let codes = |wanted: &[C]| match &error {
        E::RegistryError { envelope, .. } => {
            envelope.errors.iter().any(|e| wanted.contains(&e.code))
        }
        _ => false,
    };
    let refused = matches!(
        error,
        E::AuthenticationFailure(_)
            | E::UnauthorizedError { .. }
            | E::ServerError {
                code: 401 | 403,
                ..
            }
    ) || codes(&[C::Unauthorized, C::Denied]);
    let missing = matches!(
        error,
        E::ImageManifestNotFoundError(_) | E::ServerError { code: 404, .. }
    ) || codes(&[C::ManifestUnknown, C::NameUnknown]);
    if refused {
        Error::PermissionDenied(format!(
            "artifact {name:?}: the registry refused the credentials"
        ))
    } else if missing {
        Error::not_found("artifact", name)
    } else {
        Error::Unavailable(format!("artifact {name:?}: {error}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_stay_inside_the_volume() {
        assert!(safe_relative("model.bin", "a").is_ok());
        assert!(safe_relative("weights/part-1", "a").is_ok());
        for bad in ["", "../escape", "/etc/passwd", "a/../../b"] {
            assert!(safe_relative(bad, "a").is_err(), "{bad}");
        }
    }

    fn manifest(digest: &str, title: &str) -> Vec<u8> {
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": format!("sha256:{}", "4".repeat(64)), "size": 2},
            "layers": [{"mediaType": "application/octet-stream", "digest": digest, "size": 1,
                        "annotations": {TITLE_ANNOTATION: title}}]
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn a_registry_cannot_name_a_path_with_a_digest() {
        let good = format!("sha256:{}", "ab".repeat(32));
        let (_, files) = plan(&manifest(&good, "model.bin"), "a").unwrap();
        assert_eq!(files, [("ab".repeat(32), PathBuf::from("model.bin"))]);
        // A layer digest that is a path would have linked a host file (/etc/shadow) into the volume.
        for bad in [
            "sha256:../../../../etc/shadow",
            "sha512:00",
            "sha256:ABC",
            "",
        ] {
            let err = plan(&manifest(bad, "x"), "a").unwrap_err().to_string();
            assert!(err.contains("is not a sha256 digest"), "{bad}: {err}");
        }
        assert_eq!(sha256_hex(&good), Some("ab".repeat(32).as_str()));
        assert_eq!(sha256_hex("sha256:../x"), None);
    }
}
