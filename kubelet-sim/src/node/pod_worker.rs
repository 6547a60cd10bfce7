//! Pod workers (`pod_workers.go`, much reduced): each pod's state on the node, moved on by `sync_pods` on
//! every pass. A pod starts (through kuberuntime) once the volume manager says its volumes are attached
//! and mounted; a deleted pod is stopped, its volumes are torn down by the volume manager's reconciler, its
//! directory is removed, and then it leaves the API. Its status is written by `status.rs`.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Semaphore;

use super::Kubelet;
use super::kuberuntime::ContainerReport;
use crate::api::ApiPod;
use crate::operations::OpKey;

/// How many pods are being stopped at once in the process, over all its simulated nodes.
///
/// A real node's pod workers are bounded by nothing but its pods (`pod_workers.go`: a goroutine per pod),
/// and so is each simulated node: the slots are far more than a node has pods (the kubelet's `--max-pods`
/// is 110). But every simulated node shares this process's CPUs. When many nodes stop all their pods at
/// once (100,000 pods deleted over 1,000 nodes), each stop makes its CRI calls, which then wait for a CPU
/// with their futures and HTTP/2 streams: about 10 KB a pod, 1 GiB at once. A stop waits for its slot
/// before it is made, in a few hundred bytes. Starts need no slots: each waits for its volumes first,
/// which spreads them out; the volume operations have their own (bench/RESULTS.md, issue #28's thirteenth
/// and fifteenth passes).
static STOP_SLOTS: Semaphore = Semaphore::const_new(1024);

/// Where a pod is in its life on the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub enum PodState {
    /// Waiting for volumes (or retrying a failed start).
    #[default]
    Waiting,
    /// Being started through CRI.
    Starting,
    /// Containers started.
    Running,
    /// Being stopped through CRI.
    Killing,
    /// Containers and sandbox gone; volumes are being torn down.
    Terminated,
}

/// What the pod workers know of one pod.
#[derive(Debug, Clone, Default)]
pub struct PodRuntime {
    /// Its state.
    pub state: PodState,
    /// When the node first saw it.
    pub seen_at: Option<Instant>,
    /// The volume-wait timeout was logged.
    pub warned: bool,
    /// The sandbox, once created.
    pub sandbox_id: Option<String>,
    /// The sandbox's IP, as its status had it once created (`status.podIP`).
    pub pod_ip: Option<String>,
    /// Its containers, once created.
    pub containers: Vec<ContainerReport>,
    /// How many containers its spec has, init containers included, once it runs.
    pub containers_in_spec: usize,
    /// The pod object as it left the API without a graceful deletion, to stop it (only then: a reference
    /// held all along would make each change of the pod in the API a copy of it).
    pub pod: Option<Arc<ApiPod>>,
}

impl PodRuntime {
    /// True once containers and sandbox are gone.
    pub fn terminated(&self) -> bool {
        self.state == PodState::Terminated
    }
}

