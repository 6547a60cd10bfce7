//! A local driver served on a real unix socket in a temp dir, with gRPC clients connected to it.
//!
//! Mounts are real when the tests run as root and recorded by the fake otherwise; checks that only real
//! mounts can show print a `SKIPPED` line instead of passing silently. Dropping the fixture unmounts and
//! detaches whatever is left under its temp dir, so a failing test leaks nothing onto the host.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode};
use inlet_host::mount::{LinuxMounter, MountLayer, RecordingMounter, can_mount};
use inlet_plugin::local::{LocalConfig, LocalDriver, LocalService};
use inlet_plugin::server::serve_csi;
use inlet_proto::csi::v1::{
    self as csi, controller_client::ControllerClient, identity_client::IdentityClient,
    node_client::NodeClient,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

pub const MI: i64 = 1 << 20;
pub const GI: i64 = 1 << 30;

/// Options a test may change; the defaults are a 1Gi driver with 256Mi volumes at most.
#[derive(Clone)]
pub struct Options {
    pub enable_attach: bool,
    pub ephemeral_default: bool,
    pub capacity: u64,
    pub max_volume: u64,
    pub default_volume: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            enable_attach: false,
            ephemeral_default: false,
            capacity: 1 << 30,
            max_volume: 256 << 20,
            default_volume: 16 << 20,
        }
    }
}

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
    pub mounter: Arc<dyn MountLayer>,
    options: Options,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

impl Fixture {
    pub async fn start() -> Self {
        Self::with(Options::default()).await
    }

    /// A driver whose state dir is a tmpfs of `bytes` (a small disk that fills up). Needs root.
    pub async fn on_small_disk(bytes: u64) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        LinuxMounter.tmpfs(&state, bytes).expect("a small tmpfs");
        Self::serve(dir, Arc::new(LinuxMounter), Options::default()).await
    }

    /// CreateVolume that must succeed; the new volume's id.
    pub async fn create_volume_id(&mut self, request: csi::CreateVolumeRequest) -> String {
        let reply = self.controller.create_volume(request).await.unwrap();
        reply.into_inner().volume.unwrap().volume_id
    }

    pub async fn with(options: Options) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mounter: Arc<dyn MountLayer> = match can_mount() {
            true => Arc::new(LinuxMounter),
            false => Arc::new(RecordingMounter::new()),
        };
        Self::serve(dir, mounter, options).await
    }

    async fn serve(dir: tempfile::TempDir, mounter: Arc<dyn MountLayer>, options: Options) -> Self {
        let config = LocalConfig {
            name: "local.inlet.dev".into(),
            node_id: "node-1".into(),
            state_dir: dir.path().join("state"),
            kubelet_dir: dir.path().join("kubelet"),
            capacity_bytes: options.capacity,
            max_volume_bytes: options.max_volume,
            default_volume_bytes: options.default_volume,
            enable_attach: options.enable_attach,
            ephemeral_default: options.ephemeral_default,
            volume_mount_group: false,
        };
        std::fs::create_dir_all(&config.kubelet_dir).unwrap();
        let driver = LocalDriver::open(config, Arc::clone(&mounter)).expect("driver opens");
        let socket = dir.path().join("csi.sock");
        let (stop, stopped) = oneshot::channel::<()>();
        let service = LocalService::new(driver);
        let serve_socket = socket.clone();
        let server = tokio::spawn(async move {
            serve_csi(&serve_socket, service, true, async { drop(stopped.await) })
                .await
                .expect("server runs");
        });
        let channel = connect_when_ready(&socket).await;
        Self {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
            dir,
            mounter,
            options,
            stop: Some(stop),
            server: Some(server),
        }
    }

    /// Stops the server gracefully and starts a new driver on the same state dir and mount table.
    pub async fn restart(mut self) -> Self {
        self.stop.take().unwrap().send(()).unwrap();
        self.server.take().unwrap().await.unwrap();
        assert!(
            !self.socket().exists(),
            "a graceful stop removes the socket"
        );
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let mounter = Arc::clone(&self.mounter);
        let options = self.options.clone();
        drop(self);
        Self::serve(dir, mounter, options).await
    }

    /// Ends the server as a crash would: the task is aborted and the socket file stays behind.
    pub async fn crash_and_restart(mut self) -> Self {
        let server = self.server.take().unwrap();
        server.abort();
        let _ = server.await;
        assert!(
            self.socket().exists(),
            "a crash leaves the socket file behind"
        );
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let mounter = Arc::clone(&self.mounter);
        let options = self.options.clone();
        drop(self);
        Self::serve(dir, mounter, options).await
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("csi.sock")
    }

    pub fn real_mounts(&self) -> bool {
        can_mount()
    }

    /// Prints why a real-mount check is skipped; true when the caller should skip it.
    pub fn skip_without_root(&self, what: &str) -> bool {
        if !self.real_mounts() {
            eprintln!(
                "SKIPPED {what}: needs root for real mounts (the recording mounter ran instead)"
            );
        }
        !self.real_mounts()
    }

    /// A path under the kubelet dir, as a kubelet would pass it (`pods/<uid>/volumes/.../mount`).
    pub fn kubelet_path(&self, rel: &str) -> String {
        self.dir
            .path()
            .join("kubelet")
            .join(rel)
            .display()
            .to_string()
    }

    pub fn state_path(&self, rel: &str) -> PathBuf {
        self.dir.path().join("state").join(rel)
    }

    /// Content directories (or block files) of every volume the driver holds.
    pub fn volume_contents(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.state_path("volumes"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    pub fn is_mounted(&self, path: &str) -> bool {
        self.mounter.is_mount_point(Path::new(path)).unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if can_mount() {
            cleanup_host(self.dir.path());
        }
    }
}

/// Unmounts (deepest first) every mount under `dir` and detaches loop devices backed by files under it.
fn cleanup_host(dir: &Path) {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(&dir))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for mount in mounts {
        let _ = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH);
    }
    if let Ok(out) = std::process::Command::new("losetup").arg("-a").output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if line.contains(&*dir.to_string_lossy()) {
                if let Some(device) = line.split(':').next() {
                    let _ = std::process::Command::new("losetup")
                        .args(["-d", device])
                        .status();
                }
            }
        }
    }
}

