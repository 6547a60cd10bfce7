//! The fake runtime's state: sandboxes, containers and images, a log of calls, and the faults to inject.
//!
//! It enforces what real runtimes enforce, so a client that passes here behaves on containerd too: names are
//! reserved per sandbox and container (containerd's "name is reserved" error), a container needs a ready
//! sandbox and a pulled image, every mount's host path must exist, and a ready sandbox cannot be removed.
//! Stop and remove of something missing succeed, as the CRI asks.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use inlet_proto::runtime::v1 as cri;
use parking_lot::Mutex;
use tonic::Status;

use crate::faults::{Fault, Faults};
use crate::images::Images;
use crate::program::{self, Outcome};
use crate::pull::Registries;

/// How many of the latest calls the log keeps ([`FakeRuntime::calls`]).
pub const CALLS_KEPT: usize = 1_024;
/// The runtime handlers cri-fake serves: the default (empty) and containerd's default runtime's name.
const RUNTIME_HANDLERS: [&str; 2] = ["", "runc"];
/// One call the runtime received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriCall {
    /// The method, as on the wire (`RunPodSandbox`).
    pub method: &'static str,
    /// What it was about: a sandbox or container id, an image reference; empty for none.
    pub subject: Box<str>,
}

/// A sandbox the runtime holds.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The sandbox as ListPodSandbox reports it.
    pub sandbox: cri::PodSandbox,
    /// Its config's `log_directory`, under which its containers' logs go (the rest of the config is not
    /// read again: only what ListPodSandbox reports is kept).
    pub log_directory: String,
    /// The name it reserved (freed on removal without scanning every name).
    pub reserved_name: String,
    /// Its containers' ids (so removal does not scan every container).
    pub containers: Vec<String>,
}

/// A container the runtime holds.
#[derive(Debug, Clone)]
pub struct Container {
    /// The status ContainerStatus reports, including its mounts.
    pub status: cri::ContainerStatus,
    /// Its sandbox.
    pub sandbox_id: String,
    /// The name it reserved.
    pub reserved_name: String,
    /// How it ends once started (see [`crate::program`]).
    pub outcome: Outcome,
    /// Its CRI log file: the sandbox's `log_directory` joined with the container's `log_path`.
    pub log_file: Option<PathBuf>,
    /// Its environment, which an exec'd command sees too.
    pub envs: Vec<cri::KeyValue>,
    /// The devices it was given (a block volume's, for one).
    pub devices: Vec<cri::Device>,
    /// Its mounts as its programs read them (an image mount as the image's layers).
    pub mounts: Vec<program::Mount>,
    /// When a started container that ends exits.
    exits_at: Option<Instant>,
}

