//! The embedded API server: objects ([`store`]; pods as [`ApiPod`]), admission (defaults, validation,
//! the inline-driver policy), manifests (Kubernetes YAML), events, service-account tokens and the root CA
//! ([`tokens`]).

pub mod admission;
mod events;
mod inline_grant;
pub mod inline_profile;
pub mod manifest;
mod pod;
mod pod_index;
pub mod service_account;
pub mod store;
pub mod tokens;
mod volume_validation;

use k8s_openapi::api::core::v1::Pod;

pub use events::COMPONENT;
pub(crate) use events::EventLogs;
pub use pod::ApiPod;
pub use store::{Api, ApiRead, Key, Kind, PodFeed, now};

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
