//! CSI drivers registered on one node, as the kubelet's CSI registration handler keeps them (`csi_plugin.go`
//! `RegistrationHandler`): versions validated, the driver stored, NodeGetInfo called and the driver installed
//! in this node's CSINode object, each step failing with upstream's message. The plugin watcher
//! (`plugin_watcher.rs`) and `--driver` both register through here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inlet_proto::csi::v1::NodeGetInfoResponse;
use inlet_proto::csi::v1::{GetPluginInfoRequest, identity_client::IdentityClient};
use inlet_proto::csi_call::rpc_error;
use inlet_proto::uds::EndpointError;
use inlet_volume::csi::{CsiClient, CsiObserver};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::RwLock;

use crate::api::Api;

/// The Node annotation with each CSI driver's node id (`nodeinfomanager.go` `annotationKeyNodeID`).
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// The longest node id CSINode takes (`csiNodeIDMaxLength` in `pkg/apis/storage/validation`).
pub const CSI_NODE_ID_MAX: usize = 192;

/// One registered driver.
#[derive(Debug, Clone)]
pub struct Registered {
    /// The driver's socket.
    pub endpoint: PathBuf,
    /// The node id the driver reported (NodeGetInfo).
    pub node_id: String,
    /// A client for it.
    pub client: CsiClient,
    /// The highest CSI version it supports (a driver of the same name must support a higher one to
    /// replace it).
    pub version: CsiVersion,
    /// The registration socket it came through, when the plugin watcher registered it.
    pub registration: Option<PathBuf>,
}

/// The drivers registered on one node.
pub struct DriverRegistry {
    node: String,
    api: Arc<Api>,
    observer: Arc<dyn CsiObserver>,
    drivers: RwLock<HashMap<String, Registered>>,
    directory: Arc<DriverDirectory>,
    /// Each CSI call's deadline.
    csi_timeout: Duration,
}

/// Where every node's registered drivers answer, for the controllers that call them (the external
/// attacher's ControllerPublish/Unpublish). Each node's [`DriverRegistry`] writes its own entries, so a
/// restarted kubelet's drivers replace the old ones without the controllers holding a node: csi-attacher
/// knows its driver's socket, never a kubelet, and reads the node id from CSINode (`csi_handler.go`).
#[derive(Default)]
pub struct DriverDirectory {
    clients: RwLock<HashMap<(String, String), CsiClient>>,
}

impl DriverDirectory {
    /// A client for `driver` as registered on `node`.
    pub fn client(&self, node: &str, driver: &str) -> Option<CsiClient> {
        self.clients
            .read()
            .get(&(node.to_string(), driver.to_string()))
            .cloned()
    }
}

impl DriverRegistry {
    /// An empty registry for `node`, publishing its drivers in `directory`.
    pub fn new(
        node: &str,
        api: Arc<Api>,
        observer: Arc<dyn CsiObserver>,
        directory: Arc<DriverDirectory>,
        csi_timeout: Duration,
    ) -> Self {
        Self {
            node: node.to_string(),
            api,
            observer,
            drivers: RwLock::new(HashMap::new()),
            directory,
            csi_timeout,
        }
    }

    /// Every driver registered by `--driver` (not through the plugin watcher, which finds its own again
    /// after a restart): its name and socket.
    pub fn endpoints(&self) -> Vec<(String, PathBuf)> {
        self.drivers
            .read()
            .iter()
            .filter(|(_, r)| r.registration.is_none())
            .map(|(name, r)| (name.clone(), r.endpoint.clone()))
            .collect()
    }

    /// A registered driver.
    pub fn get(&self, name: &str) -> Option<Registered> {
        self.drivers.read().get(name).cloned()
    }

