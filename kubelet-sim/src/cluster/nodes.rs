//! The hollow nodes' Node objects and Leases: registered at start (`kubelet_node_status.go`
//! `registerWithAPIServer`), their status computed every 10 s (`nodeStatusUpdateFrequency`) and posted
//! when it changed or every 5 minutes (`nodeStatusReportFrequency`) with the Ready condition and the
//! volumes in use, their CSI node ids and topology labels as `nodeinfomanager` sets them, and a Lease in
//! `kube-node-lease` renewed every 10 s (a quarter of its 40 s duration, `nodelease`), which is the
//! heartbeat the node lifecycle controller watches. A node another live kubelet-sim process holds (its
//! Lease renewed within its duration under another instance) is refused at registration.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};

use super::{ClusterError, FIELD_MANAGER};
use crate::api::{Api, now};

/// How often a node's status is computed and its lease renewed.
const HEARTBEAT: Duration = Duration::from_secs(10);
/// How often an unchanged status is posted all the same.
const STATUS_REPORT: Duration = Duration::from_secs(5 * 60);
/// The Lease annotation naming the kubelet-sim process that holds the node.
const INSTANCE_ANNOTATION: &str = "inlet.dev/kubelet-sim-instance";

/// The lease's duration (`nodeLeaseDurationSeconds`).
const LEASE_SECONDS: i32 = 40;
/// The taint (and label) of hollow nodes: `NoSchedule`, so that pods land there only when bound to them
/// or when they tolerate it.
pub const TAINT: &str = "inlet.dev/kubelet-sim";
/// The namespace of node leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";

fn apply() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Creates each node's Node object (or, when it exists, brings its labels up to date, as
/// `tryRegisterWithAPIServer` does: its taints are others' by then, and NodeRestriction forbids a node to
/// change them) and posts its first status; returns their UIDs. Every node is checked for another holder
/// before any is registered.
pub async fn register(
    client: &kube::Client,
    api: &Api,
    nodes: &[String],
    runtime_version: &str,
) -> Result<BTreeMap<String, String>, ClusterError> {
    let since = registered_at();
    // Every node checked before any registers; each then registers on its own, as each real kubelet
    // does, a few at a time (one after another, 5,000 nodes took minutes).
    futures::stream::iter(nodes.iter().map(|name| refuse_if_held(client, name)))
        .buffer_unordered(CONCURRENT_BEATS)
        .try_collect::<Vec<()>>()
        .await?;
    let registering = nodes
        .iter()
        .map(|name| register_one(client, api, name, runtime_version, &since));
    futures::stream::iter(registering)
        .buffer_unordered(CONCURRENT_BEATS)
        .try_collect()
        .await
}

/// Registers node `name` (see [`register`]): its Node, first status and Lease; its name and UID.
async fn register_one(
    client: &kube::Client,
    api: &Api,
    name: &str,
    runtime_version: &str,
    since: &Time,
) -> Result<(String, String), ClusterError> {
    let all = kube::Api::<Node>::all(client.clone());
    let labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        (
            "kubernetes.io/arch".to_string(),
            std::env::consts::ARCH.replace("x86_64", "amd64"),
        ),
        // Says what the node is: a simulated kubelet, for whoever schedules or looks.
        (TAINT.to_string(), "true".to_string()),
    ]);
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        // The scheduler places nothing here unless asked (a toleration); pods bound by nodeName run.
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: TAINT.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let failed = || ClusterError::request(format!("registering node {name}"));
    let created = match all.create(&PostParams::default(), &node).await {
        Ok(created) => created,
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let labels = serde_json::json!({"metadata": {"labels": node.metadata.labels}});
            all.patch(name, &PatchParams::default(), &Patch::Merge(&labels))
                .await
                .map_err(failed())?
        }
        Err(e) => return Err(failed()(e)),
    };
    let uid = created.metadata.uid.unwrap_or_default();
    post_status(client, &status(api, name, runtime_version, since), name).await?;
    renew_lease(client, name, uid.clone()).await?;
    Ok((name.to_string(), uid))
}

/// The metadata of node `name`'s Lease held by this process.
fn held_lease(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(LEASE_NAMESPACE.into()),
        annotations: Some(BTreeMap::from([(
            INSTANCE_ANNOTATION.to_string(),
            instance().to_string(),
        )])),
        ..Default::default()
    }
}

/// This process's instance, written on the Leases it holds.
fn instance() -> &'static str {
    static INSTANCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(|| uuid::Uuid::new_v4().to_string())
}

