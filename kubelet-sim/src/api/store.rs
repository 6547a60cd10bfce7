//! The embedded, in-memory API: Kubernetes objects (k8s-openapi types; pods as [`ApiPod`], their volumes
//! compact) by kind, namespace and name, with a revision that every change bumps, so controllers wake on
//! change as they would on a watch.
//!
//! A kubelet watches less, as a real one does (its pods by `spec.nodeName`, informers for the rest): a
//! node's watch ([`Api::watch_node`]) sees changes to its own Pods, Node, CSINode and VolumeAttachments,
//! and the cluster watch ([`Api::watch_cluster`]) changes to every other kind. So one node's pod status
//! does not wake the other nodes, and a node's work per change does not grow with the cluster.
//!
//! Every read a node makes of a Secret, CSIDriver, PV, PVC or VolumeAttachment is recorded
//! ([`Api::reads`]), so scenarios can check the kubelet read only what it had to.
//!
//! Objects are kept behind `Arc`, so a list copies pointers, not objects (an informer's cache shares them
//! the same way); an update copies the one object it changes.
//!
//! A cluster controller does not list every pod on every pass: it takes the pods that changed from a
//! [`PodFeed`], as upstream's controllers take keys from the work queue their pod informer's handlers fill.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Weak};

use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;

use super::pod::ApiPod;

/// True for the kinds that belong to one node (see [`node_of`]).
fn is_node_scoped<T: Kind>() -> bool {
    [
        TypeId::of::<ApiPod>(),
        TypeId::of::<Node>(),
        TypeId::of::<CSINode>(),
        TypeId::of::<VolumeAttachment>(),
    ]
    .contains(&TypeId::of::<T>())
}

/// The node an object belongs to: a Pod's and a VolumeAttachment's `spec.nodeName`, a Node's and a
/// CSINode's name; none for other kinds, or a pod not yet scheduled.
fn node_of<T: Kind>(object: Option<&T>) -> Option<String> {
    let object = object?;
    let kind = TypeId::of::<T>();
    if kind == TypeId::of::<Node>() || kind == TypeId::of::<CSINode>() {
        return object.metadata().name.clone();
    }
    let any = object as &dyn Any;
    if let Some(pod) = any.downcast_ref::<ApiPod>() {
        return pod.spec.as_ref()?.node_name.clone();
    }
    any.downcast_ref::<VolumeAttachment>()
        .map(|attachment| attachment.spec.node_name.clone())
}

fn is_pod<T: Kind>() -> bool {
    TypeId::of::<T>() == TypeId::of::<ApiPod>()
}

/// The object as a Pod, if it is one.
fn as_pod<T: Kind>(object: &Arc<T>) -> Option<Arc<ApiPod>> {
    (Arc::clone(object) as Arc<dyn Any + Send + Sync>)
        .downcast::<ApiPod>()
        .ok()
}

/// `namespace/name`, or `name` for cluster-scoped objects (namespace empty).
pub type Key = (String, String);

/// One read of the API, as the report lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ApiRead {
    /// `get` or `list`.
    pub verb: String,
    /// The kind (`Secret`).
    pub kind: String,
    /// The namespace; empty for cluster-scoped kinds.
    pub namespace: String,
    /// The name; empty for a list.
    pub name: String,
}

/// The keys of the pods added, changed or removed since the last [`PodFeed::drain`], each once
/// (client-go's work queue dedupes keys the same way): a controller's pass then costs what changed, not
/// what the cluster holds. Created by [`Api::pod_feed`].
#[derive(Debug, Default)]
pub struct PodFeed(Mutex<HashSet<Key>>);

impl PodFeed {
    /// The keys fed since the last call.
    pub fn drain(&self) -> HashSet<Key> {
        std::mem::take(&mut *self.0.lock())
    }
}

/// The live [`PodFeed`]s of one kind of change.
#[derive(Debug, Default)]
pub(super) struct PodFeeds(Mutex<Vec<Weak<PodFeed>>>);

impl PodFeeds {
    /// A new feed, fed from now on.
    fn subscribe(&self) -> Arc<PodFeed> {
        let feed = Arc::new(PodFeed::default());
        self.0.lock().push(Arc::downgrade(&feed));
        feed
    }

