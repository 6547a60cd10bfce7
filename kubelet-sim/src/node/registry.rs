//! CSI drivers registered on one node, as the kubelet's plugin watcher and CSI registration handler keep
//! them (`pkg/kubelet/pluginmanager`, `csi_plugin.go` RegistrationHandler): a driver is registered in
//! numbered steps, each of which can fail with upstream's message.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inlet_plugin::volume::csi::{CSI_TIMEOUT, CsiClient, CsiObserver};
use inlet_proto::csi::v1::{GetPluginInfoRequest, identity_client::IdentityClient};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::RwLock;

use crate::api::Api;

/// One registered driver.
#[derive(Debug, Clone)]
pub struct Registered {
    /// The driver's socket.
    pub endpoint: PathBuf,
    /// The node id the driver reported (NodeGetInfo).
    pub node_id: String,
    /// A client for it.
    pub client: CsiClient,
}

/// The drivers registered on one node.
pub struct DriverRegistry {
    node: String,
    api: Arc<Api>,
    observer: Arc<dyn CsiObserver>,
    drivers: RwLock<HashMap<String, Registered>>,
}

impl DriverRegistry {
    /// An empty registry for `node`.
    pub fn new(node: &str, api: Arc<Api>, observer: Arc<dyn CsiObserver>) -> Self {
        Self {
            node: node.to_string(),
            api,
            observer,
            drivers: RwLock::new(HashMap::new()),
        }
    }

    /// Every registered driver's name and socket.
    pub fn endpoints(&self) -> Vec<(String, PathBuf)> {
        self.drivers
            .read()
            .iter()
            .map(|(name, r)| (name.clone(), r.endpoint.clone()))
            .collect()
    }

    /// A registered driver.
    pub fn get(&self, name: &str) -> Option<Registered> {
        self.drivers.read().get(name).cloned()
    }

    /// Registers the driver `name` serving on `endpoint`:
    /// 1. dial the socket; 2. GetPluginInfo (1 s), whose name must be `name`; 3. NodeGetInfo (2 min);
    /// 4. record it, and install it in this node's CSINode object.
    pub async fn register(&self, name: &str, endpoint: &Path) -> Result<(), String> {
        let span = tracing::info_span!("register", node = %self.node, driver = name);
        let _enter = span.enter();
        // Every call on it has the kubelet's CSI timeout, enforced here: a driver that never answers (a
        // hung NFS mount under NodePublishVolume) fails the call after it, and is retried.
        let channel = inlet_proto::uds::connect_with_timeout(endpoint, Some(CSI_TIMEOUT))
            .await
            .map_err(|e| {
                format!(
                    "RegisterPlugin error -- dial failed at socket {}, err: {e}",
                    endpoint.display()
                )
            })?;
        let mut request = tonic::Request::new(GetPluginInfoRequest {});
        request.set_timeout(Duration::from_secs(1));
        let info = IdentityClient::new(channel.clone()).get_plugin_info(request).await.map_err(|e| {
            format!("RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {}, err: {}", endpoint.display(), e.message())
        })?;
        let reported = info.into_inner().name;
        if reported != name {
            return Err(format!(
                "RegisterPlugin error -- the driver at {} is named {reported:?}, not {name:?}",
                endpoint.display()
            ));
        }
        let client = CsiClient::new(name, channel, Some(Arc::clone(&self.observer)));
        let node_id = client
            .node_info()
            .await
            .map_err(|e| {
                format!(
                    "error updating CSI node info: NodeGetInfo failed: {}",
                    e.message()
                )
            })?
            .node_id;
        self.install(name, &node_id);
        self.drivers.write().insert(
            name.to_string(),
            Registered {
                endpoint: endpoint.to_path_buf(),
                node_id,
                client,
            },
        );
        tracing::info!("registered CSI driver");
        Ok(())
    }

    /// Removes a driver (its socket went away), and uninstalls it from CSINode.
    pub fn deregister(&self, name: &str) {
        self.drivers.write().remove(name);
        self.api.update::<CSINode>("", &self.node, |n| {
            n.spec.drivers.retain(|d| d.name != name)
        });
    }

    fn install(&self, name: &str, node_id: &str) {
        let driver = CSINodeDriver {
            name: name.to_string(),
            node_id: node_id.to_string(),
            ..Default::default()
        };
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
