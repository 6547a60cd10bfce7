//! kubelet-sim: a simulated kubelet (volume manager, pod workers, an in-memory API) that runs CSI drivers
//! through exactly what a kubelet would do with inline and persistent volumes.
//!
//! # Layout
//! Not built yet: this crate reserves its place in the workspace. The inline-volume contract issue (#3) fills
//! it; ARCHITECTURE.md describes the planned shape (desired/actual state, populator, reconciler, pod workers).