/// Claims the node's Lease for this process (its instance annotation), refusing a node whose Lease
/// another live kubelet-sim process renews: two kubelets posting one node's status and running its pods
/// would fight over both. The claim is conditional (a create, or a patch on the version read), so two
/// processes starting together cannot both take it.
async fn refuse_if_held(client: &kube::Client, name: &str) -> Result<(), ClusterError> {
    let leases = kube::Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE);
    let failed = |what: &str| ClusterError::request(format!("{what} the lease of node {name}"));
    let lease = leases.get_opt(name).await.map_err(failed("reading"))?;
    let claimed_meanwhile = || ClusterError::NodeHeld {
        node: name.to_string(),
        holder: "another, at the same moment".into(),
        seconds: 0,
        lease_seconds: LEASE_SECONDS,
    };
    let Some(lease) = lease else {
        // Claimed by creating it: of two processes starting together, one gets a conflict.
        let claim = Lease {
            metadata: held_lease(name),
            spec: None,
        };
        return match leases.create(&PostParams::default(), &claim).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(claimed_meanwhile()),
            Err(e) => Err(failed("claiming")(e)),
        };
    };
    let holder = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INSTANCE_ANNOTATION))
        .cloned();
    if let Some(holder) = holder.filter(|h| h != instance()) {
        let spec = lease.spec.clone().unwrap_or_default();
        let duration = spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS);
        let renewed = spec.renew_time.map(|t| t.0);
        if let Some(seconds) = renewed.map(|t| now().0.as_second() - t.as_second()) {
            if seconds < i64::from(duration) {
                return Err(ClusterError::NodeHeld {
                    node: name.to_string(),
                    holder,
                    seconds,
                    lease_seconds: duration,
                });
            }
        }
    }
    // Claimed on the version read: a process that claimed it in between makes this a conflict.
    let claim = serde_json::json!({"metadata": {
        "resourceVersion": lease.metadata.resource_version,
        "annotations": {INSTANCE_ANNOTATION: instance()}}});
    match leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&claim))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(claimed_meanwhile()),
        Err(e) => Err(failed("claiming")(e)),
    }
}

/// Renews every node's lease every 10 s, and posts its status when it changed or every 5 minutes, until
/// `stop`; a failed post is tried again at the next beat.
pub async fn heartbeat(
    client: kube::Client,
    api: Arc<Api>,
    uids: BTreeMap<String, String>,
    runtime_version: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let since = registered_at();
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.tick().await;
    // What each node last posted, and when.
    let mut posted: BTreeMap<String, (Node, std::time::Instant)> = uids
        .keys()
        .map(|name| {
            let node = status(&api, name, &runtime_version, &since);
            (name.clone(), (node, std::time::Instant::now()))
        })
        .collect();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => {
                for name in uids.keys() {
                    release_lease(&client, name).await;
                }
                return;
            }
        }
        // Each node beats on its own, as each real kubelet does, a few at a time: one after another, a
        // pass over 5,000 nodes would outlast the 10 s beat.
        let beats: Vec<_> = uids
            .iter()
            .map(|(name, uid)| {
                let node = status(&api, name, &runtime_version, &since);
                let due = posted.get(name).is_none_or(|(sent, at)| {
                    !same_status(sent, &node) || at.elapsed() >= STATUS_REPORT
                });
                let (client, api) = (client.clone(), Arc::clone(&api));
                let (name, uid) = (name.clone(), uid.clone());
                async move { beat(&client, &api, name, uid, node, due).await }
            })
            .collect();
        let beats: Vec<_> = futures::stream::iter(beats)
            .buffer_unordered(CONCURRENT_BEATS)
            .collect()
            .await;
        for (name, node) in beats.into_iter().flatten() {
            posted.insert(name, (node, std::time::Instant::now()));
        }
    }
}

/// How many nodes post their status and renew their Lease at once.
const CONCURRENT_BEATS: usize = 16;

/// One node's beat: its status posted when `due`, its Lease renewed; the status posted, when it was. A
/// node that left the cluster is deleted: nothing is posted for it any more.
async fn beat(
    client: &kube::Client,
    api: &Api,
    name: String,
    uid: String,
    node: Node,
    due: bool,
) -> Option<(String, Node)> {
    if api.left() {
        return None;
    }
    let mut posted = None;
    if due {
        match post_status(client, &node, &name).await {
            Ok(()) => posted = Some((name.clone(), node)),
            Err(e) => tracing::warn!(node = %name, "{e}"),
        }
    }
    if !api.left()
        && let Err(e) = renew_lease(client, &name, uid).await
    {
        tracing::warn!(node = %name, "{e}");
    }
    posted
}

/// Lets go of a node's Lease at an orderly stop (its instance annotation removed), so that the next
/// process may take the node at once; the Lease itself stays, as a stopped kubelet's does.
async fn release_lease(client: &kube::Client, name: &str) {
    let leases = kube::Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE);
    let patch = serde_json::json!({"metadata": {"annotations": {INSTANCE_ANNOTATION: null}}});
    match leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        // Gone with its Node (the node left the cluster).
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => tracing::warn!(node = %name, "releasing the lease: {e}"),
    }
}

/// Whether two statuses differ only in their conditions' heartbeat times.
fn same_status(a: &Node, b: &Node) -> bool {
    let strip = |n: &Node| {
        let mut n = n.clone();
        for c in n
            .status
            .iter_mut()
            .flat_map(|s| s.conditions.iter_mut().flatten())
        {
            c.last_heartbeat_time = None;
        }
        n
    };
    strip(a) == strip(b)
}

/// When this process registered its nodes: their conditions' transition time, which does not move while
/// they stay as they are.
fn registered_at() -> Time {
    static AT: std::sync::OnceLock<Time> = std::sync::OnceLock::new();
    AT.get_or_init(now).clone()
}

