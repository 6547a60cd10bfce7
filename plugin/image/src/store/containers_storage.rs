//! The overlay layout of containers/storage, the storage library of CRI-O, podman and buildah (and the
//! layout cri-fake writes):
//!
//! ```text
//! overlay-images/images.json         [{id, names, layer (top layer id), big-data-names, ...}]
//! overlay-images/<id>/manifest       the manifest; other big data as `=<base64(key)>` (the config under
//!                                    key `sha256:<id>`)
//! overlay-layers/layers.json         [{id, parent, diff-digest, ...}] (also volatile-layers.json)
//! overlay/<layer-id>/diff            the layer's files, whiteouts as 0:0 character devices
//! overlay/<layer-id>/link            a short name; overlay/l/<short> links to ../<layer-id>/diff
//! ```
//!
//! The library writes each JSON file atomically (write and rename), so reading it without its lock sees a
//! whole file. Layers are mounted through their short links, as the library does, so an image with many
//! layers stays inside the kernel's one-page limit on mount options. Writable volumes get their upper and
//! work dirs under inlet's state dir, never inside the runtime's storage.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use base64::Engine;
use serde::Deserialize;

use super::{ImageMetadata, ImageStore, Mountable, no_layers};
use inlet_host::error::{Error, IoContext, Result};
use inlet_host::mount::Overlay;

/// containers/storage at `root` (`/var/lib/containers/storage`).
#[derive(Debug, Clone)]
pub struct ContainersStorage {
    root: PathBuf,
    /// Where writable volumes' upper dirs live: `<state>/rw/<key>/{upper,work}`.
    rw_dir: PathBuf,
}

#[derive(Debug, Deserialize)]
struct ImageEntry {
    id: String,
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    layer: String,
}

#[derive(Debug, Deserialize)]
struct LayerEntry {
    id: String,
    #[serde(default)]
    parent: String,
}

impl ContainersStorage {
    /// The storage at `root`; writable layers go under `state_dir/rw`.
    pub fn new(root: &Path, state_dir: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            rw_dir: state_dir.join("rw"),
        }
    }

    /// The storage root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn image(&self, image_id: &str) -> Result<ImageEntry> {
        let id = image_id.trim_start_matches("sha256:");
        let path = self.root.join("overlay-images/images.json");
        let images: Vec<ImageEntry> = read_json(&path)?.unwrap_or_default();
        images
            .into_iter()
            .find(|i| i.id == id || i.names.iter().any(|n| n == image_id))
            .ok_or_else(|| Error::not_found("image", image_id))
    }

    /// The image's layer dirs, the topmost first.
    fn lower_dirs(&self, image_id: &str) -> Result<Vec<PathBuf>> {
        let image = self.image(image_id)?;
        if image.layer.is_empty() {
            return Err(no_layers(image_id));
        }
        let mut parents = HashMap::new();
        for file in ["layers.json", "volatile-layers.json"] {
            let layers: Vec<LayerEntry> =
                read_json(&self.root.join("overlay-layers").join(file))?.unwrap_or_default();
            parents.extend(layers.into_iter().map(|l| (l.id, l.parent)));
        }
        let mut lower = Vec::new();
        let mut next = image.layer;
        while !next.is_empty() {
            // Ids become path components: one that is not a plain name (`../..`) would put a host dir
            // in the overlay.
            if !plain_name(&next) {
                return Err(Error::FailedPrecondition(format!(
                    "image {image_id}: layer id {next:?} in {} is not a storage id",
                    self.root.join("overlay-layers/layers.json").display()
                )));
            }
            let parent = parents.get(&next).cloned().ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "image {image_id}: layer {next} is missing from {}",
                    self.root.join("overlay-layers/layers.json").display()
                ))
            })?;
            lower.push(self.layer_dir(&next));
            if lower.len() > 500 {
                return Err(Error::FailedPrecondition(format!(
                    "image {image_id}: its layers form a cycle"
                )));
            }
            next = parent;
        }
        Ok(lower)
    }

    /// `overlay/l/<short>` when the layer has a short link, else its `diff` dir.
    fn layer_dir(&self, layer: &str) -> PathBuf {
        let overlay = self.root.join("overlay");
        match std::fs::read_to_string(overlay.join(layer).join("link")) {
            Ok(link) if plain_name(link.trim()) => overlay.join("l").join(link.trim()),
            _ => overlay.join(layer).join("diff"),
        }
    }
}

