//! The hollow nodes' writes to the API server, from the embedded API, each sent when it changed: pod
//! status (the kubelet's status manager, a strategic merge patch of `status`), events, CSINode objects (owned by
//! their Node), and the final delete of a pod its node has torn down (`status_manager.go`: a pod with a
//! deletion timestamp is deleted with grace period 0 once its volumes and containers are gone).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};

use super::FIELD_MANAGER;
use crate::api::{Api, COMPONENT};

/// The longest a change waits to be sent: changes come in bursts, and one pass sends them all.
const BATCH: Duration = Duration::from_millis(100);

/// A pod as last sent.
struct Sent {
    uid: String,
    status: Value,
    /// Each of its events' name and count.
    events: HashMap<String, i32>,
}

/// Sends what changed until `stop`. `nodes` maps each node to its Node's UID.
pub async fn run(
    client: kube::Client,
    api: Arc<Api>,
    nodes: BTreeMap<String, String>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut changes = api.watch();
    let mut sender = Sender {
        client,
        api,
        nodes,
        pods: HashMap::new(),
        csinodes: HashMap::new(),
        retry_finished: Vec::new(),
    };
    loop {
        sender.pass().await;
        tokio::select! {
            _ = changes.changed() => tokio::time::sleep(BATCH).await,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => return,
        }
    }
}

struct Sender {
    client: kube::Client,
    api: Arc<Api>,
    nodes: BTreeMap<String, String>,
    pods: HashMap<(String, String), Sent>,
    csinodes: HashMap<String, Value>,
    /// Final deletes that failed, tried again at the next pass.
    retry_finished: Vec<(String, String, String)>,
}

impl Sender {
    async fn pass(&mut self) {
        self.pod_statuses().await;
        self.events().await;
        self.final_deletes().await;
        self.csinodes().await;
    }

    async fn pod_statuses(&mut self) {
        for pod in self.api.list::<Pod>() {
            let key = (
                pod.metadata.namespace.clone().unwrap_or_default(),
                pod.metadata.name.clone().unwrap_or_default(),
            );
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let status = serde_json::to_value(&pod.status).unwrap_or_default();
            let fresh = || Sent {
                uid: uid.clone(),
                status: Value::Null,
                events: HashMap::new(),
            };
            let sent = self.pods.entry(key.clone()).or_insert_with(fresh);
            if sent.uid != uid {
                *sent = fresh();
            }
            if sent.status == status {
                continue;
            }
            let pods = kube::Api::<Pod>::namespaced(self.client.clone(), &key.0);
            // A strategic merge patch, as the status manager sends (`PatchPodStatus`): conditions merge by
            // type, so those others own (readiness gates, DisruptionTarget) stay.
            let patch = json!({"metadata": {"uid": uid}, "status": status});
            match pods
                .patch_status(&key.1, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
            {
                Ok(_) => sent.status = status,
                Err(e) => tracing::warn!(pod = %key.1, "posting pod status: {e}"),
            }
        }
    }

    async fn events(&mut self) {
        for ((namespace, pod), sent) in &mut self.pods {
            let node = self
                .api
                .peek::<Pod>(namespace, pod)
                .and_then(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()));
            for event in self.api.events_for(&sent.uid) {
                let name = event.metadata.name.clone().unwrap_or_default();
                let count = event.count.unwrap_or(1);
                let before = sent.events.get(&name).copied();
                if before == Some(count) {
                    continue;
                }
                let events = kube::Api::<Event>::namespaced(self.client.clone(), namespace);
                let patched = match before {
                    None => None,
                    Some(_) => {
                        let patch = json!({"count": count, "lastTimestamp": event.last_timestamp});
                        Some(
                            events
                                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                                .await,
                        )
                    }
                };
                // New, or expired by the API server (`--event-ttl`): created (again), as client-go's
                // recorder does.
                let create = match &patched {
                    None => true,
                    Some(Err(kube::Error::Api(s))) => s.code == 404,
                    Some(_) => false,
                };
                let result = match patched {
                    _ if create => {
                        let event = Event {
                            source: Some(EventSource {
                                component: Some(COMPONENT.into()),
                                host: node.clone(),
                            }),
                            ..event
                        };
                        match events.create(&PostParams::default(), &event).await {
                            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                            other => other.map(drop),
                        }
                    }
                    Some(result) => result.map(drop),
                    None => Ok(()),
                };
                match result {
                    Ok(()) => drop(sent.events.insert(name, count)),
                    Err(e) => tracing::warn!(pod, "posting an event: {e}"),
                }
            }
        }
    }

    /// Pods their nodes have finished with: their objects go, with grace period 0, if the API server
    /// still has the same pod and it is being deleted (a node removes a pod only once it was asked to,
    /// but may finish before this pass ever saw it). Pods gone from the embedded API are forgotten.
    async fn final_deletes(&mut self) {
        let api = &self.api;
        self.pods
            .retain(|(namespace, name), _| api.peek::<Pod>(namespace, name).is_some());
        let mut retry = Vec::new();
        let finished: Vec<_> = std::mem::take(&mut self.retry_finished)
            .into_iter()
            .chain(self.api.take_finished())
            .collect();
        for (namespace, name, uid) in finished {
            let pods = kube::Api::<Pod>::namespaced(self.client.clone(), &namespace);
            let deleting = match pods.get_opt(&name).await {
                Ok(Some(pod)) => {
                    pod.metadata.uid.as_deref() == Some(&uid)
                        && pod.metadata.deletion_timestamp.is_some()
                }
                Ok(None) => false,
                Err(e) => {
                    tracing::warn!(pod = %name, "reading the pod before its final delete: {e}");
                    retry.push((namespace, name, uid));
                    continue;
                }
            };
            if !deleting {
                continue;
            }
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match pods.delete(&name, &params).await {
                Ok(_) => {}
                // Already gone, or another pod of that name now: not ours to delete.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    tracing::warn!(pod = %name, "deleting the pod's object: {e}");
                    retry.push((namespace, name, uid));
                }
            }
        }
        self.retry_finished.extend(retry);
    }

    async fn csinodes(&mut self) {
        for (node, uid) in &self.nodes {
            let Some(csinode) = self.api.peek::<CSINode>("", node) else {
                continue;
            };
            let mut object = (*csinode).clone();
            object.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.clone(),
                uid: uid.clone(),
                ..Default::default()
            }]);
            let value = serde_json::to_value(&object).unwrap_or_default();
            if self.csinodes.get(node) == Some(&value) {
                continue;
            }
            let params = PatchParams::apply(FIELD_MANAGER).force();
            match kube::Api::<CSINode>::all(self.client.clone())
                .patch(node, &params, &Patch::Apply(&object))
                .await
            {
                Ok(_) => drop(self.csinodes.insert(node.clone(), value)),
                Err(e) => tracing::warn!(node, "updating CSINode: {e}"),
            }
        }
    }
}
