//! Events, kept per involved object (a pod's UID, a node's name) outside the object store: nothing in the
//! simulation watches them, so recording one wakes no controller. A log keeps its object's reference once
//! and each event as a small record, and [`Api::events_for`] builds the `Event`s the report shows: a
//! `k8s_openapi` `Event` is about 700 bytes before its strings, and a pod gathers five or more (Scheduled,
//! Pulled, Created, Started, Killing), which at 100,000 pods was the largest record kept per pod.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::{Api, container_field_path, now};

/// The reporting component of events the simulator records.
pub const COMPONENT: &str = "kubelet-sim";

/// Every object's events.
pub(crate) type EventLogs = HashMap<String, EventLog>;

/// One object's events: its reference (without a `fieldPath`), and each event.
#[derive(Debug)]
pub(crate) struct EventLog {
    involved: ObjectReference,
    events: Vec<Recorded>,
}

/// One event, as little as rebuilds it.
#[derive(Debug)]
struct Recorded {
    /// The container's `fieldPath`, for a container's event.
    field_path: Option<Box<str>>,
    /// The object's `resourceVersion` when the event was first recorded.
    resource_version: Option<Box<str>>,
    type_: Box<str>,
    reason: Box<str>,
    message: Box<str>,
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
        let mut logs = self.events.lock();
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
        let at = now();
        log.events.push(Recorded {
            field_path: field_path.map(String::into_boxed_str),
            resource_version,
            type_: type_.into(),
            reason: reason.into(),
            message: message.into(),
            id: uuid::Uuid::new_v4(),
            count: 1,
            first: at.clone(),
            last: at,
        });
    }

    /// An object's events (a pod's by its UID), oldest first.
    pub fn events_for(&self, uid: &str) -> Vec<Event> {
        let logs = self.events.lock();
        let Some(log) = logs.get(uid) else {
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
