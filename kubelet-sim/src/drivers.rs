//! The CSI drivers a simulation runs against: `NAME=local` starts inlet's local driver in-process for each
//! node, on that node's own socket (as a DaemonSet would), and `NAME=local:attach` the same with
//! ControllerPublish/Unpublish enabled; `NAME=image` starts inlet's image driver per node, pulling through
//! the simulation's runtime; `NAME=unix:///PATH` uses a driver already serving there (one a user is
//! developing), shared by every simulated node.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use inlet_image::{Engine, EngineConfig};
use inlet_plugin::image::{ImageDriverConfig, ImageService};
use inlet_plugin::local::content_mount::ContentMount;
use inlet_plugin::local::{LocalConfig, LocalDriver, LocalService};

use crate::images::SimImages;
use inlet_host::mount::MountLayer;
use inlet_plugin::registration::Registrar;
use inlet_plugin::server::serve_csi_on;
use inlet_proto::csi::v1::{
    controller_server::Controller, identity_server::Identity, node_server::Node,
};

/// Where a driver comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverSource {
    /// inlet's local driver, started per node; `attach` enables ControllerPublish/Unpublish.
    Local {
        /// Started with `--enable-attach`.
        attach: bool,
        /// Started with `--volume-mount-group`: it applies fsGroup itself (VOLUME_MOUNT_GROUP).
        mount_group: bool,
    },
    /// inlet's image driver, started per node over the simulation's runtime.
    Image,
    /// An external driver on a socket.
    Socket(PathBuf),
}

/// `--driver NAME=local|local:attach|local:mount-group|local:attach,mount-group|image|unix:///PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverArg {
    /// The CSI driver name.
    pub name: String,
    /// Where it runs.
    pub source: DriverSource,
}

impl std::str::FromStr for DriverArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (name, source) = text.split_once('=').ok_or_else(|| {
            format!(
                "{text:?}: expected NAME=local, NAME=local:attach, NAME=image or NAME=unix:///PATH"
            )
        })?;
        // The name is a directory of the node's (`plugins/<name>/`, `plugins/kubernetes.io/csi/<name>/`):
        // checked as the API server checks a CSIDriver's.
        let errors = inlet_host::names::csi_driver_name_errors(name, "driver name");
        if !errors.is_empty() {
            return Err(format!("{text:?}: {}", errors.join("; ")));
        }
        let source = match source.split_once(':') {
            _ if source == "local" => DriverSource::Local {
                attach: false,
                mount_group: false,
            },
            Some(("local", options)) => {
                let mut local = (false, false);
                for option in options.split(',') {
                    match option {
                        "attach" => local.0 = true,
                        "mount-group" => local.1 = true,
                        other => {
                            return Err(format!(
                                "{text:?}: unknown local driver option {other:?} (expected attach, mount-group)"
                            ));
                        }
                    }
                }
                DriverSource::Local {
                    attach: local.0,
                    mount_group: local.1,
                }
            }
            _ if source == "image" => DriverSource::Image,
            _ => DriverSource::Socket(
                inlet_proto::uds::socket_path(source).map_err(|e| format!("{text:?}: {e}"))?,
            ),
        };
        Ok(Self {
            name: name.to_string(),
            source,
        })
    }
}

/// An in-process driver serving for one node until the simulation stops.
pub struct DriverHandle {
    /// The driver's name.
    pub name: String,
    /// The node it serves.
    pub node: String,
    /// Its socket.
    pub socket: PathBuf,
    /// An image driver's state dir (what a teardown must find empty).
    pub image_state: Option<PathBuf>,
    /// An image driver's engine, whose volumes' images the node's image GC counts as in use.
    pub image_engine: Option<Arc<Engine>>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// A local driver's content dir bound onto itself, undone when the driver stops.
    content: Option<ContentMount>,
}

/// The node an in-process driver is started for.
pub struct DriverNode<'a> {
    /// The node's name (the driver's node id).
    pub node: &'a str,
    /// The node's kubelet root: the driver's socket and state go under `plugins/<name>/`, its target
    /// paths are confined below it.
    pub node_root: &'a Path,
    /// The runtime an image driver pulls through.
    pub cri_socket: &'a Path,
    /// Where images come from and how their pulls are checked.
    pub images: &'a SimImages,
    /// The mount layer the driver mounts through.
    pub mounter: Arc<dyn MountLayer>,
}

