//! Events, kept per involved object (a pod's UID, a node's name) outside the object store: nothing in the
//! simulation watches them, so recording one wakes no controller. A log keeps its object's reference once
//! and each event as a small record, and [`Api::events_for`] builds the `Event`s the report shows: a
//! `k8s_openapi` `Event` is about 700 bytes before its strings, and a pod gathers five or more (Scheduled,
//! Pulled, Created, Started, Killing), which at 100,000 pods was the largest record kept per pod. The
//! texts repeat from pod to pod ("Normal", "Started", "Started container app"), so each is kept once and
//! shared; a log's list grows one event at a time, as a pod gathers only a handful.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::{Api, container_field_path, now};

/// The reporting component of events the simulator records.
pub const COMPONENT: &str = "kubelet-sim";

/// Every object's events, and the texts they share.
#[derive(Debug, Default)]
pub(crate) struct EventLogs {
    logs: HashMap<String, EventLog>,
    texts: HashSet<Arc<str>>,
}

/// `text`, kept once in `texts` however many events carry it.
fn shared(texts: &mut HashSet<Arc<str>>, text: &str) -> Arc<str> {
    if let Some(kept) = texts.get(text) {
        return Arc::clone(kept);
    }
    let kept: Arc<str> = Arc::from(text);
    texts.insert(Arc::clone(&kept));
    kept
}

/// One object's events: its reference (without a `fieldPath`), and each event.
#[derive(Debug)]
pub(crate) struct EventLog {
    involved: ObjectReference,
    events: Vec<Recorded>,
}

/// One event, as little as rebuilds it; its texts are shared (see [`shared`]).
#[derive(Debug)]
struct Recorded {
    /// The container's `fieldPath`, for a container's event.
    field_path: Option<Arc<str>>,
    /// The object's `resourceVersion` when the event was first recorded.
    resource_version: Option<Box<str>>,
    type_: Arc<str>,
    reason: Arc<str>,
    message: Arc<str>,
    /// The name's random part (`<object>.<uuid>`).
    id: uuid::Uuid,
    count: i32,
    first: Time,
    last: Time,
}

impl Api {
    /// Records an event on a pod; a repeat of the same type, reason and message bumps its count, as the
    /// API server's event aggregation does.
    pub fn record_event(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        self.record(pod_reference(pod), None, type_, reason, message);
    }

    /// Records an event on one of a pod's containers: its `involvedObject.fieldPath` names the container
    /// (`GenerateContainerRef`), and a repeat counts only against the same container's events.
    pub fn record_container_event(
        &self,
        pod: &Pod,
        container: &str,
        type_: &str,
        reason: &str,
        message: &str,
    ) {
        let field_path = Some(container_field_path(pod, container));
        self.record(pod_reference(pod), field_path, type_, reason, message);
    }

