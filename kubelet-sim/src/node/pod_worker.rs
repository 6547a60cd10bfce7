//! Pod workers (`pod_workers.go`, `kuberuntime_manager.go`, much reduced): a pod starts once every volume
//! is mounted (images, sandbox, containers with the volumes as CRI mounts); a deleted pod is stopped, its
//! volumes are torn down by the reconciler, its directory removed, and then it leaves the API.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use inlet_image::auth::{self, Credentials};
use inlet_image::pull::VerificationPolicy;
use inlet_proto::csi_call::rpc_error;
use inlet_proto::runtime::v1 as cri;
use inlet_volume::PodInfo;
use inlet_volume::image::PLUGIN_NAME as IMAGE_PLUGIN;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodStatus, Secret,
};

use super::Kubelet;
use super::operations::OpKey;
use super::subpath;
use crate::api::now;

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

/// One container as the runtime reports it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ContainerReport {
    /// The container's name.
    pub name: String,
    /// Its runtime id (of its latest run).
    pub id: String,
    /// Its mounts, from the runtime's ContainerStatus.
    pub mounts: Vec<MountReport>,
    /// `running`, `terminated`, or `waiting` (between a crash and its restart).
    pub state: String,
    /// The exit code of its last run, once one ended.
    pub exit_code: Option<i32>,
    /// How many times the kubelet restarted it.
    pub restart_count: u32,
    /// Why it is in its state: the runtime's `Completed`/`Error`, or `CrashLoopBackOff`.
    pub reason: String,
    /// The last lines of its log (the CRI log file), once its last run ended.
    pub logs: Vec<String>,
    /// When a crashed container is restarted (its back-off ends).
    #[serde(skip)]
    pub restart_at: Option<Instant>,
}

/// Why a container could not be started: the waiting reason kuberuntime gives it, and the event's text.
#[derive(Debug)]
pub struct StartError {
    /// `CreateContainerConfigError` (its mounts could not be made), `CreateContainerError` or
    /// `RunContainerError` (the runtime refused).
    pub reason: &'static str,
    /// What went wrong, for the pod's `Failed` event.
    pub message: String,
}

impl StartError {
    fn reason(reason: &'static str) -> impl Fn(String) -> Self {
        move |message| Self { reason, message }
    }
}

/// One CRI mount.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MountReport {
    /// Where the container sees it.
    pub container_path: String,
    /// The host path (the volume's mount dir, or a subPath in it).
    pub host_path: String,
    /// Read-only in the container.
    pub readonly: bool,
}

/// What the pod workers know of one pod.
#[derive(Debug, Clone, Default)]
pub struct PodRuntime {
    /// The populator added its volumes.
    pub volumes_added: bool,
    /// Its state.
    pub state: PodState,
    /// When the node first saw it.
    pub seen_at: Option<Instant>,
    /// The volume-wait timeout event was recorded.
    pub warned: bool,
    /// The sandbox, once created.
    pub sandbox_id: Option<String>,
    /// Its containers, once created.
    pub containers: Vec<ContainerReport>,
    /// The pod object as last seen, to stop it if it leaves the API without a graceful deletion.
    pub pod: Option<Arc<Pod>>,
}

impl PodRuntime {
    /// True once containers and sandbox are gone.
    pub fn terminated(&self) -> bool {
        self.state == PodState::Terminated
    }
}

