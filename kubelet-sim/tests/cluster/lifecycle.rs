//! The lifecycle half of the differential test: the pods of `tests/differential/lifecycle.yaml` (init
//! containers that succeed, fail under `Never` and are retried; a crash loop; a pod that completes and one
//! that fails; a variable from a Secret, and from one that is missing) through the kit's kubelet and
//! through kubelet-sim, compared as a user sees them: phase, conditions (type, status, reason), container
//! statuses (state and reason, exit code, restarted or not, lastState) and the kubelet's event reasons.
//! Each pod is observed once it settled: ended, crash-looping after its second restart, or waiting with
//! CreateContainerConfigError. A difference is keyed pod-agnostically (`condition.Ready`, `container.state`)
//! and must be listed in `kep/upstream-differences.md`, as the CSI calls' differences are.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_host::mount::LinuxMounter;
use inlet_testkit::kit::Kit;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kubelet_sim::api::ApiPod;
use kubelet_sim::api::manifest;
use kubelet_sim::node::{BackoffPolicy, ContainerTiming};
use kubelet_sim::sim::{SimConfig, Simulation};

const MANIFESTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/differential/lifecycle.yaml"
);
/// The image every pod runs: on the kit, preloaded.
const IMAGE: &str = "localhost/kit/busybox:1.35";
/// How long the pods may take to settle: the kit's kubelet backs off 10 s, then 20 s, before the second
/// restart.
const SETTLE: Duration = Duration::from_secs(180);

/// What a user sees of one pod, field by field.
pub type Observed = BTreeMap<String, String>;

/// True once a pod shows what is compared: it ended (and, where the condition exists, lost its sandbox),
/// a container of it crash-loops after its second restart, or one cannot be configured
/// (CreateContainerConfigError: a Secret it reads is missing).
fn settled(pod: &Pod) -> bool {
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    let sandbox = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodReadyToStartContainers")
        .map(|c| c.status.clone());
    if phase == "Succeeded" || phase == "Failed" {
        return sandbox.is_none_or(|s| s == "False");
    }
    let looping = |s: &ContainerStatus| {
        s.restart_count >= 2
            && s.state
                .as_ref()
                .and_then(|st| st.waiting.as_ref())
                .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
    };
    let unconfigurable = |s: &ContainerStatus| {
        s.state
            .as_ref()
            .and_then(|st| st.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
    };
    let all = status.container_statuses.iter().flatten();
    all.chain(status.init_container_statuses.iter().flatten())
        .any(|s| looping(s) || unconfigurable(s))
}

/// A pod's fields, with the reasons of the kubelet's events for it.
fn observe(pod: &Pod, events: BTreeSet<String>) -> Observed {
    let status = pod.status.clone().unwrap_or_default();
    let mut fields = Observed::new();
    fields.insert("phase".into(), status.phase.unwrap_or_default());
    for c in status.conditions.iter().flatten() {
        let reason = c.reason.clone().unwrap_or_default();
        fields.insert(
            format!("condition.{}", c.type_),
            format!("{}/{reason}", c.status),
        );
    }
    let containers = [
        ("container", status.container_statuses),
        ("init", status.init_container_statuses),
    ];
    for (kind, statuses) in containers {
        for s in statuses.into_iter().flatten() {
            fields.insert(format!("{kind}.state"), state(s.state.as_ref()));
            fields.insert(format!("{kind}.last_state"), state(s.last_state.as_ref()));
            fields.insert(
                format!("{kind}.restarted"),
                (s.restart_count > 0).to_string(),
            );
            fields.insert(format!("{kind}.ready"), s.ready.to_string());
        }
    }
    fields.insert(
        "events".into(),
        events.into_iter().collect::<Vec<_>>().join(","),
    );
    fields
}

fn state(state: Option<&k8s_openapi::api::core::v1::ContainerState>) -> String {
    let Some(state) = state else {
        return "none".into();
    };
    if let Some(t) = &state.terminated {
        return format!(
            "terminated:{}:{}",
            t.reason.clone().unwrap_or_default(),
            t.exit_code
        );
    }
    if let Some(w) = &state.waiting {
        return format!("waiting:{}", w.reason.clone().unwrap_or_default());
    }
    if state.running.is_some() {
        return "running".into();
    }
    "none".into()
}

/// The pods through the kit's kubelet, each once settled.
pub fn on_the_kit(kit: &Kit) -> BTreeMap<String, Observed> {
    kit.kubectl(&["apply", "-f", MANIFESTS]);
    let names = pod_names();
    let started = Instant::now();
    let pods = loop {
        let list: serde_json::Value =
            serde_json::from_str(&kit.kubectl(&["get", "pods", "-o", "json"])).expect("pods");
        let pods: Vec<Pod> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| serde_json::from_value(p.clone()).ok())
            .filter(|p: &Pod| names.contains(p.metadata.name.as_deref().unwrap_or_default()))
            .collect();
        if pods.len() == names.len() && pods.iter().all(settled) {
            break pods;
        }
        assert!(
            started.elapsed() < SETTLE,
            "the kit's pods did not settle: {}",
            serde_json::to_string_pretty(&list).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    let events: serde_json::Value =
        serde_json::from_str(&kit.kubectl(&["get", "events", "-o", "json"])).expect("events");
    let by_pod = |name: &str| -> BTreeSet<String> {
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                e["involvedObject"]["name"] == name && e["source"]["component"] == "kubelet"
            })
            .filter_map(|e| e["reason"].as_str().map(str::to_string))
            // The kit's kubelet has no cluster DNS configured; kubelet-sim stands for a node that has.
            .filter(|reason| reason != "MissingClusterDNS")
            .collect()
    };
    let observed = pods
        .iter()
        .map(|p| {
            let name = p.metadata.name.clone().unwrap_or_default();
            (name.clone(), observe(p, by_pod(&name)))
        })
        .collect();
    kit.kubectl(&["delete", "-f", MANIFESTS, "--wait=true", "--timeout=120s"]);
    observed
}

