//! cri-fake: a fake CRI runtime (`runtime.v1` RuntimeService and ImageService on a unix socket) that real
//! CRI clients accept, for scenarios without a container runtime.
//!
//! # Layout
//! Not built yet: this crate reserves its place in the workspace. The inline-volume contract issue (#3) fills it.