impl Container {
    /// A running container whose program has ended becomes EXITED, with containerd's reasons.
    fn refresh(&mut self) {
        let Outcome::Exits { code, .. } = self.outcome else {
            return;
        };
        if self.status.state == cri::ContainerState::ContainerRunning as i32
            && self.exits_at.is_some_and(|at| at <= Instant::now())
        {
            self.status.state = cri::ContainerState::ContainerExited as i32;
            self.status.finished_at = now_nanos();
            self.status.exit_code = code;
            self.status.reason = match code {
                0 => "Completed".into(),
                _ => "Error".into(),
            };
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// Boxed: a B-tree node holds eleven values inline, and a sandbox or container record is about 1 KB.
    sandboxes: BTreeMap<String, Box<Sandbox>>,
    containers: BTreeMap<String, Box<Container>>,
    /// Reserved names (sandbox and container) to the id holding them.
    names: HashMap<String, String>,
    /// The last [`CALLS_KEPT`] calls: while a simulated node runs pods, its PLEG alone lists the runtime
    /// every second, for as long as the node runs. Each is 32 bytes and its subject's text (the
    /// method is a static name): a simulation holds a full log per node.
    calls: VecDeque<CriCall>,
    /// Faults and how many calls each has affected.
    faults: HashMap<String, (Fault, u32)>,
}

/// The fake runtime. Shared by both services; tests hold it to inspect calls and inject faults.
#[derive(Debug)]
pub struct FakeRuntime {
    state: Mutex<State>,
    images: Images,
}

impl FakeRuntime {
    /// A runtime keeping its images under `root` (containers/storage layout), with faults to inject. Only
    /// records of images are kept; see [`FakeRuntime::with_registries`] for real content.
    pub fn new(root: PathBuf, faults: Faults) -> std::io::Result<Self> {
        Self::with_registries(root, faults, Registries::default())
    }

    /// Like [`FakeRuntime::new`], pulling real content for images of `registries`.
    pub fn with_registries(
        root: PathBuf,
        faults: Faults,
        registries: Registries,
    ) -> std::io::Result<Self> {
        let faults = faults.into_iter().map(|(m, f)| (m, (f, 0))).collect();
        Ok(Self {
            state: Mutex::new(State {
                faults,
                ..Default::default()
            }),
            images: Images::open(&root, registries)?,
        })
    }

    /// The images.
    pub fn images(&self) -> &Images {
        &self.images
    }

    /// The calls so far, in order: the last [`CALLS_KEPT`].
    pub fn calls(&self) -> Vec<CriCall> {
        self.state.lock().calls.iter().cloned().collect()
    }

    /// Injects (or replaces) a fault for one method.
    pub fn set_fault(&self, method: &str, fault: Fault) {
        self.state
            .lock()
            .faults
            .insert(method.to_string(), (fault, 0));
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.state.lock().faults.clear();
    }

    /// The sandboxes held now.
    pub fn sandboxes(&self) -> Vec<Sandbox> {
        self.state
            .lock()
            .sandboxes
            .values()
            .map(|s| Sandbox::clone(s))
            .collect()
    }

    /// The containers held now.
    pub fn containers(&self) -> Vec<Container> {
        self.containers_where(|_| true)
    }

    /// The containers held now that `keep` selects (each brought up to date first; only those are copied).
    pub fn containers_where(&self, keep: impl Fn(&Container) -> bool) -> Vec<Container> {
        let mut state = self.state.lock();
        state
            .containers
            .values_mut()
            .filter_map(|c| {
                c.refresh();
                keep(c).then(|| Container::clone(c))
            })
            .collect()
    }

    /// Records a call, then applies its fault: the delay (which a caller's deadline may cut short), then the
    /// error. Every handler starts here.
    pub async fn enter(&self, method: &'static str, subject: &str) -> Result<(), Status> {
        let fault = {
            let mut state = self.state.lock();
            if state.calls.len() == CALLS_KEPT {
                state.calls.pop_front();
            }
            state.calls.push_back(CriCall {
                method,
                subject: subject.into(),
            });
            match state.faults.get_mut(method) {
                Some((fault, used)) if fault.times.is_none_or(|t| *used < t) => {
                    *used += 1;
                    Some(fault.clone())
                }
                _ => None,
            }
        };
        let Some(fault) = fault else { return Ok(()) };
        if let Some(delay) = fault.delay {
            tokio::time::sleep(delay).await;
        }
        match fault.code {
            Some(code) => Err(Status::new(code, fault.message)),
            None => Ok(()),
        }
    }

    /// Runs `f` on the state under the lock.
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock())
    }

    // ---- runtime ----