    /// Feeds `key` to every live feed, and lets go of those dropped.
    pub(super) fn feed(&self, key: &Key) {
        self.0.lock().retain(|feed| match feed.upgrade() {
            Some(feed) => {
                feed.0.lock().insert(key.clone());
                true
            }
            None => false,
        });
    }
}

/// A kind the API stores. Pods are stored as [`ApiPod`] (their volumes compact), so `Pod` is not one.
pub trait Kind:
    k8s_openapi::Resource + Metadata<Ty = ObjectMeta> + Clone + Send + Sync + 'static
{
}

macro_rules! kinds {
    ($($kind:ty),* $(,)?) => { $(impl Kind for $kind {})* };
}
kinds!(
    ApiPod,
    k8s_openapi::api::core::v1::ConfigMap,
    k8s_openapi::api::core::v1::Namespace,
    k8s_openapi::api::core::v1::PersistentVolume,
    k8s_openapi::api::core::v1::PersistentVolumeClaim,
    k8s_openapi::api::core::v1::Secret,
    k8s_openapi::api::core::v1::ServiceAccount,
    k8s_openapi::api::storage::v1::CSIDriver,
    k8s_openapi::api::storage::v1::StorageClass,
    CSINode,
    Node,
    VolumeAttachment,
);

/// The API. Shared by nodes and controllers through an `Arc`.
#[derive(Default)]
pub struct Api {
    objects: RwLock<HashMap<TypeId, Box<dyn Any + Send + Sync>>>,
    reads: crate::deflated::DeflatedLines,
    /// The pods by node name (`spec.nodeName`), and which joined or left each node (`pod_index.rs`).
    pods_by_node: RwLock<super::pod_index::PodIndex>,
    /// Pods that left the API (removed, or replaced by one of another UID), by the node they were on, as
    /// a watch's DELETE carries the object's last state: a node stops what it ran of them (see
    /// [`Api::take_removed_pods`]) without keeping a reference to every pod it runs, which would make
    /// every change of a pod a copy of it.
    removed_pods: Mutex<HashMap<String, Vec<Arc<ApiPod>>>>,
    /// Events by pod UID (see `Api::record_event`).
    pub(crate) events: Mutex<super::EventLogs>,
    revision: Arc<tokio::sync::watch::Sender<u64>>,
    /// Bumped by changes to objects of no node (see the module's doc).
    cluster_revision: tokio::sync::watch::Sender<u64>,
    /// Per node, bumped by changes to that node's objects.
    node_revisions: RwLock<HashMap<String, tokio::sync::watch::Sender<u64>>>,
    /// The feeds of every Pod change.
    pod_feeds: PodFeeds,
    /// The feeds of each pod an event is recorded on (see `events.rs`).
    pub(super) pod_event_feeds: PodFeeds,
    /// Pods their node has finished with (namespace, name, UID), kept while someone takes them (see
    /// [`Api::track_finished`]).
    finished: Mutex<Option<Vec<(String, String, String)>>>,
    /// Set once every object the run was given has been applied (the kubelet's "all sources ready").
    sources_ready: std::sync::atomic::AtomicBool,
    /// When the nodes began to leave their cluster (`--drain-on-exit`): they report NotReady from then on.
    leaving: std::sync::OnceLock<Time>,
    /// Set once they have left (their Nodes deleted): nothing more is posted for them.
    left: std::sync::atomic::AtomicBool,
    /// Service-account tokens, the root CA and the simulation's clock.
    pub tokens: super::tokens::Tokens,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("revision", &*self.revision.borrow())
            .finish()
    }
}

fn key_of(meta: &ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The current time as an API timestamp.
pub fn now() -> Time {
    after(std::time::Duration::ZERO)
}

/// The time `delay` from now as an API timestamp.
pub fn after(delay: std::time::Duration) -> Time {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        + delay;
    let millis = i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX);
    Time(
        k8s_openapi::jiff::Timestamp::from_millisecond(millis)
            .unwrap_or(k8s_openapi::jiff::Timestamp::MAX),
    )
}

impl Api {
    /// An empty API.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A receiver that sees every change (the revision).
    pub fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// A receiver that sees changes to `node`'s own objects: its Pods, Node, CSINode, VolumeAttachments.
    pub fn watch_node(&self, node: &str) -> tokio::sync::watch::Receiver<u64> {
        if let Some(sender) = self.node_revisions.read().get(node) {
            return sender.subscribe();
        }
        let mut revisions = self.node_revisions.write();
        revisions
            .entry(node.to_string())
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }

