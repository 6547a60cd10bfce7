//! The API's pods by node (`spec.nodeName`), maintained on every Pod change, so a node's work does not
//! grow with the number of pods elsewhere; and, per node, a count of the pods (by UID) that joined or left
//! it, by which a node knows its pods are the same ones as at its last look.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::pod::ApiPod;
use super::store::Key;

/// The index.
#[derive(Default)]
pub(super) struct PodIndex(HashMap<String, NodePods>);

/// One node's pods, and how many times one (by UID) joined or left it.
#[derive(Default)]
struct NodePods {
    pods: BTreeMap<Key, Arc<ApiPod>>,
    membership: u64,
}

impl PodIndex {
    /// The pods bound to `node`.
    pub fn pods_on(&self, node: &str) -> Vec<Arc<ApiPod>> {
        self.0
            .get(node)
            .map(|node| node.pods.values().cloned().collect())
            .unwrap_or_default()
    }

    /// How many times a pod (by UID) joined or left `node`.
    pub fn membership(&self, node: &str) -> u64 {
        self.0.get(node).map_or(0, |node| node.membership)
    }

    /// `node`'s pods, to replace one by a new version of the same pod.
    pub fn pods_mut(&mut self, node: &str) -> &mut BTreeMap<Key, Arc<ApiPod>> {
        &mut self.0.entry(node.to_string()).or_default().pods
    }

    /// The pod at `key` left `node`.
    pub fn remove(&mut self, node: &str, key: &Key) {
        if let Some(pods) = self.0.get_mut(node)
            && pods.pods.remove(key).is_some()
        {
            pods.membership += 1;
        }
    }

    /// `pod` is at `key` on `node`: a new member unless it replaces the same pod (by UID).
    pub fn insert(&mut self, node: String, key: &Key, pod: Arc<ApiPod>) {
        let pods = self.0.entry(node).or_default();
        let uid = pod.metadata.uid.clone();
        match pods.pods.insert(key.clone(), pod) {
            Some(old) if old.metadata.uid == uid => {}
            _ => pods.membership += 1,
        }
    }
}
