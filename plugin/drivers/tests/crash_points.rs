//! Kill the local driver (SIGKILL) at every named crash point in turn ([`inlet_host::crash::DRIVER_POINTS`]),
//! restart it, retry the call that was cut off as a kubelet would, finish the volume's life, and check that
//! nothing is lost or left: no mount under the kubelet dir, no target or staging dir, no volume content,
//! no record. Two lives are run for each point: an ephemeral inline volume (publish, unpublish) and a
//! persistent one (create, stage, publish, unpublish, unstage, delete). Needs root (real mounts: the
//! recording mounter's table dies with the process); otherwise SKIPPED.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inlet_host::crash;
use inlet_host::mount::{LinuxMounter, MountLayer, can_mount};
use inlet_proto::csi::v1 as csi;
use tonic::transport::Channel;

use inlet_testkit::kit;

const BIN: &str = env!("CARGO_BIN_EXE_inlet-plugin");

/// Which driver a life runs against.
#[derive(Clone, Copy)]
enum Kind {
    Local,
    /// The image driver, pulling through cri-fake on `dir/cri.sock`.
    Image,
}

/// The driver under test, killed on drop if still running.
struct Driver {
    dir: PathBuf,
    kind: Kind,
    child: Child,
}

impl Driver {
    fn start(dir: &Path, kind: Kind, crash_at: Option<&str>) -> Self {
        std::fs::create_dir_all(dir.join("kubelet")).expect("kubelet dir");
        let mut command = Command::new(BIN);
        match kind {
            Kind::Local => {
                command.args(["serve", "--driver", "local", "--name", "local.inlet.dev"])
            }
            Kind::Image => command
                .args(["serve", "--driver", "image", "--name", "image.inlet.dev"])
                .args(["--storage", "containers-storage", "--runtime-endpoint"])
                .arg(format!("unix://{}", dir.join("cri.sock").display())),
        };
        command
            .args(["--node-id", "n1"])
            .arg(format!(
                "--endpoint=unix://{}",
                dir.join("csi.sock").display()
            ))
            .arg(format!("--state-dir={}", dir.join("state").display()))
            .arg(format!("--kubelet-dir={}", dir.join("kubelet").display()))
            .env_remove(crash::ENV)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(point) = crash_at {
            command.env(crash::ENV, point);
        }
        Self {
            dir: dir.to_path_buf(),
            kind,
            child: command.spawn().expect("the driver starts"),
        }
    }

    async fn channel(&self) -> Channel {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(channel) = inlet_proto::uds::connect(&self.dir.join("csi.sock")).await {
                // A socket left by a killed driver accepts nothing: probe before use.
                let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
                if identity.probe(csi::ProbeRequest {}).await.is_ok() {
                    return channel;
                }
            }
            assert!(Instant::now() < deadline, "the driver does not answer");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// True when the driver process is gone (a call cut off by its death may return a moment before the
    /// process is reaped, so a failed call waits a little to tell).
    async fn died(&mut self, call_failed: bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(if call_failed { 2 } else { 0 });
        loop {
            if self.child.try_wait().ok().flatten().is_some() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        kit::terminate(&mut self.child);
    }
}

/// One CSI call of a volume's life.
#[derive(Clone)]
enum Step {
    Create(csi::CreateVolumeRequest),
    Stage(csi::NodeStageVolumeRequest),
    Publish(csi::NodePublishVolumeRequest),
    Unpublish(csi::NodeUnpublishVolumeRequest),
    Unstage(csi::NodeUnstageVolumeRequest),
    Delete(csi::DeleteVolumeRequest),
}

async fn call(channel: Channel, step: Step) -> Result<(), tonic::Status> {
    let mut node = csi::node_client::NodeClient::new(channel.clone());
    let mut controller = csi::controller_client::ControllerClient::new(channel);
    match step {
        Step::Create(r) => controller.create_volume(r).await.map(drop),
        Step::Stage(r) => node.node_stage_volume(r).await.map(drop),
        Step::Publish(r) => node.node_publish_volume(r).await.map(drop),
        Step::Unpublish(r) => node.node_unpublish_volume(r).await.map(drop),
        Step::Unstage(r) => node.node_unstage_volume(r).await.map(drop),
        Step::Delete(r) => controller.delete_volume(r).await.map(drop),
    }
}

/// A volume's life: its calls, given the kubelet dir.
type Life = dyn Fn(&Path) -> Vec<Step>;

fn capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

fn ephemeral_life(kubelet: &Path) -> Vec<Step> {
    let id = "csi-ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12";
    let target = kubelet.join("pods/u1/volumes/kubernetes.io~csi/scratch/mount");
    vec![
        Step::Publish(csi::NodePublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability()),
            volume_context: HashMap::from([(
                "csi.storage.k8s.io/ephemeral".to_string(),
                "true".to_string(),
            )]),
            ..Default::default()
        }),
        Step::Unpublish(csi::NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        }),
    ]
}

/// An image volume's publish and unpublish; `writable` gets a copy-on-write volume of its own.
fn image_life(kubelet: &Path, writable: bool) -> Vec<Step> {
    let target = kubelet.join("pods/u3/volumes/kubernetes.io~csi/site/mount");
    vec![
        Step::Publish(csi::NodePublishVolumeRequest {
            volume_id: "csi-image".into(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability()),
            readonly: !writable,
            volume_context: HashMap::from([("image".to_string(), format!("{IMAGE}:v1"))]),
            ..Default::default()
        }),
        Step::Unpublish(csi::NodeUnpublishVolumeRequest {
            volume_id: "csi-image".into(),
            target_path: target.display().to_string(),
        }),
    ]
}