    /// A feed of the pods that change from now on (the key of each pod added, changed or removed).
    pub fn pod_feed(&self) -> Arc<PodFeed> {
        self.pod_feeds.subscribe()
    }

    /// A feed of the pods an event is recorded on from now on: events change no object, so a pod feed
    /// does not see them.
    pub fn pod_event_feed(&self) -> Arc<PodFeed> {
        self.pod_event_feeds.subscribe()
    }

    /// The keys of every pod now.
    pub fn pod_keys(&self) -> Vec<Key> {
        self.with_map::<ApiPod, _>(|m| m.keys().cloned().collect())
    }

    /// A receiver that sees changes to objects of no node (PVs, PVCs, CSIDrivers, Secrets, ...).
    pub fn watch_cluster(&self) -> tokio::sync::watch::Receiver<u64> {
        self.cluster_revision.subscribe()
    }

    /// The nodes leave their cluster: they report NotReady from now on.
    pub fn mark_leaving(&self) {
        let _ = self.leaving.set(now());
    }

    /// Since when the nodes leave their cluster, if they do.
    pub fn leaving(&self) -> Option<Time> {
        self.leaving.get().cloned()
    }

    /// The nodes have left their cluster: nothing more is posted for them.
    pub fn mark_left(&self) {
        self.left.store(true, std::sync::atomic::Ordering::Release);
    }

    /// True once the nodes have left their cluster.
    pub fn left(&self) -> bool {
        self.left.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks the API's content complete: nodes may now act on what is *not* in it (see
    /// [`Api::sources_ready`]). Wakes every watcher.
    pub fn mark_sources_ready(&self) {
        self.sources_ready
            .store(true, std::sync::atomic::Ordering::Release);
        self.cluster_revision.send_modify(|r| *r += 1);
        self.changed();
    }

    /// True once the pods the run wants are all in the API. Before that, a pod missing from the API may
    /// just not be loaded yet, so a kubelet must not tear down what it finds on disk (upstream's
    /// `sourcesReady.AllReady()`, which gates the populator's `HasAddedPods` and the reconciler's
    /// `readyToUnmount`).
    pub fn sources_ready(&self) -> bool {
        self.sources_ready
            .load(std::sync::atomic::Ordering::Acquire)
    }

    fn changed(&self) {
        self.revision.send_modify(|r| *r += 1);
    }

    fn with_map<T: Kind, R>(&self, f: impl FnOnce(&BTreeMap<Key, Arc<T>>) -> R) -> R {
        let objects = self.objects.read();
        match objects
            .get(&TypeId::of::<T>())
            .and_then(|m| m.downcast_ref::<BTreeMap<Key, Arc<T>>>())
        {
            Some(map) => f(map),
            None => f(&BTreeMap::new()),
        }
    }

    fn with_map_mut<T: Kind, R>(&self, f: impl FnOnce(&mut BTreeMap<Key, Arc<T>>) -> R) -> R {
        let mut objects = self.objects.write();
        let map = objects
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::new(BTreeMap::<Key, Arc<T>>::new()));
        let result = f(map
            .downcast_mut::<BTreeMap<Key, Arc<T>>>()
            .expect("one map type per TypeId"));
        drop(objects);
        self.changed();
        result
    }

    /// Reads one object without recording the read (the simulator's own bookkeeping).
    pub fn peek<T: Kind>(&self, namespace: &str, name: &str) -> Option<Arc<T>> {
        self.with_map::<T, _>(|m| m.get(&(namespace.to_string(), name.to_string())).cloned())
    }

