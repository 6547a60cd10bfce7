//! inlet-testkit: what inlet's integration tests share, as a dev-only crate (never a dependency of what
//! ships).
//!
//! # Layout
//! - [`kit`]: the kit beside the project (`../shared/kit`, or `$INLET_KIT`): a real single-node cluster
//!   (kubelet, API server, containerd or CRI-O) brought up and taken down by a test, one at a time per
//!   test process; its binaries (kubectl, csi-sanity); stopping child processes with SIGTERM first.
//! - [`local`]: inlet's local driver served from the test process on a socket of its own (an external
//!   driver, as a user's would be), and the mount layer a test may use (real as root).
//! - [`images`]: the container images `deploy/build-images.sh` builds, for the tests that run them.
//! - [`hostile`]: a CSI driver that lies (a symlink for a target, a publish that never answers, an error
//!   meant for a terminal), for what the kubelet side and conform must refuse or survive.
//!
//! The fixtures a benchmark also needs (a private containerd, a private registry, images built here) are
//! cri-fake's (`cri_fake::containerd`, `cri_fake::registry`, `cri_fake::layout`), since `kubelet-sim bench`
//! runs them too.

pub mod hostile;
pub mod images;
pub mod kit;
pub mod local;
