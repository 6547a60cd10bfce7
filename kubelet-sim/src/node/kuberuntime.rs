//! kuberuntime, much reduced (`pkg/kubelet/kuberuntime`): a pod's sandbox and containers through CRI.
//! `start` is `SyncPod` for a new pod (`computePodActions`: images through the image manager, a sandbox,
//! then the init containers one by one and the regular containers, `start_next`), `start_container` is
//! `startContainer` (`kuberuntime_container.go`: its mounts from `container_mounts.rs`, create, start),
//! and `adopt_sandboxes` takes over what a previous kubelet left running. Stopping a pod is `kill.rs`.

use std::sync::Arc;
use std::time::Instant;

use inlet_proto::csi_call::rpc_error;
use inlet_proto::runtime::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::Kubelet;
use super::container_config::{container_annotations, container_labels, linux_config};
use super::env::expand_words;
use super::image_volumes::ImageVolumes;
use super::pod_worker::{PodRuntime, PodState};
use super::status::is_sidecar;
use crate::api::ApiPod;
use crate::operations::BackoffEntry;

/// Where a container is, as the report and the pod's status show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerState {
    /// Not running: before its first start, or between a crash and its restart.
    #[default]
    Waiting,
    /// Started, and not seen to exit.
    Running,
    /// Its last run ended.
    Terminated,
}

impl ContainerState {
    /// The state's name, as the report's JSON has it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Running => "running",
            Self::Terminated => "terminated",
        }
    }
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
    /// `running`, `terminated`, or `waiting` (before its start, or between a crash and its restart).
    pub state: ContainerState,
    /// The exit code of its last run, once one ended.
    pub exit_code: Option<i32>,
    /// How many times the kubelet restarted it.
    pub restart_count: u32,
    /// Why it is in its state: the runtime's `Completed`/`Error`, or `CrashLoopBackOff`.
    pub reason: String,
    /// The last lines of its log (the CRI log file), once its last run ended.
    pub logs: Vec<String>,
    /// The image it runs as the runtime names it (CRI `image_id`, else `image_ref`), the status's `imageID`.
    pub image_id: String,
    /// When its latest run started, as the runtime reports it.
    pub started_at: Option<Time>,
    /// When its latest run ended.
    pub finished_at: Option<Time>,
    /// Why it waits, in full (`back-off 10s restarting failed container=...`).
    pub message: String,
    /// The run before the latest, once it was restarted (the status's `lastState`).
    pub last_state: Option<TerminatedRun>,
    /// An init container (the report lists it under `init_containers`).
    #[serde(skip)]
    pub init: bool,
    /// When a crashed container is restarted (its back-off ends).
    #[serde(skip)]
    pub restart_at: Option<Instant>,
    /// Its crash-loop back-off entry (`flowcontrol.Backoff`): the next delay, and when it last grew.
    #[serde(skip)]
    pub backoff: Option<BackoffEntry>,
}

impl ContainerReport {
    /// Its latest run, as a run that ended (`lastState`).
    pub fn run(&self) -> TerminatedRun {
        TerminatedRun {
            id: self.id.clone(),
            exit_code: self.exit_code.unwrap_or_default(),
            reason: self.reason.clone(),
            started_at: self.started_at.clone(),
            finished_at: self.finished_at.clone(),
        }
    }
}

/// A run that ended, as `lastState.terminated` shows it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TerminatedRun {
    /// The run's runtime id.
    pub id: String,
    /// Its exit code.
    pub exit_code: i32,
    /// The runtime's reason (`Completed`, `Error`).
    pub reason: String,
    /// When it started.
    pub started_at: Option<Time>,
    /// When it ended.
    pub finished_at: Option<Time>,
}

/// Why a container could not be started: the waiting reason kuberuntime gives it, and the event's text.
#[derive(Debug, Clone)]
pub struct StartError {
    /// `ErrImagePull`, `ImagePullBackOff` or `ErrImageNeverPull` (its image), `CreateContainerConfigError`
    /// (its environment or mounts could not be made), `CreateContainerError` or `RunContainerError` (the
    /// runtime refused).
    pub reason: &'static str,
    /// What went wrong, for the pod's `Failed` event.
    pub message: String,
}

impl StartError {
    fn reason(reason: &'static str) -> impl Fn(String) -> Self {
        move |message| Self { reason, message }
    }

    /// What the `Failed` event says after `Error: `: the error's message, or for an image error its
    /// reason alone (`Error: ErrImagePull`), as `startContainer` records the image manager's error.
    pub fn event(&self) -> &str {
        match self.reason {
            "ErrImagePull" | "ImagePullBackOff" | "ErrImageNeverPull" => self.reason,
            _ => &self.message,
        }
    }
}