    /// Registers the driver `name` given by `--driver` as serving on `endpoint`. Beyond what the plugin
    /// watcher does, the driver's GetPluginInfo (1 s) must report `name`, since here the user, not the
    /// driver, said which driver is there.
    pub async fn register(&self, name: &str, endpoint: &Path) -> Result<(), RegistrationError> {
        let channel = connect(endpoint, self.csi_timeout)
            .await
            .map_err(|source| RegistrationError::Dial {
                endpoint: endpoint.to_path_buf(),
                source,
            })?;
        let mut request = tonic::Request::new(GetPluginInfoRequest {});
        request.set_timeout(Duration::from_secs(1));
        let info = IdentityClient::new(channel.clone())
            .get_plugin_info(request)
            .await
            .map_err(|source| RegistrationError::PluginInfo {
                endpoint: endpoint.to_path_buf(),
                source,
            })?;
        let reported = info.into_inner().name;
        if reported != name {
            return Err(RegistrationError::WrongName {
                endpoint: endpoint.to_path_buf(),
                reported,
                name: name.to_string(),
            });
        }
        let version = CsiVersion(vec![1, 0, 0]);
        self.install(name, endpoint, channel, version, None).await
    }

    /// Upstream's `validateVersions`: the highest 1.x version of `versions`, which must be higher than that
    /// of a driver of the same name already registered. `caller` names the step (`ValidatePlugin`,
    /// `RegisterPlugin`) in the error.
    pub fn validate_versions(
        &self,
        caller: &str,
        name: &str,
        versions: &[String],
    ) -> Result<CsiVersion, RegistrationError> {
        let refused = |reason: String| RegistrationError::Versions {
            caller: caller.to_string(),
            name: name.to_string(),
            reason,
        };
        if versions.is_empty() {
            return Err(refused(
                "Plugin returned an empty list for supported versions".into(),
            ));
        }
        let highest = CsiVersion::highest_supported(versions).map_err(|e| {
            refused(format!(
                "None of the versions specified {} are supported. err={e}",
                go_quoted_list(versions)
            ))
        })?;
        if let Some(existing) = self.get(name)
            && existing.version >= highest
        {
            return Err(refused(format!(
                "Another driver with the same name is already registered with a higher supported version: \"{}\"",
                existing.version
            )));
        }
        Ok(highest)
    }

    /// Upstream's `RegisterPlugin` for a driver the plugin watcher found at `registration`: versions
    /// validated again, the driver stored, NodeGetInfo (2 min), CSINode updated; on a failure the driver
    /// is unregistered again.
    pub async fn register_plugin(
        &self,
        name: &str,
        endpoint: &Path,
        versions: &[String],
        registration: &Path,
    ) -> Result<(), RegistrationError> {
        tracing::info!(
            node = %self.node,
            "kubernetes.io/csi: Register new plugin with name: {name} at endpoint: {}",
            endpoint.display()
        );
        let version = self.validate_versions("RegisterPlugin", name, versions)?;
        // grpc-go dials lazily, so upstream's failure to reach the driver shows at NodeGetInfo.
        let channel = connect(endpoint, self.csi_timeout)
            .await
            .map_err(RegistrationError::Unreachable)?;
        self.install(
            name,
            endpoint,
            channel,
            version,
            Some(registration.to_path_buf()),
        )
        .await
    }

    /// Stores the driver, asks its node id and installs it in CSINode; unregisters it on a failure.
    async fn install(
        &self,
        name: &str,
        endpoint: &Path,
        channel: tonic::transport::Channel,
        version: CsiVersion,
        registration: Option<PathBuf>,
    ) -> Result<(), RegistrationError> {
        let (socket, timeout) = (endpoint.to_path_buf(), self.csi_timeout);
        let dial = move || inlet_proto::uds::connect_lazy(&socket, Some(timeout));
        let client = CsiClient::dialing(name, channel, dial, Some(Arc::clone(&self.observer)))
            .with_timeout(self.csi_timeout);
        let mut registered = Registered {
            endpoint: endpoint.to_path_buf(),
            node_id: String::new(),
            client: client.clone(),
            version,
            registration,
        };
        self.drivers
            .write()
            .insert(name.to_string(), registered.clone());
        let info = match client.node_info().await {
            Ok(info) if info.node_id.is_empty() => {
                self.deregister(name);
                // `nodeinfomanager.go` InstallCSIDriver.
                return Err(RegistrationError::EmptyNodeId);
            }
            Ok(info) => match self.csinode_errors(name, &info.node_id) {
                Some(reason) => {
                    self.deregister(name);
                    return Err(reason);
                }
                None => info,
            },
            Err(e) => {
                self.deregister(name);
                return Err(RegistrationError::NodeInfo(e));
            }
        };
        registered.node_id = info.node_id.clone();
        self.install_in_csinode(name, &info);
        self.drivers.write().insert(name.to_string(), registered);
        self.directory
            .clients
            .write()
            .insert((self.node.clone(), name.to_string()), client);
        tracing::info!(node = %self.node, driver = name, "registered CSI driver");
        Ok(())
    }

