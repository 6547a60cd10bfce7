//! kubelet-sim against API servers and runtimes, in one test binary: the exact requests hollow nodes make
//! of a mock one (`requests.rs`), hollow nodes joining the kit's real one with bound tokens, and with a
//! node's own credential, and as a Deployment's pods (`hollow_nodes.rs`, `node_credentials.rs`,
//! `hollow_deployment.rs`), the
//! differential test against the kit's real kubelet (`differential.rs`, with `lifecycle.rs` for what pods
//! show and `conform_on_kit.rs` for conform's checks on that kubelet), and kubelet-sim on the kit's CRI-O, containerd 1.6 and 2.1 (`runtimes.rs`). The kit tests take
//! turns: the kit's addresses are fixed (`inlet_testkit::kit::Kit::up`).

mod conform_on_kit;
mod differential;
mod hollow_deployment;
mod hollow_nodes;
mod lifecycle;
mod node_credentials;
mod requests;
mod runtimes;