    /// RunPodSandbox: a ready sandbox, its name reserved. An unknown runtime handler is refused.
    pub fn run_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: String,
    ) -> Result<String, Status> {
        let metadata = config
            .metadata
            .clone()
            .ok_or_else(|| Status::invalid_argument("sandbox config has no metadata"))?;
        // containerd knows the runtimes its config names (here only its default, `runc`); another handler
        // (a RuntimeClass the node lacks) fails the sandbox with its text (`getSandboxRuntime`), code Unknown.
        if !RUNTIME_HANDLERS.contains(&runtime_handler.as_str()) {
            return Err(Status::unknown(format!(
                "failed to get sandbox runtime: no runtime for {runtime_handler:?} is configured"
            )));
        }
        let name = format!(
            "k8s_POD_{}_{}_{}_{}",
            metadata.name, metadata.namespace, metadata.uid, metadata.attempt
        );
        let id = new_id();
        self.with(|s| {
            reserve(&mut s.names, &name, &id)?;
            let sandbox = cri::PodSandbox {
                id: id.clone(),
                metadata: Some(metadata),
                state: cri::PodSandboxState::SandboxReady as i32,
                created_at: now_nanos(),
                labels: config.labels,
                annotations: config.annotations,
                runtime_handler,
            };
            let sandbox = Sandbox {
                sandbox,
                log_directory: config.log_directory,
                reserved_name: name.clone(),
                containers: Vec::new(),
            };
            s.sandboxes.insert(id.clone(), Box::new(sandbox));
            Ok(id)
        })
    }

    /// StopPodSandbox: stops its containers and marks it not ready; a missing sandbox is already stopped.
    pub fn stop_sandbox(&self, id: &str) {
        self.with(|s| {
            let Some(sandbox) = s.sandboxes.get_mut(id) else {
                return;
            };
            sandbox.sandbox.state = cri::PodSandboxState::SandboxNotready as i32;
            // Its own containers, not a scan of every container of the runtime.
            for cid in &sandbox.containers {
                if let Some(c) = s.containers.get_mut(cid) {
                    stop(&mut c.status);
                }
            }
        })
    }

    /// RemovePodSandbox: removes it and its containers; a missing one is already removed. A ready sandbox must
    /// be stopped first, as containerd requires.
    pub fn remove_sandbox(&self, id: &str) -> Result<(), Status> {
        self.with(|s| {
            let Some(sandbox) = s.sandboxes.get(id) else {
                return Ok(());
            };
            if sandbox.sandbox.state == cri::PodSandboxState::SandboxReady as i32 {
                return Err(Status::failed_precondition(format!(
                    "sandbox container {id:?} is not fully stopped"
                )));
            }
            let Some(sandbox) = s.sandboxes.remove(id) else {
                return Ok(());
            };
            for cid in &sandbox.containers {
                if let Some(container) = s.containers.remove(cid) {
                    s.names.remove(&container.reserved_name);
                }
            }
            s.names.remove(&sandbox.reserved_name);
            Ok(())
        })
    }

    /// PodSandboxStatus.
    pub fn sandbox(&self, id: &str) -> Result<Sandbox, Status> {
        self.with(|s| s.sandboxes.get(id).map(|s| Sandbox::clone(s)))
            .ok_or_else(|| {
                Status::not_found(format!(
                    "an error occurred when try to find sandbox {id:?}: not found"
                ))
            })
    }

    /// CreateContainer: needs a ready sandbox, a pulled image, and every mount's host path to exist.
    pub fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
    ) -> Result<String, Status> {
        let metadata = config
            .metadata
            .clone()
            .ok_or_else(|| Status::invalid_argument("container config has no metadata"))?;
        let image_name = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let mounts = config
            .mounts
            .iter()
            .map(|m| self.container_mount(m))
            .collect::<Result<Vec<_>, _>>()?;
        for mount in &config.mounts {
            if mount.host_path.is_empty() {
                continue;
            }
            if std::fs::symlink_metadata(&mount.host_path).is_err() {
                return Err(Status::unknown(format!(
                    "failed to generate container spec: failed to stat host path {:?} of mount {:?}: no such file or directory",
                    mount.host_path, mount.container_path
                )));
            }
        }
        // A device's host path is followed (the kubelet passes a block volume's symlink), as runc does.
        for device in &config.devices {
            if std::fs::metadata(&device.host_path).is_err() {
                return Err(Status::unknown(format!(
                    "failed to generate container spec: error gathering device information while adding custom device {:?}: no such file or directory",
                    device.host_path
                )));
            }
        }
        let id = new_id();
        self.with(|s| {
            let sandbox = s
                .sandboxes
                .get(sandbox_id)
                .ok_or_else(|| Status::not_found(format!("sandbox {sandbox_id:?} not found")))?;
            if sandbox.sandbox.state != cri::PodSandboxState::SandboxReady as i32 {
                return Err(Status::failed_precondition(format!(
                    "sandbox {sandbox_id:?} is not ready"
                )));
            }
            let pod = sandbox.sandbox.metadata.clone().unwrap_or_default();
            let log_file = (!sandbox.log_directory.is_empty() && !config.log_path.is_empty())
                .then(|| PathBuf::from(&sandbox.log_directory).join(&config.log_path));
            let image = self.images.get(&image_name).ok_or_else(|| {
                Status::not_found(format!(
                    "failed to get image {image_name:?}: not found (pull it first)"
                ))
            })?;
            let name = format!(
                "k8s_{}_{}_{}_{}_{}",
                metadata.name, pod.name, pod.namespace, pod.uid, metadata.attempt
            );
            reserve(&mut s.names, &name, &id)?;
            let status = cri::ContainerStatus {
                id: id.clone(),
                metadata: Some(metadata),
                state: cri::ContainerState::ContainerCreated as i32,
                created_at: now_nanos(),
                image: config.image.clone(),
                image_ref: image.id.clone(),
                image_id: image.id.clone(),
                labels: config.labels,
                annotations: config.annotations,
                mounts: config.mounts.clone(),
                log_path: config.log_path.clone(),
                ..Default::default()
            };
            if let Some(sandbox) = s.sandboxes.get_mut(sandbox_id) {
                sandbox.containers.push(id.clone());
            }
            let outcome = program::run(&config.command, &config.args, &mounts, &config.envs);
            s.containers.insert(
                id.clone(),
                Box::new(Container {
                    status,
                    sandbox_id: sandbox_id.to_string(),
                    reserved_name: name,
                    outcome,
                    log_file,
                    envs: config.envs,
                    devices: config.devices,
                    mounts,
                    exits_at: None,
                }),
            );
            Ok(id)
        })
    }

    /// A CRI mount as the container's programs read it. A mount with `image` set (KEP-4639) is the
    /// image's layers, from `image_sub_path` down when one is given, read-only, as CRI-O 1.33 and
    /// containerd 2.2 mount it: the image must be present (the kubelet pulled it) and the sub path must
    /// be a relative path that exists in it, and the mount read-only with no host path (containerd's
    /// checks). Failures are wrapped as both runtimes wrap them (`crierrors.ErrImageVolumeMountFailed`).
    fn container_mount(&self, mount: &cri::Mount) -> Result<program::Mount, Status> {
        let Some(image) = mount.image.as_ref().filter(|i| !i.image.is_empty()) else {
            return Ok(program::Mount::from(mount));
        };
        let failed = |why: String| {
            Status::unknown(format!(
                "ImageVolumeMountFailed: failed to mount image {:?} at {:?}: {why}",
                image.image, mount.container_path
            ))
        };
        if !mount.host_path.is_empty() {
            return Err(failed("hostpath must be empty while mount image".into()));
        }
        if !mount.readonly {
            return Err(failed("readonly must be true while mount image".into()));
        }
        let id = self
            .images
            .get(&image.image)
            .ok_or_else(|| failed("image not known (pull it first)".into()))?
            .id;
        let layers = self
            .images
            .storage()
            .layer_dirs(id.trim_start_matches("sha256:"))
            .map_err(|e| failed(e.to_string()))?
            .ok_or_else(|| failed("image not known (pull it first)".into()))?;
        let sub = std::path::Path::new(&mount.image_sub_path);
        use std::path::Component::{CurDir, Normal};
        if sub.components().any(|c| !matches!(c, Normal(_) | CurDir)) {
            return Err(failed(format!(
                "sub path {:?} is not a relative path inside the image",
                mount.image_sub_path
            )));
        }
        let image_root = program::Mount {
            container_path: mount.container_path.clone(),
            layers,
            image: true,
        };
        let is_dir = |path: PathBuf| std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
        if !mount.image_sub_path.is_empty() && !image_root.find(sub).is_some_and(is_dir) {
            // CRI-O's words (cri-o#9050).
            return Err(failed(format!(
                "sub path {:?} does not exist in image volume {:?}",
                mount.image_sub_path, image.image
            )));
        }
        // The sub path's dir in each layer that has one, reached without a symlink.
        let layers = image_root.layers.iter().filter(|l| {
            let one = program::Mount {
                layers: vec![l.to_path_buf()],
                ..image_root.clone()
            };
            one.find(sub).is_some()
        });
        Ok(program::Mount {
            layers: layers.map(|l| l.join(sub)).collect(),
            ..image_root.clone()
        })
    }

    /// RemoveImage: refused while a container mounts the image (KEP-4639), as CRI-O keeps an image
    /// volume's image; otherwise gone, with the layers no other image uses.
    pub fn remove_image(&self, reference: &str) -> Result<(), Status> {
        if let Some(image) = self.images.get(reference) {
            let user = self.with(|s| {
                s.containers
                    .iter()
                    .find(|(_, c)| {
                        c.status.mounts.iter().any(|m| {
                            m.image.as_ref().is_some_and(|i| {
                                self.images.get(&i.image).is_some_and(|x| x.id == image.id)
                            })
                        })
                    })
                    .map(|(id, _)| id.clone())
            });
            if let Some(container) = user {
                return Err(Status::failed_precondition(format!(
                    "image {reference:?} is in use by container {container:?} as an image volume"
                )));
            }
        }
        self.images.remove(reference)
    }

    /// StartContainer: a created container starts running.
    pub fn start_container(&self, id: &str) -> Result<(), Status> {
        self.with(|s| {
            let c = s
                .containers
                .get_mut(id)
                .ok_or_else(|| Status::not_found(format!("container {id:?} not found")))?;
            require_state(id, &c.status, cri::ContainerState::ContainerCreated)?;
            c.status.state = cri::ContainerState::ContainerRunning as i32;
            c.status.started_at = now_nanos();
            if let Outcome::Exits { after, output, .. } = &c.outcome {
                c.exits_at = Some(Instant::now() + *after);
                if let Some(file) = &c.log_file {
                    write_log(file, output);
                }
            }
            Ok(())
        })
    }

    /// ExecSync's first half: how `cmd` ends when run in the running container `id`, over its mounts and
    /// with its environment. NOT_FOUND for an unknown container, FAILED_PRECONDITION for one not running
    /// (containerd's texts).
    pub fn exec(&self, id: &str, cmd: &[String]) -> Result<Outcome, Status> {
        if cmd.is_empty() {
            return Err(Status::invalid_argument("cmd must not be empty"));
        }
        let c = self.container(id)?;
        require_state(id, &c.status, cri::ContainerState::ContainerRunning)?;
        Ok(program::run(cmd, &[], &c.mounts, &c.envs))
    }

    /// True while the container `id` exists and runs.
    pub fn is_running(&self, id: &str) -> bool {
        self.with(|s| {
            s.containers.get_mut(id).is_some_and(|c| {
                c.refresh();
                c.status.state == cri::ContainerState::ContainerRunning as i32
            })
        })
    }

    /// StopContainer: a missing or exited container is already stopped.
    pub fn stop_container(&self, id: &str) {
        self.with(|s| {
            if let Some(c) = s.containers.get_mut(id) {
                stop(&mut c.status);
            }
        })
    }

    /// RemoveContainer: a missing container is already removed.
    pub fn remove_container(&self, id: &str) {
        self.with(|s| {
            if let Some(container) = s.containers.remove(id) {
                s.names.remove(&container.reserved_name);
                if let Some(sandbox) = s.sandboxes.get_mut(&container.sandbox_id) {
                    sandbox.containers.retain(|c| c != id);
                }
            }
        })
    }

    /// ContainerStatus.
    pub fn container(&self, id: &str) -> Result<Container, Status> {
        self.with(|s| {
            s.containers.get_mut(id).map(|c| {
                c.refresh();
                Container::clone(c)
            })
        })
        .ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find container {id:?}: not found"
            ))
        })
    }
}

