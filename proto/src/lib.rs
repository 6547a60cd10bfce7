//! Generated gRPC APIs that inlet serves and calls, plus the unix-socket transport they all use.
//!
//! # Layout
//! - [`csi::v1`]: the Container Storage Interface spec v1.9.0 (Identity, Controller, Node; clients and servers).
//! - [`runtime::v1`]: the Kubernetes Container Runtime Interface (RuntimeService, ImageService).
//! - [`containerd`]: containerd's native API: `services::{snapshots, content, images, leases}::v1` and `types`.
//! - [`pluginregistration`]: the kubelet plugin-registration API (`Registration` service, served by plugins).
//! - [`uds`]: dial and listen on unix sockets, the transport of every API above; [`authority`]: served
//!   connections accept clients that send the socket's path as `:authority` (kubelets before 1.26), by
//!   rewriting that header in each connection's HTTP/2 frames.
//! - [`csi_call`]: a CSI call as a record ([`csi_call::CsiCall`]), made from any request message: what the
//!   kubelet side reports of the calls it makes and the drivers' call log of the calls they receive.
//! - [`codec`]: the protobuf codec of every client and server above: prost's, with small buffers.
//! - [`peer_text`]: text a peer controls, escaped and capped before it is printed or logged.
//!
//! The module tree mirrors the protobuf packages. The .proto sources live unmodified under `protos/`, with
//! their licence and `PROVENANCE.md`; `build.rs` compiles them with protox, so no system `protoc` is needed.
//! Unimplemented server methods answer `UNIMPLEMENTED` (default stubs), as the CSI spec asks of optional RPCs.

#[allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/_includes.rs"));
}

pub use generated::{containerd, csi, pluginregistration, runtime};

pub mod authority;
pub mod codec;
pub mod csi_call;
pub mod peer_text;
pub mod uds;