    /// Reads one object, recording the read as the report's `api_reads`.
    pub fn get_recorded<T: Kind>(&self, namespace: &str, name: &str) -> Option<Arc<T>> {
        let read = ApiRead {
            verb: "get".into(),
            kind: T::KIND.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        // Kept as its JSON line, deflated with the others: a run of 100,000 pods records several a pod.
        self.reads.push_json(&read);
        self.peek(namespace, name)
    }

    /// Every object of a kind (not recorded: informers list once, and the simulator lists often).
    pub fn list<T: Kind>(&self) -> Vec<Arc<T>> {
        self.with_map::<T, _>(|m| m.values().cloned().collect())
    }

    /// Stores an object, replacing one of the same name.
    pub fn put<T: Kind>(&self, object: T) {
        let key = key_of(object.metadata());
        self.with_map_mut::<T, _>(|m| {
            let old = m.insert(key.clone(), Arc::new(object));
            self.replaced(&key, old, m.get(&key));
        });
    }

    /// Stores `object` as `merge` makes it from the stored one of the same name (if any), in one step: no
    /// change by anyone else comes between the read and the write.
    pub fn upsert<T: Kind>(&self, object: T, merge: impl FnOnce(Option<&T>, T) -> T) {
        let key = key_of(object.metadata());
        self.with_map_mut::<T, _>(|m| {
            let merged = merge(m.get(&key).map(Arc::as_ref), object);
            let old = m.insert(key.clone(), Arc::new(merged));
            self.replaced(&key, old, m.get(&key));
        });
    }

    /// Changes an object in place; false when it does not exist. The object is copied only if someone
    /// still holds the version read before (a pod is 7 KB or more in k8s-openapi's layout): the index's
    /// own reference is let go first.
    pub fn update<T: Kind>(&self, namespace: &str, name: &str, f: impl FnOnce(&mut T)) -> bool {
        let key = (namespace.to_string(), name.to_string());
        self.with_map_mut::<T, _>(|m| match m.get_mut(&key) {
            Some(object) => {
                let before = node_of(Some(object.as_ref()));
                match before.as_ref().filter(|_| is_pod::<T>()) {
                    // The index lets its reference go while the pod changes, and takes the new version
                    // back under the same lock, so no reader of `pods_on` misses the pod meanwhile.
                    Some(node) => {
                        let mut index = self.pods_by_node.write();
                        let pods = index.pods_mut(node);
                        pods.remove(&key);
                        f(Arc::make_mut(object));
                        pods.extend(as_pod(object).map(|pod| (key.clone(), pod)));
                    }
                    None => f(Arc::make_mut(object)),
                }
                self.after_change(&key, before, Some(&*object));
                true
            }
            None => false,
        })
    }

    /// Removes an object; the removed one, if it existed.
    pub fn remove<T: Kind>(&self, namespace: &str, name: &str) -> Option<Arc<T>> {
        let key = (namespace.to_string(), name.to_string());
        self.with_map_mut::<T, _>(|m| {
            let old = m.remove(&key);
            self.replaced::<T>(&key, old.clone(), None);
            old
        })
    }

    /// Removes a pod its node has finished with (kept for no one: see [`Api::take_removed_pods`]).
    fn remove_finished(&self, key: &Key, uid: &str) {
        self.with_map_mut::<ApiPod, _>(|m| {
            if m.get(key).and_then(|p| p.metadata.uid.as_deref()) == Some(uid) {
                let old = m.remove(key);
                self.after_change::<ApiPod>(key, node_of(old.as_deref()), None);
            }
        });
    }

    /// The pods bound to a node (`spec.nodeName`), from the index (which holds them): a node's work does
    /// not grow with the number of pods elsewhere.
    pub fn pods_on(&self, node: &str) -> Vec<Arc<ApiPod>> {
        self.pods_by_node.read().pods_on(node)
    }

    /// How many times a pod (by UID) joined or left `node`: unchanged, the node's pods are the same pods,
    /// whatever their changes, so a node need not look again for the ones that left.
    pub fn pod_membership(&self, node: &str) -> u64 {
        self.pods_by_node.read().membership(node)
    }

    /// After `old` was replaced by `new` (or removed): [`Self::after_change`], and a pod that left the API
    /// (removed, or replaced by one of another UID) is kept for its node as [`Api::take_removed_pods`]
    /// gives it.
    fn replaced<T: Kind>(&self, key: &Key, old: Option<Arc<T>>, new: Option<&Arc<T>>) {
        let before = node_of(old.as_deref());
        // Kept before the node is woken, so the pass it wakes for finds it.
        if let (Some(node), Some(pod)) = (&before, old.as_ref().and_then(as_pod)) {
            let uid_of = |p: &Arc<T>| as_pod(p).and_then(|p| p.metadata.uid.clone());
            // Only for the nodes simulated here (they watch their objects): no one takes the others'.
            let simulated = self.node_revisions.read().contains_key(node);
            if simulated && new.is_none_or(|new| uid_of(new) != pod.metadata.uid) {
                let mut removed = self.removed_pods.lock();
                removed.entry(node.clone()).or_default().push(pod);
            }
        }
        self.after_change(key, before, new);
    }

    /// The pods that left the API since the last call, of those that were bound to `node`.
    pub fn take_removed_pods(&self, node: &str) -> Vec<Arc<ApiPod>> {
        self.removed_pods.lock().remove(node).unwrap_or_default()
    }

    /// After a change: wakes the watchers of the nodes the object belongs to (`before` the change, and
    /// after), or the cluster's, and keeps the pods-by-node index in step with a change of a Pod.
    fn after_change<T: Kind>(&self, key: &Key, before: Option<String>, new: Option<&Arc<T>>) {
        let after = node_of(new.map(Arc::as_ref));
        match (&before, &after) {
            (None, None) if !is_node_scoped::<T>() => {
                self.cluster_revision.send_modify(|r| *r += 1);
            }
            _ => {
                let revisions = self.node_revisions.read();
                for node in before
                    .iter()
                    .chain(after.iter().filter(|a| Some(*a) != before.as_ref()))
                {
                    if let Some(sender) = revisions.get(node) {
                        sender.send_modify(|r| *r += 1);
                    }
                }
            }
        }
        if !is_pod::<T>() {
            return;
        }
        self.pod_feeds.feed(key);
        let mut index = self.pods_by_node.write();
        if let Some(node) = before.filter(|b| Some(b) != after.as_ref()) {
            index.remove(&node, key);
        }
        if let (Some(node), Some(pod)) = (after, new.and_then(as_pod)) {
            index.insert(node, key, pod);
        }
    }

    /// Keeps, from now on, the pods nodes finish with, for [`Api::take_finished`]: what a real API server
    /// needs to hear (the kubelet's final delete). Untracked, nothing is kept.
    pub fn track_finished(&self) {
        self.finished.lock().get_or_insert_with(Vec::new);
    }

    /// Removes a pod its node has finished with (its containers stopped, volumes torn down, directory
    /// removed) if the API still holds that pod (not another of the same name), and notes it when
    /// finished pods are tracked.
    pub fn remove_finished_pod(&self, namespace: &str, name: &str, uid: &str) {
        self.remove_finished(&(namespace.to_string(), name.to_string()), uid);
        if let Some(finished) = self.finished.lock().as_mut() {
            finished.push((namespace.to_string(), name.to_string(), uid.to_string()));
        }
    }

    /// The finished pods noted since the last call.
    pub fn take_finished(&self) -> Vec<(String, String, String)> {
        self.finished
            .lock()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Every read so far.
    pub fn reads(&self) -> Vec<ApiRead> {
        self.reads
            .lines()
            .iter()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Pod, PodSpec, Secret};

    #[test]
    fn stores_by_kind_and_records_reads() {
        let api = Api::new();
        let mut watch = api.watch();
        api.put(Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        assert!(watch.has_changed().unwrap());
        watch.mark_unchanged();
        assert!(api.get_recorded::<Secret>("ns", "s").is_some());
        assert!(
            api.get_recorded::<Secret>("other", "s").is_none(),
            "namespaces are separate"
        );
        assert!(
            api.get_recorded::<ApiPod>("ns", "s").is_none(),
            "kinds are separate"
        );
        assert_eq!(api.reads().len(), 3);
        assert_eq!(
            api.reads()[0],
            ApiRead {
                verb: "get".into(),
                kind: "Secret".into(),
                namespace: "ns".into(),
                name: "s".into()
            }
        );
        assert!(api.update::<Secret>("ns", "s", |s| s.type_ = Some("Opaque".into())));
        assert!(watch.has_changed().unwrap());
        assert!(api.remove::<Secret>("ns", "s").is_some());
        assert!(api.list::<Secret>().is_empty());
    }

    #[test]
    fn pods_are_indexed_by_node() {
        let api = Api::new();
        let pod = |name: &str, node: Option<&str>| Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(String::from),
                ..Default::default()
            }),
            status: None,
        };
        api.put(ApiPod::from(pod("a", Some("n1"))));
        api.put(ApiPod::from(pod("b", Some("n2"))));
        api.put(ApiPod::from(pod("c", None)));
        assert_eq!(api.pods_on("n1").len(), 1);
        api.update::<ApiPod>("ns", "c", |p| {
            p.spec.as_mut().unwrap().node_name = Some("n1".into())
        });
        assert_eq!(api.pods_on("n1").len(), 2);
        api.remove::<ApiPod>("ns", "a");
        let names: Vec<_> = api
            .pods_on("n1")
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["c"]);
        assert_eq!(api.pods_on("n2").len(), 1);
    }

    #[test]
    fn a_pod_changes_in_place_and_its_node_gets_it_when_it_leaves() {
        let api = Api::new();
        let _watch = api.watch_node("n1");
        let pod = |name: &str, uid: &str, node: &str| Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            status: None,
        };
        api.put(ApiPod::from(pod("a", "1", "n1")));
        let stored = Arc::as_ptr(&api.peek::<ApiPod>("ns", "a").unwrap());
        api.update::<ApiPod>("ns", "a", |p| p.status = Some(Default::default()));
        let held = api.peek::<ApiPod>("ns", "a").unwrap();
        assert_eq!(Arc::as_ptr(&held), stored, "no reader held it: not copied");
        api.update::<ApiPod>("ns", "a", |p| p.status = None);
        assert!(held.status.is_some(), "a reader's version stays as read");
        assert!(
            api.take_removed_pods("n1").is_empty(),
            "changes are no removal"
        );
        assert_eq!(
            api.pod_membership("n1"),
            1,
            "one pod joined; changes are no membership"
        );

        api.put(ApiPod::from(pod("a", "2", "n1")));
        api.remove::<ApiPod>("ns", "a");
        let uids: Vec<_> = api
            .take_removed_pods("n1")
            .iter()
            .map(|p| p.metadata.uid.clone().unwrap())
            .collect();
        assert_eq!(uids, ["1", "2"], "replaced by another UID, then removed");
        assert_eq!(
            api.pod_membership("n1"),
            3,
            "a pod of another UID joined, then left"
        );
        api.put(ApiPod::from(pod("b", "3", "n1")));
        api.remove_finished_pod("ns", "b", "3");
        assert!(
            api.take_removed_pods("n1").is_empty(),
            "the node's own delete"
        );
        api.put(ApiPod::from(pod("c", "4", "elsewhere")));
        api.remove::<ApiPod>("ns", "c");
        assert!(
            api.removed_pods.lock().is_empty(),
            "no node here to take it"
        );
    }

    #[test]
    fn a_pod_feed_gives_each_changed_pod_once() {
        let api = Api::new();
        let pod = |name: &str| Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.put(ApiPod::from(pod("before")));
        let feed = api.pod_feed();
        let key = |name: &str| ("ns".to_string(), name.to_string());
        assert!(feed.drain().is_empty(), "only changes from now on");
        api.put(ApiPod::from(pod("a")));
        api.update::<ApiPod>("ns", "a", |p| p.status = Some(Default::default()));
        api.put(ApiPod::from(pod("b")));
        api.put(Secret::default());
        assert_eq!(feed.drain(), [key("a"), key("b")].into_iter().collect());
        assert!(feed.drain().is_empty(), "drained");
        api.remove::<ApiPod>("ns", "before");
        assert_eq!(feed.drain(), [key("before")].into_iter().collect());
        drop(feed);
        api.put(ApiPod::from(pod("c")));
        assert!(
            api.pod_feeds.0.lock().is_empty(),
            "a dropped feed is let go"
        );
        assert_eq!(api.pod_keys(), [key("a"), key("b"), key("c")]);

        let events = api.pod_event_feed();
        let a = api.peek::<ApiPod>("ns", "a").unwrap();
        api.record_event(&a, "Normal", "Pulled", "pulled");
        api.record_event(&a, "Normal", "Pulled", "pulled");
        api.record_node_event("n1", "Normal", "Starting", "starting");
        assert_eq!(
            events.drain(),
            [key("a")].into_iter().collect(),
            "a pod's events only"
        );
    }
}
