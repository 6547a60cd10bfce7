//! cri-fake's image store, in the overlay layout of containers/storage (the layout CRI-O and podman write),
//! so inlet's containers/storage backend reads cri-fake's images exactly as it reads CRI-O's:
//!
//! ```text
//! overlay-images/images.json      [{id, digest, names, layer, big-data-*, created}]
//! overlay-images/<id>/manifest    the manifest; the config as `=<base64("sha256:<id>")>`
//! overlay-layers/layers.json      [{id, parent, diff-digest, compressed-diff-digest, sizes, compression}]
//! overlay/<layer-id>/diff         the layer's files (whiteouts as 0:0 character devices when root)
//! overlay/<layer-id>/link, lower  the short name, and the parents' short names
//! overlay/l/<short>               -> ../<layer-id>/diff
//! ```
//!
//! Image ids are the config digest's hex (as CRI-O reports them); layer ids are chain ids. Each JSON file is
//! written to a temporary file and renamed, as containers/storage does, so readers never see half a file.
//! Images without content (a container image the fake only pretends to have) are entries without a layer.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One image entry of `images.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageEntry {
    /// The config digest's hex.
    pub id: String,
    /// The manifest digest (`sha256:...`); empty for an image without content.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    /// Normalized references.
    #[serde(default)]
    pub names: Vec<String>,
    /// The top layer's id; empty for an image without layers.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub layer: String,
    /// Big-data keys (`manifest`, `sha256:<id>`).
    #[serde(default, rename = "big-data-names")]
    pub big_data_names: Vec<String>,
    /// Their sizes.
    #[serde(default, rename = "big-data-sizes")]
    pub big_data_sizes: BTreeMap<String, u64>,
    /// Their digests.
    #[serde(default, rename = "big-data-digests")]
    pub big_data_digests: BTreeMap<String, String>,
    /// RFC 3339 creation time.
    #[serde(default)]
    pub created: String,
}

/// One layer entry of `layers.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerEntry {
    /// The chain id's hex.
    pub id: String,
    /// The parent layer's id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent: String,
    /// RFC 3339 creation time.
    #[serde(default)]
    pub created: String,
    /// The blob's digest.
    #[serde(default, rename = "compressed-diff-digest")]
    pub compressed_diff_digest: String,
    /// The blob's size.
    #[serde(default, rename = "compressed-size")]
    pub compressed_size: u64,
    /// The uncompressed tar's digest (the diff id).
    #[serde(default, rename = "diff-digest")]
    pub diff_digest: String,
    /// The uncompressed tar's size.
    #[serde(default, rename = "diff-size")]
    pub diff_size: u64,
    /// 0 none, 2 gzip (containers/storage's `archive.Compression`).
    #[serde(default)]
    pub compression: u8,
}

/// containers/storage at a root dir. Not internally locked: the runtime serializes writers.
#[derive(Debug, Clone)]
pub struct Storage {
    root: PathBuf,
}

