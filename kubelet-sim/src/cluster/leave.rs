//! Hollow nodes leaving the cluster (`--drain-on-exit`, what a hollow-node Deployment scaled down
//! needs): the nodes report NotReady and are cordoned, their pods are deleted as the node lifecycle
//! controller's taint manager deletes the pods of a node that is gone (`deletePodHandler`), each torn down
//! by its node (unpublished, containers stopped, the final delete) while the process still runs, and then
//! the Nodes are deleted (their Leases and CSINodes follow them, by owner). A kubemark hollow node that
//! goes away instead stays NotReady until someone deletes it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use super::ClusterError;
use crate::api::Api;

/// Drains `nodes` and deletes them, waiting at most `deadline` for their pods to be torn down (pods still
/// there then are left to the cluster's pod garbage collector, which deletes the pods of deleted nodes).
/// Pods a DaemonSet owns are left, as `kubectl drain --ignore-daemonsets` leaves them: their controller
/// would make them again. Each node is drained and deleted whatever happened to the others; the errors
/// are returned together.
pub async fn leave(
    client: &kube::Client,
    api: &Arc<Api>,
    nodes: &[String],
    deadline: Duration,
) -> Result<(), ClusterError> {
    api.mark_leaving();
    let all = kube::Api::<Node>::all(client.clone());
    let mut errors = Vec::new();
    for name in nodes {
        if let Err(e) = drain(client, api, name).await {
            errors.push(e.to_string());
        }
    }
    let until = Instant::now() + deadline;
    let draining = |name: &String| api.pods_on(name).iter().any(|p| !daemon(p));
    while Instant::now() < until && nodes.iter().any(draining) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing more is posted for them: a status or a label would only fail on a deleted Node.
    api.mark_left();
    for name in nodes {
        match all.delete(name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(node = %name, "node deleted: it left the cluster"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(kube::Error::Api(s)) if s.code == 403 => errors.push(format!(
                "node {name} was drained and left NotReady, not deleted: this credential may not delete Nodes (a node's own may not; {})",
                s.message
            )),
            Err(e) => errors.push(format!("deleting node {name}: {e}")),
        }
    }
    match errors.is_empty() {
        true => Ok(()),
        false => Err(ClusterError::Leave { errors }),
    }
}

/// Cordons the node, reports it NotReady, and deletes its pods (but a DaemonSet's).
async fn drain(client: &kube::Client, api: &Arc<Api>, name: &str) -> Result<(), ClusterError> {
    let cordon = json!({"spec": {"unschedulable": true}});
    kube::Api::<Node>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&cordon))
        .await
        .map_err(ClusterError::request(format!("cordoning node {name}")))?;
    super::nodes::post_not_ready(client, api, name).await?;
    for pod in api.pods_on(name).iter().filter(|p| !daemon(p)) {
        let (namespace, pod_name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        match kube::Api::<Pod>::namespaced(client.clone(), &namespace)
            .delete(&pod_name, &DeleteParams::default())
            .await
        {
            Ok(_) => tracing::info!(node = %name, pod = %pod_name, "evicting: the node leaves"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(ClusterError::request(format!(
                    "evicting pod {namespace}/{pod_name}"
                ))(e));
            }
        }
    }
    Ok(())
}

/// True for a pod a DaemonSet owns.
fn daemon(pod: &Pod) -> bool {
    let owners = pod.metadata.owner_references.iter().flatten();
    owners.into_iter().any(|o| o.kind == "DaemonSet")
}