fn reserve(names: &mut HashMap<String, String>, name: &str, id: &str) -> Result<(), Status> {
    if let Some(holder) = names.get(name) {
        return Err(Status::unknown(format!(
            "failed to reserve name {name:?}: name {name:?} is reserved for {holder:?}"
        )));
    }
    names.insert(name.to_string(), id.to_string());
    Ok(())
}

/// A running container stopped: as a busybox `sleep` that, PID 1 with no handler, ignores SIGTERM and is
/// killed when its grace period ends (exit 137, `Error`).
fn stop(status: &mut cri::ContainerStatus) {
    if status.state != cri::ContainerState::ContainerExited as i32 {
        status.state = cri::ContainerState::ContainerExited as i32;
        status.finished_at = now_nanos();
        status.exit_code = 137;
        status.reason = "Error".into();
    }
}

/// Appends `lines` to a CRI log file, in the CRI's format (`<RFC 3339 time> stdout F <line>`).
fn write_log(file: &std::path::Path, lines: &[String]) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // O_NOFOLLOW: a log path that is a symlink is not written through.
    let Ok(mut log) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(file)
    else {
        return;
    };
    let time = humantime::format_rfc3339_nanos(SystemTime::now());
    for line in lines {
        let _ = writeln!(log, "{time} stdout F {line}");
    }
}

fn new_id() -> String {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    format!("{a}{b}")
}

/// Nanoseconds since the epoch, as CRI timestamps are.
pub fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos() as i64
}

/// FAILED_PRECONDITION, in containerd's words, unless the container is in `wanted`.
fn require_state(
    id: &str,
    status: &cri::ContainerStatus,
    wanted: cri::ContainerState,
) -> Result<(), Status> {
    if status.state == wanted as i32 {
        return Ok(());
    }
    let state = cri::ContainerState::try_from(status.state)
        .map(|s| s.as_str_name())
        .unwrap_or("UNKNOWN");
    Err(Status::failed_precondition(format!(
        "container {id:?} is in {state} state"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_call_log_keeps_the_latest_calls() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = FakeRuntime::new(dir.path().to_path_buf(), Faults::default()).unwrap();
        runtime.enter("RunPodSandbox", "first").await.unwrap();
        for _ in 0..CALLS_KEPT {
            runtime.enter("ListContainers", "").await.unwrap();
        }
        let calls = runtime.calls();
        assert_eq!(calls.len(), CALLS_KEPT);
        assert!(calls.iter().all(|c| c.method == "ListContainers"));
    }
}
