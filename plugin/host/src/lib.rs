//! inlet-host: the code that touches the host, shared by the kubelet side and the drivers.
//!
//! # Layout
//! - [`mount`]: the mount layer (bind, tmpfs, overlay, remount, unmount, loop devices): a real Linux
//!   implementation and a recording fake, so mount logic is testable without root.
//! - [`host_path`]: target and staging paths walked and created without following a symlink.
//! - [`names`]: names that become paths (CSI driver names), checked as the API server checks them.
//! - [`records`]: durable JSON records (write, fsync, rename), shared by the local driver and the image engine.
//! - [`crash`]: named crash points (`INLET_CRASH_POINT`) for the kill-anywhere tests.
//! - [`quantity`]: Kubernetes quantities (`64Mi`) as bytes.
//! - [`selinux`]: whether the host runs SELinux, and a file's label.
//! - [`metrics`]: Prometheus metrics: the `/metrics` endpoint, the process collector, upstream's buckets.
//! - [`error`]: the one error type of the drivers and the image engine, and its mapping to gRPC codes.

pub mod crash;
pub mod error;
pub mod host_path;
pub mod metrics;
pub mod mount;
pub mod names;
pub mod quantity;
pub mod records;
pub mod selinux;

pub use error::{Error, Result};