/// The node as the kubelet reports it: its status (Ready, its capacity, the runtime, the volumes in use
/// from the embedded Node) and the CSI node ids and topology labels its drivers gave (the embedded Node's,
/// set at registration as `nodeinfomanager` sets them).
fn status(api: &Api, name: &str, runtime_version: &str, since: &Time) -> Node {
    let embedded = api.peek::<Node>("", name);
    let volumes_in_use = embedded
        .as_ref()
        .and_then(|n| n.status.clone())
        .and_then(|s| s.volumes_in_use);
    let metadata = embedded.map(|n| n.metadata.clone()).unwrap_or_default();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now()),
        last_transition_time: Some(since.clone()),
    };
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity("8".into())),
        ("memory".to_string(), Quantity("32Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
        ("ephemeral-storage".to_string(), Quantity("100Gi".into())),
    ]);
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: metadata.labels.filter(|l| !l.is_empty()),
            annotations: metadata.annotations.filter(|a| !a.is_empty()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                match api.leaving().is_some() {
                    false => condition(
                        "Ready",
                        "True",
                        "KubeletReady",
                        "kubelet is posting ready status",
                    ),
                    true => not_ready(api),
                },
            ]),
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: "127.0.0.1".into(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.to_string(),
                },
            ]),
            node_info: Some(NodeSystemInfo {
                architecture: std::env::consts::ARCH.replace("x86_64", "amd64"),
                operating_system: "linux".into(),
                os_image: "kubelet-sim".into(),
                kernel_version: nix::sys::utsname::uname()
                    .map(|u| u.release().to_string_lossy().into_owned())
                    .unwrap_or_default(),
                container_runtime_version: runtime_version.to_string(),
                // A valid version, honest about what runs: kubelet-sim's own.
                kubelet_version: format!("v{}-kubelet-sim", env!("CARGO_PKG_VERSION")),
                kube_proxy_version: String::new(),
                machine_id: String::new(),
                system_uuid: String::new(),
                boot_id: String::new(),
                ..Default::default()
            }),
            volumes_in_use,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Ready condition of a node that leaves the cluster.
fn not_ready(api: &Api) -> NodeCondition {
    NodeCondition {
        type_: "Ready".into(),
        status: "False".into(),
        reason: Some("KubeletNotReady".into()),
        message: Some("kubelet-sim is leaving the cluster: the node is drained and deleted".into()),
        last_heartbeat_time: Some(now()),
        last_transition_time: api.leaving().or_else(|| Some(now())),
    }
}

/// Reports the node NotReady at once (a strategic merge of its Ready condition; the heartbeat keeps it so,
/// since [`Api::leaving`] is set).
pub async fn post_not_ready(
    client: &kube::Client,
    api: &Api,
    name: &str,
) -> Result<(), ClusterError> {
    let patch = serde_json::json!({"status": {"conditions": [not_ready(api)]}});
    kube::Api::<Node>::all(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map(drop)
        .map_err(ClusterError::request(format!(
            "reporting node {name} NotReady"
        )))
}

/// Posts a node's labels and annotations (when it has any; a merge patch, which never makes a Node that
/// is gone again) and its status (even when the labels were refused).
async fn post_status(client: &kube::Client, node: &Node, name: &str) -> Result<(), ClusterError> {
    let nodes = kube::Api::<Node>::all(client.clone());
    // Only the maps that are set: in a merge patch `"labels": null` deletes every label the node has,
    // its registration's `kubernetes.io/hostname` and `inlet.dev/kubelet-sim` among them.
    let mut metadata = serde_json::Map::new();
    if let Some(labels) = &node.metadata.labels {
        metadata.insert("labels".into(), serde_json::json!(labels));
    }
    if let Some(annotations) = &node.metadata.annotations {
        metadata.insert("annotations".into(), serde_json::json!(annotations));
    }
    if !metadata.is_empty() {
        let metadata = serde_json::json!({ "metadata": metadata });
        if let Err(e) = nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&metadata))
            .await
        {
            tracing::warn!(node = %name, "labelling the node: {e}");
        }
    }
    nodes
        .patch_status(name, &apply(), &Patch::Apply(node))
        .await
        .map(drop)
        .map_err(ClusterError::request(format!(
            "posting the status of node {name}"
        )))
}

/// The node's Lease, owned by its Node (so it goes with it).
async fn renew_lease(
    client: &kube::Client,
    name: &str,
    node_uid: String,
) -> Result<(), ClusterError> {
    let lease = Lease {
        metadata: ObjectMeta {
            owner_references: (!node_uid.is_empty()).then(|| {
                vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: name.to_string(),
                        uid: node_uid,
                        ..Default::default()
                    },
                ]
            }),
            ..held_lease(name)
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_string()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(now().0)),
            ..Default::default()
        }),
    };
    kube::Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE)
        .patch(name, &apply(), &Patch::Apply(&lease))
        .await
        .map(drop)
        .map_err(ClusterError::request(format!(
            "renewing the lease of node {name}"
        )))
}