impl Storage {
    /// Opens (and creates) the layout at `root`.
    pub fn open(root: &Path) -> io::Result<Self> {
        for dir in ["overlay-images", "overlay-layers", "overlay/l", "tmp"] {
            fs::create_dir_all(root.join(dir))?;
        }
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A scratch dir for downloads, inside the root (so renames stay on one filesystem).
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Every image.
    pub fn images(&self) -> io::Result<Vec<ImageEntry>> {
        read_json(&self.images_file())
    }

    /// Every layer.
    pub fn layers(&self) -> io::Result<Vec<LayerEntry>> {
        read_json(&self.layers_file())
    }

    /// True when a layer with this chain id is stored.
    pub fn has_layer(&self, id: &str) -> io::Result<bool> {
        Ok(self.layers()?.iter().any(|l| l.id == id))
    }

    /// Unpacks an uncompressed layer tar as layer `entry` (an existing layer is kept). Whiteouts become
    /// overlay whiteouts when this process may create them. When `entry.diff_digest` is set, the tar must
    /// have that digest; otherwise nothing is kept.
    pub fn put_layer(&self, mut entry: LayerEntry, tar: impl Read) -> io::Result<()> {
        if self.has_layer(&entry.id)? {
            return Ok(());
        }
        let dir = self.root.join("overlay").join(&entry.id);
        // A crash mid-unpack leaves a dir without a layers.json entry; start it afresh.
        let _ = fs::remove_dir_all(&dir);
        let diff = dir.join("diff");
        fs::create_dir_all(&diff)?;
        let mut hashing = HashingReader {
            inner: tar,
            hash: Sha256::new(),
            size: 0,
        };
        let unpacked = unpack(&mut hashing, &diff)
            // The tar reader stops at the end-of-archive marker; the digest covers the padding after it.
            .and_then(|()| io::copy(&mut hashing, &mut io::sink()).map(drop));
        let actual = format!("sha256:{}", hex::encode(hashing.hash.finalize()));
        let checked = unpacked.and_then(|()| {
            if entry.diff_digest.is_empty() || entry.diff_digest == actual {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "layer content is {actual}, but the image config says {}",
                        entry.diff_digest
                    ),
                ))
            }
        });
        if let Err(e) = checked {
            let _ = fs::remove_dir_all(&dir);
            return Err(e);
        }
        entry.diff_digest = actual;
        entry.diff_size = hashing.size;
        let short = short_name(&entry.id);
        fs::write(dir.join("link"), &short)?;
        let link = self.root.join("overlay/l").join(&short);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(format!("../{}/diff", entry.id), &link)?;
        if !entry.parent.is_empty() {
            let mut lower = vec![format!("l/{}", short_name(&entry.parent))];
            if let Ok(parent_lower) =
                fs::read_to_string(self.root.join("overlay").join(&entry.parent).join("lower"))
            {
                lower.extend(parent_lower.split(':').map(str::to_string));
            }
            fs::write(dir.join("lower"), lower.join(":"))?;
        }
        let mut layers = self.layers()?;
        layers.push(entry);
        write_json(&self.layers_file(), &layers)
    }

    /// Records an image: its entry, manifest and config. An image with the same id gains the names.
    pub fn put_image(
        &self,
        mut entry: ImageEntry,
        manifest: &[u8],
        config: &[u8],
    ) -> io::Result<()> {
        let dir = self.root.join("overlay-images").join(&entry.id);
        fs::create_dir_all(&dir)?;
        let config_key = format!("sha256:{}", entry.id);
        entry.big_data_names.clear();
        for (key, body) in [("manifest", manifest), (config_key.as_str(), config)] {
            if body.is_empty() {
                continue;
            }
            fs::write(dir.join(big_data_file(key)), body)?;
            entry.big_data_names.push(key.to_string());
            entry
                .big_data_sizes
                .insert(key.to_string(), body.len() as u64);
            entry.big_data_digests.insert(
                key.to_string(),
                format!("sha256:{}", hex::encode(Sha256::digest(body))),
            );
        }
        let mut images = self.images()?;
        // A name belongs to one image: a newer pull of a tag takes it from the older image.
        for other in images.iter_mut().filter(|i| i.id != entry.id) {
            other.names.retain(|n| !entry.names.contains(n));
        }
        match images.iter_mut().find(|i| i.id == entry.id) {
            Some(existing) => {
                for name in entry.names {
                    if !existing.names.contains(&name) {
                        existing.names.push(name);
                    }
                }
            }
            None => images.push(entry),
        }
        write_json(&self.images_file(), &images)
    }

    /// Removes an image and the layers no other image uses. A missing image is removed.
    pub fn remove_image(&self, id: &str) -> io::Result<()> {
        let mut images = self.images()?;
        let Some(at) = images.iter().position(|i| i.id == id) else {
            return Ok(());
        };
        images.remove(at);
        write_json(&self.images_file(), &images)?;
        let _ = fs::remove_dir_all(self.root.join("overlay-images").join(id));
        let mut layers = self.layers()?;
        let parents: BTreeMap<String, String> = layers
            .iter()
            .map(|l| (l.id.clone(), l.parent.clone()))
            .collect();
        let mut used = std::collections::BTreeSet::new();
        for image in &images {
            let mut next = image.layer.clone();
            while !next.is_empty() && used.insert(next.clone()) {
                next = parents.get(&next).cloned().unwrap_or_default();
            }
        }
        let (keep, drop): (Vec<_>, Vec<_>) = layers.drain(..).partition(|l| used.contains(&l.id));
        write_json(&self.layers_file(), &keep)?;
        for layer in drop {
            let _ = fs::remove_file(self.root.join("overlay/l").join(short_name(&layer.id)));
            let _ = fs::remove_dir_all(self.root.join("overlay").join(&layer.id));
        }
        Ok(())
    }

    /// The dirs of an image's layers, top first: what an overlay mount of it would stack. None for an
    /// image not stored; empty for one without layers.
    pub fn layer_dirs(&self, id: &str) -> io::Result<Option<Vec<PathBuf>>> {
        let Some(image) = self.images()?.into_iter().find(|i| i.id == id) else {
            return Ok(None);
        };
        let parents: BTreeMap<String, String> = self
            .layers()?
            .into_iter()
            .map(|l| (l.id, l.parent))
            .collect();
        let mut dirs = Vec::new();
        let mut next = image.layer;
        // Bounded by the layer count, so a parent loop in a corrupt layers.json cannot spin.
        while !next.is_empty() && dirs.len() <= parents.len() {
            dirs.push(self.root.join("overlay").join(&next).join("diff"));
            next = parents.get(&next).cloned().unwrap_or_default();
        }
        Ok(Some(dirs))
    }

    fn images_file(&self) -> PathBuf {
        self.root.join("overlay-images/images.json")
    }

    fn layers_file(&self) -> PathBuf {
        self.root.join("overlay-layers/layers.json")
    }
}