/// A driver for one node: started in-process, or a user's already serving on its socket.
pub enum Driver {
    /// inlet's driver, served by this process until [`DriverHandle::stop`].
    InProcess(DriverHandle),
    /// A driver serving on this socket, started by someone else.
    External(PathBuf),
}

impl Driver {
    /// The socket the driver serves CSI on.
    pub fn socket(&self) -> &Path {
        match self {
            Driver::InProcess(handle) => &handle.socket,
            Driver::External(socket) => socket,
        }
    }
}

/// Why an in-process driver did not start.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The driver could not open its state, mount its content dir or reach the runtime.
    #[error("{kind} driver {name} on {node}: {source}")]
    Start {
        /// `local` or `image`.
        kind: &'static str,
        /// The driver's name.
        name: String,
        /// The node it was started for.
        node: String,
        /// What the driver said.
        #[source]
        source: inlet_host::Error,
    },
    /// Its socket could not be served.
    #[error("driver {name} on {node}: {source}")]
    Listen {
        /// The driver's name.
        name: String,
        /// The node it was started for.
        node: String,
        /// What listening said.
        #[source]
        source: inlet_proto::uds::EndpointError,
    },
}

impl DriverArg {
    /// The driver for one node: inlet's `local` or `image` driver started in-process on the node's own
    /// socket (as a DaemonSet's pod would serve it), or the external driver's socket. The one place that
    /// choice is made, for simulations, conform and the benches.
    pub async fn start(&self, on: DriverNode<'_>) -> Result<Driver, DriverError> {
        let handle = match &self.source {
            DriverSource::Socket(path) => return Ok(Driver::External(path.clone())),
            DriverSource::Local {
                attach,
                mount_group,
            } => DriverHandle::start_local(&self.name, &on, *attach, *mount_group).await?,
            DriverSource::Image => DriverHandle::start_image(&self.name, &on).await?,
        };
        Ok(Driver::InProcess(handle))
    }
}

impl DriverHandle {
    /// Starts the local driver `name` for a node: socket and state under the node's `plugins/<name>/`,
    /// target paths confined to the node's kubelet root.
    async fn start_local(
        name: &str,
        on: &DriverNode<'_>,
        attach: bool,
        mount_group: bool,
    ) -> Result<Self, DriverError> {
        let dir = on.node_root.join("plugins").join(name);
        let config = LocalConfig {
            name: name.to_string(),
            node_id: on.node.to_string(),
            state_dir: dir.join("state"),
            kubelet_dir: on.node_root.to_path_buf(),
            // Capacity is bookkeeping for directories (nothing is preallocated): large enough that a
            // simulation of many pods is limited by what it tests, not by the driver's pool.
            capacity_bytes: 1 << 40,
            max_volume_bytes: 1 << 40,
            default_volume_bytes: 100 << 20,
            enable_attach: attach,
            // As csi-driver-host-path's deployments do, so inline volumes work without podInfoOnMount.
            ephemeral_default: true,
            volume_mount_group: mount_group,
        };
        let failed = |source| DriverError::Start {
            kind: "local",
            name: name.to_string(),
            node: on.node.to_string(),
            source,
        };
        let state_dir = config.state_dir.clone();
        let driver = LocalDriver::open(config, Arc::clone(&on.mounter)).map_err(failed)?;
        let content = ContentMount::bind(&state_dir, Arc::clone(&on.mounter)).map_err(failed)?;
        let mut handle = Self::serve(name, on.node, &dir, LocalService::new(driver), None).await?;
        handle.content = Some(content);
        Ok(handle)
    }

