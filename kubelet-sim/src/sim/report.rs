//! What a simulation reports: the JSON report now, each pod's part of it, and whether every pod of the
//! run is where its manifest expects it.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::Simulation;
use crate::api::manifest::EXPECTED_PHASE_ANNOTATION;
use crate::api::{ApiPod, Key, PodFeed};
use crate::report::{PodReport, Report};

/// What [`Simulation::pods_as_expected`] keeps from one call to the next.
pub(super) struct Unsettled {
    /// The pods changed since the last call.
    feed: Arc<PodFeed>,
    /// The pods not known to be as expected, by key; none before the first call, which takes every pod.
    waiting: Option<BTreeSet<Key>>,
}

impl Unsettled {
    pub(super) fn new(feed: Arc<PodFeed>) -> Self {
        Self {
            feed,
            waiting: None,
        }
    }
}

impl Simulation {
    /// True when every pod of the run is where its manifest expects it. A wait calls it often, so it
    /// costs what changed since the last call: the pods not as expected are kept in the order of their
    /// keys and looked at from the first until one still is not, and a pod that changes is looked at again.
    pub fn pods_as_expected(&self) -> bool {
        let mut unsettled = self.unsettled.lock();
        let changed = unsettled.feed.drain();
        let waiting = unsettled
            .waiting
            .get_or_insert_with(|| self.api.pod_keys().into_iter().collect());
        waiting.extend(changed);
        while let Some((namespace, name)) = waiting.first() {
            let settled = self
                .api
                .peek::<ApiPod>(namespace, name)
                .is_none_or(|p| !self.is_run_pod(&p) || self.as_expected(&p));
            if !settled {
                return false;
            }
            waiting.pop_first();
        }
        true
    }

    /// True when one pod is where its manifest expects it.
    fn as_expected(&self, pod: &ApiPod) -> bool {
        let expected = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(EXPECTED_PHASE_ANNOTATION));
        match expected.map(String::as_str) {
            // The common case, checked without building the pod's report (its events).
            None | Some("Running") => {
                pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            }
            Some(_) => self.pod_report(pod).as_expected(),
        }
    }

    /// True for a pod this run is about (see [`Simulation::run_pods`]).
    fn is_run_pod(&self, pod: &Pod) -> bool {
        if self.config.cluster.is_none() || self.created.is_empty() {
            return true;
        }
        let meta = &pod.metadata;
        self.created.contains(&(
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        ))
    }

    /// The pods this run is about: in a cluster, those its manifests created (other pods may run on its
    /// nodes: DaemonSets tolerate any taint); alone, every pod.
    pub(super) fn run_pods(&self) -> Vec<Arc<ApiPod>> {
        let mut pods = self.api.list::<ApiPod>();
        pods.retain(|p| self.is_run_pod(p));
        pods
    }

    /// The report now.
    pub fn report(&self) -> Report {
        let mut pods: Vec<PodReport> = self
            .api
            .list::<ApiPod>()
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

    fn pod_report(&self, pod: &ApiPod) -> PodReport {
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
