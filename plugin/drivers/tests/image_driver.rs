//! The `image` CSI driver over a real socket, with cri-fake (in-process, its images in containers/storage's
//! layout) as the runtime: what standard CSI tools ask of a node-only driver, request validation that names
//! the field at fault, idempotency, pull policies, slow pulls past the caller's budget, a writable volume on a
//! full disk, and secrets kept out of every message. Mounts are real as root and recorded otherwise.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cri_fake::FakeRuntime;
use cri_fake::faults::Fault;
use cri_fake::layout::ImageBuilder;
use inlet_host::mount::{LinuxMounter, MountLayer, RecordingMounter, can_mount};
use inlet_image::{Engine, EngineConfig};
use inlet_plugin::image::{ImageDriverConfig, ImageService};
use inlet_plugin::server::serve_csi;
use inlet_proto::csi::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};
use inlet_proto::csi::v1::{
    self as csi, controller_client::ControllerClient, identity_client::IdentityClient,
    node_client::NodeClient,
};
use tonic::Code;
use tonic::transport::Channel;

const IMAGE: &str = "example.inlet.dev/site:v1";

struct Fixture {
    dir: tempfile::TempDir,
    runtime: Arc<FakeRuntime>,
    node: NodeClient<Channel>,
    identity: IdentityClient<Channel>,
    controller: ControllerClient<Channel>,
    mounter: Arc<dyn MountLayer>,
    _stop: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Fixture {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// The fixture, with `prepare` given the driver's state dir before the engine opens it.
    async fn start_with(prepare: impl FnOnce(&std::path::Path)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let layout = dir.path().join("layout");
        ImageBuilder::new()
            .file("index.html", "hello")
            .write_layout(&layout, "v1")
            .unwrap();
        ImageBuilder::new().write_layout(&layout, "empty").unwrap();
        let runtime =
            Arc::new(FakeRuntime::new(dir.path().join("cri"), Default::default()).unwrap());
        runtime
            .images()
            .import_layout(&layout, "example.inlet.dev/site")
            .unwrap();
        let cri_socket = dir.path().join("cri.sock");
        let (stop_cri, cri_stopped) = tokio::sync::oneshot::channel::<()>();
        let (serving, socket) = (Arc::clone(&runtime), cri_socket.clone());
        tokio::spawn(async move {
            cri_fake::serve(&socket, serving, async { drop(cri_stopped.await) }).await
        });
        wait_for(&cri_socket).await;
        let mounter: Arc<dyn MountLayer> = if can_mount() {
            Arc::new(LinuxMounter)
        } else {
            Arc::new(RecordingMounter::new())
        };
        let state = dir.path().join("state");
        prepare(&state);
        let engine = Engine::start(
            &EngineConfig::new(&cri_socket, &state),
            Arc::clone(&mounter),
        )
        .await
        .unwrap();
        let config = ImageDriverConfig {
            name: "image.inlet.dev".into(),
            node_id: "node-1".into(),
            kubelet_dir: dir.path().join("kubelet"),
            state_dir: state,
            pull_wait: Duration::from_millis(200),
        };
        std::fs::create_dir_all(dir.path().join("kubelet")).unwrap();
        let csi_socket = dir.path().join("csi.sock");
        let (stop_csi, csi_stopped) = tokio::sync::oneshot::channel::<()>();
        let (service, socket) = (ImageService::new(config, engine), csi_socket.clone());
        tokio::spawn(async move {
            serve_csi(&socket, service, true, async { drop(csi_stopped.await) }).await
        });
        wait_for(&csi_socket).await;
        let channel = inlet_proto::uds::connect(&csi_socket).await.unwrap();
        Self {
            node: NodeClient::new(channel.clone()),
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel),
            runtime,
            mounter,
            dir,
            _stop: vec![stop_csi, stop_cri],
        }
    }

    fn target(&self, name: &str) -> String {
        self.dir
            .path()
            .join("kubelet/pods/p/volumes")
            .join(name)
            .display()
            .to_string()
    }

    fn publish(&self, target: &str, attributes: &[(&str, &str)]) -> csi::NodePublishVolumeRequest {
        csi::NodePublishVolumeRequest {
            volume_id: "csi-abc".into(),
            target_path: target.into(),
            volume_capability: Some(mount_capability(Mode::SingleNodeWriter)),
            volume_context: attributes
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .chain([(
                    "csi.storage.k8s.io/ephemeral".to_string(),
                    "true".to_string(),
                )])
                .collect(),
            ..Default::default()
        }
    }