/// One CRI mount.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MountReport {
    /// Where the container sees it.
    pub container_path: String,
    /// The host path (the volume's mount dir, or a subPath in it); empty for an image the runtime mounts.
    pub host_path: String,
    /// Read-only in the container.
    pub readonly: bool,
    /// The image the runtime mounts here (KEP-4639's `Mount.image`: as the pod named it, or the image id
    /// where the runtime reports only that, as CRI-O does); absent for a host path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The path inside that image a subPath chose (`image_sub_path`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_sub_path: Option<String>,
}

impl From<cri::Mount> for MountReport {
    fn from(m: cri::Mount) -> Self {
        Self {
            image: m.image.map(|i| match i.user_specified_image.is_empty() {
                true => i.image,
                false => i.user_specified_image,
            }),
            image_sub_path: Some(m.image_sub_path).filter(|s| !s.is_empty()),
            container_path: m.container_path,
            host_path: m.host_path,
            readonly: m.readonly,
        }
    }
}

impl Kubelet {
    /// Starts a pod whose volumes are mounted, as `SyncPod` does for a new pod (`computePodActions`):
    /// RunPodSandbox, then the first init container, or the regular containers when there is none (see
    /// [`Kubelet::start_next`]). A sandbox that cannot be made is retried after backoff; a container that
    /// cannot start waits in the sandbox and is tried again, as upstream keeps the sandbox.
    ///
    /// Every pod starting holds this future, so the calls it and [`Kubelet::start_container`] await are
    /// boxed: a start holds only the call it is in (1–4 KB each, `-Zprint-type-sizes`), not room for the
    /// largest, which adds up over thousands of pods starting at once.
    pub(super) async fn start(self: Arc<Self>, pod: Arc<ApiPod>) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let sandbox_config = self.sandbox_config(&pod);
        let request = cri::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        };
        let sandbox_id = match Box::pin(self.cri.run_pod_sandbox(request)).await {
            Ok(reply) => reply.pod_sandbox_id,
            Err(s) => {
                let message = format!("Failed to create pod sandbox: {}", rpc_error(&s));
                self.api
                    .record_event(&pod, "Warning", "FailedCreatePodSandBox", &message);
                return false;
            }
        };
        inlet_host::crash::point("pod.sandbox-started");
        // The pod's IP from its sandbox's status, as `generateAPIPodStatus` takes it (host-network pods
        // have the node's), before its containers start: their `status.podIP` environment needs it.
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let ip = match host_network {
            true => Some("127.0.0.1".to_string()),
            false => Box::pin(self.sandbox_ip(sandbox_id.clone())).await,
        };
        if let Some(rt) = self.pods.lock().get_mut(&uid) {
            rt.pod_ip = ip;
        }
        let mut reports = Vec::new();
        Box::pin(self.start_next(&pod, &sandbox_id, &sandbox_config, &mut reports)).await;
        // Record the containers before the status says Running, so whoever sees Running finds them.
        if let Some(rt) = self.pods.lock().get_mut(&uid) {
            rt.state = PodState::Running;
            rt.sandbox_id = Some(sandbox_id);
            rt.containers = reports.clone();
            rt.containers_in_spec = all_containers(&pod).count();
        }
        self.set_status_releasing(pod, &reports, false);
        true
    }

    /// `computePodActions`' containers to start, started: init containers one at a time in order (a
    /// regular one must have completed before the next starts; a sidecar, `restartPolicy: Always`, only
    /// started), then every regular container not started yet. A container that fails to start waits
    /// with its error's reason (the `Failed` event says why) and is tried again after the pod workers'
    /// back-off (`backOffPeriod`, 10 s upstream); the others go on. Reports are updated in `reports`;
    /// returns whether any changed.
    pub(super) async fn start_next(
        &self,
        pod: &ApiPod,
        sandbox_id: &str,
        sandbox_config: &cri::PodSandboxConfig,
        reports: &mut Vec<ContainerReport>,
    ) -> bool {
        let mut changed = false;
        let mut image_volumes = None;
        loop {
            let next = next_to_start(pod, reports);
            if next.is_empty() {
                return changed;
            }
            changed = true;
            let mut started = false;
            // Once per sync, before any container of it starts (SyncPod's getImageVolumes).
            if image_volumes.is_none() {
                image_volumes = Some(Box::pin(self.image_volumes(pod, sandbox_config)).await);
            }
            let volumes = image_volumes.as_ref().expect("resolved above");
            for container in next {
                let init = is_init(pod, &container.name);
                let attempt =
                    self.start_container(pod, container, sandbox_id, sandbox_config, volumes, 0);
                let report = match Box::pin(attempt).await {
                    Ok(report) => {
                        started = true;
                        ContainerReport { init, ..report }
                    }
                    Err(e) => {
                        let event = format!("Error: {}", e.event());
                        let name = &container.name;
                        self.api
                            .record_container_event(pod, name, "Warning", "Failed", &event);
                        ContainerReport {
                            name: container.name.clone(),
                            state: ContainerState::Waiting,
                            reason: e.reason.into(),
                            message: e.message,
                            init,
                            restart_at: Some(
                                Instant::now() + self.config.containers.backoff.initial,
                            ),
                            ..Default::default()
                        }
                    }
                };
                match reports.iter_mut().find(|r| r.name == container.name) {
                    Some(slot) => *slot = report,
                    None => reports.push(report),
                }
            }
            if !started {
                return changed;
            }
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
        image_volumes: &ImageVolumes,
        attempt: u32,
    ) -> Result<ContainerReport, StartError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(failed) = image_volumes.failed_for(container) {
            return Err(failed);
        }
        // Step 1 of `startContainer`, at every start: the image per its pull policy (a restart re-checks
        // the pod's credentials, and a tag that moved is pulled again under `Always`).
        let ensured = self
            .images
            .ensure_container_image(pod, container, sandbox_config);
        Box::pin(ensured).await.map_err(|e| StartError {
            reason: e.reason,
            message: e.message,
        })?;
        // `generateContainerConfig`: the environment first, then the mounts (a subPathExpr reads it).
        let config_error = StartError::reason("CreateContainerConfigError");
        let env = self.environment(pod, container).map_err(&config_error)?;
        let mounts = self
            .container_mounts(&uid, container, &env, image_volumes)
            .map_err(&config_error)?;
        let devices = self
            .container_devices(&uid, container)
            .map_err(&config_error)?;
        // The container's log directory is the kubelet's to make (`BuildContainerLogsDirectory`): a
        // runtime's monitor (conmon) writes the log below it and fails without it.
        let log_dir = std::path::Path::new(&sandbox_config.log_directory).join(&container.name);
        std::fs::create_dir_all(&log_dir).map_err(|e| {
            config_error(format!(
                "create container log directory for container {} failed: {e}",
                container.name
            ))
        })?;
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: container.name.clone(),
                attempt,
            }),
            image: Some(cri::ImageSpec {
                image: container.image.clone().unwrap_or_default(),
                ..Default::default()
            }),
            command: expand_words(container.command.as_deref().unwrap_or_default(), &env),
            args: expand_words(container.args.as_deref().unwrap_or_default(), &env),
            working_dir: container.working_dir.clone().unwrap_or_default(),
            envs: env
                .into_iter()
                .map(|(key, value)| cri::KeyValue { key, value })
                .collect(),
            mounts,
            devices,
            labels: container_labels(pod, container),
            annotations: container_annotations(pod, container, attempt),
            linux: Some(linux_config(pod, container, &self.config.root)),
            stdin: container.stdin.unwrap_or(false),
            stdin_once: container.stdin_once.unwrap_or(false),
            tty: container.tty.unwrap_or(false),
            log_path: format!("{}/{attempt}.log", container.name),
            ..Default::default()
        };
        let rpc = |reason| move |s: tonic::Status| StartError::reason(reason)(rpc_error(&s));
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config.clone()),
        };
        let id = Box::pin(self.cri.create_container(request))
            .await
            .map_err(rpc("CreateContainerError"))?
            .container_id;
        self.api.record_container_event(
            pod,
            &container.name,
            "Normal",
            "Created",
            // 1.35's text (`kuberuntime_container.go` startContainer; 1.20 wrote "Created container %v").
            &format!("Created container: {}", container.name),
        );
        let mut runtime = self.cri.runtime.clone();
        let request = cri::StartContainerRequest {
            container_id: id.clone(),
        };
        Box::pin(runtime.start_container(request))
            .await
            .map_err(rpc("RunContainerError"))?;
        self.api.record_container_event(
            pod,
            &container.name,
            "Normal",
            "Started",
            &format!("Started container {}", container.name),
        );
        let request = cri::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        };
        let status = Box::pin(runtime.container_status(request))
            .await
            .map_err(rpc("RunContainerError"))?;
        let status = status.into_inner().status.unwrap_or_default();
        let mounts = status.mounts.into_iter().map(MountReport::from).collect();
        Ok(ContainerReport {
            name: container.name.clone(),
            id,
            mounts,
            state: ContainerState::Running,
            restart_count: attempt,
            // `toKubeContainerStatus`: the runtime's image id (CRI 1.30), else the digested reference.
            image_id: if status.image_id.is_empty() {
                status.image_ref
            } else {
                status.image_id
            },
            started_at: api_time(status.started_at),
            ..Default::default()
        })
    }

    /// Sandboxes the runtime still has: a pod that still exists keeps running; an orphan is stopped. Run
    /// once the populator has added the API's pods, so a pod not loaded yet is not taken for an orphan.
    pub(super) async fn adopt_sandboxes(&self) {
        let pods = self.my_pods_by_uid();
        let mut runtime = self.cri.runtime.clone();
        let Ok(sandboxes) = runtime
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
        else {
            return;
        };
        for sandbox in sandboxes.into_inner().items {
            let uid = sandbox
                .labels
                .get("io.kubernetes.pod.uid")
                .cloned()
                .unwrap_or_default();
            let node_pod = pods.contains_key(&uid);
            let ours = node_pod || self.config.root.join("pods").join(&uid).exists();
            if !ours {
                continue;
            }
            // A pod this kubelet is already starting (its volumes were ready before the adoption ran)
            // owns its new sandbox: taking it over would lose the containers being started in it.
            let tracked = self
                .pods
                .lock()
                .get(&uid)
                .is_some_and(|rt| rt.state != PodState::Waiting);
            if tracked {
                continue;
            }
            if !node_pod {
                let _ = runtime
                    .stop_pod_sandbox(cri::StopPodSandboxRequest {
                        pod_sandbox_id: sandbox.id.clone(),
                    })
                    .await;
                let _ = runtime
                    .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                        pod_sandbox_id: sandbox.id.clone(),
                    })
                    .await;
                continue;
            }
            let filter = cri::ContainerFilter {
                pod_sandbox_id: sandbox.id.clone(),
                ..Default::default()
            };
            let containers = runtime
                .list_containers(cri::ListContainersRequest {
                    filter: Some(filter),
                })
                .await
                .map(|r| r.into_inner().containers)
                .unwrap_or_default();
            let mut reports = Vec::new();
            for c in containers {
                let status = runtime
                    .container_status(cri::ContainerStatusRequest {
                        container_id: c.id.clone(),
                        verbose: false,
                    })
                    .await;
                let mounts = status
                    .ok()
                    .and_then(|s| s.into_inner().status)
                    .map(|s| s.mounts)
                    .unwrap_or_default();
                // Running as far as is known: the next relist sees whether it exited meanwhile.
                let metadata = c.metadata.unwrap_or_default();
                let init = pods.get(&uid).is_some_and(|p| is_init(p, &metadata.name));
                reports.push(ContainerReport {
                    init,
                    name: metadata.name,
                    restart_count: metadata.attempt,
                    state: ContainerState::Running,
                    id: c.id,
                    mounts: mounts.into_iter().map(MountReport::from).collect(),
                    ..Default::default()
                });
            }
            let containers_in_spec = pods.get(&uid).map_or(0, |p| all_containers(p).count());
            let runtime_state = PodRuntime {
                state: PodState::Running,
                sandbox_id: Some(sandbox.id),
                containers: reports,
                containers_in_spec,
                seen_at: Some(Instant::now()),
                ..Default::default()
            };
            self.pods.lock().insert(uid, runtime_state);
        }
    }
}

