//! Steps of the plugin watcher scenarios (`features/plugin_registration.feature`): drivers that register
//! themselves through `--plugins-registry`, and registration sockets the kubelet refuses.

use std::sync::Arc;

use cucumber::{given, then, when};
use inlet_proto::csi::v1::node_server::{Node, NodeServer};
use inlet_proto::csi::v1::{NodeGetInfoRequest, NodeGetInfoResponse};
use inlet_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use inlet_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use k8s_openapi::api::storage::v1::CSINode;
use kubelet_sim::drivers::DriverArg;
use tonic::{Request, Response, Status};

use super::{Sim, WAIT};

/// A registration socket that offers any plugin info and keeps what the kubelet tells it.
#[derive(Clone)]
struct OfferedPlugin {
    info: PluginInfo,
    told: Arc<tokio::sync::watch::Sender<Vec<RegistrationStatus>>>,
}

#[tonic::async_trait]
impl Registration for OfferedPlugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.told.send_modify(|told| told.push(status));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// An offered plugin's registration socket: what the kubelet told it, and the task serving it (stopped
/// with the scenario).
pub struct Offered {
    told: Arc<tokio::sync::watch::Sender<Vec<RegistrationStatus>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Offered {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[given(regex = r"^the kubelet watches a plugins registry$")]
fn watches(w: &mut Sim) {
    w.plugins_registry = Some(w.dir.path().join("plugins_registry"));
}

#[when(regex = r#"^the local driver "([^"]+)" registers through the plugins registry$"#)]
async fn registers_itself(w: &mut Sim, name: String) {
    let driver: DriverArg = format!("{name}=local").parse().expect("driver");
    w.sim
        .as_mut()
        .expect("running")
        .add_self_registering_driver(&driver)
        .await
        .expect("the driver starts");
}

#[when(regex = r#"^a plugin "([^"]+)" of type "([^"]*)" with versions "([^"]*)" offers itself$"#)]
async fn offers(w: &mut Sim, name: String, type_: String, versions: String) {
    serve_offered(w, &name, &type_, &versions, None).await;
}

/// Serves a registration socket for `name` in the plugins registry, with a CSI Node service on the same
/// socket when `node` is given (the registration socket is then the driver's endpoint too).
async fn serve_offered(
    w: &mut Sim,
    name: &str,
    type_: &str,
    versions: &str,
    node: Option<NodeIdOf>,
) {
    let name = name.to_string();
    let type_ = type_.to_string();
    let dir = w.plugins_registry.clone().expect("a plugins registry");
    let plugin = OfferedPlugin {
        info: PluginInfo {
            r#type: type_,
            name: name.clone(),
            // Empty: the kubelet takes the registration socket for the endpoint.
            endpoint: String::new(),
            supported_versions: versions
                .split(',')
                .filter(|v| !v.is_empty())
                .map(String::from)
                .collect(),
        },
        told: Arc::new(tokio::sync::watch::channel(Vec::new()).0),
    };
    std::fs::create_dir_all(&dir).expect("registry dir");
    let incoming = inlet_proto::uds::listen(&dir.join(format!("{name}-reg.sock")))
        .await
        .expect("registration socket");
    let server = RegistrationServer::new(plugin.clone());
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(server)
            .add_optional_service(node.map(NodeServer::new))
            .serve_with_incoming(incoming)
            .await;
    });
    w.offered.insert(
        name,
        Offered {
            told: plugin.told,
            task,
        },
    );
}

/// A CSI driver's NodeGetInfo answering a node id of a given length, for the offered plugin's socket.
#[derive(Clone)]
struct NodeIdOf(usize);

#[tonic::async_trait]
impl Node for NodeIdOf {
    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: "n".repeat(self.0),
            ..Default::default()
        }))
    }
}

#[when(regex = r#"^a CSI driver "([^"]+)" whose node id is (\d+) characters long offers itself$"#)]
async fn offers_node_id(w: &mut Sim, name: String, length: usize) {
    serve_offered(w, &name, "CSIPlugin", "1.0.0", Some(NodeIdOf(length))).await;
}

#[then(regex = r#"^the plugin "([^"]+)" is refused with "(.*)"$"#)]
async fn refused(w: &mut Sim, name: String, text: String) {
    let mut told = w.offered[&name].told.subscribe();
    let waited = tokio::time::timeout(
        WAIT,
        told.wait_for(|statuses| statuses.iter().any(|s| !s.plugin_registered)),
    )
    .await;
    let statuses = w.offered[&name].told.borrow().clone();
    assert!(
        waited.is_ok(),
        "the kubelet never answered {name}: {statuses:?}"
    );
    let refusal = statuses
        .iter()
        .find(|s| !s.plugin_registered)
        .expect("refused");
    assert!(
        refusal.error.contains(&text),
        "{name} was refused with {:?}, not {text:?}",
        refusal.error
    );
    assert!(
        statuses.iter().all(|s| !s.plugin_registered),
        "{statuses:?}"
    );
}

#[then(regex = r#"^node "([^"]+)" (lists|does not list) driver "([^"]+)" in its CSINode$"#)]
async fn csinode_lists(w: &mut Sim, node: String, lists: String, driver: String) {
    let want = lists == "lists";
    let api = Arc::clone(&w.sim().api);
    let listed = move || {
        api.get_recorded::<CSINode>("", &node)
            .is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == driver))
    };
    w.wait(&format!("the CSINode {lists} the driver"), |_| {
        listed() == want
    })
    .await;
}
