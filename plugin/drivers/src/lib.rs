//! inlet-plugin: inlet's CSI drivers, served out of tree on a unix socket, as a driver author reads them.
//!
//! # Layout
//! - [`local`]: the `local` driver: volumes as directories (or loop-attached files for raw block) under a
//!   state dir, with snapshots, clones, expansion, attach, staging and KEP-596 ephemeral inline volumes.
//! - [`image`]: the `image` driver: container images as volumes, through the image engine (`inlet-image`).
//! - [`keys`], [`validate`]: the volume-context keys and the request checks both drivers share; each check
//!   names the request field at fault.
//! - [`server`]: serving a driver's CSI services on a unix socket; [`call_log`]: a record of the Node
//!   calls a driver receives (`--call-log`), in the kubelet-side report's form (`inlet_proto::csi_call`).
//! - [`metrics`]: `--metrics-address`: `csi_operations_seconds` timed around the services, the published
//!   volumes by mode.
//! - [`health`]: the liveness check (`/healthz` beside `/metrics`, and `inlet-plugin probe`): a Probe
//!   through the driver's own socket, as the livenessprobe sidecar makes it.
//! - [`registration`]: the kubelet plugin-watcher registration (`--registration-dir`), no sidecar needed.
//!
//! Host effects (mounts, confined paths, records, crash points) come from `inlet-host`; nothing here
//! imports the kubelet side (`inlet-volume`). The `inlet-plugin` binary (`src/main.rs`) is a thin CLI over
//! [`server::serve_csi`]; its flags are in this crate's README.

pub mod call_log;
pub mod health;
pub mod image;
pub mod keys;
pub mod local;
pub mod metrics;
pub mod registration;
pub mod server;
pub mod validate;
