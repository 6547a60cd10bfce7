//! The API server's objects into the embedded API, as the kubelet's informers see them: the pods bound to
//! each node (one watch per node, `spec.nodeName=<node>`, as the kubelet's pod source), and the
//! cluster-wide CSIDrivers, PVs, PVCs and VolumeAttachments. A watch that lists again (after it expired)
//! removes what its new list no longer has. Once every watch has listed once, the embedded API's sources
//! are ready (the kubelet's `sourcesReady`), so nodes may clean up what no pod wants.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use super::secrets;
use crate::api::Api;

/// How long a referenced Secret the API server does not have waits before it is asked for again.
const RETRY_MISSING: Duration = Duration::from_secs(5);
use crate::api::store::{Key, Kind};

/// Counts the watches that have listed once; the last one marks the embedded API's sources ready.
struct Synced {
    api: Arc<Api>,
    left: AtomicUsize,
}

impl Synced {
    fn one_more(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.api.mark_sources_ready();
        }
    }
}

/// Starts every watch; they run until `stop`.
pub fn start(
    client: &kube::Client,
    api: &Arc<Api>,
    nodes: &[String],
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let synced = Arc::new(Synced {
        api: Arc::clone(api),
        left: AtomicUsize::new(nodes.len() + 4),
    });
    let ours: HashSet<String> = nodes.iter().cloned().collect();
    let mut tasks = vec![
        spawn_mirror::<CSIDriver>(client, api, &synced, &stop, |_| true),
        spawn_mirror::<PersistentVolume>(client, api, &synced, &stop, |_| true),
        spawn_mirror::<PersistentVolumeClaim>(client, api, &synced, &stop, |_| true),
        // Only the attachments to these nodes: other nodes' are none of theirs.
        spawn_mirror::<VolumeAttachment>(client, api, &synced, &stop, move |va| {
            ours.contains(&va.spec.node_name)
        }),
    ];
    for node in nodes {
        tasks.push(tokio::spawn(pods(
            client.clone(),
            Arc::clone(api),
            node.clone(),
            Arc::clone(&synced),
            stop.clone(),
        )));
    }
    tasks.push(tokio::spawn(refresh_secrets(
        client.clone(),
        Arc::clone(api),
        stop,
    )));
    tasks
}

fn key_of<K: Kind>(object: &K) -> Key {
    let meta = object.metadata();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn spawn_mirror<K>(
    client: &kube::Client,
    api: &Arc<Api>,
    synced: &Arc<Synced>,
    stop: &tokio::sync::watch::Receiver<bool>,
    in_scope: impl Fn(&K) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: Kind + kube::Resource<DynamicType = ()> + DeserializeOwned + Debug,
{
    let (client, api, synced, mut stop) = (
        client.clone(),
        Arc::clone(api),
        Arc::clone(synced),
        stop.clone(),
    );
    tokio::spawn(async move {
        let stream = watcher::watcher(kube::Api::<K>::all(client), watcher::Config::default())
            .default_backoff();
        tokio::pin!(stream);
        let mut listing = Listing::default();
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                _ = stop.changed() => return,
            };
            match event {
                Some(Ok(event)) => {
                    if listing.apply(&api, event, &in_scope, |_, o| o) {
                        synced.one_more();
                    }
                }
                Some(Err(e)) => tracing::warn!(kind = K::KIND, "watch: {e}"),
                None => return,
            }
        }
    })
}

/// A watch's relist bookkeeping: what the current list has seen.
#[derive(Default)]
struct Listing {
    seen: Option<BTreeSet<Key>>,
    done_once: bool,
}

impl Listing {
    /// Applies one watch event to the embedded API: objects in scope are stored through `merge` (given
    /// the stored one), others are not kept. True the first time a list completes.
    fn apply<K: Kind>(
        &mut self,
        api: &Api,
        event: Event<K>,
        in_scope: impl Fn(&K) -> bool,
        merge: impl Fn(Option<&K>, K) -> K,
    ) -> bool {
        match event {
            Event::Init => self.seen = Some(BTreeSet::new()),
            Event::InitApply(object) | Event::Apply(object) if !in_scope(&object) => {
                let (namespace, name) = key_of(&object);
                api.remove::<K>(&namespace, &name);
            }
            Event::InitApply(object) => {
                if let Some(seen) = &mut self.seen {
                    seen.insert(key_of(&object));
                }
                api.upsert(object, merge);
            }
            Event::InitDone => {
                let seen = self.seen.take().unwrap_or_default();
                for gone in api
                    .list::<K>()
                    .iter()
                    .filter(|o| in_scope(o) && !seen.contains(&key_of(o.as_ref())))
                {
                    let (namespace, name) = key_of(gone.as_ref());
                    api.remove::<K>(&namespace, &name);
                }
                return !std::mem::replace(&mut self.done_once, true);
            }
            Event::Apply(object) => api.upsert(object, merge),
            Event::Delete(object) => {
                let (namespace, name) = key_of(&object);
                let same = api
                    .peek::<K>(&namespace, &name)
                    .is_some_and(|o| o.metadata().uid == object.metadata().uid);
                if same {
                    api.remove::<K>(&namespace, &name);
                }
            }
        }
        false
    }
}

