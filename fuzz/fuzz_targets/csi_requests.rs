//! CSI Node requests as any client could send them (protobuf decoded from arbitrary bytes), through the
//! local driver over the recording mounter: every request gets an answer, never a panic, and no mount is
//! ever made outside the kubelet dir.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use inlet_plugin::local::{LocalConfig, LocalDriver};
use inlet_host::mount::{MountLayer, RecordingMounter};
use inlet_proto::csi::v1 as csi;
use libfuzzer_sys::fuzz_target;
use prost::Message;

struct Node {
    kubelet: PathBuf,
    mounter: Arc<RecordingMounter>,
    driver: Mutex<LocalDriver>,
}

fn node() -> &'static Node {
    static NODE: OnceLock<Node> = OnceLock::new();
    NODE.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("inlet-fuzz-csi-{}", std::process::id()));
        let kubelet = root.join("kubelet");
        std::fs::create_dir_all(&kubelet).unwrap();
        let mounter = Arc::new(RecordingMounter::new());
        let config = LocalConfig {
            name: "local.inlet.dev".into(),
            node_id: "n1".into(),
            state_dir: root.join("state"),
            kubelet_dir: kubelet.clone(),
            capacity_bytes: 1 << 30,
            max_volume_bytes: 1 << 30,
            default_volume_bytes: 1 << 20,
            enable_attach: false,
            ephemeral_default: true,
            volume_mount_group: false,
        };
        let shared: Arc<dyn MountLayer> = mounter.clone();
        let driver = LocalDriver::open(config, shared).unwrap();
        Node {
            kubelet: kubelet.canonicalize().unwrap(),
            mounter,
            driver: Mutex::new(driver),
        }
    })
}

// The first byte picks the call; the rest is its protobuf encoding. A `K` at the start of a target path
// stands for the kubelet dir, so the fuzzer reaches paths the driver accepts.
fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let node = node();
    let driver = node.driver.lock().unwrap();
    let expand = |path: &mut String| {
        if let Some(rest) = path.strip_prefix('K') {
            *path = format!("{}{rest}", node.kubelet.display());
        }
    };
    match which % 3 {
        0 => {
            if let Ok(mut request) = csi::NodePublishVolumeRequest::decode(body) {
                expand(&mut request.target_path);
                let _ = driver.node_publish(request);
            }
        }
        1 => {
            if let Ok(mut request) = csi::NodeUnpublishVolumeRequest::decode(body) {
                expand(&mut request.target_path);
                let _ = driver.node_unpublish(request);
            }
        }
        _ => {
            if let Ok(mut request) = csi::NodeStageVolumeRequest::decode(body) {
                expand(&mut request.staging_target_path);
                let _ = driver.node_stage(request);
            }
        }
    }
    for target in node.mounter.mounts().keys() {
        assert!(
            target.starts_with(&node.kubelet),
            "a mount outside the kubelet dir: {target:?}"
        );
    }
});
