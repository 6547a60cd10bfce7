//! The hollow nodes' writes to the API server, from the embedded API, each sent when it changed: pod
//! status (the kubelet's status manager, a strategic merge patch of `status`), events, CSINode objects (owned by
//! their Node), and the final delete of a pod its node has torn down (`status_manager.go`: a pod with a
//! deletion timestamp is deleted with grace period 0 once its volumes and containers are gone).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, EventSource, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};

use super::FIELD_MANAGER;
use crate::api::{Api, ApiPod, COMPONENT, Key, PodFeed};

/// The longest a change waits to be sent: changes come in bursts, and one pass sends them all.
const BATCH: Duration = Duration::from_millis(100);
/// Writes of one pass in flight at once.
const CONCURRENT_WRITES: usize = 32;

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
    // Subscribed before the pods there are now are read: none is missed between the two.
    let (pod_feed, event_feed) = (api.pod_feed(), api.pod_event_feed());
    let statuses_due: HashSet<Key> = api.pod_keys().into_iter().collect();
    let mut sender = Sender {
        client,
        api,
        nodes,
        pods: HashMap::new(),
        pod_feed,
        event_feed,
        events_due: statuses_due.clone(),
        statuses_due,
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
    pods: HashMap<Key, Sent>,
    /// The pods that changed, and those an event was recorded on, since the last pass: a pass looks at
    /// those, not at every pod of the process's nodes.
    pod_feed: Arc<PodFeed>,
    event_feed: Arc<PodFeed>,
    /// Pods whose status, or events, are to be looked at on the next pass (a write that failed is tried
    /// again).
    statuses_due: HashSet<Key>,
    events_due: HashSet<Key>,
    csinodes: HashMap<String, Value>,
    /// Final deletes that failed, tried again at the next pass.
    retry_finished: Vec<(String, String, String)>,
}

/// Deletes a finished pod's object (`namespace`, `name`, `uid`) if the API server still has that pod and
/// it is being deleted; gives the pod back when it should be tried again.
async fn final_delete(
    client: &kube::Client,
    (namespace, name, uid): (String, String, String),
) -> Option<(String, String, String)> {
    let pods = kube::Api::<Pod>::namespaced(client.clone(), &namespace);
    let deleting = match pods.get_opt(&name).await {
        Ok(Some(pod)) => {
            pod.metadata.uid.as_deref() == Some(&uid) && pod.metadata.deletion_timestamp.is_some()
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(pod = %name, "reading the pod before its final delete: {e}");
            return Some((namespace, name, uid));
        }
    };
    if !deleting {
        return None;
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
        Ok(_) => None,
        // Already gone, or another pod of that name now: not ours to delete.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => None,
        Err(e) => {
            tracing::warn!(pod = %name, "deleting the pod's object: {e}");
            Some((namespace, name, uid))
        }
    }
}

/// Sends one event: its new count as a patch when it was sent before (`before`), else (or when the API
/// server expired it, `--event-ttl`) created, as client-go's recorder does.
async fn post_event(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    before: Option<i32>,
    event: Event,
    node: Option<String>,
) -> Result<(), kube::Error> {
    let events = kube::Api::<Event>::namespaced(client.clone(), namespace);
    if before.is_some() {
        let patch =
            json!({"count": event.count.unwrap_or(1), "lastTimestamp": event.last_timestamp});
        match events
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            other => return other.map(drop),
        }
    }
    let event = Event {
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: node,
        }),
        ..event
    };
    match events.create(&PostParams::default(), &event).await {
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        other => other.map(drop),
    }
}

impl Sender {
    async fn pass(&mut self) {
        self.pod_statuses().await;
        self.events().await;
        self.final_deletes().await;
        self.csinodes().await;
    }

