//! The fake runtime's images: real content for configured registries and imported OCI layouts, records
//! without content for everything else, all kept in containers/storage's layout under the root (see
//! [`crate::storage`]) so they survive restarts and inlet's containers/storage backend reads them.

use std::collections::BTreeMap;
use std::path::Path;

use inlet_proto::runtime::v1 as cri;
use oci_client::Reference;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tonic::Status;

use crate::pull::{self, Registries};
use crate::storage::{ImageEntry, Storage};

/// The image store and what CRI reports of it.
#[derive(Debug)]
pub struct Images {
    storage: Storage,
    registries: Registries,
    /// CRI images by id, rebuilt from storage after every change.
    cache: Mutex<BTreeMap<String, cri::Image>>,
    /// One pull at a time: layers shared between images are written once.
    pulling: tokio::sync::Mutex<()>,
}

impl Images {
    /// The images under `root`, pulling real content from `registries`.
    pub fn open(root: &Path, registries: Registries) -> std::io::Result<Self> {
        let images = Self {
            storage: Storage::open(root)?,
            registries,
            cache: Mutex::default(),
            pulling: tokio::sync::Mutex::new(()),
        };
        images.refresh()?;
        Ok(images)
    }

    /// The storage (tests and `--image-layout` import into it).
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Imports the OCI layout at `dir` as `repository:<tag>` images.
    pub fn import_layout(&self, dir: &Path, repository: &str) -> std::io::Result<Vec<String>> {
        let names = pull::import_layout(&self.storage, dir, repository)?;
        self.refresh()?;
        Ok(names)
    }

    /// PullImage: real content from a configured registry (with `auth`); for other registries the image
    /// already held under that name, else a record without content. Returns the image id.
    pub async fn pull(
        &self,
        reference: &str,
        auth: Option<&cri::AuthConfig>,
    ) -> Result<String, Status> {
        let parsed = parse(reference)?;
        let _one_at_a_time = self.pulling.lock().await;
        let id = if self.registries.serves(parsed.registry()) {
            let auth = pull::registry_auth(auth);
            pull::pull(&self.storage, &self.registries, &parsed, &auth).await?
        } else if let Some(held) = self.get(reference) {
            // No registry to ask: the image held under that name (imported from a layout) is the pull.
            return Ok(held.id);
        } else {
            let name = parsed.whole();
            let id = hex::encode(Sha256::digest(name.as_bytes()));
            let entry = ImageEntry {
                id: id.clone(),
                digest: String::new(),
                names: vec![name],
                layer: String::new(),
                big_data_names: Vec::new(),
                big_data_sizes: BTreeMap::new(),
                big_data_digests: BTreeMap::new(),
                created: humantime::format_rfc3339(std::time::SystemTime::now()).to_string(),
            };
            self.storage
                .put_image(entry, &[], &[])
                .map_err(|e| Status::internal(format!("recording image {reference:?}: {e}")))?;
            id
        };
        self.refresh()
            .map_err(|e| Status::internal(format!("reading images: {e}")))?;
        // As CRI-O answers: the pulled manifest as `repository@digest` when the image came from a
        // registry (containerd answers with the image id). A client must not take it for an id.
        let repo_digest = self.cache.lock().get(&id).and_then(|image| {
            image
                .repo_digests
                .iter()
                .find(|d| d.starts_with(&format!("{}@", repository(&parsed.whole()))))
                .cloned()
        });
        Ok(repo_digest.unwrap_or(id))
    }

    /// ImageStatus: by id (with or without `sha256:`), or by reference.
    pub fn get(&self, reference: &str) -> Option<cri::Image> {
        let cache = self.cache.lock();
        let id = reference.trim_start_matches("sha256:");
        if let Some(image) = cache.get(id) {
            return Some(image.clone());
        }
        let name = Reference::try_from(reference).ok()?.whole();
        cache
            .values()
            .find(|i| i.repo_tags.contains(&name) || i.repo_digests.contains(&name))
            .cloned()
    }

    /// ListImages.
    pub fn list(&self) -> Vec<cri::Image> {
        self.cache.lock().values().cloned().collect()
    }