    /// What the API server's CSINode validation (`ValidateCSINode`: `validateCSINodeDriverNodeID`,
    /// `ValidateCSIDriverName`) would refuse of this driver's entry, as `updateCSINode` returns it: a
    /// driver's name or node id is never written where the API would not take it. The value is escaped
    /// and capped (a driver's megabyte node id is not logged whole).
    fn csinode_errors(&self, name: &str, node_id: &str) -> Option<RegistrationError> {
        let index = self.api.peek::<CSINode>("", &self.node).map_or(0, |n| {
            n.spec.drivers.iter().filter(|d| d.name != name).count()
        });
        let field = format!("spec.drivers[{index}]");
        let mut errors = inlet_host::names::csi_driver_name_errors(name, &format!("{field}.name"));
        if node_id.len() > CSI_NODE_ID_MAX {
            errors.push(format!(
                "{field}.nodeID: Invalid value: {:?}: must be {CSI_NODE_ID_MAX} characters or less",
                inlet_proto::peer_text::shown(node_id, 64)
            ));
        }
        let errors = match errors.len() {
            0 => return None,
            1 => errors.remove(0),
            _ => format!("[{}]", errors.join(", ")),
        };
        Some(RegistrationError::CsiNode {
            node: self.node.clone(),
            errors,
        })
    }

    /// Removes a driver (its socket went away), and uninstalls it from CSINode.
    pub fn deregister(&self, name: &str) {
        self.drivers.write().remove(name);
        self.directory
            .clients
            .write()
            .remove(&(self.node.clone(), name.to_string()));
        self.api.update::<CSINode>("", &self.node, |n| {
            n.spec.drivers.retain(|d| d.name != name)
        });
        self.update_node_info(name, None);
    }

    /// The Node's `csi.volume.kubernetes.io/nodeid` annotation (a JSON map of driver to node id) and the
    /// driver's topology labels, with the driver's entry added (`info`) or removed (`nodeinfomanager.go`
    /// `updateNodeIDInNode`, `updateTopologyLabels`; a label is never removed, as upstream leaves it).
    fn update_node_info(&self, name: &str, info: Option<&NodeGetInfoResponse>) {
        self.api
            .update::<k8s_openapi::api::core::v1::Node>("", &self.node, |node| {
                let annotations = node
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default);
                let mut ids: std::collections::BTreeMap<String, String> = annotations
                    .get(NODE_ID_ANNOTATION)
                    .and_then(|text| serde_json::from_str(text).ok())
                    .unwrap_or_default();
                match info {
                    Some(info) => drop(ids.insert(name.to_string(), info.node_id.clone())),
                    None => drop(ids.remove(name)),
                }
                match ids.is_empty() {
                    true => drop(annotations.remove(NODE_ID_ANNOTATION)),
                    false => drop(annotations.insert(
                        NODE_ID_ANNOTATION.to_string(),
                        serde_json::to_string(&ids).unwrap_or_default(),
                    )),
                }
                let labels = node.metadata.labels.get_or_insert_with(Default::default);
                for topology in info.iter().flat_map(|i| &i.accessible_topology) {
                    labels.extend(topology.segments.clone());
                }
            });
    }

    /// The driver's entry in CSINode: its node id, its topology keys and its volume limit
    /// (`nodeinfomanager.go` `installDriverToCSINode`).
    fn install_in_csinode(&self, name: &str, info: &NodeGetInfoResponse) {
        let mut topology_keys: Vec<String> = info
            .accessible_topology
            .iter()
            .flat_map(|t| t.segments.keys().cloned())
            .collect();
        topology_keys.sort();
        let driver = CSINodeDriver {
            name: name.to_string(),
            node_id: info.node_id.clone(),
            topology_keys: Some(topology_keys),
            allocatable: (info.max_volumes_per_node > 0).then(|| VolumeNodeResources {
                count: i32::try_from(info.max_volumes_per_node).ok(),
            }),
        };
        self.update_node_info(name, Some(info));
        let updated = self.api.update::<CSINode>("", &self.node, |n| {
            n.spec.drivers.retain(|d| d.name != name);
            n.spec.drivers.push(driver.clone());
        });
        if !updated {
            self.api.put(CSINode {
                metadata: ObjectMeta {
                    name: Some(self.node.clone()),
                    ..Default::default()
                },
                spec: CSINodeSpec {
                    drivers: vec![driver],
                },
            });
        }
    }
}

