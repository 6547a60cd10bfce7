//! The driver under test: what it says of itself (identity, capabilities), the CSIDriver object it is
//! tested with (given, or the one it would need), and where it runs: inlet's in-process drivers, started
//! and restarted here per check, or an external driver on a socket, restarted by the user's command.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_host::mount::MountLayer;
use inlet_proto::csi::v1::{self as csi, identity_client::IdentityClient};
use inlet_volume::csi::CsiClient;
use k8s_openapi::api::storage::v1::CSIDriver;

use super::ConformError;
use crate::api::manifest::{self, Object};
use crate::drivers::{Driver, DriverArg, DriverHandle, DriverNode, DriverSource};
use crate::images::SimImages;

/// What the driver says of itself, and the CSIDriver object it is tested with.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DriverInfo {
    /// GetPluginInfo's name.
    pub name: String,
    /// GetPluginInfo's vendor_version.
    pub vendor_version: String,
    /// The plugin serves the Controller service (CONTROLLER_SERVICE).
    pub controller_service: bool,
    /// NodeGetCapabilities, by name (`STAGE_UNSTAGE_VOLUME`).
    pub node_capabilities: BTreeSet<String>,
    /// ControllerGetCapabilities, by name (`CREATE_DELETE_VOLUME`).
    pub controller_capabilities: BTreeSet<String>,
    /// The CSIDriver object the checks run with.
    #[serde(skip)]
    pub csi_driver: CSIDriver,
    /// Where the CSIDriver came from: the file given, or "suggested".
    pub csi_driver_source: String,
}

impl DriverInfo {
    /// The CSIDriver's lifecycle modes (`Persistent` when it lists none, as the API defaults).
    pub fn modes(&self) -> BTreeSet<String> {
        let modes: BTreeSet<String> = self
            .csi_driver
            .spec
            .volume_lifecycle_modes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        if modes.is_empty() {
            BTreeSet::from(["Persistent".to_string()])
        } else {
            modes
        }
    }

    /// The driver serves inline ephemeral volumes (KEP-596).
    pub fn ephemeral(&self) -> bool {
        self.modes().contains("Ephemeral")
    }

    /// The driver advertises the node capability `name`.
    pub fn node_has(&self, name: &str) -> bool {
        self.node_capabilities.contains(name)
    }

    /// The driver advertises the controller capability `name` (and serves the Controller service).
    pub fn controller_has(&self, name: &str) -> bool {
        self.controller_service && self.controller_capabilities.contains(name)
    }
}

/// Asks the driver on `socket` who it is and what it can do; `expected` is the name it must report.
pub async fn describe(socket: &Path, expected: &str) -> Result<DriverInfo, ConformError> {
    let channel = inlet_proto::uds::connect_with_timeout(socket, Some(Duration::from_secs(10)))
        .await
        .map_err(|source| ConformError::Endpoint {
            what: format!("the driver {expected}"),
            source,
        })?;
    let rpc = |what: &str, source: tonic::Status| ConformError::Rpc {
        what: format!("the driver {expected}: {what}"),
        source,
    };
    let mut identity = IdentityClient::new(channel.clone());
    let info = identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .map_err(|s| rpc("GetPluginInfo", s))?
        .into_inner();
    if info.name != expected {
        return Err(ConformError::Misnamed {
            socket: socket.to_path_buf(),
            reported: info.name,
            expected: expected.to_string(),
        });
    }
    let plugin = identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .map_err(|s| rpc("GetPluginCapabilities", s))?
        .into_inner();
    let controller_service = plugin.capabilities.iter().any(|c| {
        matches!(
            &c.r#type,
            Some(csi::plugin_capability::Type::Service(s))
                if s.r#type == csi::plugin_capability::service::Type::ControllerService as i32
        )
    });
    // The kubelet's own client reads the capabilities, as it does at registration.
    let client = CsiClient::new(expected, channel, None);
    let node_capabilities = client
        .node_capabilities()
        .await
        .map_err(|s| rpc("NodeGetCapabilities", s))?
        .into_iter()
        .map(|t| t.as_str_name().to_string())
        .collect();
    let controller_capabilities = if controller_service {
        client
            .controller_capabilities()
            .await
            .map_err(|s| rpc("ControllerGetCapabilities", s))?
            .into_iter()
            .map(|t| t.as_str_name().to_string())
            .collect()
    } else {
        BTreeSet::new()
    };
    Ok(DriverInfo {
        name: info.name,
        vendor_version: info.vendor_version,
        controller_service,
        node_capabilities,
        controller_capabilities,
        csi_driver: CSIDriver::default(),
        csi_driver_source: String::new(),
    })
}

/// The CSIDriver object a driver with these capabilities needs for inline volumes, as YAML: both modes
/// when it can create volumes (else inline only), pod info on mount (KEP-596: the only way a driver tells
/// the modes apart), attach only when it implements ControllerPublishVolume, and fsGroup applied by the
/// kubelet (`File`) unless the driver takes it itself (VOLUME_MOUNT_GROUP).
pub fn suggested_csi_driver(info: &DriverInfo) -> String {
    let modes = if info.controller_has("CREATE_DELETE_VOLUME") {
        "[Persistent, Ephemeral]"
    } else {
        "[Ephemeral]"
    };
    format!(
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: {}\nspec:\n  attachRequired: {}\n  \
         podInfoOnMount: true\n  volumeLifecycleModes: {modes}\n  fsGroupPolicy: File\n",
        info.name,
        info.controller_has("PUBLISH_UNPUBLISH_VOLUME"),
    )
}

