//! inlet's local driver served from the test process, and the mount layer a test may use.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use inlet_host::mount::{LinuxMounter, MountLayer, RecordingMounter, can_mount};
use inlet_plugin::local::{LocalConfig, LocalDriver, LocalService};

/// Real mounts as root, the recording mounter otherwise.
pub fn mounter() -> Arc<dyn MountLayer> {
    if can_mount() {
        Arc::new(LinuxMounter)
    } else {
        Arc::new(RecordingMounter::new())
    }
}

/// inlet's local driver `name` serving in this process on `dir/<name>.sock`, for pods under `root`; it
/// serves until the test's runtime ends.
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
    let incoming = inlet_proto::uds::listen(&driver_socket)
        .await
        .expect("the driver's socket");
    let service =
        LocalService::new(LocalDriver::open(config, mounter()).expect("the driver opens"));
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