/// The same pods through kubelet-sim (the library, its in-process cri-fake and real mounts), each once
/// settled.
pub fn in_kubelet_sim(dir: &Path, runtime: &tokio::runtime::Runtime) -> BTreeMap<String, Observed> {
    let config = SimConfig {
        root: dir.join("lifecycle"),
        nodes: 1,
        drivers: Vec::new(),
        cri: None,
        gates: BTreeSet::new(),
        selinux: false,
        allowed_inline_drivers: None,
        backoff: BackoffPolicy {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(300),
        },
        volume_wait_timeout: Duration::from_secs(60),
        csi_timeout: inlet_volume::csi::CSI_TIMEOUT,
        republish_period: Duration::from_secs(60),
        volume_stats_agg_period: Duration::from_secs(60),
        // The kubelet's timing but a shorter back-off: the comparison is of states, not of waits.
        containers: ContainerTiming {
            relist_period: Duration::from_millis(100),
            backoff: BackoffPolicy {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(5),
            },
            runtime_request_timeout: Duration::from_secs(10),
        },
        mounter: Arc::new(LinuxMounter),
        images: Default::default(),
        plugins_registry: None,
        node_name_prefix: "node".into(),
        cluster: None,
    };
    runtime.block_on(async {
        let mut sim = Simulation::start(config)
            .await
            .expect("the simulation starts");
        // The kit's nodes have the image already; so does this one.
        let mut cri =
            kubelet_sim::cri::Cri::connect(sim.cri_socket("node-1"), Duration::from_secs(10))
                .await
                .expect("the runtime");
        cri.image
            .pull_image(inlet_proto::runtime::v1::PullImageRequest {
                image: Some(inlet_proto::runtime::v1::ImageSpec {
                    image: IMAGE.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("the image pulls");
        let yaml = std::fs::read_to_string(MANIFESTS).expect("manifests");
        sim.apply(manifest::parse(&yaml, "lifecycle.yaml").expect("manifests parse"))
            .await;
        let names = pod_names();
        let done = sim
            .wait_for(SETTLE, |sim| {
                let pods = sim.api.list::<ApiPod>();
                pods.len() == names.len() && pods.iter().all(|p| settled(p))
            })
            .await;
        assert!(
            done,
            "kubelet-sim's pods did not settle: {}",
            serde_json::to_string_pretty(&sim.report()).unwrap_or_default()
        );
        let observed = sim
            .api
            .list::<ApiPod>()
            .iter()
            .map(|p| {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                let events = sim
                    .api
                    .events_for(&uid)
                    .into_iter()
                    .filter_map(|e| e.reason)
                    .filter(|r| r != "Scheduled")
                    .collect();
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    observe(p, events),
                )
            })
            .collect();
        sim.shutdown().await;
        observed
    })
}

fn pod_names() -> BTreeSet<String> {
    let yaml = std::fs::read_to_string(MANIFESTS).expect("manifests");
    manifest::parse(&yaml, "lifecycle.yaml")
        .expect("manifests parse")
        .iter()
        .filter_map(|m| match &m.object {
            manifest::Object::Pod(p) => p.metadata.name.clone(),
            _ => None,
        })
        .collect()
}

/// Each difference as (`field`, `pod: kubelet <a> | kubelet-sim <b>`).
pub fn differences(
    kubelet: &BTreeMap<String, Observed>,
    sim: &BTreeMap<String, Observed>,
) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for pod in kubelet.keys().chain(sim.keys()).collect::<BTreeSet<_>>() {
        let (a, b) = (kubelet.get(pod), sim.get(pod));
        let fields: BTreeSet<&String> = a.iter().chain(b.iter()).flat_map(|f| f.keys()).collect();
        for field in fields {
            let (va, vb) = (a.and_then(|f| f.get(field)), b.and_then(|f| f.get(field)));
            if va != vb {
                found.push((
                    field.clone(),
                    format!(
                        "{pod}: kubelet {:?} | kubelet-sim {:?}",
                        va.map(String::as_str).unwrap_or("<none>"),
                        vb.map(String::as_str).unwrap_or("<none>")
                    ),
                ));
            }
        }
    }
    found
}
