//! What the CLI tests share: running the binary; the mount layer they may use and inlet's local driver
//! served on a socket of its own come from `inlet-testkit`.

use std::path::{Path, PathBuf};

pub use inlet_testkit::local::{mounter, serve_local_driver};

/// The `kubelet-sim` binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_kubelet-sim");

/// Runs `kubelet-sim ARGS` with warnings logged: (exit code, or -1 when a signal ended it; stdout; stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    run_logging(args, "warn")
}

/// [`run`] with `RUST_LOG` set to `level`.
pub fn run_logging(args: &[&str], level: &str) -> (i32, String, String) {
    let out = std::process::Command::new(BIN)
        .args(args)
        .env("RUST_LOG", level)
        .output()
        .expect("kubelet-sim runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Everything below `dir`, depth first, without following symlinks.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(entry.path());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&entry.path()));
        }
    }
    out
}

/// The mount points below `root` (real mounts only: the recording mounter of another process shows none).
pub fn mounted_under(root: &Path) -> Vec<PathBuf> {
    walk(root)
        .into_iter()
        .filter(|d| mounter().is_mount_point(d).unwrap_or(false))
        .collect()
}
