//! What the CLI tests share: running the binary; the mount layer they may use and inlet's local driver
//! served on a socket of its own come from `inlet-testkit`.

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