/// Dials a driver with the kubelet's CSI timeout on every call: a driver that never answers (a hung NFS
/// mount under NodePublishVolume) fails the call after it, and is retried.
async fn connect(
    endpoint: &Path,
    timeout: Duration,
) -> Result<tonic::transport::Channel, EndpointError> {
    inlet_proto::uds::connect_with_timeout(endpoint, Some(timeout)).await
}

/// Why a driver was not registered, in upstream's words (`csi_plugin.go`, `nodeinfomanager.go`); each
/// variant keeps what it came from.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The driver's socket could not be dialed.
    #[error("RegisterPlugin error -- dial failed at socket {}, err: {source}", endpoint.display())]
    Dial {
        /// The driver's socket.
        endpoint: PathBuf,
        /// What dialing said.
        #[source]
        source: EndpointError,
    },
    /// GetPluginInfo failed.
    #[error(
        "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {}, err: {}",
        endpoint.display(),
        rpc_error(source)
    )]
    PluginInfo {
        /// The driver's socket.
        endpoint: PathBuf,
        /// The driver's answer.
        #[source]
        source: tonic::Status,
    },
    /// The driver at the socket is another than the one named (`--driver NAME=unix://...`).
    #[error("RegisterPlugin error -- the driver at {} is named {reported:?}, not {name:?}", endpoint.display())]
    WrongName {
        /// The driver's socket.
        endpoint: PathBuf,
        /// The name GetPluginInfo reported.
        reported: String,
        /// The name given.
        name: String,
    },
    /// The driver's supported versions are refused (`validateVersions`).
    #[error("kubernetes.io/csi: {caller} for CSI driver {name:?} failed. {reason}")]
    Versions {
        /// The step (`ValidatePlugin`, `RegisterPlugin`).
        caller: String,
        /// The driver.
        name: String,
        /// Upstream's reason.
        reason: String,
    },
    /// The driver could not be reached (grpc-go's lazy dial shows it at NodeGetInfo).
    #[error("rpc error: code = Unavailable desc = connection error: {0}")]
    Unreachable(#[source] EndpointError),
    /// NodeGetInfo answered no node id (`InstallCSIDriver`).
    #[error("error adding CSI driver node info: driverNodeID must not be empty")]
    EmptyNodeId,
    /// CSINode's validation refused the driver's entry (`InstallCSIDriver`'s `updateCSINode`).
    #[error(
        "error updating CSINode object with CSI driver node info: CSINode.storage.k8s.io {node:?} is invalid: {errors}"
    )]
    CsiNode {
        /// The node (the CSINode's name).
        node: String,
        /// The field errors, joined as the API server joins them.
        errors: String,
    },
    /// NodeGetInfo failed.
    #[error("{}", rpc_error(.0))]
    NodeInfo(#[source] tonic::Status),
}

/// A CSI version as apimachinery's `ParseGeneric` reads it: at least major.minor, numeric components,
/// compared component by component with missing ones as zero.
#[derive(Debug, Clone)]
pub struct CsiVersion(Vec<u64>);

