//! What the CLI tests share: running the binary, the mount layer they may use, and inlet's local driver
//! served from the test process on a socket of its own (an external driver, as a user's would be).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use inlet_host::mount::{LinuxMounter, MountLayer, RecordingMounter, can_mount};
use inlet_plugin::local::{LocalConfig, LocalDriver, LocalService};

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

/// Real mounts as root, the recording mounter otherwise.
pub fn mounter() -> Arc<dyn MountLayer> {
    if can_mount() {
        Arc::new(LinuxMounter)
    } else {
        Arc::new(RecordingMounter::new())
    }
}

/// inlet's local driver `name` serving in this process on `dir/<name>.sock`, for pods under `root`.
pub async fn serve_local_driver(dir: &Path, root: &Path, name: &str) -> PathBuf {
    let driver_socket = dir.join(format!("{name}.sock"));
    let config = LocalConfig {
        name: name.into(),
        node_id: "ext-node".into(),
        state_dir: dir.join(format!("{name}-state")),
        kubelet_dir: root.to_path_buf(),
        capacity_bytes: 1 << 30,
        max_volume_bytes: 1 << 30,
        default_volume_bytes: 8 << 20,
        enable_attach: false,
        ephemeral_default: false,
        volume_mount_group: false,
    };
    let incoming = inlet_proto::uds::listen(&driver_socket).await.unwrap();
    let service = LocalService::new(LocalDriver::open(config, mounter()).unwrap());
    let socket = driver_socket.clone();
    tokio::spawn(async move {
        inlet_plugin::server::serve_csi_on(
            incoming,
            &socket,
            service,
            true,
            None,
            std::future::pending(),
        )
        .await
    });
    driver_socket
}
