//! kubelet-sim as nodes of a real cluster (`kubelet-sim run --kubeconfig FILE`): hollow nodes, as
//! kubemark's, but with real volume logic. The simulated kubelets keep working on the embedded API; this
//! module keeps it in step with the real API server, in both directions, with the traffic a kubelet has:
//!
//! - `nodes.rs`: registers the Nodes, posts their status (Ready, `volumesInUse`) and renews their Leases;
//! - `inbound.rs`: watches the pods bound to them and the CSIDrivers into the embedded API, and reads
//!   the Secrets, ConfigMaps, claims, PVs and VolumeAttachments its pods refer to, one GET each, as the
//!   Node authorizer allows a kubelet (`references.rs`);
//! - `outbound.rs`: posts pod status, events and CSINode objects, and deletes a pod's object once its
//!   node has torn it down (the kubelet's final delete).
//!
//! Attach and detach belong to the control plane in a real cluster: the simulated nodes only wait for the
//! VolumeAttachments it makes. Admission too is the API server's.

mod client_metrics;
mod error;
mod inbound;
mod leave;
mod nodes;
mod outbound;
pub mod references;
mod tokens;

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use client_metrics::register as register_metrics;
pub use error::ClusterError;

use crate::api::Api;
use crate::api::manifest::Object;

/// The name kubelet-sim's changes are made under (server-side apply's field manager).
pub const FIELD_MANAGER: &str = "kubelet-sim";

/// A client for the API server a kubeconfig names.
pub async fn connect(kubeconfig: &Path) -> Result<kube::Client, ClusterError> {
    let bad = |e: Box<dyn std::error::Error + Send + Sync>| ClusterError::Kubeconfig {
        path: kubeconfig.to_path_buf(),
        source: e,
    };
    let text = std::fs::read_to_string(kubeconfig).map_err(|e| bad(e.into()))?;
    let parsed = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| bad(e.into()))?;
    let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
        .await
        .map_err(|e| bad(e.into()))?;
    client(config).map_err(|e| bad(e.into()))
}

/// A client from the pod's own service account (`kube::Config::infer`: `KUBECONFIG` when set, else the
/// in-cluster config), for hollow nodes that run as pods of the cluster they join.
pub async fn connect_in_cluster() -> Result<kube::Client, ClusterError> {
    let bad = |e: Box<dyn std::error::Error + Send + Sync>| ClusterError::InCluster { source: e };
    let config = kube::Config::infer().await.map_err(|e| bad(e.into()))?;
    client(config).map_err(|e| bad(e.into()))
}

/// A client for `config` whose requests are counted (`rest_client_requests_total`). A connection silent
/// for 295 s (no byte read or written) fails its request, where kube waits for ever by default: longer
/// than a watch's 290 s server-side timeout (kube-runtime's), as client-go's transport gives up on a
/// silent connection rather than hang a caller.
fn client(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    config.read_timeout = Some(std::time::Duration::from_secs(295));
    config.reset_reader_on_write = true;
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&client_metrics::RequestMetricsLayer)
        .build())
}

/// The hollow nodes' link to the API server, running until `stop` turns true.
pub struct Cluster {
    client: kube::Client,
}

impl Cluster {
    /// Registers `nodes` (their runtime reported as `runtime_version`), then keeps the embedded API in
    /// step with the API server until `stop`. The embedded API's sources are ready once every watch has
    /// listed once. Returns the tasks.
    pub async fn start(
        client: kube::Client,
        api: Arc<Api>,
        nodes: Vec<String>,
        runtime_version: String,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, ClusterError> {
        // Pods the nodes finish with are kept for their final delete.
        api.track_finished();
        api.tokens
            .use_issuer(std::sync::Arc::new(tokens::ClusterTokens {
                client: client.clone(),
            }));
        let uids = nodes::register(&client, &api, &nodes, &runtime_version).await?;
        let mut tasks = vec![tokio::spawn(nodes::heartbeat(
            client.clone(),
            Arc::clone(&api),
            uids.clone(),
            runtime_version,
            stop.clone(),
        ))];
        tasks.extend(inbound::start(&client, &api, &nodes, stop.clone()));
        tasks.push(tokio::spawn(outbound::run(client, api, uids, stop)));
        Ok(tasks)
    }

    /// A client of the cluster.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// Drains `nodes` and deletes them (`--drain-on-exit`; see `leave.rs`).
    pub async fn leave(
        &self,
        api: &Arc<Api>,
        nodes: &[String],
        deadline: std::time::Duration,
    ) -> Result<(), ClusterError> {
        leave::leave(&self.client, api, nodes, deadline).await
    }

    /// Applies a manifest's object to the API server (server-side apply, as `kubectl apply
    /// --server-side`: created, or brought to what the manifest says, so a run can be repeated); a pod is
    /// bound to `node` unless it names one. The API server's refusal is the error.
    pub async fn create(&self, object: Object, node: &str) -> Result<(), ClusterError> {
        let client = &self.client;
        match object {
            Object::Pod(mut pod) => {
                let spec = pod.spec.get_or_insert_with(Default::default);
                spec.node_name.get_or_insert_with(|| node.to_string());
                apply(
                    kube::Api::namespaced(client.clone(), &namespace(&pod.metadata)),
                    *pod,
                )
                .await
            }
            Object::Secret(s) => {
                apply(
                    kube::Api::namespaced(client.clone(), &namespace(&s.metadata)),
                    *s,
                )
                .await
            }
            Object::ConfigMap(c) => {
                apply(
                    kube::Api::namespaced(client.clone(), &namespace(&c.metadata)),
                    *c,
                )
                .await
            }
            Object::PersistentVolumeClaim(c) => {
                apply(
                    kube::Api::namespaced(client.clone(), &namespace(&c.metadata)),
                    *c,
                )
                .await
            }
            Object::ServiceAccount(a) => {
                apply(
                    kube::Api::namespaced(client.clone(), &namespace(&a.metadata)),
                    *a,
                )
                .await
            }
            Object::CsiDriver(d) => apply(kube::Api::all(client.clone()), *d).await,
            Object::StorageClass(c) => apply(kube::Api::all(client.clone()), *c).await,
            Object::PersistentVolume(v) => apply(kube::Api::all(client.clone()), *v).await,
            Object::Namespace(n) => apply(kube::Api::all(client.clone()), *n).await,
        }
    }

    /// True once the API server has none of `pods` (namespace, name, UID) any more: their nodes have
    /// sent their final deletes.
    pub async fn pods_gone(&self, pods: &[(String, String, String)]) -> bool {
        for (namespace, name, uid) in pods {
            match kube::Api::<Pod>::namespaced(self.client.clone(), namespace)
                .get_opt(name)
                .await
            {
                Ok(Some(pod)) if pod.metadata.uid.as_deref() == Some(uid) => return false,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Starts a pod's graceful deletion in the API server (a pod already gone is deleted).
    pub async fn delete_pod(&self, namespace: &str, name: &str) -> Result<(), ClusterError> {
        match kube::Api::<Pod>::namespaced(self.client.clone(), namespace)
            .delete(name, &Default::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(ClusterError::request(format!(
                "deleting pod {namespace}/{name}"
            ))(e)),
        }
    }
}

fn namespace(meta: &ObjectMeta) -> String {
    meta.namespace.clone().unwrap_or_else(|| "default".into())
}

/// Server-side apply of `object` (kubelet-sim's field manager, taking over fields others set).
async fn apply<K>(api: kube::Api<K>, object: K) -> Result<(), ClusterError>
where
    K: kube::Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(&object))
        .await
        .map(drop)
        .map_err(|source| ClusterError::Refused { source })
}
