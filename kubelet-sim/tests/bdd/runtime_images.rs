//! Steps of image volumes against the runtime: who mounts them, the CRI mount the runtime got, the runtime
//! keeping the image while it is mounted (features/image_volumes_runtime.feature); image garbage
//! collection (features/image_gc.feature).

use std::time::Duration;

use cucumber::{given, then, when};
use inlet_proto::runtime::v1 as cri;
use kubelet_sim::node::{Collected, ContainerState, ImageGcPolicy, ImageVolumeMounts};
use sha2::{Digest, Sha256};

use super::Sim;
use super::containers::container_of;

#[given(regex = r"^image volumes are mounted by the (runtime|kubelet)$")]
fn mounted_by(w: &mut Sim, side: String) {
    w.images.volume_mounts = match side.as_str() {
        "runtime" => ImageVolumeMounts::Runtime,
        _ => ImageVolumeMounts::Kubelet,
    };
}

#[then(
    regex = r#"^container "([^"]+)" of pod "([^"]+)" has the runtime mount image "([^"]+)" at "([^"]+)" read-only$"#
)]
fn runtime_mount(w: &mut Sim, container: String, pod: String, image: String, path: String) {
    let report = w.report();
    let pod = report.pods.iter().find(|p| p.name == pod).expect("pod");
    let mount = container_of(pod, &container)
        .mounts
        .iter()
        .find(|m| m.container_path == path)
        .unwrap_or_else(|| panic!("no mount at {path}"));
    assert_eq!(mount.image.as_deref(), Some(image.as_str()), "{mount:?}");
    assert!(mount.host_path.is_empty(), "no host path: {mount:?}");
    assert!(mount.readonly, "{mount:?}");
}

#[then(regex = r#"^container "([^"]+)" of pod "([^"]+)" is running$"#)]
async fn container_running(w: &mut Sim, container: String, pod: String) {
    w.wait(&format!("container {container} of pod {pod} runs"), |r| {
        r.pods.iter().filter(|p| p.name == pod).any(|p| {
            p.containers
                .iter()
                .any(|c| c.name == container && c.state == ContainerState::Running)
        })
    })
    .await;
}

#[then(regex = r#"^the runtime refuses to remove image "([^"]+)", saying "(.*)"$"#)]
fn refuses_removal(w: &mut Sim, image: String, text: String) {
    let runtime = w
        .sim()
        .cri_fake("node-1")
        .expect("cri-fake runs in-process");
    let err = runtime
        .remove_image(&image)
        .expect_err("an image volume's image stays");
    assert!(err.message().contains(&text), "{err:?}");
    assert!(runtime.images().get(&image).is_some(), "the image is kept");
}

/// One image collection: the runtime's images before it, and what it did.
#[derive(Debug)]
pub struct GcRun {
    before: Vec<cri::Image>,
    collected: Collected,
}

impl GcRun {
    /// The id `image` had before the collection.
    fn id(&self, image: &str) -> String {
        let name = cri_fake::images::parse(image).expect("a reference").whole();
        self.before
            .iter()
            .find(|i| i.repo_tags.contains(&name))
            .unwrap_or_else(|| panic!("no image {name} before the collection: {:#?}", self.before))
            .id
            .clone()
    }
}

/// The high threshold at 100 turns the collection for space off, as `--image-gc-high-threshold=100` does:
/// the image filesystem here is the host's disk, and a host over 85 % full (CI's machine after its image
/// builds) would start one, remove the scenario's images as they are pulled, and report "Insufficient free
/// disk space".
#[given(
    regex = r"^the image garbage collector removes images unused for (\d+) ms, and none for space$"
)]
fn gc_max_age(w: &mut Sim, ms: u64) {
    w.images.gc = ImageGcPolicy {
        maximum_gc_age: Duration::from_millis(ms),
        minimum_gc_age: Duration::ZERO,
        high_threshold_percent: 100,
        ..ImageGcPolicy::default()
    };
}

#[when(regex = r#"^the image garbage collector of node "([^"]+)" runs after (\d+) ms$"#)]
async fn gc_runs(w: &mut Sim, node: String, ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    let runtime = w.sim().cri_fake(&node).expect("cri-fake runs in-process");
    let before = runtime.images().list();
    let kubelet = w
        .sim()
        .nodes
        .iter()
        .find(|n| n.config.name == node)
        .expect("the node");
    let collected = kubelet
        .garbage_collect_images()
        .await
        .expect("the collection succeeds");
    w.image_gc = Some(GcRun { before, collected });
}

#[then(regex = r#"^it removed images (.+), and no other$"#)]
fn gc_removed(w: &mut Sim, list: String) {
    let run = w.image_gc.as_ref().expect("a collection ran");
    let mut expected: Vec<String> = quoted(&list).map(|image| run.id(image)).collect();
    let mut removed = run.collected.removed.clone();
    expected.sort();
    removed.sort();
    assert_eq!(removed, expected, "{run:#?}");
}

/// The quoted items of `"a", "b" and "c"`.
fn quoted(list: &str) -> impl Iterator<Item = &str> {
    list.split('"').skip(1).step_by(2)
}

#[then(regex = r#"^the runtime has images? (.+)$"#)]
fn runtime_has(w: &mut Sim, list: String) {
    let runtime = w
        .sim()
        .cri_fake("node-1")
        .expect("cri-fake runs in-process");
    for image in quoted(&list) {
        assert!(
            runtime.images().get(image).is_some(),
            "the runtime keeps {image}"
        );
    }
}

#[then(regex = r#"^node "([^"]+)" has (a|no) pulled-image record of image "([^"]+)"$"#)]
fn has_record(w: &mut Sim, node: String, has: String, image: String) {
    let id = match w.image_gc.as_ref() {
        Some(run) => run.id(&image),
        None => {
            let runtime = w.sim().cri_fake(&node).expect("cri-fake runs in-process");
            runtime.images().get(&image).expect("the image").id
        }
    };
    let file = format!("sha256-{:x}", Sha256::digest(id.as_bytes()));
    let path = w
        .dir
        .path()
        .join("root")
        .join(&node)
        .join("image_manager/pulled")
        .join(file);
    assert_eq!(path.exists(), has == "a", "{}", path.display());
}

#[then(regex = r#"^kubelet_image_garbage_collected_total\{reason="(\w+)"\} is at least (\d+)$"#)]
fn images_collected_metric(_: &mut Sim, reason: String, least: u64) {
    // The process's one registry, which every scenario's nodes add to: at least, never exactly.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(
        &mut text,
        &kubelet_sim::metrics::registry(Vec::new()),
    )
    .expect("the metrics encode");
    let series = format!("kubelet_image_garbage_collected_total{{reason=\"{reason}\"}} ");
    let value: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series}in {text}"));
    assert!(value >= least, "{series}{value}");
}