async fn connect_when_ready(socket: &Path) -> Channel {
    for _ in 0..200 {
        if let Ok(channel) = inlet_proto::uds::connect(socket).await {
            return channel;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("the driver never listened on {}", socket.display());
}

// ---- request builders ----

pub fn mount_cap(mode: Mode) -> csi::VolumeCapability {
    mount_cap_flags(mode, &[])
}

pub fn mount_cap_flags(mode: Mode, flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        })),
    }
}

pub fn block_cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

pub fn rwo() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

pub fn create(name: &str, bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: (bytes > 0).then_some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![rwo()],
        ..Default::default()
    }
}

pub fn stage(
    volume_id: &str,
    staging: &str,
    cap: csi::VolumeCapability,
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn publish(
    volume_id: &str,
    staging: &str,
    target: &str,
    cap: csi::VolumeCapability,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.into(),
        target_path: target.into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

/// An inline ephemeral publish as the kubelet sends it: no staging path, the ephemeral key set.
pub fn publish_ephemeral(
    volume_id: &str,
    target: &str,
    attributes: &[(&str, &str)],
) -> csi::NodePublishVolumeRequest {
    let mut context: HashMap<String, String> = attributes
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    context.insert("csi.storage.k8s.io/ephemeral".into(), "true".into());
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.into(),
        volume_capability: Some(rwo()),
        volume_context: context,
        ..Default::default()
    }
}

pub fn unpublish(volume_id: &str, target: &str) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.into(),
    }
}

pub fn unstage(volume_id: &str, staging: &str) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.into(),
    }
}

/// Asserts a call failed with `code` and a message containing `needle`.
#[track_caller]
pub fn assert_status<T: std::fmt::Debug>(
    result: Result<tonic::Response<T>, tonic::Status>,
    code: tonic::Code,
    needle: &str,
) {
    match result {
        Ok(reply) => panic!("expected {code:?} ({needle}), got OK: {reply:?}"),
        Err(status) => {
            assert_eq!(status.code(), code, "message: {}", status.message());
            assert!(
                status.message().contains(needle),
                "{:?} does not mention {needle:?}",
                status.message()
            );
        }
    }
}
