//! The kubelet's plugin manager for CSI drivers (`--plugins-registry DIR`): sockets in DIR are the desired
//! state, registered sockets the actual state, and a reconciler registers what appeared and deregisters
//! what went away or was replaced (`pkg/kubelet/pluginmanager`: `pluginwatcher/plugin_watcher.go`,
//! `reconciler/reconciler.go`, `operationexecutor/operation_generator.go`).
//!
//! Upstream feeds its desired state from fsnotify and acts on it in a reconciler that runs every second;
//! this reads the directory on each of those ticks instead, which acts at the same moments and cannot miss
//! an event when inotify's queue overflows. A socket is told apart from the one it replaced by its inode
//! and birth time (upstream: the time the watcher saw it created). A pass whose read of the directory
//! fails changes nothing (upstream deregisters only on a removal it saw).

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use inlet_plugin::registration::CSI_PLUGIN;
use inlet_proto::csi_call::rpc_error;
use inlet_proto::pluginregistration::registration_client::RegistrationClient;
use inlet_proto::pluginregistration::{InfoRequest, RegistrationStatus};
use tokio::task::JoinSet;
use tonic::transport::Channel;

use super::registry::DriverRegistry;
use crate::operations::BackoffPolicy;

/// How often the reconciler runs (upstream's `loopSleepDuration`).
const LOOP_PERIOD: Duration = Duration::from_secs(1);
/// How long dialing a registration socket may take (`dialTimeoutDuration`).
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long GetInfo may take.
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// How long NotifyRegistrationStatus may take (`notifyTimeoutDuration`).
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// Which file a socket path holds: a socket removed and made again is another plugin (a chmod or a new
/// link is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SocketStamp {
    device: u64,
    inode: u64,
    born: Option<std::time::SystemTime>,
}

/// A plugin in the actual state.
struct Plugin {
    stamp: SocketStamp,
    name: String,
}

/// A registration that failed before the plugin reached the actual state, and when it may run again.
struct Failed {
    stamp: SocketStamp,
    retry_at: Instant,
    backoff: Duration,
}

/// How one registration ended.
enum Registration {
    /// The plugin reached the actual state (`name`); `Err` if the CSI handler then refused it, which
    /// upstream does not retry until the socket changes.
    Added(String, Result<(), String>),
    /// It failed before: retried with backoff.
    Failed(String),
}

/// The plugin manager of one node.
pub struct PluginWatcher {
    dir: PathBuf,
    registry: Arc<DriverRegistry>,
    backoff: BackoffPolicy,
    actual: HashMap<PathBuf, Plugin>,
    failed: HashMap<PathBuf, Failed>,
    running: JoinSet<(PathBuf, SocketStamp, Registration)>,
    pending: HashMap<PathBuf, SocketStamp>,
}

impl PluginWatcher {
    /// A watcher of `dir` registering into `registry`, retrying failed registrations with `backoff`.
    pub fn new(dir: &Path, registry: Arc<DriverRegistry>, backoff: BackoffPolicy) -> Self {
        Self {
            dir: dir.to_path_buf(),
            registry,
            backoff,
            actual: HashMap::new(),
            failed: HashMap::new(),
            running: JoinSet::new(),
            pending: HashMap::new(),
        }
    }

    /// Makes the directory (0755, as upstream) and reconciles every second until the task is dropped;
    /// `changed` runs after each registration or deregistration, so the node looks at its pods again.
    pub async fn run(mut self, changed: impl Fn()) {
        if let Err(e) = std::fs::create_dir_all(&self.dir) {
            tracing::error!("error (re-)creating root {}: {e}", self.dir.display());
        }
        let mut tick = tokio::time::interval(LOOP_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if self.reconcile() {
                        changed();
                    }
                }
                Some(Ok((socket, stamp, outcome))) = self.running.join_next() => {
                    self.finished(socket, stamp, outcome);
                    changed();
                }
            }
        }
    }

    /// One pass: deregistrations first, then registrations of what is new (in the background, each
    /// socket at most once at a time). Returns whether a driver was deregistered.
    fn reconcile(&mut self) -> bool {
        let Some(desired) = self.desired() else {
            return false;
        };
        let gone: Vec<PathBuf> = self
            .actual
            .iter()
            .filter(|(socket, plugin)| desired.get(*socket) != Some(&plugin.stamp))
            .map(|(socket, _)| socket.clone())
            .collect();
        for socket in &gone {
            if let Some(plugin) = self.actual.remove(socket) {
                tracing::info!(socket = %socket.display(), "kubernetes.io/csi: registrationHandler.DeRegisterPlugin request for plugin {}", plugin.name);
                self.registry.deregister(&plugin.name);
            }
        }
        self.failed
            .retain(|socket, f| desired.get(socket) == Some(&f.stamp));
        let now = Instant::now();
        for (socket, stamp) in desired {
            let waiting = self.failed.get(&socket).is_some_and(|f| now < f.retry_at);
            if self.actual.contains_key(&socket) || self.pending.contains_key(&socket) || waiting {
                continue;
            }
            self.pending.insert(socket.clone(), stamp);
            let registry = Arc::clone(&self.registry);
            self.running.spawn(async move {
                // A registration that panics is a failed one, retried, not a socket ignored forever.
                let outcome = std::panic::AssertUnwindSafe(register(&registry, &socket))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| Registration::Failed("RegisterPlugin panicked".into()));
                (socket, stamp, outcome)
            });
        }
        !gone.is_empty()
    }

    fn finished(&mut self, socket: PathBuf, stamp: SocketStamp, outcome: Registration) {
        self.pending.remove(&socket);
        match outcome {
            Registration::Added(name, result) => {
                if let Err(e) = result {
                    tracing::error!(socket = %socket.display(), "{e}");
                }
                self.failed.remove(&socket);
                self.actual.insert(socket, Plugin { stamp, name });
            }
            Registration::Failed(e) => {
                tracing::error!(socket = %socket.display(), "operationExecutor.RegisterPlugin failed: {e}");
                let backoff = match self.failed.get(&socket) {
                    Some(f) if f.stamp == stamp => (f.backoff * 2).min(self.backoff.max),
                    _ => self.backoff.initial,
                };
                self.failed.insert(
                    socket,
                    Failed {
                        stamp,
                        retry_at: Instant::now() + backoff,
                        backoff,
                    },
                );
            }
        }
    }

    /// The sockets under the directory, walked without following symlinks (a symlink is not a socket of
    /// this node's plugins); names starting with `.` are skipped, as upstream does. None when the walk
    /// failed anywhere.
    fn desired(&self) -> Option<HashMap<PathBuf, SocketStamp>> {
        let mut sockets = HashMap::new();
        let walk = walkdir::WalkDir::new(&self.dir)
            .follow_links(false)
            .into_iter()
            .filter_entry(|e| e.depth() == 0 || !e.file_name().to_string_lossy().starts_with('.'));
        for entry in walk {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), "reading the plugins registry: {e}");
                    return None;
                }
            };
            if !entry.file_type().is_socket() {
                continue;
            }
            // Gone between the listing and the stat: not there.
            let Ok(meta) = entry.metadata() else { continue };
            let stamp = SocketStamp {
                device: meta.dev(),
                inode: meta.ino(),
                born: meta.created().ok(),
            };
            sockets.insert(entry.into_path(), stamp);
        }
        Some(sockets)
    }
}