    /// Records an event on a node (the kubelet's `nodeRef`: kind Node, its name as uid, in `default`).
    pub fn record_node_event(&self, node: &str, type_: &str, reason: &str, message: &str) {
        let involved = ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: Some(node.into()),
            ..Default::default()
        };
        self.record(involved, None, type_, reason, message);
    }

    /// Records an event on `involved`, kept under its uid (a pod's UID, a node's name as `nodeRef` has it).
    fn record(
        &self,
        involved: ObjectReference,
        field_path: Option<String>,
        type_: &str,
        reason: &str,
        message: &str,
    ) {
        if involved.kind.as_deref() == Some("Pod") {
            let namespace = involved.namespace.clone().unwrap_or_default();
            let key = (namespace, involved.name.clone().unwrap_or_default());
            self.pod_event_feeds.feed(&key);
        }
        let uid = involved.uid.clone().unwrap_or_default();
        let resource_version = involved.resource_version.as_deref().map(Box::from);
        let mut events = self.events.lock();
        let EventLogs { logs, texts } = &mut *events;
        let log = logs.entry(uid).or_insert_with(|| EventLog {
            involved,
            events: Vec::new(),
        });
        if let Some(event) = log.events.iter_mut().find(|e| {
            e.field_path.as_deref() == field_path.as_deref()
                && &*e.type_ == type_
                && &*e.reason == reason
                && &*e.message == message
        }) {
            event.count += 1;
            event.last = now();
            return;
        }
        // A pod's log stops at five events or so: while it is short, it grows a slot at a time.
        if log.events.len() == log.events.capacity() && log.events.len() < 8 {
            log.events.reserve_exact(1);
        }
        let at = now();
        log.events.push(Recorded {
            field_path: field_path.map(|f| shared(texts, &f)),
            resource_version,
            type_: shared(texts, type_),
            reason: shared(texts, reason),
            message: shared(texts, message),
            id: uuid::Uuid::new_v4(),
            count: 1,
            first: at.clone(),
            last: at,
        });
    }

    /// An object's events (a pod's by its UID), oldest first.
    pub fn events_for(&self, uid: &str) -> Vec<Event> {
        let events = self.events.lock();
        let Some(log) = events.logs.get(uid) else {
            return Vec::new();
        };
        let namespace = log
            .involved
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let object = log.involved.name.as_deref().unwrap_or_default();
        log.events
            .iter()
            .map(|e| Event {
                metadata: ObjectMeta {
                    name: Some(format!("{object}.{}", e.id.simple())),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                },
                involved_object: ObjectReference {
                    field_path: e.field_path.as_deref().map(String::from),
                    resource_version: e.resource_version.as_deref().map(String::from),
                    ..log.involved.clone()
                },
                type_: Some(e.type_.to_string()),
                reason: Some(e.reason.to_string()),
                message: Some(e.message.to_string()),
                count: Some(e.count),
                first_timestamp: Some(e.first.clone()),
                last_timestamp: Some(e.last.clone()),
                reporting_component: Some(COMPONENT.into()),
                ..Default::default()
            })
            .collect()
    }

    /// A node's events, oldest first.
    pub fn node_events(&self, node: &str) -> Vec<Event> {
        self.events_for(node)
    }
}

/// A pod as an event's `involvedObject` (a container's `fieldPath` is added per event).
fn pod_reference(pod: &Pod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.metadata.namespace.clone().unwrap_or_default()),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        resource_version: pod.metadata.resource_version.clone(),
        field_path: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some(format!("uid-{name}"));
        let app = k8s_openapi::api::core::v1::Container {
            name: "app".into(),
            ..Default::default()
        };
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![app],
            ..Default::default()
        });
        pod
    }

    #[test]
    fn pods_share_the_texts_of_their_events_and_repeats_are_counted() {
        let api = Api::new();
        for name in ["a", "b"] {
            api.record_container_event(
                &pod(name),
                "app",
                "Normal",
                "Started",
                "Started container app",
            );
        }
        api.record_event(&pod("a"), "Normal", "Pulled", "pulled");
        api.record_event(&pod("a"), "Normal", "Pulled", "pulled");
        let events = api.events.lock();
        let (a, b) = (&events.logs["uid-a"].events, &events.logs["uid-b"].events);
        assert!(
            Arc::ptr_eq(&a[0].message, &b[0].message),
            "one copy of the text"
        );
        assert!(Arc::ptr_eq(&a[0].type_, &a[1].type_));
        assert_eq!(a.len(), 2, "a repeat is counted, not kept again");
        assert_eq!(
            (a[1].count, a.capacity()),
            (2, 2),
            "a short log has no spare slots"
        );
        drop(events);
        let shown = api.events_for("uid-a");
        assert_eq!(shown[0].message.as_deref(), Some("Started container app"));
        assert_eq!(
            shown[0].involved_object.field_path.as_deref(),
            Some("spec.containers{app}")
        );
        assert_eq!(shown[1].count, Some(2));
    }
}