impl CsiVersion {
    /// `utilversion.ParseGeneric`: optional leading blanks and `v`, then dotted numbers; what follows the
    /// numbers is not part of the version.
    pub fn parse(text: &str) -> Result<Self, String> {
        let rest = text.trim_start();
        let rest = rest.strip_prefix('v').unwrap_or(rest);
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let numbers = rest[..end].trim_end_matches('.');
        if numbers.is_empty() || numbers.starts_with('.') {
            return Err(format!("could not parse {text:?} as version"));
        }
        let parts: Vec<&str> = numbers.split('.').collect();
        if parts.len() < 2 {
            return Err(format!("illegal version string {text:?}"));
        }
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!("could not parse {text:?} as version"));
        }
        if parts[0].len() > 1 && parts[0].starts_with('0') {
            return Err(format!(
                "illegal zero-prefixed version component {:?} in {text:?}",
                parts[0]
            ));
        }
        parts
            .iter()
            .map(|p| {
                p.parse::<u64>().map_err(|e| {
                    format!("illegal non-numeric version component {p:?} in {text:?}: {e}")
                })
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Upstream's `highestSupportedVersion`: the highest of `versions` below 2.x, which must be a 1.x.
    pub fn highest_supported(versions: &[String]) -> Result<Self, String> {
        let mut highest: Option<Self> = None;
        let mut last_error: Option<String> = None;
        for text in versions.iter().rev() {
            match Self::parse(text) {
                Err(e) => last_error = Some(e),
                // CSI has only 0.x and 1.x; a 2.x need not be compatible.
                Ok(v) if v.0[0] > 1 => {}
                Ok(v) if highest.as_ref().is_none_or(|h| *h < v) => highest = Some(v),
                Ok(_) => {}
            }
        }
        let Some(highest) = highest else {
            return Err(format!(
                "could not find a highest supported version from versions ([{}]) reported by this driver: {}",
                versions.join(" "),
                last_error.as_deref().unwrap_or("<nil>")
            ));
        };
        if highest.0[0] != 1 {
            // CSI 0.x has not been supported since Kubernetes 1.17.
            return Err(format!(
                "highest supported version reported by driver is {highest}, must be v1.x"
            ));
        }
        Ok(highest)
    }

    fn component(&self, i: usize) -> u64 {
        self.0.get(i).copied().unwrap_or(0)
    }
}

impl PartialEq for CsiVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for CsiVersion {}

impl PartialOrd for CsiVersion {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CsiVersion {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (0..self.0.len().max(other.0.len()))
            .map(|i| self.component(i).cmp(&other.component(i)))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    }
}

impl std::fmt::Display for CsiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn go_quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions(list: &[&str]) -> Vec<String> {
        list.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn parses_versions_as_apimachinery_does() {
        assert_eq!(CsiVersion::parse("1.0.0").unwrap().to_string(), "1.0.0");
        assert_eq!(CsiVersion::parse(" v1.2").unwrap().to_string(), "1.2");
        assert_eq!(
            CsiVersion::parse("1.5.0-beta").unwrap().to_string(),
            "1.5.0"
        );
        assert_eq!(
            CsiVersion::parse("1").unwrap_err(),
            "illegal version string \"1\""
        );
        assert_eq!(
            CsiVersion::parse("one").unwrap_err(),
            "could not parse \"one\" as version"
        );
        assert!(CsiVersion::parse("01.0").is_err());
        assert_eq!(
            CsiVersion::parse("1.0").unwrap(),
            CsiVersion::parse("1.0.0").unwrap()
        );
        assert!(CsiVersion::parse("1.10.0").unwrap() > CsiVersion::parse("1.9.9").unwrap());
    }

    #[test]
    fn picks_the_highest_1x_version() {
        let pick = |list: &[&str]| CsiVersion::highest_supported(&versions(list));
        assert_eq!(
            pick(&["0.3.0", "1.0.0", "1.2.0", "2.0.0"])
                .unwrap()
                .to_string(),
            "1.2.0"
        );
        assert_eq!(
            pick(&["2.0.0"]).unwrap_err(),
            "could not find a highest supported version from versions ([2.0.0]) reported by this driver: <nil>"
        );
        assert_eq!(
            pick(&["0.3.0"]).unwrap_err(),
            "highest supported version reported by driver is 0.3.0, must be v1.x"
        );
        assert_eq!(
            pick(&["x"]).unwrap_err(),
            "could not find a highest supported version from versions ([x]) reported by this driver: could not parse \"x\" as version"
        );
    }

    #[test]
    fn quotes_lists_as_go_does() {
        assert_eq!(
            go_quoted_list(&versions(&["2.0.0", "3"])),
            r#"["2.0.0" "3"]"#
        );
    }
}