fn persistent_life(kubelet: &Path) -> Vec<Step> {
    let id = "pv-crash";
    let staging = kubelet.join("plugins/kubernetes.io/csi/local.inlet.dev/abc/globalmount");
    let target = kubelet.join("pods/u2/volumes/kubernetes.io~csi/pv-crash/mount");
    vec![
        Step::Create(csi::CreateVolumeRequest {
            name: id.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability()],
            ..Default::default()
        }),
        Step::Stage(csi::NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        }),
        Step::Publish(csi::NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        }),
        Step::Unpublish(csi::NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        }),
        Step::Unstage(csi::NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
        }),
        Step::Delete(csi::DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        }),
    ]
}

/// What is left once a life is over: mount points, non-empty leaf dirs under the kubelet dir, content,
/// records. Empty when nothing leaked.
fn leftovers(dir: &Path) -> Vec<String> {
    let mut left = Vec::new();
    for entry in walkdir::WalkDir::new(dir.join("kubelet")).min_depth(1) {
        let entry = entry.expect("walk");
        let path = entry.path();
        if LinuxMounter.is_mount_point(path).unwrap_or(true) {
            left.push(format!("mounted: {}", path.display()));
        }
        let last = path.file_name().and_then(|n| n.to_str());
        if matches!(last, Some("mount" | "globalmount")) {
            left.push(format!("not removed: {}", path.display()));
        }
    }
    for sub in ["state/volumes", "state/records/volumes"] {
        for entry in std::fs::read_dir(dir.join(sub))
            .into_iter()
            .flatten()
            .flatten()
        {
            left.push(format!("in {sub}: {}", entry.file_name().to_string_lossy()));
        }
    }
    let image_state = inlet_image::leftovers(&dir.join("state"));
    left.extend(
        image_state
            .iter()
            .map(|p| format!("image state: {}", p.display())),
    );
    left
}

const IMAGE: &str = "example.inlet.dev/site";

/// cri-fake on `dir/cri.sock`, holding a small image, served by this test (it outlives driver crashes).
async fn serve_runtime(dir: &Path) -> tokio::sync::oneshot::Sender<()> {
    let layout = dir.join("layout");
    cri_fake::layout::ImageBuilder::new()
        .file("index.html", "hello")
        .layer()
        .file("data/more.txt", "more")
        .write_layout(&layout, "v1")
        .expect("image");
    let runtime = std::sync::Arc::new(
        cri_fake::FakeRuntime::new(dir.join("cri"), Default::default()).expect("cri-fake"),
    );
    runtime
        .images()
        .import_layout(&layout, IMAGE)
        .expect("import");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let socket = dir.join("cri.sock");
    tokio::spawn(
        async move { cri_fake::serve(&socket, runtime, async { drop(stopped.await) }).await },
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dir.join("cri.sock").exists() {
        assert!(Instant::now() < deadline, "cri-fake did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop
}

/// Runs `life` with the driver set to crash at `point`; true when it crashed there.
async fn live_through(point: &str, kind: Kind, life: &Life) -> bool {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("kubelet")).expect("kubelet dir");
    let _runtime = match kind {
        Kind::Image => Some(serve_runtime(dir.path()).await),
        Kind::Local => None,
    };
    let steps = life(&dir.path().join("kubelet"));
    let mut driver = Driver::start(dir.path(), kind, Some(point));
    let mut crashed = false;
    for step in steps {
        // The kubelet retries a call until it succeeds; a connection lost mid-call is one more retry.
        let mut attempts = 0;
        loop {
            attempts += 1;
            assert!(attempts < 5, "{point}: a call keeps failing");
            let result = call(driver.channel().await, step.clone()).await;
            if driver.died(result.is_err()).await {
                crashed = true;
                driver = Driver::start(dir.path(), driver.kind, None);
                continue;
            }
            if let Err(status) = result {
                panic!("{point}: {status:?}");
            }
            break;
        }
    }
    drop(driver);
    let left = leftovers(dir.path());
    assert!(
        left.is_empty(),
        "crashed at {point}, then finished: left {left:#?}"
    );
    crashed
}

#[tokio::test(flavor = "multi_thread")]
async fn a_driver_killed_at_any_crash_point_loses_and_leaks_nothing() {
    if !can_mount() {
        eprintln!("SKIPPED crash points: needs root for real mounts");
        return;
    }
    let lives: [(Kind, &Life); 4] = [
        (Kind::Local, &ephemeral_life),
        (Kind::Local, &persistent_life),
        (Kind::Image, &|k| image_life(k, false)),
        (Kind::Image, &|k| image_life(k, true)),
    ];
    let mut reached = BTreeSet::new();
    for point in crash::DRIVER_POINTS {
        for (kind, life) in &lives {
            if live_through(point, *kind, *life).await {
                reached.insert(point);
            }
        }
    }
    let missed: Vec<_> = crash::DRIVER_POINTS
        .iter()
        .filter(|p| !reached.contains(*p))
        .collect();
    assert!(
        missed.is_empty(),
        "crash points no life reached: {missed:?}"
    );
}
