//! kubelet-sim: a simulated kubelet that runs CSI drivers through exactly what a kubelet does with inline
//! (KEP-596) and persistent volumes, in seconds, without a cluster: real unix sockets to the drivers and to
//! a CRI runtime, real mounts when root, an embedded in-memory API.
//!
//! # Layout
//! - [`api`]: the embedded API (objects, admission with the inline-driver policy, manifests, events, tokens).
//! - [`bench`]: `kubelet-sim bench` (csi-ephemeral, pods): figures, JSON and an SVG chart.
//! - [`conform`]: `kubelet-sim conform`, the kubelet-level conformance suite for any CSI driver.
//! - [`cluster`]: `--kubeconfig`: the nodes as hollow nodes of a real cluster (Nodes, Leases, pods, status,
//!   events, CSINode, only the referenced Secrets), with the `kube` crate.
//! - [`node`]: one simulated kubelet: desired/actual state, populator, reconciler, operations with backoff,
//!   pod workers, the `VolumeHost` for plugins, and the CSI driver registry.
//! - [`controllers`]: the attach/detach controller and the external attacher (VolumeAttachments), the PV
//!   binder, the local driver's pre-provisioning, the round-robin scheduler.
//! - [`drivers`]: `--driver NAME=local|image|unix:///PATH`, started for a node by `DriverArg::start`;
//!   [`images`]: where a simulation's images come from; [`cri`]: the CRI client and the in-process
//!   cri-fake; [`specs`]: pod volume -> spec.
//! - [`metrics`]: `--metrics-address`: the kubelet's storage metrics (upstream's names and labels).
//! - [`sim`]: a whole simulated cluster; [`report`]: the JSON report and the summary table;
//!   [`deflated`]: the report's logs of calls and reads, kept deflated;
//!   [`signals`]: SIGINT/SIGTERM for a run (tear down, then exit 128+N; a second signal exits at once).
//! - `main.rs`: the `kubelet-sim run` CLI.

pub mod api;
pub mod bench;
pub mod cluster;
pub mod conform;
pub mod controllers;
pub mod cri;
pub mod deflated;
pub mod drivers;
pub mod images;
pub mod metrics;
pub mod node;
pub mod operations;
pub mod report;
pub mod signals;
pub mod sim;
pub mod specs;
