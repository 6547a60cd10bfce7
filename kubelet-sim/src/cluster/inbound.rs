//! The API server's objects into the embedded API, as a kubelet reads them with a node's rights: the pods
//! bound to each node (one watch per node, `spec.nodeName=<node>`, as the kubelet's pod source) and the
//! cluster-wide CSIDrivers (watched, as the kubelet's informer does), and, one GET each, only what those
//! pods refer to (`references.rs`: Secrets, ConfigMaps, claims, their PVs and VolumeAttachments). A watch
//! that lists again (after it expired) removes what its new list no longer has. Once every watch has listed
//! once, the embedded API's sources are ready (the kubelet's `sourcesReady`), so nodes may clean up what no
//! pod wants.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::Resource;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use super::references::{self, ObjectKey};
use crate::api::store::{Key, Kind};
use crate::api::{Api, ApiPod};

/// How long a referenced object the API server does not have waits before it is asked for again.
const RETRY_MISSING: Duration = Duration::from_secs(5);
/// How often a VolumeAttachment a pod waits for is read again until it is attached (the attacher polls).
const ATTACH_POLL: Duration = Duration::from_secs(1);

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
        left: AtomicUsize::new(nodes.len() + 1),
    });
    let mut tasks = vec![spawn_mirror::<CSIDriver>(
        client,
        api,
        &synced,
        &stop,
        |_| true,
    )];
    for node in nodes {
        tasks.push(tokio::spawn(pods(
            client.clone(),
            Arc::clone(api),
            node.clone(),
            Arc::clone(&synced),
            stop.clone(),
        )));
    }
    tasks.push(tokio::spawn(refresh_referenced(
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
        move |p: &ApiPod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node);
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            _ = stop.changed() => return,
        };
        let event = match event {
            Some(Ok(event)) => stored(event),
            Some(Err(e)) => {
                tracing::warn!("watch of pods: {e}");
                continue;
            }
            None => return,
        };
        // What a pod refers to and the node does not hold yet, before the pod reaches the node; what it
        // holds is kept fresh by `refresh_referenced`.
        if let Event::Apply(pod) | Event::InitApply(pod) = &event {
            fetch_referenced(&client, &api, pod).await;
        }
        let keep_status = |known: Option<&ApiPod>, mut pod: ApiPod| {
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

/// A watch event of pods, with each pod in the form the API stores.
fn stored(event: Event<Pod>) -> Event<ApiPod> {
    match event {
        Event::Init => Event::Init,
        Event::InitApply(pod) => Event::InitApply(pod.into()),
        Event::InitDone => Event::InitDone,
        Event::Apply(pod) => Event::Apply(pod.into()),
        Event::Delete(pod) => Event::Delete(pod.into()),
    }
}

/// Reads what `pod` refers to that the embedded API does not hold yet, in the order each depends on the
/// last: claims, their PVs, the PVs' attachments, Secrets (a PV's references), ConfigMaps.
async fn fetch_referenced(client: &kube::Client, api: &Arc<Api>, pod: &ApiPod) {
    let missing = |keys: BTreeSet<ObjectKey>, held: &dyn Fn(&ObjectKey) -> bool| -> BTreeSet<_> {
        keys.into_iter().filter(|k| !held(k)).collect()
    };
    let claims = missing(references::referenced_claims(pod), &|(n, c)| {
        api.peek::<PersistentVolumeClaim>(n, c).is_some()
    });
    references::fetch(api, &claims, namespaced::<PersistentVolumeClaim>(client)).await;
    let volumes = missing(references::referenced_volumes(pod, api), &|(_, v)| {
        api.peek::<PersistentVolume>("", v).is_some()
    });
    references::fetch(api, &volumes, cluster::<PersistentVolume>(client)).await;
    let attachments = missing(references::referenced_attachments(pod, api), &|(_, a)| {
        api.peek::<VolumeAttachment>("", a).is_some()
    });
    references::fetch(api, &attachments, cluster::<VolumeAttachment>(client)).await;
    let secrets = missing(references::referenced_secrets(pod, api), &|(n, s)| {
        api.peek::<Secret>(n, s).is_some()
    });
    references::fetch(api, &secrets, namespaced::<Secret>(client)).await;
    let config_maps = missing(references::referenced_config_maps(pod), &|(n, c)| {
        api.peek::<ConfigMap>(n, c).is_some()
    });
    references::fetch(api, &config_maps, namespaced::<ConfigMap>(client)).await;
}

fn namespaced<T>(client: &kube::Client) -> impl Fn(&str) -> kube::Api<T>
where
    T: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    let client = client.clone();
    move |namespace| kube::Api::namespaced(client.clone(), namespace)
}

fn cluster<T: Resource<DynamicType = ()>>(client: &kube::Client) -> impl Fn(&str) -> kube::Api<T> {
    let client = client.clone();
    move |_| kube::Api::all(client.clone())
}

/// Keeps the embedded API's copies of what the pods refer to: one referred to but not read yet (its pod's
/// claim or PV arrived after the pod) is read when the API changes, again at most every few seconds while
/// the API server has none; a claim not bound yet, and a VolumeAttachment a pod waits for, are read every
/// second until bound or attached;
/// each minute every referenced object is read again (the kubelet's cache TTL), and those no pod refers to
/// any more are dropped.
async fn refresh_referenced(
    client: kube::Client,
    api: Arc<Api>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut changes = api.watch();
    let mut full_tick = tokio::time::interval(Duration::from_secs(60));
    full_tick.tick().await;
    let mut poll = tokio::time::interval(ATTACH_POLL);
    let mut missing: [HashMap<ObjectKey, Instant>; 5] = Default::default();
    loop {
        let full = tokio::select! {
            _ = full_tick.tick() => true,
            _ = poll.tick() => false,
            _ = changes.changed() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                false
            }
            _ = stop.changed() => return,
        };
        let claims = references::referenced_by_all(&api, |p, _| references::referenced_claims(p));
        // A claim not bound yet is read again each second, as the populator reads it on each pass.
        let unbound = claims
            .iter()
            .filter(|(namespace, name)| {
                let claim = api.peek::<PersistentVolumeClaim>(namespace, name);
                let phase = claim
                    .as_ref()
                    .and_then(|c| c.status.as_ref()?.phase.clone());
                claim.is_some() && phase.as_deref() != Some("Bound")
            })
            .cloned()
            .collect();
        references::fetch(&api, &unbound, namespaced::<PersistentVolumeClaim>(&client)).await;
        let pass = Pass { api: &api, full };
        pass.refresh(
            claims,
            &mut missing[0],
            namespaced::<PersistentVolumeClaim>(&client),
        )
        .await;
        let volumes = references::referenced_by_all(&api, references::referenced_volumes);
        pass.refresh(
            volumes,
            &mut missing[1],
            cluster::<PersistentVolume>(&client),
        )
        .await;
        let attachments = references::referenced_by_all(&api, references::referenced_attachments);
        let waiting = attachments
            .iter()
            .filter(|(_, name)| {
                api.peek::<VolumeAttachment>("", name)
                    .is_some_and(|va| !va.status.as_ref().is_some_and(|s| s.attached))
            })
            .cloned()
            .collect();
        references::fetch(&api, &waiting, cluster::<VolumeAttachment>(&client)).await;
        pass.refresh(
            attachments,
            &mut missing[2],
            cluster::<VolumeAttachment>(&client),
        )
        .await;
        let secrets = references::referenced_by_all(&api, references::referenced_secrets);
        pass.refresh(secrets, &mut missing[3], namespaced::<Secret>(&client))
            .await;
        let config_maps =
            references::referenced_by_all(&api, |p, _| references::referenced_config_maps(p));
        pass.refresh(
            config_maps,
            &mut missing[4],
            namespaced::<ConfigMap>(&client),
        )
        .await;
        // Its own changes are not news.
        changes.borrow_and_update();
    }
}

/// One pass of [`refresh_referenced`].
struct Pass<'a> {
    api: &'a Arc<Api>,
    /// Every referenced object is read again and the others dropped; else only those not held yet,
    /// each at most every [`RETRY_MISSING`].
    full: bool,
}

impl Pass<'_> {
    async fn refresh<T>(
        &self,
        referenced: BTreeSet<ObjectKey>,
        missing_since: &mut HashMap<ObjectKey, Instant>,
        objects: impl Fn(&str) -> kube::Api<T>,
    ) where
        T: Kind + Clone + DeserializeOwned + Debug,
    {
        let api = self.api;
        let wanted: BTreeSet<_> = if self.full {
            // Only here: a pod's objects are read just before the pod is stored, so between the two a
            // change-driven pass would drop them.
            references::forget_unreferenced::<T>(api, &referenced);
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
        references::fetch(api, &wanted, objects).await;
        for key in wanted {
            if api.peek::<T>(&key.0, &key.1).is_none() {
                missing_since.insert(key, Instant::now());
            }
        }
    }
}