/// The CSIDriver named `name` in YAML `text` (from `origin`).
pub fn csi_driver_from(text: &str, origin: &str, name: &str) -> Result<CSIDriver, ConformError> {
    let manifests = manifest::parse(text, origin).map_err(|e| ConformError::CsiDriver(e.0))?;
    manifests
        .into_iter()
        .find_map(|m| match m.object {
            Object::CsiDriver(d) if d.metadata.name.as_deref() == Some(name) => Some(*d),
            _ => None,
        })
        .ok_or_else(|| ConformError::CsiDriver(format!("{origin}: no CSIDriver named {name:?}")))
}

/// Where the driver under test runs.
pub enum DriverRun {
    /// inlet's local or image driver, started in-process for one check's node.
    InProcess(Option<DriverHandle>),
    /// A driver serving on a socket; restarted (for the one check that needs it) by a shell command.
    External,
}

/// How a check's environment starts and restarts the driver under test.
#[derive(Clone)]
pub struct DriverSetup {
    /// The driver flag as given.
    pub arg: DriverArg,
    /// `--restart-command`: restarts an external driver.
    pub restart_command: Option<String>,
    /// Images for an in-process image driver.
    pub images: SimImages,
    /// The mount layer in-process drivers use.
    pub mounter: Arc<dyn MountLayer>,
}

impl DriverSetup {
    /// The driver's name.
    pub fn name(&self) -> &str {
        &self.arg.name
    }

    /// Whether conform can restart the driver: its own in-process drivers, or with `--restart-command`.
    pub fn restartable(&self) -> bool {
        !matches!(self.arg.source, DriverSource::Socket(_)) || self.restart_command.is_some()
    }

    /// Starts the driver for `node` (an external one is already running): its socket, and how it runs.
    pub async fn start(
        &self,
        node: &str,
        node_root: &Path,
        cri_socket: &Path,
    ) -> Result<(PathBuf, DriverRun), ConformError> {
        let on = DriverNode {
            node,
            node_root,
            cri_socket,
            images: &self.images,
            mounter: Arc::clone(&self.mounter),
        };
        Ok(match self.arg.start(on).await? {
            Driver::External(socket) => (socket, DriverRun::External),
            Driver::InProcess(handle) => {
                (handle.socket.clone(), DriverRun::InProcess(Some(handle)))
            }
        })
    }

    /// Stops the driver and starts it again on the same state, as a crash and a DaemonSet's restart would;
    /// returns once it answers Probe again.
    pub async fn restart(
        &self,
        run: &mut DriverRun,
        node: &str,
        node_root: &Path,
        cri_socket: &Path,
    ) -> Result<(), ConformError> {
        let socket = match run {
            DriverRun::InProcess(handle) => {
                if let Some(handle) = handle.take() {
                    handle.stop().await;
                }
                let (socket, started) = self.start(node, node_root, cri_socket).await?;
                *run = started;
                socket
            }
            DriverRun::External => {
                let command = self.restart_command.as_deref().ok_or_else(|| {
                    ConformError::Usage("no --restart-command to restart the driver with".into())
                })?;
                run_restart("restart-command", command, RESTART_WAIT).await?;
                let DriverSource::Socket(path) = &self.arg.source else {
                    return Err(ConformError::Usage(
                        "an external driver without a socket".into(),
                    ));
                };
                path.clone()
            }
        };
        wait_for_probe(&socket, Duration::from_secs(30)).await
    }

    /// Stops an in-process driver.
    pub async fn stop(&self, run: DriverRun) {
        if let DriverRun::InProcess(Some(handle)) = run {
            handle.stop().await;
        }
    }
}

/// How long a restart command may take.
const RESTART_WAIT: Duration = Duration::from_secs(120);

/// Runs the restart command `command` of `--flag` with `sh -c`, killed if it takes longer than `wait`.
pub(crate) async fn run_restart(
    flag: &'static str,
    command: &str,
    wait: Duration,
) -> Result<(), ConformError> {
    let failed = |reason: String| ConformError::Restart {
        flag,
        command: command.to_string(),
        reason,
    };
    let child = tokio::process::Command::new("sh")
        .args(["-c", command])
        .kill_on_drop(true)
        .status();
    match tokio::time::timeout(wait, child).await {
        Err(_) => Err(failed(format!("did not return within {wait:?}"))),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Ok(Ok(status)) if !status.success() => Err(failed(format!("failed: {status}"))),
        Ok(Ok(_)) => Ok(()),
    }
}

/// Waits until the driver on `socket` answers Probe with ready (or unset, which means ready).
async fn wait_for_probe(socket: &Path, timeout: Duration) -> Result<(), ConformError> {
    let deadline = Instant::now() + timeout;
    loop {
        let ready = match inlet_proto::uds::connect(socket).await {
            Ok(channel) => IdentityClient::new(channel)
                .probe(csi::ProbeRequest {})
                .await
                .is_ok_and(|r| r.into_inner().ready != Some(false)),
            Err(_) => false,
        };
        if ready {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ConformError::NotReady {
                socket: socket.to_path_buf(),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