#[async_trait]
impl ImageStore for ContainersStorage {
    fn kind(&self) -> &'static str {
        "containers-storage"
    }

    /// Nothing is created: a read-only view is the layers themselves.
    async fn view(&self, image_id: &str, _key: &str) -> Result<Mountable> {
        let mut lower = self.lower_dirs(image_id)?;
        // The kernel refuses a read-only overlay of a single lower dir.
        Ok(if lower.len() == 1 {
            Mountable::Bind(lower.remove(0))
        } else {
            Mountable::Overlay(Overlay { lower, upper: None })
        })
    }

    /// Creates `rw/<key>/{upper,work}`; existing ones are reused, so a retry keeps what was written.
    async fn prepare(&self, image_id: &str, key: &str) -> Result<Mountable> {
        let lower = self.lower_dirs(image_id)?;
        let dir = self.rw_dir.join(key);
        let (upper, work) = (dir.join("upper"), dir.join("work"));
        for d in [&upper, &work] {
            std::fs::create_dir_all(d).context(|| format!("creating {}", d.display()))?;
        }
        Ok(Mountable::Overlay(Overlay {
            lower,
            upper: Some((upper, work)),
        }))
    }

    async fn remove(&self, key: &str) -> Result<()> {
        let dir = self.rw_dir.join(key);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).context(|| format!("removing {}", dir.display()))
            }
            _ => Ok(()),
        }
    }

    async fn keys(&self) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.rw_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).context(|| format!("reading {}", self.rw_dir.display())),
        };
        Ok(entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect())
    }

    async fn metadata(&self, image_id: &str) -> Result<ImageMetadata> {
        let image = self.image(image_id)?;
        let dir = self.root.join("overlay-images").join(&image.id);
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).context(|| format!("reading {}", path.display()))
        };
        Ok(ImageMetadata {
            manifest: read("manifest")?,
            config: read(&big_data_file(&format!("sha256:{}", image.id)))?,
        })
    }
}

/// The file a big-data item is stored in: its key when that is a plain name, else `=` + base64(key)
/// (containers/storage `makeBigDataBaseName`).
pub fn big_data_file(key: &str) -> String {
    if key
        .chars()
        .all(|c| c == '.' || c.is_ascii_digit() || c.is_ascii_lowercase())
    {
        key.to_string()
    } else {
        format!(
            "={}",
            base64::engine::general_purpose::STANDARD.encode(key.as_bytes())
        )
    }
}

/// A storage id or short link name: letters and digits only (containers/storage's are hex digests and
/// base32 names), so it is one path component and never `..`.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 128 && name.bytes().all(|b| b.is_ascii_alphanumeric())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match std::fs::read(path) {
        Ok(raw) => serde_json::from_slice(&raw)
            .map(Some)
            .map_err(std::io::Error::from)
            .context(|| format!("parsing {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).context(|| format!("reading {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with(images: &str, layers: &str) -> (tempfile::TempDir, ContainersStorage) {
        let dir = tempfile::tempdir().unwrap();
        for (sub, file, text) in [
            ("overlay-images", "images.json", images),
            ("overlay-layers", "layers.json", layers),
        ] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
            std::fs::write(dir.path().join(sub).join(file), text).unwrap();
        }
        let store = ContainersStorage::new(dir.path(), &dir.path().join("state"));
        (dir, store)
    }

    #[tokio::test]
    async fn layer_ids_that_are_not_plain_names_are_refused() {
        let (_dir, store) = store_with(
            r#"[{"id":"a1","names":["img"],"layer":"../../../etc"}]"#,
            r#"[{"id":"../../../etc","parent":""}]"#,
        );
        let err = store.view("img", "k").await.unwrap_err().to_string();
        assert!(err.contains("is not a storage id"), "{err}");
        let (dir, store) = store_with(
            r#"[{"id":"a1","names":["img"],"layer":"l2"}]"#,
            r#"[{"id":"l2","parent":"l1"},{"id":"l1","parent":""}]"#,
        );
        let Mountable::Overlay(overlay) = store.view("img", "k").await.unwrap() else {
            panic!("two layers make an overlay");
        };
        assert_eq!(
            overlay.lower,
            [
                dir.path().join("overlay/l2/diff"),
                dir.path().join("overlay/l1/diff")
            ]
        );
    }
}