    fn pulls(&self) -> usize {
        self.runtime
            .calls()
            .iter()
            .filter(|c| c.method == "PullImage")
            .count()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Unmount whatever a failing test left, deepest first.
        let mut left: Vec<_> = walk(self.dir.path())
            .into_iter()
            .filter(|p| self.mounter.is_mount_point(p).unwrap_or(false))
            .collect();
        left.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for p in left {
            let _ = self.mounter.unmount(&p);
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&e.path()));
        }
    }
    out
}

async fn wait_for(socket: &std::path::Path) {
    for _ in 0..200 {
        if socket.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never appeared", socket.display());
}

fn mount_capability(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

#[tokio::test]
async fn answers_what_csi_tools_ask_of_a_node_only_driver() {
    let mut f = Fixture::start().await;
    let caps = f
        .controller
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(caps.capabilities.is_empty());
    let plugin = f
        .identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap();
    assert!(plugin.into_inner().capabilities.is_empty());
    let probe = f
        .identity
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    let create = f
        .controller
        .create_volume(csi::CreateVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(create.code(), Code::Unimplemented);
    let node = f
        .node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap();
    assert!(node.into_inner().capabilities.is_empty(), "no staging");
}

#[tokio::test]
async fn bad_requests_name_the_field_at_fault() {
    let mut f = Fixture::start().await;
    let target = f.target("v");
    let mut block = f.publish(&target, &[("image", IMAGE)]);
    block.volume_capability = Some(csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    });
    let mut persistent_rw = f.publish(&target, &[]);
    persistent_rw.volume_id = IMAGE.into();
    persistent_rw.volume_context.clear();
    let cases = [
        (f.publish(&target, &[]), "the \"image\" attribute"),
        (block, "unable to mount as a block device"),
        (
            persistent_rw,
            "AccessMode of PV can be only ReadOnlyMany or ReadOnlyOnce",
        ),
        (
            f.publish(&target, &[("image", "Not An Image")]),
            "is not an image reference",
        ),
        (
            f.publish(&target, &[("image", IMAGE), ("pullPolicy", "Sometimes")]),
            "volume_context.pullPolicy",
        ),
        (
            f.publish(&target, &[("image", IMAGE), ("metadata", "yes")]),
            "volume_context.metadata",
        ),
        (
            f.publish("/etc/passwd", &[("image", IMAGE)]),
            "outside the kubelet dir",
        ),
    ];
    for (request, text) in cases {
        let err = f.node.node_publish_volume(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
        assert!(
            err.message().contains(text),
            "{:?} lacks {text:?}",
            err.message()
        );
    }
    let mut secret = f.publish(&target, &[("image", IMAGE)]);
    secret.secrets = HashMap::from([(".dockerconfigjson".into(), "hunter2-not-json".into())]);
    let err = f.node.node_publish_volume(secret).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("secrets[.dockerconfigjson]"),
        "{}",
        err.message()
    );
    assert!(
        !err.message().contains("hunter2"),
        "a secret value reached the message"
    );
    assert_eq!(f.pulls(), 0, "nothing was pulled for a bad request");
}

#[tokio::test]
async fn publish_and_unpublish_are_idempotent() {
    let mut f = Fixture::start().await;
    let target = f.target("v");
    let mut request = f.publish(&target, &[("image", IMAGE)]);
    request.readonly = true;
    f.node.node_publish_volume(request.clone()).await.unwrap();
    f.node.node_publish_volume(request.clone()).await.unwrap();
    assert!(
        f.mounter
            .is_mount_point(std::path::Path::new(&target))
            .unwrap()
    );
    let mut other = request.clone();
    other.readonly = false;
    let err = f.node.node_publish_volume(other).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{}", err.message());
    let unpublish = csi::NodeUnpublishVolumeRequest {
        volume_id: "csi-abc".into(),
        target_path: target.clone(),
    };
    f.node
        .node_unpublish_volume(unpublish.clone())
        .await
        .unwrap();
    f.node.node_unpublish_volume(unpublish).await.unwrap();
    assert!(
        !std::path::Path::new(&target).exists(),
        "the target dir is removed"
    );
    assert!(inlet_image::leftovers(&f.dir.path().join("state")).is_empty());
}

/// A writable volume's upper dir lives in the driver's state dir: on a full disk its publish is
/// RESOURCE_EXHAUSTED naming the cause, with nothing mounted or left; once published, the pod's writes end
/// in ENOSPC and the unpublish still frees everything.
#[tokio::test]
async fn a_writable_volume_on_a_full_disk_is_resource_exhausted_and_leaves_nothing() {
    if !can_mount() {
        println!("SKIPPED (not root: a small tmpfs is the full disk)");
        return;
    }
    let f = Fixture::start_with(|state| {
        std::fs::create_dir_all(state).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            state,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=1m"),
        )
        .unwrap();
    })
    .await;
    let state = f.dir.path().join("state");
    let filler = state.join("filler");
    let fill = |path: &std::path::Path| {
        let mut file = std::fs::File::create(path).unwrap();
        let block = vec![0u8; 64 << 10];
        loop {
            if let Err(e) = std::io::Write::write_all(&mut file, &block) {
                return e.raw_os_error();
            }
        }
    };
    assert_eq!(fill(&filler), Some(nix::libc::ENOSPC));
    let target = f.target("w");
    let request = f.publish(&target, &[("image", IMAGE)]);
    let err = f
        .node
        .clone()
        .node_publish_volume(request.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(
        err.message().contains("No space left on device"),
        "{}",
        err.message()
    );
    let target_path = std::path::Path::new(&target);
    assert!(!target_path.exists() || !f.mounter.is_mount_point(target_path).unwrap());
    let left = inlet_image::leftovers(&state);
    assert!(left.is_empty(), "nothing left: {left:?}");
    // Room again: the volume is published, and the pod fills the disk through it.
    std::fs::remove_file(&filler).unwrap();
    f.node.clone().node_publish_volume(request).await.unwrap();
    assert_eq!(fill(&target_path.join("big")), Some(nix::libc::ENOSPC));
    let unpublish = csi::NodeUnpublishVolumeRequest {
        volume_id: "csi-abc".into(),
        target_path: target.clone(),
    };
    f.node
        .clone()
        .node_unpublish_volume(unpublish)
        .await
        .unwrap();
    assert!(!target_path.exists(), "the target dir is removed");
    assert!(inlet_image::leftovers(&state).is_empty(), "nothing left");
    let free = nix::sys::statvfs::statvfs(&state).unwrap();
    assert!(
        free.blocks_available() * 2 > free.blocks(),
        "the upper dir's data is gone with the volume"
    );
}

#[tokio::test]
async fn pull_policies_and_images_with_nothing_to_mount() {
    let mut f = Fixture::start().await;
    let never = f.publish(
        &f.target("a"),
        &[
            ("image", "example.inlet.dev/absent:v1"),
            ("pullPolicy", "Never"),
        ],
    );
    let err = f.node.node_publish_volume(never).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message()
            .contains("is not present with pull policy of Never"),
        "{}",
        err.message()
    );
    let empty = f.publish(&f.target("b"), &[("image", "example.inlet.dev/site:empty")]);
    let err = f.node.node_publish_volume(empty).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("has no layers"), "{}", err.message());
    assert!(
        !std::path::Path::new(&f.target("b")).exists(),
        "a failed publish leaves no target dir"
    );
    assert_eq!(f.pulls(), 0, "IfNotPresent found both images on the node");
    let always = f.publish(&f.target("c"), &[("image", IMAGE), ("pullAlways", "TRUE")]);
    f.node.node_publish_volume(always).await.unwrap();
    assert_eq!(f.pulls(), 1, "warm-metal's pullAlways pulls");
}

#[tokio::test]
async fn a_slow_pull_goes_on_past_the_callers_budget() {
    let mut f = Fixture::start().await;
    f.runtime.set_fault(
        "PullImage",
        Fault {
            delay: Some(Duration::from_millis(800)),
            ..Default::default()
        },
    );
    let request = f.publish(
        &f.target("v"),
        &[("image", IMAGE), ("pullPolicy", "Always")],
    );
    let err = f
        .node
        .node_publish_volume(request.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{}", err.message());
    assert!(
        err.message().contains("in the background"),
        "{}",
        err.message()
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    f.node.node_publish_volume(request).await.unwrap();
    assert_eq!(f.pulls(), 1, "the retry joined the running pull");
}
