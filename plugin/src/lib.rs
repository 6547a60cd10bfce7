//! inlet-plugin: inlet's CSI drivers and the pieces they are built from.
//!
//! # Layout
//! - [`crash`]: named crash points (`INLET_CRASH_POINT`) for the kill-anywhere tests.
//! - [`error`]: the one error type of this crate and its mapping to gRPC codes.
//! - [`host_path`]: target and staging paths walked and created without following a symlink.
//! - [`mount`]: the mount layer (bind, tmpfs, overlay, remount, unmount, loop devices): a real Linux
//!   implementation and a recording fake, so driver logic is testable without root.
//! - [`image`]: image volumes: CRI pulls, the runtime's storage (containerd or containers/storage),
//!   shared read-only views and writable copy-on-write volumes, and the `image` CSI driver.
//! - [`local`]: the `local` driver: volumes as directories (or loop-attached files for raw block) under a
//!   state dir, with snapshots, clones, expansion, attach, staging and KEP-596 ephemeral inline volumes.
//! - [`registration`]: the kubelet plugin-watcher registration (`--registration-dir`), no sidecar needed.
//! - [`server`]: serving a driver's CSI services on a unix socket; [`call_log`]: a record of the Node
//!   calls a driver receives (`--call-log`).
//! - [`quantity`]: Kubernetes quantities (`64Mi`) as bytes.
//! - [`volume`]: the kubelet-side volume plugin framework (`VolumePlugin`, `Mounter`, `Unmounter`,
//!   `Attacher`, `Detacher`, `VolumeHost`) and the `kubernetes.io/csi` plugin with the KEP-596 contract.
//!
//! The `inlet-plugin` binary (`src/main.rs`) is a thin CLI over [`server::serve_csi`].

pub mod call_log;
pub mod crash;
pub mod error;
pub mod host_path;
pub mod image;
pub mod local;
pub mod mount;
pub mod quantity;
mod records;
pub mod registration;
pub mod server;
pub mod volume;

pub use error::{Error, Result};