/// Every container of the pod, init containers first.
pub(crate) fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    let init = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let regular = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    init.iter().chain(regular)
}

/// True when `name` is one of the pod's init containers.
pub(super) fn is_init(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|i| i.iter().any(|c| c.name == name))
}

/// What `computePodActions` starts next, given the containers already created: the first init container
/// not created yet (a regular one only once those before it completed), else every regular container not
/// created yet once every regular init container completed. One whose creation failed counts as not
/// created once its retry is due.
pub(super) fn next_to_start<'a>(pod: &'a Pod, reports: &[ContainerReport]) -> Vec<&'a Container> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    // A container that failed to be created is tried again once its wait is over.
    let due = |r: &ContainerReport| r.restart_at.is_none_or(|at| at <= Instant::now());
    for container in spec.init_containers.iter().flatten() {
        let Some(report) = reports.iter().find(|r| r.name == container.name) else {
            return vec![container];
        };
        if report.id.is_empty() {
            return if due(report) {
                vec![container]
            } else {
                Vec::new()
            };
        }
        let completed = report.state == ContainerState::Terminated && report.exit_code == Some(0);
        if !is_sidecar(container) && !completed {
            // Running, or failed and waiting for its restart: nothing after it starts yet.
            return Vec::new();
        }
    }
    spec.containers
        .iter()
        .filter(|c| match reports.iter().find(|r| r.name == c.name) {
            None => true,
            Some(r) => r.id.is_empty() && due(r),
        })
        .collect()
}

/// A CRI timestamp (nanoseconds since the epoch; 0 for none) as an API time.
pub(super) fn api_time(nanos: i64) -> Option<Time> {
    (nanos > 0)
        .then(|| k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(nanos)).ok())
        .flatten()
        .map(Time)
}
