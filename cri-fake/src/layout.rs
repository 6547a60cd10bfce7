//! Building small images from files, for tests and demos where no registry or image builder is at hand:
//! [`ImageBuilder`] writes an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/...`) that
//! `cri-fake serve --image-layout`, skopeo and umoci read, and [`push`] uploads one to a registry.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use flate2::Compression;
use flate2::write::GzEncoder;
use oci_client::Reference;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{OciDescriptor, OciImageIndex, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use serde_json::json;
use sha2::{Digest, Sha256};

/// An entry of a layer.
#[derive(Debug, Clone)]
enum Entry {
    File {
        path: String,
        body: Vec<u8>,
        mode: u32,
    },
    Symlink {
        path: String,
        target: String,
    },
    Whiteout {
        path: String,
    },
}

/// An image under construction: layers of files, a command, annotations.
#[derive(Debug, Clone, Default)]
pub struct ImageBuilder {
    layers: Vec<Vec<Entry>>,
    cmd: Vec<String>,
    annotations: BTreeMap<String, String>,
}

/// A built image: its blobs by digest, and its manifest's digest.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// The manifest's bytes.
    pub manifest: Vec<u8>,
    /// The manifest's digest.
    pub digest: String,
    /// The config's bytes.
    pub config: Vec<u8>,
    /// The gzip-compressed layer blobs, bottom first.
    pub layers: Vec<Vec<u8>>,
}

impl ImageBuilder {
    /// An image with no layers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a new layer on top of the previous ones.
    pub fn layer(mut self) -> Self {
        self.layers.push(Vec::new());
        self
    }

    /// Adds a regular file (mode 0644) to the current layer.
    pub fn file(self, path: &str, body: impl Into<Vec<u8>>) -> Self {
        self.file_with_mode(path, body, 0o644)
    }

    /// Adds a regular file with a mode to the current layer.
    pub fn file_with_mode(mut self, path: &str, body: impl Into<Vec<u8>>, mode: u32) -> Self {
        self.current().push(Entry::File {
            path: path.trim_start_matches('/').to_string(),
            body: body.into(),
            mode,
        });
        self
    }

    /// Adds a symlink to the current layer.
    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        self.current().push(Entry::Symlink {
            path: path.trim_start_matches('/').to_string(),
            target: target.to_string(),
        });
        self
    }

    /// Deletes a path of a lower layer (an OCI whiteout).
    pub fn remove(mut self, path: &str) -> Self {
        self.current().push(Entry::Whiteout {
            path: path.trim_start_matches('/').to_string(),
        });
        self
    }

    /// Sets the config's command.
    pub fn cmd(mut self, cmd: &[&str]) -> Self {
        self.cmd = cmd.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Adds a manifest annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    fn current(&mut self) -> &mut Vec<Entry> {
        if self.layers.is_empty() {
            self.layers.push(Vec::new());
        }
        self.layers.last_mut().expect("a layer")
    }

    /// The image's blobs. Deterministic: the same builder gives the same digests.
    pub fn build(&self) -> std::io::Result<BuiltImage> {
        let mut layers = Vec::new();
        let mut diff_ids = Vec::new();
        for entries in &self.layers {
            let tar = tar_of(entries)?;
            diff_ids.push(digest(&tar));
            let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
            gz.write_all(&tar)?;
            layers.push(gz.finish()?);
        }
        let config = serde_json::to_vec(&json!({
            "architecture": oci_arch(),
            "os": "linux",
            "config": { "Cmd": self.cmd },
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
        }))?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
            "layers": layers
                .iter()
                .map(|l| descriptor("application/vnd.oci.image.layer.v1.tar+gzip", l))
                .collect::<Vec<_>>(),
            "annotations": self.annotations,
        });
        let manifest = serde_json::to_vec(&manifest)?;
        Ok(BuiltImage {
            digest: digest(&manifest),
            manifest,
            config,
            layers,
        })
    }

    /// Writes the image into the OCI layout at `dir` under `tag` (other tags there are kept).
    pub fn write_layout(&self, dir: &Path, tag: &str) -> std::io::Result<BuiltImage> {
        let image = self.build()?;
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs)?;
        for blob in [&image.manifest, &image.config]
            .into_iter()
            .chain(&image.layers)
        {
            std::fs::write(blobs.join(digest(blob).trim_start_matches("sha256:")), blob)?;
        }
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        let index_path = dir.join("index.json");
        let mut index: OciImageIndex = match std::fs::read(&index_path) {
            Ok(raw) => serde_json::from_slice(&raw).map_err(std::io::Error::other)?,
            Err(_) => serde_json::from_value(json!({"schemaVersion": 2, "manifests": []}))?,
        };
        index.manifests.retain(|m| {
            m.annotations
                .as_ref()
                .and_then(|a| a.get("org.opencontainers.image.ref.name"))
                .is_none_or(|t| t != tag)
        });
        index.manifests.push(serde_json::from_value(json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": image.digest,
            "size": image.manifest.len(),
            "annotations": { "org.opencontainers.image.ref.name": tag },
        }))?);
        std::fs::write(&index_path, serde_json::to_vec(&index)?)?;
        Ok(image)
    }
}

