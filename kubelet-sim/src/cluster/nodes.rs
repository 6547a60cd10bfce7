//! The hollow nodes' Node objects and Leases: registered at start (`kubelet_node_status.go`
//! `registerWithAPIServer`), their status posted every 10 s (`nodeStatusUpdateFrequency`) with the Ready
//! condition and the volumes in use, and a Lease in `kube-node-lease` renewed every 10 s (a quarter of its
//! 40 s duration, `nodelease`), which is what the node lifecycle controller watches.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Patch, PatchParams};

use super::{ClusterError, FIELD_MANAGER};
use crate::api::{Api, now};

/// How often a node's status and lease are renewed.
const HEARTBEAT: Duration = Duration::from_secs(10);
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

/// Creates (or takes over) each node's Node object and posts its first status; returns their UIDs.
pub async fn register(
    client: &kube::Client,
    api: &Api,
    nodes: &[String],
    runtime_version: &str,
) -> Result<BTreeMap<String, String>, ClusterError> {
    let all = kube::Api::<Node>::all(client.clone());
    let since = registered_at();
    let mut uids = BTreeMap::new();
    for name in nodes {
        let labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), name.clone()),
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
                name: Some(name.clone()),
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
        let created = all
            .patch(name, &apply(), &Patch::Apply(&node))
            .await
            .map_err(ClusterError::request(format!("registering node {name}")))?;
        uids.insert(name.clone(), created.metadata.uid.unwrap_or_default());
        post_status(client, api, name, runtime_version, &since).await?;
        renew_lease(client, name, uids.get(name).cloned().unwrap_or_default()).await?;
    }
    Ok(uids)
}

/// Renews every node's status and lease until `stop`; a failed renewal is retried at the next beat.
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
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        for (name, uid) in &uids {
            if let Err(e) = post_status(&client, &api, name, &runtime_version, &since).await {
                tracing::warn!(node = %name, "{e}");
            }
            if let Err(e) = renew_lease(&client, name, uid.clone()).await {
                tracing::warn!(node = %name, "{e}");
            }
        }
    }
}

/// When this process registered its nodes: their conditions' transition time, which does not move while
/// they stay as they are.
fn registered_at() -> Time {
    static AT: std::sync::OnceLock<Time> = std::sync::OnceLock::new();
    AT.get_or_init(now).clone()
}

/// The node's status: Ready, its capacity, the runtime, and the volumes in use from the embedded Node.
async fn post_status(
    client: &kube::Client,
    api: &Api,
    name: &str,
    runtime_version: &str,
    since: &Time,
) -> Result<(), ClusterError> {
    let volumes_in_use = api
        .peek::<Node>("", name)
        .and_then(|n| n.status.clone())
        .and_then(|s| s.volumes_in_use);
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
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
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
                condition(
                    "Ready",
                    "True",
                    "KubeletReady",
                    "kubelet is posting ready status",
                ),
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
    };
    kube::Api::<Node>::all(client.clone())
        .patch_status(name, &apply(), &Patch::Apply(&node))
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
            name: Some(name.to_string()),
            namespace: Some(LEASE_NAMESPACE.into()),
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
            ..Default::default()
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
