//! Where a runtime keeps its images, and how to make a volume of one: the [`ImageStore`] trait and its
//! backends, chosen by `--storage`.
//!
//! - [`ContainersStorage`]: the overlay layout of containers/storage (CRI-O's and podman's storage, and
//!   cri-fake's): layers are read from `overlay-layers/layers.json` and mounted as overlay lower dirs.
//! - [`Containerd`]: containerd's native API (namespace `k8s.io`): snapshots `View`ed or `Prepare`d on the
//!   image's top snapshot, each protected from garbage collection by a lease.
//!
//! Keys name what a store made for a volume: `inlet-ro-<image>` for the one read-only view shared by every
//! read-only volume of an image, `inlet-rw-<volume>` for each writable volume's copy-on-write layer.

mod containerd;
mod containers_storage;

use std::fmt;
use std::path::PathBuf;

use async_trait::async_trait;

pub use containerd::Containerd;
pub use containers_storage::ContainersStorage;

use inlet_host::Result;
use inlet_host::mount::Overlay;

/// How to mount what a store made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mountable {
    /// A read-only bind of one directory (an image with one layer).
    Bind(PathBuf),
    /// An overlay (read-only without an upper dir).
    Overlay(Overlay),
}

/// How far running pulls have got, where the runtime tells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bytes downloaded.
    pub bytes_done: u64,
    /// Bytes to download, as far as known.
    pub bytes_total: u64,
    /// Layers downloading.
    pub layers_active: usize,
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} downloaded, {} layer(s) in flight",
            inlet_host::quantity::format_bytes(self.bytes_done),
            inlet_host::quantity::format_bytes(self.bytes_total),
            self.layers_active
        )
    }
}

/// The image's own description, for volumes that ask for metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageMetadata {
    /// The image manifest, as stored.
    pub manifest: Vec<u8>,
    /// The image config, as stored.
    pub config: Vec<u8>,
}

/// A runtime's image storage. Every method is idempotent: the engine calls it again after a crash.
#[async_trait]
pub trait ImageStore: Send + Sync {
    /// `containerd` or `containers-storage`.
    fn kind(&self) -> &'static str;
    /// A read-only view of image `image_id` (the CRI image id) under `key`.
    async fn view(&self, image_id: &str, key: &str) -> Result<Mountable>;
    /// A writable copy-on-write layer over image `image_id` under `key`.
    async fn prepare(&self, image_id: &str, key: &str) -> Result<Mountable>;
    /// Removes what [`view`](Self::view) or [`prepare`](Self::prepare) made under `key`; a missing key
    /// is removed.
    async fn remove(&self, key: &str) -> Result<()>;
    /// The keys this store holds for inlet (to find what a crash left behind).
    async fn keys(&self) -> Result<Vec<String>>;
    /// The image's manifest and config.
    async fn metadata(&self, image_id: &str) -> Result<ImageMetadata>;
    /// Progress of pulls in flight, if the runtime exposes it.
    async fn progress(&self) -> Option<Progress> {
        None
    }
}

/// The message for an image with nothing to mount (built `FROM scratch` with nothing added; warm-metal #65).
pub(crate) fn no_layers(image_id: &str) -> inlet_host::Error {
    inlet_host::Error::FailedPrecondition(format!(
        "image {image_id} has no layers (built FROM scratch with nothing added): there is nothing to mount"
    ))
}