/// `GenerateRegisterPluginFunc` with the CSI handler: dial, GetInfo, type, versions, RegisterPlugin,
/// NotifyRegistrationStatus, each failing with upstream's text.
async fn register(registry: &DriverRegistry, socket: &Path) -> Registration {
    let at = socket.display();
    let channel = match tokio::time::timeout(DIAL_TIMEOUT, inlet_proto::uds::connect(socket)).await
    {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => {
            return Registration::Failed(format!(
                "RegisterPlugin error -- dial failed at socket {at}, err: failed to dial socket {at}, err: {e}"
            ));
        }
        Err(_) => {
            return Registration::Failed(format!(
                "RegisterPlugin error -- dial failed at socket {at}, err: failed to dial socket {at}, err: context deadline exceeded"
            ));
        }
    };
    let mut client = RegistrationClient::new(channel);
    let mut request = tonic::Request::new(InfoRequest {});
    request.set_timeout(GET_INFO_TIMEOUT);
    let info = match client.get_info(request).await {
        Ok(info) => info.into_inner(),
        Err(e) => {
            return Registration::Failed(format!(
                "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {at}, err: {}",
                rpc_error(&e)
            ));
        }
    };
    // The kubelet has handlers for CSI and device plugins; kubelet-sim only for CSI.
    if info.r#type != CSI_PLUGIN {
        let refusal = format!(
            "RegisterPlugin error -- no handler registered for plugin type: {} at socket {at}",
            info.r#type
        );
        return Registration::Failed(refused(&mut client, refusal, &at.to_string()).await);
    }
    let endpoint = if info.endpoint.is_empty() {
        socket.to_path_buf()
    } else {
        PathBuf::from(&info.endpoint)
    };
    tracing::info!(
        "kubernetes.io/csi: Trying to validate a new CSI Driver with name: {} endpoint: {} versions: {}",
        info.name,
        endpoint.display(),
        info.supported_versions.join(",")
    );
    if let Err(e) =
        registry.validate_versions("ValidatePlugin", &info.name, &info.supported_versions)
    {
        let refusal = format!(
            "RegisterPlugin error -- plugin validation failed with err: validation failed for CSI Driver {} at endpoint {}: {e}",
            info.name,
            endpoint.display()
        );
        return Registration::Failed(refused(&mut client, refusal, &at.to_string()).await);
    }
    // From here the plugin is in the actual state, so that a socket removed meanwhile deregisters it.
    let result = match registry
        .register_plugin(&info.name, &endpoint, &info.supported_versions, socket)
        .await
    {
        Err(e) => notify(
            &mut client,
            &format!("RegisterPlugin error -- plugin registration failed with err: {e}"),
        )
        .await,
        Ok(()) => notify(&mut client, "").await.map_err(|e| {
            format!("RegisterPlugin error -- failed to send registration status at socket {at}, err: {e}")
        }),
    };
    Registration::Added(info.name, result)
}

/// Tells the plugin it is refused. Upstream's `notifyPlugin` returns the refusal as an error even when
/// it was sent, so its caller always reports it as a failure to send.
async fn refused(client: &mut RegistrationClient<Channel>, refusal: String, at: &str) -> String {
    let error = notify(client, &refusal).await.err().unwrap_or(refusal);
    format!("RegisterPlugin error -- failed to send error at socket {at}, err: {error}")
}

/// `notifyPlugin`: tells the plugin how its registration went (`error` empty: registered). Fails with
/// `error`, or with `error: <rpc error>` when the plugin could not be told.
async fn notify(client: &mut RegistrationClient<Channel>, error: &str) -> Result<(), String> {
    let mut request = tonic::Request::new(RegistrationStatus {
        plugin_registered: error.is_empty(),
        error: error.to_string(),
    });
    request.set_timeout(NOTIFY_TIMEOUT);
    match client.notify_registration_status(request).await {
        Err(e) => Err(format!("{error}: {}", rpc_error(&e))),
        Ok(_) if !error.is_empty() => Err(error.to_string()),
        Ok(_) => Ok(()),
    }
}