    /// Each pod whose status changed since it was last sent. Each real kubelet's status manager sends its
    /// pods one after another, and the nodes of a process send side by side: a few at a time here, as the
    /// nodes share this sender (one request after another capped a process at one round trip per change).
    /// A pod gone from the embedded API is forgotten.
    async fn pod_statuses(&mut self) {
        let mut due = Vec::new();
        self.statuses_due.extend(self.pod_feed.drain());
        for key in std::mem::take(&mut self.statuses_due) {
            let Some(pod) = self.api.peek::<ApiPod>(&key.0, &key.1) else {
                self.pods.remove(&key);
                continue;
            };
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
            if sent.status != status {
                due.push((key, uid, status));
            }
        }
        let client = &self.client;
        let patched: Vec<_> = futures::stream::iter(due)
            .map(|(key, uid, status)| async move {
                let pods = kube::Api::<Pod>::namespaced(client.clone(), &key.0);
                // A strategic merge patch, as the status manager sends (`PatchPodStatus`): conditions
                // merge by type, so those others own (readiness gates, DisruptionTarget) stay.
                let patch = json!({"metadata": {"uid": uid}, "status": &status});
                let params = PatchParams::default();
                let result = pods
                    .patch_status(&key.1, &params, &Patch::Strategic(&patch))
                    .await;
                (key, status, result)
            })
            .buffer_unordered(CONCURRENT_WRITES)
            .collect()
            .await;
        for (key, status, result) in patched {
            match result {
                Ok(_) => {
                    if let Some(sent) = self.pods.get_mut(&key) {
                        sent.status = status;
                    }
                }
                Err(e) => {
                    tracing::warn!(pod = %key.1, "posting pod status: {e}");
                    self.statuses_due.insert(key);
                }
            }
        }
    }

    /// Each pod's events that are new or counted again since they were last sent, a few at a time (as
    /// the statuses).
    async fn events(&mut self) {
        let mut due = Vec::new();
        self.events_due.extend(self.event_feed.drain());
        for key in std::mem::take(&mut self.events_due) {
            let Some(pod) = self.api.peek::<ApiPod>(&key.0, &key.1) else {
                continue;
            };
            // Its status goes first: a pod not sent yet has its events looked at again next pass.
            let Some(sent) = self.pods.get(&key) else {
                self.events_due.insert(key);
                continue;
            };
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            for event in self.api.events_for(&sent.uid) {
                let name = event.metadata.name.clone().unwrap_or_default();
                let before = sent.events.get(&name).copied();
                if before != Some(event.count.unwrap_or(1)) {
                    due.push((key.clone(), name, before, event, node.clone()));
                }
            }
        }
        let client = &self.client;
        let posted: Vec<_> = futures::stream::iter(due)
            .map(|(key, name, before, event, node)| async move {
                let count = event.count.unwrap_or(1);
                let result = post_event(client, &key.0, &name, before, event, node).await;
                (key, name, count, result)
            })
            .buffer_unordered(CONCURRENT_WRITES)
            .collect()
            .await;
        for (key, name, count, result) in posted {
            match result {
                Ok(()) => {
                    if let Some(sent) = self.pods.get_mut(&key) {
                        sent.events.insert(name, count);
                    }
                }
                Err(e) => {
                    tracing::warn!(pod = %key.1, "posting an event: {e}");
                    self.events_due.insert(key);
                }
            }
        }
    }

    /// Pods their nodes have finished with: their objects go, with grace period 0, if the API server
    /// still has the same pod and it is being deleted (a node removes a pod only once it was asked to,
    /// but may finish before this pass ever saw it).
    async fn final_deletes(&mut self) {
        let finished: Vec<_> = std::mem::take(&mut self.retry_finished)
            .into_iter()
            .chain(self.api.take_finished())
            .collect();
        let client = &self.client;
        let retry: Vec<_> = futures::stream::iter(finished)
            .map(|pod| final_delete(client, pod))
            .buffer_unordered(CONCURRENT_WRITES)
            .filter_map(std::future::ready)
            .collect()
            .await;
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