    /// Starts the image driver `name` for a node, pulling through the node's runtime: socket and state
    /// under the node's `plugins/<name>/`.
    async fn start_image(name: &str, on: &DriverNode<'_>) -> Result<Self, DriverError> {
        let dir = on.node_root.join("plugins").join(name);
        let engine = Engine::start(
            &EngineConfig {
                // The simulation's plain-HTTP registries serve artifacts too.
                artifact_insecure_registries: on.images.insecure_registries.clone(),
                verification: on.images.verification,
                preloaded_allowlist: on.images.allowlist.clone(),
                // One record per node of which credentials pulled which image, shared with the
                // kubelet's own pulls: else an image one pulled with credentials looks preloaded to
                // the other.
                pull_records_dir: Some(crate::node::pull_records_dir(on.node_root)),
                ..EngineConfig::new(on.cri_socket, &dir.join("state"))
            },
            Arc::clone(&on.mounter),
        )
        .await
        .map_err(|source| DriverError::Start {
            kind: "image",
            name: name.to_string(),
            node: on.node.to_string(),
            source,
        })?;
        let config = ImageDriverConfig {
            name: name.to_string(),
            node_id: on.node.to_string(),
            kubelet_dir: on.node_root.to_path_buf(),
            state_dir: dir.join("state"),
            pull_wait: on.images.pull_wait,
        };
        let state = Some(dir.join("state"));
        let service = ImageService::new(config, engine);
        let engine = Arc::clone(service.engine());
        let mut handle = Self::serve(name, on.node, &dir, service, state).await?;
        handle.image_engine = Some(engine);
        Ok(handle)
    }

    async fn serve<S>(
        name: &str,
        node: &str,
        dir: &Path,
        service: S,
        image_state: Option<PathBuf>,
    ) -> Result<Self, DriverError>
    where
        S: Identity + Controller + Node + Clone,
    {
        let socket = dir.join("csi.sock");
        let incoming =
            inlet_proto::uds::listen(&socket)
                .await
                .map_err(|source| DriverError::Listen {
                    name: name.to_string(),
                    node: node.to_string(),
                    source,
                })?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let serve_socket = socket.clone();
        let task = tokio::spawn(async move {
            let shutdown = async { drop(stopped.changed().await) };
            if let Err(e) =
                serve_csi_on(incoming, &serve_socket, service, true, None, shutdown).await
            {
                tracing::error!("driver stopped: {e}");
            }
        });
        Ok(Self {
            name: name.to_string(),
            node: node.to_string(),
            socket,
            image_state,
            image_engine: None,
            stop,
            tasks: vec![task],
            content: None,
        })
    }

    /// Also serves the driver's registration socket in the kubelet's plugin registration dir `dir`, as
    /// `inlet-plugin serve --registration-dir` does, until the driver stops.
    pub fn serve_registration(&mut self, dir: &Path) {
        let registrar = Registrar::new(&self.name, &self.socket);
        let mut stopped = self.stop.subscribe();
        let dir = dir.to_path_buf();
        self.tasks.push(tokio::spawn(async move {
            let shutdown = async { drop(stopped.changed().await) };
            if let Err(e) = registrar.serve(&dir, shutdown).await {
                tracing::error!("plugin registration stopped: {e}");
            }
        }));
    }

    /// Stops the driver and waits for it (then its content dir's self-bind is undone).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        drop(self.content);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_driver_flags() {
        assert_eq!(
            "a.dev=local".parse::<DriverArg>().unwrap().source,
            DriverSource::Local {
                attach: false,
                mount_group: false
            }
        );
        assert_eq!(
            "a.dev=local:attach".parse::<DriverArg>().unwrap().source,
            DriverSource::Local {
                attach: true,
                mount_group: false
            }
        );
        assert_eq!(
            "a.dev=local:attach,mount-group"
                .parse::<DriverArg>()
                .unwrap()
                .source,
            DriverSource::Local {
                attach: true,
                mount_group: true
            }
        );
        assert!(
            "a.dev=local:bogus"
                .parse::<DriverArg>()
                .unwrap_err()
                .contains("unknown local driver option \"bogus\"")
        );
        assert_eq!(
            "a.dev=unix:///run/x.sock"
                .parse::<DriverArg>()
                .unwrap()
                .source,
            DriverSource::Socket("/run/x.sock".into())
        );
        assert_eq!(
            "a.dev=image".parse::<DriverArg>().unwrap().source,
            DriverSource::Image
        );
        assert!("a.dev".parse::<DriverArg>().is_err());
        assert!("=local".parse::<DriverArg>().is_err());
        assert!("a.dev=tcp://x".parse::<DriverArg>().is_err());
    }
}