/// The pods bound to `node`. A pod's Secrets are read before the pod reaches the node; the node's view of
/// a pod's status is its own (the kubelet owns pod status), so only its spec and metadata come in.
async fn pods(
    client: kube::Client,
    api: Arc<Api>,
    node: String,
    synced: Arc<Synced>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let stream = watcher::watcher(kube::Api::<Pod>::all(client.clone()), config).default_backoff();
    tokio::pin!(stream);
    let mut listing = Listing::default();
    let on_node =
        move |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node);
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            _ = stop.changed() => return,
        };
        let event = match event {
            Some(Ok(event)) => event,
            Some(Err(e)) => {
                tracing::warn!("watch of pods: {e}");
                continue;
            }
            None => return,
        };
        // The Secrets a pod refers to and the node does not hold yet, before the pod reaches the node;
        // those it holds are kept fresh by `refresh_secrets`.
        if let Event::Apply(pod) | Event::InitApply(pod) = &event {
            let missing = secrets::referenced(pod, &api)
                .into_iter()
                .filter(|(namespace, name)| api.peek::<Secret>(namespace, name).is_none())
                .collect();
            secrets::fetch::<Secret>(&client, &api, &missing).await;
            let missing = secrets::referenced_config_maps(pod)
                .into_iter()
                .filter(|(namespace, name)| api.peek::<ConfigMap>(namespace, name).is_none())
                .collect();
            secrets::fetch::<ConfigMap>(&client, &api, &missing).await;
        }
        let keep_status = |known: Option<&Pod>, mut pod: Pod| {
            if let Some(known) = known.filter(|k| k.metadata.uid == pod.metadata.uid) {
                pod.status = known.status.clone();
            }
            pod
        };
        if listing.apply(&api, event, &on_node, keep_status) {
            synced.one_more();
        }
    }
}

/// Keeps the embedded API's Secrets and ConfigMaps to what the pods refer to: one referred to but not read
/// yet (its pod's claim or PV arrived after the pod) is read when the API changes, again at most every few
/// seconds while the API server has none; each minute every referenced one is read again (the kubelet's
/// cache TTL), and those no pod refers to any more are dropped.
async fn refresh_secrets(
    client: kube::Client,
    api: Arc<Api>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut changes = api.watch();
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.tick().await;
    let mut missing_since: (HashMap<_, Instant>, HashMap<_, Instant>) = Default::default();
    loop {
        let full = tokio::select! {
            _ = tick.tick() => true,
            _ = changes.changed() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                false
            }
            _ = stop.changed() => return,
        };
        let referenced = secrets::referenced_by_all(&api);
        refresh::<Secret>(&client, &api, referenced, full, &mut missing_since.0).await;
        let referenced = secrets::config_maps_referenced_by_all(&api);
        refresh::<ConfigMap>(&client, &api, referenced, full, &mut missing_since.1).await;
        // Its own changes are not news.
        changes.borrow_and_update();
    }
}

/// One pass of [`refresh_secrets`] for one kind: on a `full` pass every `referenced` object is read again
/// and the others dropped; else only those not held yet, each at most every [`RETRY_MISSING`].
async fn refresh<T>(
    client: &kube::Client,
    api: &Arc<Api>,
    referenced: BTreeSet<secrets::SecretKey>,
    full: bool,
    missing_since: &mut HashMap<secrets::SecretKey, Instant>,
) where
    T: crate::api::Kind
        + kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let wanted: BTreeSet<_> = if full {
        // Only here: a pod's objects are read just before the pod is stored, so between the two a
        // change-driven pass would drop them.
        secrets::forget_unreferenced::<T>(api, &referenced);
        missing_since.clear();
        referenced
    } else {
        referenced
            .into_iter()
            .filter(|(namespace, name)| api.peek::<T>(namespace, name).is_none())
            .filter(|key| {
                missing_since
                    .get(key)
                    .is_none_or(|at| at.elapsed() >= RETRY_MISSING)
            })
            .collect()
    };
    if wanted.is_empty() {
        return;
    }
    secrets::fetch::<T>(client, api, &wanted).await;
    for key in wanted {
        if api.peek::<T>(&key.0, &key.1).is_none() {
            missing_since.insert(key, Instant::now());
        }
    }
}
