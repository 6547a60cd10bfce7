//! A Pod as the embedded API keeps it: k8s-openapi's `Pod` with its volumes held apart, each as the volume
//! manager's [`InlineVolume`] (its name and its one source).
//!
//! k8s-openapi lays a `Volume` out with all thirty of its sources inline, set or not: 3,208 bytes, where
//! Go's `v1.Volume` holds pointers (about 250 bytes). A pod with two inline CSI volumes and its
//! `kube-api-access` took 9.6 KB for its volumes alone, more than the rest of the pod; 96 MiB of a
//! 10,000-pod run's heap (issue #28, bench/RESULTS.md, eleventh pass). Here a volume costs its source,
//! every pod's equal `kube-api-access` projection is shared, and the volume manager's specs share these
//! very volumes instead of converting their own.
//!
//! The pod derefs to the `Pod` it came from, whose `spec.volumes` is empty: a pod's volumes are read
//! through [`ApiPod::volumes`], and [`ApiPod::to_pod`] gives the whole Pod again (for reports, or to
//! send). The store holds only this form of a pod (`Kind` is not implemented for `Pod`), so no pod is
//! kept with its volumes inline by mistake.

use std::ops::{Deref, DerefMut};

use inlet_volume::InlineVolume;
use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::{Pod, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A Pod as the API stores it (see the module's doc).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApiPod {
    pod: Pod,
    volumes: Vec<InlineVolume>,
}

impl ApiPod {
    /// `spec.volumes`, in order.
    pub fn volumes(&self) -> &[InlineVolume] {
        &self.volumes
    }

    /// The volume named `name`.
    pub fn volume(&self, name: &str) -> Option<&InlineVolume> {
        self.volumes.iter().find(|v| v.name() == name)
    }

    /// The whole Pod, its volumes back in `spec.volumes`.
    pub fn to_pod(&self) -> Pod {
        let mut pod = self.pod.clone();
        if let Some(spec) = pod.spec.as_mut().filter(|_| !self.volumes.is_empty()) {
            spec.volumes = Some(self.volumes.iter().map(Volume::from).collect());
        }
        pod
    }
}

impl From<Pod> for ApiPod {
    fn from(mut pod: Pod) -> Self {
        let volumes = pod.spec.as_mut().and_then(|s| s.volumes.take());
        let volumes = volumes.into_iter().flatten().map(InlineVolume::from);
        Self {
            volumes: volumes.collect(),
            pod,
        }
    }
}

impl Deref for ApiPod {
    type Target = Pod;

    fn deref(&self) -> &Pod {
        &self.pod
    }
}

/// For changes to a stored pod's metadata and status. Volumes cannot change: the API server refuses any
/// change of a pod's spec but its containers' images, activeDeadlineSeconds and tolerations.
impl DerefMut for ApiPod {
    fn deref_mut(&mut self) -> &mut Pod {
        &mut self.pod
    }
}

impl k8s_openapi::Resource for ApiPod {
    const API_VERSION: &'static str = Pod::API_VERSION;
    const GROUP: &'static str = Pod::GROUP;
    const KIND: &'static str = Pod::KIND;
    const VERSION: &'static str = Pod::VERSION;
    const URL_PATH_SEGMENT: &'static str = Pod::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl Metadata for ApiPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.pod.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.pod.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(volumes: Option<Vec<Volume>>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                volumes,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn holds_the_volumes_apart_and_gives_the_same_pod_back() {
        let volumes: Vec<Volume> = serde_json::from_value(serde_json::json!([
            {"name": "data", "csi": {"driver": "local.inlet.dev"}},
            {"name": "scratch", "emptyDir": {}},
        ]))
        .unwrap();
        let stored = ApiPod::from(pod(Some(volumes)));
        assert_eq!(stored.spec.as_ref().unwrap().volumes, None);
        let names: Vec<_> = stored.volumes().iter().map(InlineVolume::name).collect();
        assert_eq!(names, ["data", "scratch"]);
        assert!(stored.volume("scratch").unwrap().empty_dir().is_some());
        assert_eq!(ApiPod::from(stored.to_pod()), stored);
        assert_eq!(stored.to_pod().spec.unwrap().volumes.unwrap().len(), 2);
    }

    #[test]
    fn a_pod_without_volumes_stays_without() {
        let stored = ApiPod::from(pod(None));
        assert!(stored.volumes().is_empty());
        assert_eq!(stored.to_pod(), pod(None));
    }
}