    /// RemoveImage: a missing image is removed.
    pub fn remove(&self, reference: &str) -> Result<(), Status> {
        let Some(image) = self.get(reference) else {
            return Ok(());
        };
        self.storage
            .remove_image(&image.id)
            .and_then(|()| self.refresh())
            .map_err(|e| Status::internal(format!("removing image {reference:?}: {e}")))
    }

    /// Where images live (ImageFsInfo reports `<root>/overlay-images`, as CRI-O does).
    pub fn root(&self) -> &Path {
        self.storage.root()
    }

    fn refresh(&self) -> std::io::Result<()> {
        let layers: BTreeMap<String, (String, u64)> = self
            .storage
            .layers()?
            .into_iter()
            .map(|l| (l.id, (l.parent, l.compressed_size.max(l.diff_size))))
            .collect();
        let images = self
            .storage
            .images()?
            .into_iter()
            .map(|entry| {
                let mut size = 0;
                let mut next = entry.layer.clone();
                while let Some((parent, bytes)) = layers.get(&next) {
                    size += bytes;
                    next = parent.clone();
                }
                let repo_digests = if entry.digest.is_empty() {
                    Vec::new()
                } else {
                    entry
                        .names
                        .iter()
                        .map(|n| format!("{}@{}", repository(n), entry.digest))
                        .collect()
                };
                let image = cri::Image {
                    id: entry.id.clone(),
                    repo_tags: entry.names.clone(),
                    repo_digests,
                    // The CRI asks for a size above zero.
                    size: size.max(1),
                    spec: Some(cri::ImageSpec {
                        image: entry.id.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                (entry.id, image)
            })
            .collect();
        *self.cache.lock() = images;
        Ok(())
    }
}

/// A reference, normalized as containerd and the kubelet do (`busybox` is `docker.io/library/busybox:latest`).
pub fn parse(reference: &str) -> Result<Reference, Status> {
    Reference::try_from(reference).map_err(|e| {
        Status::invalid_argument(format!(
            "failed to pull image {reference:?}: invalid reference format: {e}"
        ))
    })
}

/// Parses `REPOSITORY=DIR`, the `--image-layout` flag of cri-fake and kubelet-sim.
pub fn parse_layout_flag(value: &str) -> Result<(String, std::path::PathBuf), String> {
    let (repository, dir) = value
        .split_once('=')
        .filter(|(r, d)| !r.is_empty() && !d.is_empty())
        .ok_or("expected REPOSITORY=DIR, for example example.inlet.dev/site=deploy/images/site")?;
    Ok((repository.to_string(), dir.into()))
}

/// `registry/repo` of a `registry/repo:tag` or `registry/repo@digest` name.
fn repository(name: &str) -> &str {
    let name = name.split('@').next().unwrap_or(name);
    match name.rfind(':') {
        Some(colon) if !name[colon..].contains('/') => &name[..colon],
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_references_as_the_kubelet_does() {
        let whole = |r: &str| parse(r).unwrap().whole();
        assert_eq!(whole("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(whole("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(whole("quay.io/org/app"), "quay.io/org/app:latest");
        assert_eq!(whole("127.0.0.1:5000/data:v1"), "127.0.0.1:5000/data:v1");
        assert!(parse("Upper/Case").is_err());
        assert!(parse("has space").is_err());
        assert!(parse("").is_err());
        assert_eq!(repository("127.0.0.1:5000/data:v1"), "127.0.0.1:5000/data");
        assert_eq!(repository("127.0.0.1:5000/data"), "127.0.0.1:5000/data");
    }

    #[tokio::test]
    async fn records_images_without_content_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let images = Images::open(dir.path(), Registries::default()).unwrap();
        let id = images.pull("busybox:1.36", None).await.unwrap();
        assert_eq!(images.get("docker.io/library/busybox:1.36").unwrap().id, id);
        assert_eq!(images.get(&format!("sha256:{id}")).unwrap().id, id);
        let reopened = Images::open(dir.path(), Registries::default()).unwrap();
        assert_eq!(reopened.list().len(), 1);
        reopened.remove("busybox:1.36").unwrap();
        assert!(reopened.list().is_empty());
        reopened.remove("busybox:1.36").unwrap();
    }
}