impl Kubelet {
    pub(super) async fn sync_pods(self: &Arc<Self>) {
        // The membership, then the pods that left the API, taken before the list: one that leaves after
        // it is taken on the next pass, by when this pass has made its runtime entry, and the membership
        // has changed.
        let membership = self.api.pod_membership(&self.config.name);
        self.note_removed_pods();
        let pods = self.my_pods();
        self.stop_removed_pods(&pods, membership);
        // Every pod is visited on every pass, with one look at the pod workers' table (which makes the
        // entries of new pods); nothing is copied for one already known, and a running pod with nothing
        // to do is left there.
        let visits: Vec<(Arc<ApiPod>, PodState, Instant, bool)> = {
            let mut table = self.pods.lock();
            pods.into_iter()
                .filter_map(|pod| {
                    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                    if !table.contains_key(uid) {
                        table.insert(uid.to_string(), PodRuntime::default());
                    }
                    let rt = table.get_mut(uid)?;
                    let seen = *rt.seen_at.get_or_insert_with(Instant::now);
                    let gated = || {
                        let gates = pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref());
                        gates.is_some_and(|g| !g.is_empty())
                    };
                    let visit = pod.metadata.deletion_timestamp.is_some()
                        || rt.state == PodState::Waiting
                        || (rt.state == PodState::Running && gated());
                    visit.then_some((pod, rt.state, seen, rt.warned))
                })
                .collect()
        };
        for (pod, state, seen_at, warned) in visits {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if pod.metadata.deletion_timestamp.is_some() {
                match state {
                    PodState::Waiting | PodState::Running => {
                        self.spawn_kill(uid, state, pod.clone())
                    }
                    PodState::Terminated => self.finish_termination(&pod, uid),
                    PodState::Starting | PodState::Killing => {}
                }
                continue;
            }
            if state == PodState::Running {
                let containers = self
                    .pod_runtime(uid)
                    .map(|r| r.containers)
                    .unwrap_or_default();
                self.sync_readiness_gates(&pod, &containers);
            }
            if state != PodState::Waiting {
                continue;
            }
            match self.volumes.wait_for_attach_and_mount(uid) {
                true => {
                    self.set_state(uid, PodState::Starting);
                    let object = pod.clone();
                    let start = move |me: Arc<Self>| me.start(object);
                    let key = OpKey::Pod(uid.to_string());
                    self.spawn_pod_op(key, "start", uid, PodState::Waiting, None, start);
                }
                false if !warned && seen_at.elapsed() >= self.config.volume_wait_timeout => {
                    self.warn_volume_timeout(&pod, uid);
                }
                false => {}
            }
        }
    }

    /// Stops the pods that left the API without a graceful deletion (a force delete), as upstream's
    /// `HandlePodRemoves`: their containers and sandbox are stopped, and their directory goes once their
    /// volumes are torn down (the populator already dropped them). Only after the API's sources are ready:
    /// before, a missing pod may just not be loaded yet.
    ///
    /// Looked for only when the node's pods changed (`membership`, read before anything else of the API)
    /// since a look found none: a pod that left stays among them until its termination is finished.
    fn stop_removed_pods(self: &Arc<Self>, present: &[Arc<ApiPod>], membership: u64) {
        if !self.api.sources_ready() {
            return;
        }
        if *self.removed_looked.lock() == Some(membership) {
            debug_assert!(
                self.removed_pods(present).is_empty(),
                "a pod left unnoticed"
            );
            return;
        }
        let removed = self.removed_pods(present);
        if removed.is_empty() {
            *self.removed_looked.lock() = Some(membership);
        }
        for (uid, pod, state) in removed {
            match state {
                PodState::Waiting | PodState::Running => self.spawn_kill(&uid, state, pod),
                PodState::Terminated => self.finish_termination(&pod, &uid),
                PodState::Starting | PodState::Killing => {}
            }
        }
    }

    /// The pods the workers know that are not among `present`, with their state.
    fn removed_pods(&self, present: &[Arc<ApiPod>]) -> Vec<(String, Arc<ApiPod>, PodState)> {
        let present: foldhash::HashSet<&str> = present
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.pods
            .lock()
            .iter()
            .filter(|(uid, _)| !present.contains(uid.as_str()))
            .filter_map(|(uid, rt)| Some((uid.clone(), rt.pod.clone()?, rt.state)))
            .collect()
    }

    /// The last state of the pods that left the API, as a watch's DELETE carries it, kept for those this
    /// node knows (the others never ran here).
    fn note_removed_pods(&self) {
        for pod in self.api.take_removed_pods(&self.config.name) {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if let Some(rt) = self.pods.lock().get_mut(uid) {
                rt.pod = Some(pod);
            }
        }
    }

    /// Waiting too long for volumes (`volume_manager.go` WaitForAttachAndMount, 2m3s upstream): the
    /// error is upstream's, but since 1.28 the kubelet records no event for a plain timeout (`kubelet.go`
    /// SyncPod skips `wait.Interrupted` errors), so it is logged once and the pod goes on waiting. The
    /// volume operations' own events (`FailedMount`, `FailedAttachVolume`) say what is wrong.
    fn warn_volume_timeout(&self, pod: &ApiPod, uid: &str) {
        let missing = self.volumes.missing_volumes(uid);
        let known: Vec<&String> = missing
            .unmounted
            .iter()
            .chain(&missing.unattached)
            .collect();
        let mounted = self.volumes.mounted_volumes_for_pod(uid);
        let not_processed: Vec<String> = pod
            .volumes()
            .iter()
            .map(|v| v.name().to_string())
            .filter(|n| !known.contains(&n) && !mounted.contains_key(n))
            .collect();
        let go_list = |names: &[String]| format!("[{}]", names.join(" "));
        tracing::warn!(
            pod = %pod.metadata.name.as_deref().unwrap_or_default(),
            "Unable to attach or mount volumes for pod: unmounted volumes={}, unattached volumes={}, failed to process volumes={}: context deadline exceeded",
            go_list(&missing.unmounted),
            go_list(&missing.unattached),
            go_list(&not_processed),
        );
        if let Some(rt) = self.pods.lock().get_mut(uid) {
            rt.warned = true;
        }
    }

    pub(super) fn set_state(&self, uid: &str, state: PodState) {
        if let Some(rt) = self.pods.lock().get_mut(uid) {
            rt.state = state;
        }
    }

    /// Stops a pod (`kill`) now: the back-off of its failed starts does not hold a stop (a failed stop
    /// backs off as any operation), as upstream's pod worker moves a deleted pod to terminating
    /// at once (`pod_workers.go` UpdatePod); a start still running keeps it out until it ends. On failure
    /// the pod goes back to `retry_state`.
    pub(super) fn spawn_kill(self: &Arc<Self>, uid: &str, retry_state: PodState, pod: Arc<ApiPod>) {
        let key = OpKey::Pod(uid.to_string());
        self.set_state(uid, PodState::Killing);
        let stop = move |me: Arc<Self>| me.kill(pod);
        self.spawn_pod_op(key, "kill", uid, retry_state, Some(&STOP_SLOTS), stop);
    }

    /// Runs a pod operation, once it has one of `slots` if given; on failure the pod goes back to
    /// `retry_state` and is retried after backoff.
    pub(super) fn spawn_pod_op<F, Fut>(
        self: &Arc<Self>,
        key: OpKey,
        operation: &'static str,
        uid: &str,
        retry_state: PodState,
        slots: Option<&'static Semaphore>,
        op: F,
    ) where
        F: FnOnce(Arc<Self>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send + 'static,
    {
        if !self.pod_ops.lock().try_start(&key, operation) {
            self.set_state(uid, retry_state);
            return;
        }
        let me = Arc::clone(self);
        let uid = uid.to_string();
        tokio::spawn(async move {
            // The slots are never closed, so one always comes.
            let slot = match slots {
                Some(slots) => slots.acquire().await.ok(),
                None => None,
            };
            // Boxed, so that a task waiting for its slot holds only `op`'s captures, not the whole
            // operation's future; and the future is not kept twice in the task (as captured, as awaited).
            let ok = Box::pin(op(Arc::clone(&me))).await;
            drop(slot);
            if !ok {
                me.set_state(&uid, retry_state);
            }
            me.pod_ops.lock().finish(&key, operation, ok);
            me.kick.notify_one();
        });
    }

    /// Once a terminated pod has no volume left, removes its directory (never through a mount) and the
    /// pod object.
    fn finish_termination(&self, pod: &Pod, uid: &str) {
        if self.volumes.pod_volumes_exist(uid) {
            return;
        }
        let dir = self.config.root.join("pods").join(uid);
        if self.volumes.mounter().anything_mounted_under(&dir) {
            tracing::warn!(
                pod = uid,
                "something is still mounted under {}; leaving it",
                dir.display()
            );
            return;
        }
        let _ = std::fs::remove_dir_all(&dir);
        let meta = &pod.metadata;
        let _ = std::fs::remove_dir_all(self.pod_log_dir(pod));
        self.api.remove_finished_pod(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
            uid,
        );
        self.pods.lock().remove(uid);
        self.volumes.forget_pod(uid);
        self.tokens.forget_pod(uid);
    }
}
