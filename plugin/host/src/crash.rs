//! Named crash points, for the tests that kill a driver between any two steps of its work.
//!
//! With `INLET_CRASH_POINT=<name>` in its environment, the process kills itself (SIGKILL: no unwinding, no
//! cleanup, as a node losing power or an OOM kill would) the first time it reaches that point. Without the
//! variable a point costs one comparison with a value read once. The tests restart the driver, let the
//! caller retry as a kubelet would, and check that nothing is lost or left behind.

use std::sync::OnceLock;

/// The environment variable naming the point to crash at.
pub const ENV: &str = "INLET_CRASH_POINT";

/// The drivers' crash points (local, then image), each between two steps whose order matters for recovery.
pub const DRIVER_POINTS: [&str; 12] = [
    // The content of a new volume exists; its record does not yet.
    "volume.content-created",
    // A volume's content is gone; its record is not yet.
    "volume.content-removed",
    // A publication is recorded; nothing is mounted at the target yet.
    "publish.recorded",
    // The target is mounted; the caller has not heard so.
    "publish.mounted",
    // The target is unmounted; the record still lists the publication.
    "unpublish.unmounted",
    // The staging path is recorded; nothing is mounted there yet.
    "stage.recorded",
    // The staging path is mounted; the caller has not heard so.
    "stage.mounted",
    // The staging path is unmounted; the record still says staged.
    "unstage.unmounted",
    // The unstage is recorded; the caller has not heard so.
    "unstage.recorded",
    // An image volume's record is written; nothing is mounted at its target yet.
    "image.recorded",
    // The image volume is mounted; the caller has not heard so.
    "image.mounted",
    // The image volume's target is unmounted; its record and snapshot are not released yet.
    "image.unmounted",
];

/// The kubelet's (the CSI plugin's and kubelet-sim's pod workers'), likewise.
pub const KUBELET_POINTS: [&str; 4] = [
    // vol_data.json is written beside the mount dir; NodePublishVolume is not sent yet.
    "setup.recorded",
    // NodePublishVolume succeeded; the actual state does not know yet.
    "setup.published",
    // NodeUnpublishVolume succeeded; the mount dir and vol_data.json are still there.
    "teardown.unpublished",
    // The pod's sandbox runs; its containers are not created yet.
    "pod.sandbox-started",
];

/// Kills the process here when the environment names this point.
pub fn point(name: &'static str) {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    debug_assert!(
        DRIVER_POINTS.contains(&name) || KUBELET_POINTS.contains(&name),
        "unlisted crash point {name}"
    );
    if AT.get_or_init(|| std::env::var(ENV).ok()).as_deref() == Some(name) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