impl Kubelet {
    pub(super) async fn sync_pods(self: &Arc<Self>) {
        let pods = self.my_pods();
        self.stop_removed_pods(&pods);
        for pod in pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let (state, volumes_added, seen_at, warned) = {
                let mut pods = self.pods.lock();
                let rt = pods.entry(uid.clone()).or_default();
                rt.pod = Some(Arc::clone(&pod));
                let seen = *rt.seen_at.get_or_insert_with(Instant::now);
                (rt.state, rt.volumes_added, seen, rt.warned)
            };
            let key = OpKey {
                volume: format!("pod/{uid}"),
                pod: None,
            };
            if pod.metadata.deletion_timestamp.is_some() {
                match state {
                    PodState::Waiting | PodState::Running => {
                        self.set_state(&uid, PodState::Killing);
                        let object = pod.clone();
                        self.spawn_pod_op(key, &uid, state, move |me| me.kill(object));
                    }
                    PodState::Terminated => self.finish_termination(&pod, &uid),
                    PodState::Starting | PodState::Killing => {}
                }
                continue;
            }
            if state != PodState::Waiting || !volumes_added {
                if state == PodState::Waiting
                    && !warned
                    && seen_at.elapsed() >= self.config.volume_wait_timeout
                {
                    self.warn_volume_timeout(&pod, &uid);
                }
                continue;
            }
            let (unmounted, _) = self.missing_volumes(&uid);
            if unmounted.is_empty() {
                self.set_state(&uid, PodState::Starting);
                let object = pod.clone();
                self.spawn_pod_op(key, &uid, PodState::Waiting, move |me| me.start(object));
            } else if !warned && seen_at.elapsed() >= self.config.volume_wait_timeout {
                self.warn_volume_timeout(&pod, &uid);
            }
        }
    }

    /// Stops the pods that left the API without a graceful deletion (a force delete), as upstream's
    /// `HandlePodRemoves`: their containers and sandbox are stopped, and their directory goes once their
    /// volumes are torn down (the populator already dropped them). Only after the API's sources are ready:
    /// before, a missing pod may just not be loaded yet.
    fn stop_removed_pods(self: &Arc<Self>, present: &[Arc<Pod>]) {
        if !self.api.sources_ready() {
            return;
        }
        let present: std::collections::HashSet<&str> = present
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let removed: Vec<(String, Arc<Pod>, PodState)> = self
            .pods
            .lock()
            .iter()
            .filter(|(uid, _)| !present.contains(uid.as_str()))
            .filter_map(|(uid, rt)| Some((uid.clone(), rt.pod.clone()?, rt.state)))
            .collect();
        for (uid, pod, state) in removed {
            let key = OpKey {
                volume: format!("pod/{uid}"),
                pod: None,
            };
            match state {
                PodState::Waiting | PodState::Running => {
                    self.set_state(&uid, PodState::Killing);
                    self.spawn_pod_op(key, &uid, state, move |me| me.kill(pod));
                }
                PodState::Terminated => self.finish_termination(&pod, &uid),
                PodState::Starting | PodState::Killing => {}
            }
        }
    }

    /// (unmounted, unattached) volume names of a pod, by its names for them.
    fn missing_volumes(&self, uid: &str) -> (Vec<String>, Vec<String>) {
        let dsw = self.dsw.lock();
        let asw = self.asw.lock();
        let mut unmounted = Vec::new();
        let mut unattached = Vec::new();
        for (unique, volume) in dsw.pod_volumes(uid) {
            if asw.mounted(&unique, uid).is_none() {
                unmounted.push(volume.outer_name.clone());
            }
            if dsw.volume(&unique).is_some_and(|v| v.attachable)
                && !asw.volume(&unique).is_some_and(|v| v.attached)
            {
                unattached.push(volume.outer_name.clone());
            }
        }
        (unmounted, unattached)
    }

    /// The kubelet's event after waiting too long for volumes (`volume_manager.go` WaitForAttachAndMount).
    fn warn_volume_timeout(&self, pod: &Pod, uid: &str) {
        let (mut unmounted, unattached) = self.missing_volumes(uid);
        if unmounted.is_empty() {
            unmounted = pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .map(|v| v.iter().map(|v| v.name.clone()).collect())
                .unwrap_or_default();
        }
        let message = format!(
            "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[{}]: timed out waiting for the condition",
            unmounted.join(" "),
            unattached.join(" ")
        );
        self.api
            .record_event(pod, "Warning", "FailedMount", &message);
        if let Some(rt) = self.pods.lock().get_mut(uid) {
            rt.warned = true;
        }
    }

    pub(super) fn set_state(&self, uid: &str, state: PodState) {
        if let Some(rt) = self.pods.lock().get_mut(uid) {
            rt.state = state;
        }
    }

    /// Runs a pod operation; on failure the pod goes back to `retry_state` and is retried after backoff.
    pub(super) fn spawn_pod_op<F, Fut>(
        self: &Arc<Self>,
        key: OpKey,
        uid: &str,
        retry_state: PodState,
        op: F,
    ) where
        F: FnOnce(Arc<Self>) -> Fut,
        Fut: std::future::Future<Output = bool> + Send + 'static,
    {
        if !self.ops.lock().try_start(&key) {
            self.set_state(uid, retry_state);
            return;
        }
        let me = Arc::clone(self);
        let uid = uid.to_string();
        let run = op(Arc::clone(self));
        tokio::spawn(async move {
            let ok = run.await;
            if !ok {
                me.set_state(&uid, retry_state);
            }
            me.ops.lock().finish(&key, ok);
            me.kick.notify_one();
        });
    }

    ///
    /// Every pod waiting to start holds this future, so the calls it awaits are boxed: a pending start
    /// costs a few hundred bytes, not the largest CRI call's state (16 KB), which adds up over thousands
    /// of pods starting at once.
    async fn start(self: Arc<Self>, pod: Arc<Pod>) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let containers = pod
            .spec
            .as_ref()
            .map(|s| s.containers.as_slice())
            .unwrap_or_default();
        for container in containers {
            if !Box::pin(self.ensure_image(&pod, container)).await {
                return false;
            }
        }
        let sandbox_config = self.sandbox_config(&pod);
        let request = cri::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        };
        let sandbox_id = match Box::pin(self.cri.runtime.clone().run_pod_sandbox(request)).await {
            Ok(reply) => reply.into_inner().pod_sandbox_id,
            Err(s) => {
                let message = format!("Failed to create pod sandbox: {}", rpc_error(&s));
                self.api
                    .record_event(&pod, "Warning", "FailedCreatePodSandBox", &message);
                return false;
            }
        };
        inlet_host::crash::point("pod.sandbox-started");
        let mut reports = Vec::new();
        for container in containers {
            match Box::pin(self.start_container(&pod, container, &sandbox_id, &sandbox_config, 0))
                .await
            {
                Ok(report) => reports.push(report),
                Err(e) => {
                    self.api.record_event(
                        &pod,
                        "Warning",
                        "Failed",
                        &format!("Error: {}", e.message),
                    );
                    let waiting = ContainerReport {
                        name: container.name.clone(),
                        state: "waiting".into(),
                        reason: e.reason.into(),
                        ..Default::default()
                    };
                    self.set_status(&pod, std::slice::from_ref(&waiting), "Pending");
                    if let Some(rt) = self.pods.lock().get_mut(&uid) {
                        rt.containers = vec![waiting];
                    }
                    // Leave nothing half-started: the next attempt starts from a clean sandbox.
                    let mut runtime = self.cri.runtime.clone();
                    let _ = Box::pin(runtime.stop_pod_sandbox(cri::StopPodSandboxRequest {
                        pod_sandbox_id: sandbox_id.clone(),
                    }))
                    .await;
                    let _ = Box::pin(runtime.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                        pod_sandbox_id: sandbox_id.clone(),
                    }))
                    .await;
                    return false;
                }
            }
        }
        // Record the containers before the status says Running, so whoever sees Running finds them.
        if let Some(rt) = self.pods.lock().get_mut(&uid) {
            rt.state = PodState::Running;
            rt.sandbox_id = Some(sandbox_id);
            rt.containers = reports.clone();
        }
        self.set_status(&pod, &reports, "Running");
        true
    }

    /// Pulls per the container's pull policy (default: Always for `:latest` or no tag, else IfNotPresent).
    async fn ensure_image(&self, pod: &Pod, container: &Container) -> bool {
        let image = container.image.clone().unwrap_or_default();
        let tagged = image
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':') || last.contains('@'));
        let latest = !tagged || image.ends_with(":latest");
        let policy = container.image_pull_policy.clone().unwrap_or_else(|| {
            if latest {
                "Always".into()
            } else {
                "IfNotPresent".into()
            }
        });
        let spec = cri::ImageSpec {
            image: image.clone(),
            ..Default::default()
        };
        let present_id = self
            .cri
            .image
            .clone()
            .image_status(cri::ImageStatusRequest {
                image: Some(spec.clone()),
                verbose: false,
            })
            .await
            .ok()
            .and_then(|r| r.into_inner().image.map(|i| i.id));
        let present = present_id.is_some();
        let credentials = self.pull_credentials(pod, &image);
        // A cached image is the pod's only if the node's record says its credentials may use it
        // (KEP-2535, image_manager.go EnsureImageExists: MustAttemptImagePull).
        let usable = present_id.is_some_and(|id| self.may_use_cached(&image, &id, &credentials));
        match (policy.as_str(), present, usable) {
            // Absent, or present but this pod has not shown the credentials it was pulled with, and
            // Never forbids a pull to show them: upstream answers the same for both.
            ("Never", _, false) => {
                let message =
                    format!("Container image {image:?} is not present with pull policy of Never");
                self.api
                    .record_event(pod, "Warning", "ErrImageNeverPull", &message);
                false
            }
            ("Never" | "IfNotPresent", true, true) => {
                let message = format!(
                    "Container image {image:?} already present on machine and can be accessed by the pod"
                );
                self.api.record_event(pod, "Normal", "Pulled", &message);
                true
            }
            _ => {
                // Announced before it starts, so a crash before its record leaves the image needing
                // proof, never preloaded (upstream's pull intent).
                if let Some(puller) = &self.puller
                    && let Err(e) = puller.intend_pull(&image)
                {
                    let message = format!("Failed to pull image {image:?}: {e}");
                    self.api.record_event(pod, "Warning", "Failed", &message);
                    return false;
                }
                self.api.record_event(
                    pod,
                    "Normal",
                    "Pulling",
                    &format!("Pulling image {image:?}"),
                );
                // Each pull secret that applies, in keyring order, until one works; none: anonymous
                // (`kuberuntime_image.go` PullImage).
                let attempts: Vec<Option<&Credentials>> = if credentials.is_empty() {
                    vec![None]
                } else {
                    credentials.iter().map(Some).collect()
                };
                let mut outcome = Err(tonic::Status::unknown("no pull attempted"));
                let mut used = None;
                for credential in attempts {
                    let request = cri::PullImageRequest {
                        image: Some(spec.clone()),
                        auth: credential.map(Credentials::to_cri),
                        sandbox_config: Some(self.sandbox_config(pod)),
                    };
                    outcome = self.cri.image.clone().pull_image(request).await;
                    if outcome.is_ok() {
                        used = credential;
                        break;
                    }
                }
                match outcome {
                    Ok(pulled) => {
                        let image_ref = &pulled.get_ref().image_ref;
                        if let Some(puller) = &self.puller
                            && let Err(e) = puller.record_pull(&image, image_ref, used).await
                        {
                            tracing::warn!(image, error = %e, "could not record the pull");
                        }
                        self.api.record_event(
                            pod,
                            "Normal",
                            "Pulled",
                            &format!("Successfully pulled image {image:?}"),
                        );
                        true
                    }
                    Err(s) => {
                        let message = format!("Failed to pull image {image:?}: {}", rpc_error(&s));
                        self.api.record_event(pod, "Warning", "Failed", &message);
                        false
                    }
                }
            }
        }
    }

    /// Whether the node's pull record lets a pod with `credentials` use the cached `image` (the runtime's
    /// `id` for it), per the node's verification policy. Without a record (it could not be opened), only
    /// `NeverVerify` lets a cached image be used unproven.
    fn may_use_cached(&self, image: &str, id: &str, credentials: &[Credentials]) -> bool {
        match &self.puller {
            Some(puller) => puller.may_use(image, id, credentials),
            None => self.config.image_verification == VerificationPolicy::NeverVerify,
        }
    }

    /// The credentials of the pod's `imagePullSecrets` (read from its namespace) that apply to `image`;
    /// secrets that are missing or unreadable are skipped, as the kubelet skips them.
    fn pull_credentials(&self, pod: &Pod, image: &str) -> Vec<Credentials> {
        let info = PodInfo::from_pod(pod);
        let all: Vec<Credentials> = info
            .image_pull_secrets
            .iter()
            .filter_map(|name| self.api.get::<Secret>(&info.namespace, name))
            .flat_map(|secret| auth::from_secret(&secret).unwrap_or_default())
            .collect();
        auth::for_reference(&all, image)
    }

    pub(super) fn sandbox_config(&self, pod: &Pod) -> cri::PodSandboxConfig {
        let meta = &pod.metadata;
        let (name, namespace, uid) = (
            meta.name.clone().unwrap_or_default(),
            meta.namespace.clone().unwrap_or_default(),
            meta.uid.clone().unwrap_or_default(),
        );
        let log_directory = self
            .config
            .root
            .join("logs")
            .join(format!("{namespace}_{name}_{uid}"));
        let _ = std::fs::create_dir_all(&log_directory);
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.clone(),
                uid: uid.clone(),
                namespace: namespace.clone(),
                attempt: 0,
            }),
            // Host-network pods keep the node's hostname (`kuberuntime_sandbox.go` sets one only for pods
            // with their own network; runc refuses a hostname without a private UTS namespace).
            hostname: if host_network {
                String::new()
            } else {
                name.clone()
            },
            log_directory: log_directory.display().to_string(),
            labels: HashMap::from([
                ("io.kubernetes.pod.name".to_string(), name),
                ("io.kubernetes.pod.namespace".to_string(), namespace),
                ("io.kubernetes.pod.uid".to_string(), uid),
            ]),
            linux: Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: if host_network {
                            cri::NamespaceMode::Node as i32
                        } else {
                            cri::NamespaceMode::Pod as i32
                        },
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Creates and starts one container (run `attempt`, 0 for the first), as kuberuntime's
    /// `startContainer` does.
    pub(super) async fn start_container(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox_id: &str,
        sandbox_config: &cri::PodSandboxConfig,
        attempt: u32,
    ) -> Result<ContainerReport, StartError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mounts = self
            .container_mounts(&uid, container)
            .map_err(StartError::reason("CreateContainerConfigError"))?;
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: container.name.clone(),
                attempt,
            }),
            image: Some(cri::ImageSpec {
                image: container.image.clone().unwrap_or_default(),
                ..Default::default()
            }),
            command: container.command.clone().unwrap_or_default(),
            args: container.args.clone().unwrap_or_default(),
            working_dir: container.working_dir.clone().unwrap_or_default(),
            envs: container
                .env
                .iter()
                .flatten()
                .filter_map(|e| {
                    e.value.clone().map(|value| cri::KeyValue {
                        key: e.name.clone(),
                        value,
                    })
                })
                .collect(),
            mounts,
            // The pod's labels too, as `newContainerLabels` sets them: the relist finds a container's pod.
            labels: sandbox_config
                .labels
                .clone()
                .into_iter()
                .chain([(
                    "io.kubernetes.container.name".to_string(),
                    container.name.clone(),
                )])
                .collect(),
            log_path: format!("{}/{attempt}.log", container.name),
            ..Default::default()
        };
        let rpc = |reason| move |s: tonic::Status| StartError::reason(reason)(rpc_error(&s));
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config.clone()),
        };
        let id = self
            .cri
            .runtime
            .clone()
            .create_container(request)
            .await
            .map_err(rpc("CreateContainerError"))?
            .into_inner()
            .container_id;
        self.api.record_event(
            pod,
            "Normal",
            "Created",
            &format!("Created container {}", container.name),
        );
        self.cri
            .runtime
            .clone()
            .start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .map_err(rpc("RunContainerError"))?;
        self.api.record_event(
            pod,
            "Normal",
            "Started",
            &format!("Started container {}", container.name),
        );
        let status = self
            .cri
            .runtime
            .clone()
            .container_status(cri::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            })
            .await
            .map_err(rpc("RunContainerError"))?;
        let mounts = status
            .into_inner()
            .status
            .map(|s| s.mounts)
            .unwrap_or_default()
            .into_iter()
            .map(|m| MountReport {
                container_path: m.container_path,
                host_path: m.host_path,
                readonly: m.readonly,
            })
            .collect();
        Ok(ContainerReport {
            name: container.name.clone(),
            id,
            mounts,
            state: "running".into(),
            restart_count: attempt,
            ..Default::default()
        })
    }

    /// The CRI mounts of a container (`kubelet_pods.go` makeMounts): each volumeMount's volume dir, or for a
    /// subPath the bind [`subpath::prepare`] makes of it; read-only when the volumeMount or the volume itself
    /// says so. The errors are upstream's texts; a subPath's details go to the log only, as upstream keeps
    /// host paths from the user.
    fn container_mounts(
        &self,
        uid: &str,
        container: &Container,
    ) -> Result<Vec<cri::Mount>, String> {
        let volumes: HashMap<String, (String, String, bool)> = {
            let dsw = self.dsw.lock();
            dsw.pod_volumes(uid)
                .into_iter()
                .map(|(unique, v)| {
                    let spec_name = v.spec.name().to_string();
                    (v.outer_name.clone(), (unique, spec_name, v.read_only))
                })
                .collect()
        };
        let pod_dir = self.config.root.join("pods").join(uid);
        let mut mounts = Vec::new();
        for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
            let not_found = || {
                format!(
                    "cannot find volume {:?} to mount into container {:?}",
                    mount.name, container.name
                )
            };
            let (unique, spec_name, volume_read_only) =
                volumes.get(&mount.name).ok_or_else(not_found)?;
            let dir = self
                .asw
                .lock()
                .mounted(unique, uid)
                .map(|m| m.path.clone())
                .ok_or_else(not_found)?;
            let host_path = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
                None => dir,
                Some(sub) => {
                    check_sub_path(sub)?;
                    let request = subpath::SubPath {
                        volume_path: &dir,
                        sub_path: sub,
                        volume_name: spec_name,
                        container: &container.name,
                        index,
                        pod_dir: &pod_dir,
                    };
                    self.sub_path_mount(&request, &mount.name, unique.starts_with(IMAGE_PLUGIN))?
                }
            };
            let propagation = match mount.mount_propagation.as_deref() {
                Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
                Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
                _ => cri::MountPropagation::PropagationPrivate,
            };
            mounts.push(cri::Mount {
                container_path: mount.mount_path.clone(),
                host_path: host_path.display().to_string(),
                readonly: mount.read_only.unwrap_or(false) || *volume_read_only,
                propagation: propagation as i32,
                ..Default::default()
            });
        }
        Ok(mounts)
    }

    /// The bind of one volumeMount's subPath; a missing subPath is created first in a writable volume, as the
    /// kubelet does, and must exist in an image volume (the CRI's `image_sub_path` rule).
    fn sub_path_mount(
        &self,
        request: &subpath::SubPath,
        name: &str,
        image_volume: bool,
    ) -> Result<PathBuf, String> {
        let (sub, cname, volume_path) = (request.sub_path, request.container, request.volume_path);
        if !volume_path.join(sub).exists() {
            if image_volume {
                return Err(format!(
                    "subPath {sub:?} does not exist in image volume {name:?}"
                ));
            }
            if let Err(e) = subpath::safe_make_dir(volume_path, sub) {
                tracing::warn!(container = %cname, volume_mount = %name, "Failed to create subPath directory: {e}");
                return Err(format!(
                    "failed to create subPath directory for volumeMount {name:?} of container {cname:?}"
                ));
            }
        }
        subpath::prepare(&*self.host.mounter, request).map_err(|e| {
            tracing::warn!(container = %cname, volume_mount = %name, "Failed to prepare subPath: {e}");
            format!("failed to prepare subPath for volumeMount {name:?} of container {cname:?}")
        })
    }

    /// The pod's status: its phase, and each container's state as the runtime last reported it.
    pub(super) fn set_status(&self, pod: &Pod, containers: &[ContainerReport], phase: &str) {
        let (namespace, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let condition = |t: &str| PodCondition {
            type_: t.into(),
            status: "True".into(),
            last_transition_time: Some(now()),
            ..Default::default()
        };
        let images: HashMap<String, String> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
            .collect();
        let statuses = containers
            .iter()
            .map(|c| ContainerStatus {
                name: c.name.clone(),
                container_id: Some(format!("cri://{}", c.id)),
                image: images.get(&c.name).cloned().unwrap_or_default(),
                ready: c.state == "running",
                started: Some(c.state == "running"),
                restart_count: i32::try_from(c.restart_count).unwrap_or(i32::MAX),
                state: Some(container_state(c)),
                ..Default::default()
            })
            .collect();
        let running = phase == "Running";
        let conditions = ["PodReadyToStartContainers", "Initialized"]
            .into_iter()
            .chain(
                running
                    .then_some(["ContainersReady", "Ready"])
                    .into_iter()
                    .flatten(),
            )
            .chain(["PodScheduled"]);
        self.api.update::<Pod>(&namespace, &name, |p| {
            // When the node first started working on the pod, kept from then on.
            let start_time = p.status.as_ref().and_then(|s| s.start_time.clone());
            p.status = Some(PodStatus {
                phase: Some(phase.into()),
                conditions: Some(conditions.clone().map(condition).collect()),
                container_statuses: Some(statuses),
                host_ip: Some("127.0.0.1".into()),
                start_time: start_time.or_else(|| Some(now())),
                ..Default::default()
            });
        });
    }

    pub(super) async fn kill(self: Arc<Self>, pod: Arc<Pod>) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let (sandbox, containers) = self
            .pods
            .lock()
            .get(&uid)
            .map(|r| (r.sandbox_id.clone(), r.containers.clone()))
            .unwrap_or_default();
        let mut runtime = self.cri.runtime.clone();
        // A container waiting to be created (no id) has nothing to stop.
        for container in containers.iter().filter(|c| !c.id.is_empty()) {
            self.api.record_event(
                &pod,
                "Normal",
                "Killing",
                &format!("Stopping container {}", container.name),
            );
            if runtime
                .stop_container(cri::StopContainerRequest {
                    container_id: container.id.clone(),
                    timeout: 30,
                })
                .await
                .is_err()
            {
                return false;
            }
        }
        if let Some(sandbox) = sandbox {
            if runtime
                .stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: sandbox.clone(),
                })
                .await
                .is_err()
                || runtime
                    .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                        pod_sandbox_id: sandbox,
                    })
                    .await
                    .is_err()
            {
                return false;
            }
        }
        self.set_state(&uid, PodState::Terminated);
        true
    }

    /// Once a terminated pod has no volume left, removes its directory (never through a mount) and the
    /// pod object.
    fn finish_termination(&self, pod: &Pod, uid: &str) {
        if self.asw.lock().pod_has_mounts(uid) || self.dsw.lock().has_pod(uid) {
            return;
        }
        let dir = self.config.root.join("pods").join(uid);
        let mounter = self.host.mounter.clone();
        let mounted = walk_dirs(&dir)
            .into_iter()
            .any(|d| mounter.is_mount_point(&d).unwrap_or(true));
        if mounted {
            tracing::warn!(
                pod = uid,
                "something is still mounted under {}; leaving it",
                dir.display()
            );
            return;
        }
        let _ = std::fs::remove_dir_all(&dir);
        let meta = &pod.metadata;
        let log_dir = self.config.root.join("logs").join(format!(
            "{}_{}_{uid}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ));
        let _ = std::fs::remove_dir_all(log_dir);
        self.api.remove_finished_pod(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
            uid,
        );
        self.pods.lock().remove(uid);
    }
}

/// A container's state in the API, from what the runtime last reported.
fn container_state(c: &ContainerReport) -> ContainerState {
    match c.state.as_str() {
        "terminated" => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: c.exit_code.unwrap_or_default(),
                reason: Some(c.reason.clone()).filter(|r| !r.is_empty()),
                finished_at: Some(now()),
                ..Default::default()
            }),
            ..Default::default()
        },
        "waiting" => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(c.reason.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        _ => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(now()),
            }),
            ..Default::default()
        },
    }
}

/// A subPath must be relative and must not step out with `..` (`kubelet_pods.go` makeMounts, whose texts
/// these are).
fn check_sub_path(sub: &str) -> Result<(), String> {
    if Path::new(sub).is_absolute() {
        return Err(format!(
            "error SubPath `{sub}` must not be an absolute path"
        ));
    }
    if Path::new(sub)
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(format!(
            "unable to provision SubPath `{sub}`: must not contain '..'"
        ));
    }
    Ok(())
}

/// Every directory under `dir`, `dir` included.
pub(super) fn walk_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        dirs.push(d);
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_must_be_relative_without_backsteps() {
        check_sub_path("data/x").unwrap();
        check_sub_path("a..b").unwrap();
        assert_eq!(
            check_sub_path("/etc").unwrap_err(),
            "error SubPath `/etc` must not be an absolute path"
        );
        assert_eq!(
            check_sub_path("a/../../x").unwrap_err(),
            "unable to provision SubPath `a/../../x`: must not contain '..'"
        );
    }
}