struct HashingReader<R> {
    inner: R,
    hash: Sha256,
    size: u64,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
}

/// The chain id of a layer over `parent` (the OCI image spec's ChainID), as bare hex.
pub fn chain_id(parent: Option<&str>, diff_id: &str) -> String {
    match parent {
        None => diff_id.trim_start_matches("sha256:").to_string(),
        Some(parent) => hex::encode(Sha256::digest(
            format!("sha256:{parent} {diff_id}").as_bytes(),
        )),
    }
}

/// A layer's short link name: 26 characters of [A-Z2-7], stable for a layer id.
fn short_name(id: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    Sha256::digest(id.as_bytes())
        .iter()
        .take(26)
        .map(|b| ALPHABET[(*b as usize) % 32] as char)
        .collect()
}

/// containers/storage's `makeBigDataBaseName`: plain when only [a-z0-9.], else `=` + base64.
fn big_data_file(key: &str) -> String {
    if key
        .chars()
        .all(|c| c == '.' || c.is_ascii_digit() || c.is_ascii_lowercase())
    {
        key.to_string()
    } else {
        format!("={}", base64::engine::general_purpose::STANDARD.encode(key))
    }
}

/// Unpacks a layer tar into `dir`: OCI whiteouts (`.wh.NAME`) become 0:0 character devices and opaque
/// markers (`.wh..wh..opq`) the `trusted.overlay.opaque` xattr, as overlayfs reads them. Creating those
/// needs root; without it they are kept as the plain files the tar has (nothing reads them as overlays then).
fn unpack(tar: impl Read, dir: &Path) -> io::Result<()> {
    let privileged = nix::unistd::Uid::effective().is_root();
    let mut archive = tar::Archive::new(tar);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(privileged);
    archive.set_unpack_xattrs(privileged);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        if path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::RootDir))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("layer entry {} escapes the layer", path.display()),
            ));
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if privileged && let Some(hidden) = name.strip_prefix(".wh.") {
            let parent = dir.join(path.parent().unwrap_or(Path::new("")));
            fs::create_dir_all(&parent)?;
            if hidden == ".wh..opq" {
                xattr::set(&parent, "trusted.overlay.opaque", b"y")?;
            } else {
                let target = parent.join(hidden);
                let _ = fs::remove_file(&target);
                nix::sys::stat::mknod(
                    &target,
                    nix::sys::stat::SFlag::S_IFCHR,
                    nix::sys::stat::Mode::empty(),
                    0,
                )?;
            }
            continue;
        }
        entry.unpack_in(dir)?;
    }
    Ok(())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> io::Result<Vec<T>> {
    match fs::read(path) {
        Ok(raw) if raw.is_empty() => Ok(Vec::new()),
        Ok(raw) => serde_json::from_slice(&raw).map_err(io::Error::other),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    fs::write(&tmp, serde_json::to_vec(value).map_err(io::Error::other)?)?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, body) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(body.len() as u64);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_cksum();
            builder
                .append_data(&mut header, path, body.as_bytes())
                .unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn layer(id: &str, parent: &str) -> LayerEntry {
        LayerEntry {
            id: id.into(),
            parent: parent.into(),
            created: String::new(),
            compressed_diff_digest: String::new(),
            compressed_size: 0,
            diff_digest: String::new(),
            diff_size: 0,
            compression: 0,
        }
    }

    #[test]
    fn stores_layers_and_images_and_removes_unused_layers() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(dir.path()).unwrap();
        storage
            .put_layer(layer("a", ""), tar_of(&[("data/one.txt", "1")]).as_slice())
            .unwrap();
        storage
            .put_layer(layer("b", "a"), tar_of(&[("data/two.txt", "2")]).as_slice())
            .unwrap();
        let image = |id: &str, top: &str| ImageEntry {
            id: id.into(),
            digest: String::new(),
            names: vec![format!("reg.example/{id}:1")],
            layer: top.into(),
            big_data_names: vec![],
            big_data_sizes: BTreeMap::new(),
            big_data_digests: BTreeMap::new(),
            created: String::new(),
        };
        storage.put_image(image("one", "a"), b"{}", b"{}").unwrap();
        storage.put_image(image("two", "b"), b"{}", b"{}").unwrap();
        let root = dir.path();
        assert_eq!(
            fs::read_to_string(
                root.join("overlay/l")
                    .join(short_name("b"))
                    .join("data/two.txt")
            )
            .unwrap(),
            "2"
        );
        assert!(root.join("overlay-images/one/manifest").exists());
        storage.remove_image("two").unwrap();
        assert!(!root.join("overlay/b").exists(), "b is used by no image");
        assert!(root.join("overlay/a/diff/data/one.txt").exists());
        assert_eq!(storage.layers().unwrap().len(), 1);
    }

    #[test]
    fn refuses_entries_that_escape_the_layer() {
        let dir = tempfile::tempdir().unwrap();
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        // `append_data` refuses `..`; write the raw name the way a hostile layer would.
        header.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../escape");
        header.set_cksum();
        builder.append(&header, &b"x"[..]).unwrap();
        let tar = builder.into_inner().unwrap();
        let err = unpack(tar.as_slice(), dir.path()).unwrap_err();
        assert!(err.to_string().contains("escapes"), "{err}");
        assert!(!dir.path().parent().unwrap().join("escape").exists());
    }

    #[test]
    fn chain_ids_follow_the_oci_formula() {
        assert_eq!(chain_id(None, "sha256:aa"), "aa");
        let expected = hex::encode(Sha256::digest(b"sha256:aa sha256:bb"));
        assert_eq!(chain_id(Some("aa"), "sha256:bb"), expected);
    }
}