/// Pushes a built image to `reference` (plain HTTP for registries in `insecure`).
pub async fn push(
    image: &BuiltImage,
    reference: &Reference,
    auth: &RegistryAuth,
    insecure: &[String],
) -> Result<(), oci_client::errors::OciDistributionError> {
    let client = crate::pull::new_client(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(insecure.to_vec()),
        ..Default::default()
    });
    let manifest: OciImageManifest = serde_json::from_slice(&image.manifest)?;
    let layers: Vec<ImageLayer> = image
        .layers
        .iter()
        .map(|l| {
            ImageLayer::new(
                l.clone(),
                "application/vnd.oci.image.layer.v1.tar+gzip".into(),
                None,
            )
        })
        .collect();
    let config = Config::new(
        image.config.clone(),
        "application/vnd.oci.image.config.v1+json".into(),
        None,
    );
    client
        .push(reference, &layers, config, auth, Some(manifest))
        .await?;
    Ok(())
}

fn tar_of(entries: &[Entry]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for entry in entries {
        let path = match entry {
            Entry::File { path, .. } | Entry::Symlink { path, .. } | Entry::Whiteout { path } => {
                path
            }
        };
        // Parent dirs first, as image builders write them.
        let mut parent = Path::new(path).parent();
        let mut missing = Vec::new();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            if dirs.insert(p.to_path_buf()) {
                missing.push(p.to_path_buf());
            }
            parent = p.parent();
        }
        for dir in missing.into_iter().rev() {
            let mut header = header(tar::EntryType::Directory, 0o755, 0);
            builder.append_data(&mut header, &dir, std::io::empty())?;
        }
        match entry {
            Entry::File { path, body, mode } => {
                let mut header = header(tar::EntryType::Regular, *mode, body.len() as u64);
                builder.append_data(&mut header, path, body.as_slice())?;
            }
            Entry::Symlink { path, target } => {
                let mut header = header(tar::EntryType::Symlink, 0o777, 0);
                builder.append_link(&mut header, path, target)?;
            }
            Entry::Whiteout { path } => {
                let p = Path::new(path);
                let name = format!(
                    ".wh.{}",
                    p.file_name().unwrap_or_default().to_string_lossy()
                );
                let wh = p.parent().unwrap_or(Path::new("")).join(name);
                let mut header = header(tar::EntryType::Regular, 0o644, 0);
                builder.append_data(&mut header, wh, std::io::empty())?;
            }
        }
    }
    builder.into_inner()
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn descriptor(media_type: &str, blob: &[u8]) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.into(),
        digest: digest(blob),
        size: blob.len() as i64,
        ..Default::default()
    }
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Storage;

    #[test]
    fn a_built_layout_imports_into_storage_with_whiteouts_applied_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let layout = dir.path().join("layout");
        ImageBuilder::new()
            .file("data/hello.txt", "hello\n")
            .file("data/gone.txt", "x")
            .layer()
            .file("data/two.txt", "two\n")
            .remove("data/gone.txt")
            .annotation("org.example.purpose", "test")
            .write_layout(&layout, "v1")
            .unwrap();
        let storage = Storage::open(&dir.path().join("storage")).unwrap();
        let names = crate::pull::import_layout(&storage, &layout, "registry.example/data").unwrap();
        assert_eq!(names, ["registry.example/data:v1"]);
        let images = storage.images().unwrap();
        assert_eq!(images.len(), 1);
        let layers = storage.layers().unwrap();
        assert_eq!(layers.len(), 2);
        let top = layers.iter().find(|l| l.id == images[0].layer).unwrap();
        let diff = dir
            .path()
            .join("storage/overlay")
            .join(&top.id)
            .join("diff/data");
        assert_eq!(
            std::fs::read_to_string(diff.join("two.txt")).unwrap(),
            "two\n"
        );
        // Root turns the whiteout into a 0:0 character device; others keep the marker file.
        let privileged = nix::unistd::Uid::effective().is_root();
        if privileged {
            use std::os::unix::fs::FileTypeExt;
            let whiteout = diff.join("gone.txt").symlink_metadata().unwrap();
            assert!(whiteout.file_type().is_char_device());
        } else {
            assert!(diff.join(".wh.gone.txt").exists());
        }
    }
}
