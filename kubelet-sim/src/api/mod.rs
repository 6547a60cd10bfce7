//! The embedded API server: objects ([`store`]), admission (defaults, validation, the inline-driver policy),
//! manifests (Kubernetes YAML), events, service-account tokens and the root CA ([`tokens`]).

pub mod admission;
mod inline_grant;
pub mod inline_profile;
pub mod manifest;
pub mod service_account;
pub mod store;
pub mod tokens;
mod volume_validation;

use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use store::{Api, ApiRead, Key, Kind, now};

/// The reporting component of events the simulator records.
pub const COMPONENT: &str = "kubelet-sim";

impl Api {
    /// Records an event on a pod; a repeat of the same type, reason and message bumps its count, as the
    /// API server's event aggregation does. Events are kept per pod, outside the object store: nothing in
    /// the simulation watches them, so recording one wakes no controller.
    pub fn record_event(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        self.record(pod_reference(pod, None), type_, reason, message);
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
        self.record(pod_reference(pod, field_path), type_, reason, message);
    }

    /// Records an event on a node (the kubelet's `nodeRef`: kind Node, its name as uid, in `default`).
    pub fn record_node_event(&self, node: &str, type_: &str, reason: &str, message: &str) {
        let involved = ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: Some(node.into()),
            ..Default::default()
        };
        self.record(involved, type_, reason, message);
    }

    /// Records an event on `involved`, kept under its uid (a pod's UID, a node's name as `nodeRef` has it).
    fn record(&self, involved: ObjectReference, type_: &str, reason: &str, message: &str) {
        let uid = involved.uid.clone().unwrap_or_default();
        let mut events = self.events.lock();
        let log = events.entry(uid).or_default();
        if let Some(event) = log.iter_mut().find(|e| {
            e.involved_object.field_path == involved.field_path
                && e.type_.as_deref() == Some(type_)
                && e.reason.as_deref() == Some(reason)
                && e.message.as_deref() == Some(message)
        }) {
            event.count = Some(event.count.unwrap_or(1) + 1);
            event.last_timestamp = Some(now());
            return;
        }
        let namespace = involved
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = format!(
            "{}.{}",
            involved.name.as_deref().unwrap_or_default(),
            uuid::Uuid::new_v4().simple()
        );
        log.push(Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace),
                ..Default::default()
            },
            involved_object: involved,
            type_: Some(type_.into()),
            reason: Some(reason.into()),
            message: Some(message.into()),
            count: Some(1),
            first_timestamp: Some(now()),
            last_timestamp: Some(now()),
            reporting_component: Some(COMPONENT.into()),
            ..Default::default()
        });
    }

    /// A pod's events, oldest first.
    pub fn events_for(&self, pod_uid: &str) -> Vec<Event> {
        self.events.lock().get(pod_uid).cloned().unwrap_or_default()
    }

    /// A node's events, oldest first.
    pub fn node_events(&self, node: &str) -> Vec<Event> {
        self.events_for(node)
    }
}

/// A pod as an event's `involvedObject`, with a container's `fieldPath`.
fn pod_reference(pod: &Pod, field_path: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.metadata.namespace.clone().unwrap_or_default()),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        resource_version: pod.metadata.resource_version.clone(),
        field_path,
    }
}

/// Where a container sits in its pod, as an event's `involvedObject.fieldPath` says it
/// (`pkg/kubelet/container/ref.go` fieldPath: app containers first, then init containers; one the pod
/// does not have is "implicitly required container <name>").
pub fn container_field_path(pod: &Pod, name: &str) -> String {
    let spec = pod.spec.as_ref();
    let find = |list: Option<&Vec<k8s_openapi::api::core::v1::Container>>, field: &str| {
        let index = list?.iter().position(|c| c.name == name)?;
        Some(if name.is_empty() {
            format!("spec.{field}[{index}]")
        } else {
            format!("spec.{field}{{{name}}}")
        })
    };
    find(spec.map(|s| &s.containers), "containers")
        .or_else(|| {
            find(
                spec.and_then(|s| s.init_containers.as_ref()),
                "initContainers",
            )
        })
        .unwrap_or_else(|| format!("implicitly required container {name}"))
}
