//! What a simulation reports: the JSON report now, each pod's part of it, and whether every pod of the
//! run is where its manifest expects it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::Simulation;
use crate::api::manifest::EXPECTED_PHASE_ANNOTATION;
use crate::report::{PodReport, Report};

impl Simulation {
    /// True when every pod is where its manifest expects it.
    pub fn pods_as_expected(&self) -> bool {
        self.run_pods().iter().all(|p| {
            let expected = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(EXPECTED_PHASE_ANNOTATION));
            match expected.map(String::as_str) {
                // The common case, checked without building the pod's report (its events).
                None | Some("Running") => {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                }
                Some(_) => self.pod_report(p).as_expected(),
            }
        })
    }

    /// The pods this run is about: in a cluster, those its manifests created (other pods may run on its
    /// nodes: DaemonSets tolerate any taint); alone, every pod.
    pub(super) fn run_pods(&self) -> Vec<Arc<Pod>> {
        let pods = self.api.list::<Pod>();
        if self.config.cluster.is_none() || self.created.is_empty() {
            return pods;
        }
        let created = |p: &Arc<Pod>| {
            let meta = &p.metadata;
            self.created.contains(&(
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default(),
            ))
        };
        pods.into_iter().filter(created).collect()
    }

    /// The report now.
    pub fn report(&self) -> Report {
        let mut pods: Vec<PodReport> = self
            .api
            .list::<Pod>()
            .iter()
            .map(|p| self.pod_report(p))
            .collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Report {
            pods,
            csi_calls: [self.calls.calls(), self.calls.in_flight()].concat(),
            api_reads: self.api.reads(),
            volume_attachments: self.attach_detach.report(),
            rejected: self.rejected.clone(),
            teardown: None,
        }
    }

    fn pod_report(&self, pod: &Pod) -> PodReport {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let containers = node
            .and_then(|node| self.node(node))
            .and_then(|n| n.pod_runtime(uid))
            .map(|r| r.containers)
            .unwrap_or_default();
        PodReport::of(pod, &self.api, containers)
    }
}
