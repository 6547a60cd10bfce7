//! The exact requests hollow nodes make of an API server, against a mock one (a tower service answering
//! as kube-apiserver would), shaped as the Node authorizer allows a kubelet: Nodes created, their status
//! and Leases applied by name; pods listed and watched only with the node's `spec.nodeName` field selector; claims, PVs,
//! VolumeAttachments and Secrets read one by one (never listed), only those a pod refers to (its claim,
//! that claim's PV, its inline CSI volume's `nodePublishSecretRef` in its namespace, the PV's
//! `nodeStageSecretRef` in the namespace that names), never one it does not.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use k8s_openapi::api::core::v1::Secret;
use kubelet_sim::api::{Api, ApiPod};
use kubelet_sim::cluster::Cluster;
use parking_lot::Mutex;
use serde_json::{Value, json};

/// (method, path and query) of every request.
type Requests = Arc<Mutex<Vec<(String, String)>>>;

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": api_version(kind), "kind": format!("{kind}List"),
           "metadata": {"resourceVersion": "1"}, "items": items})
}

fn api_version(kind: &str) -> &'static str {
    match kind {
        "CSIDriver" | "CSINode" | "VolumeAttachment" => "storage.k8s.io/v1",
        "Lease" => "coordination.k8s.io/v1",
        _ => "v1",
    }
}

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "team", "uid": "u1", "resourceVersion": "1"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [
                {"name": "data", "csi": {"driver": "x.inlet.dev", "nodePublishSecretRef": {"name": "used"}}},
                {"name": "claimed", "persistentVolumeClaim": {"claimName": "claim"}}]},
        "status": {"phase": "Pending"}})
}

fn pvc() -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim", "namespace": "team", "resourceVersion": "1"},
        "spec": {"volumeName": "pv"}, "status": {"phase": "Bound"}})
}

fn pv() -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv", "resourceVersion": "1"},
        "spec": {"csi": {"driver": "x.inlet.dev", "volumeHandle": "h",
            "nodeStageSecretRef": {"name": "stage", "namespace": "admin"}}}})
}

fn secret(namespace: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace}, "data": {"k": "dmFsdWU="}})
}

fn status(code: u16) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": "NotFound"})
}

/// The object a write answers with: its kind, from the path.
fn written(path: &str) -> Value {
    let segments: Vec<&str> = path.split('?').next().unwrap().split('/').collect();
    let (resource, name) = match segments
        .iter()
        .rposition(|s| ["nodes", "leases", "pods", "events", "csinodes"].contains(s))
    {
        Some(i) => (segments[i], segments.get(i + 1).copied().unwrap_or("new")),
        None => ("unknown", ""),
    };
    let kind = match resource {
        "nodes" => "Node",
        "leases" => "Lease",
        "pods" => "Pod",
        "events" => "Event",
        "csinodes" => "CSINode",
        _ => return status(404),
    };
    let mut object = json!({"apiVersion": api_version(kind), "kind": kind,
        "metadata": {"name": name, "uid": format!("uid-{name}")}});
    if kind == "Event" {
        object["involvedObject"] = json!({});
    }
    if kind == "CSINode" {
        object["spec"] = json!({"drivers": []});
    }
    object
}

fn answer(method: &str, path: &str) -> Result<Value, ()> {
    if method != "GET" {
        return Ok(written(path));
    }
    let bare = path.split('?').next().unwrap();
    if path.contains("watch=true") {
        return Err(());
    }
    Ok(match bare {
        "/api/v1/pods" if path.contains("node-1") => list("Pod", vec![pod()]),
        "/api/v1/pods" => list("Pod", vec![]),
        "/api/v1/namespaces/team/persistentvolumeclaims/claim" => pvc(),
        "/api/v1/persistentvolumes/pv" => pv(),
        "/apis/storage.k8s.io/v1/csidrivers" => list("CSIDriver", vec![]),
        "/api/v1/namespaces/team/secrets/used" => secret("team", "used"),
        "/api/v1/namespaces/team/secrets/unused" => secret("team", "unused"),
        "/api/v1/namespaces/admin/secrets/stage" => secret("admin", "stage"),
        _ => status(404),
    })
}

/// A mock API server; while `down` is true it answers 503 to everything, and the watches it had open end.
fn mock(requests: Requests, down: tokio::sync::watch::Receiver<bool>) -> kube::Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let requests = Arc::clone(&requests);
        let mut down = down.clone();
        async move {
            let method = request.method().to_string();
            let path = request
                .uri()
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            requests.lock().push((method.clone(), path.clone()));
            let unavailable = *down.borrow();
            let answer = match unavailable {
                true => Ok(
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "code": 503, "reason": "ServiceUnavailable",
                    "message": "the server is currently unable to handle the request"}),
                ),
                false => answer(&method, &path),
            };
            let code = match &answer {
                Ok(v) if v["kind"] == "Status" => v["code"].as_u64().unwrap_or(404) as u16,
                _ => 200,
            };
            let body: BoxBody<Bytes, Infallible> = match answer {
                Ok(value) => Full::new(Bytes::from(value.to_string())).boxed(),
                // A watch: open and quiet, until the server goes away.
                Err(()) => {
                    let gone = async move { drop(down.wait_for(|d| *d).await) };
                    let stream =
                        futures::stream::pending::<Result<http_body::Frame<Bytes>, Infallible>>();
                    StreamBody::new(futures::StreamExt::take_until(stream, gone)).boxed()
                }
            };
            let response = http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(body)
                .unwrap();
            Ok::<_, Infallible>(response)
        }
    });
    kube::Client::new(service, "default")
}

#[tokio::test(flavor = "multi_thread")]
async fn hollow_nodes_read_only_what_their_pods_refer_to() {
    let requests: Requests = Arc::default();
    let api = Api::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (_up, never_down) = tokio::sync::watch::channel(false);
    let tasks = Cluster::start(
        mock(Arc::clone(&requests), never_down),
        Arc::clone(&api),
        vec!["node-1".into(), "node-2".into()],
        "cri-fake://0.1.0".into(),
        stopped,
    )
    .await
    .expect("the nodes register");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(api.sources_ready()
        && api.peek::<ApiPod>("team", "web").is_some()
        && api.peek::<Secret>("team", "used").is_some()
        && api.peek::<Secret>("admin", "stage").is_some())
    {
        assert!(
            Instant::now() < deadline,
            "requests: {:#?}",
            requests.lock()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A quiet moment: nothing more should be read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.send(true).unwrap();
    for task in tasks {
        task.await.unwrap();
    }

    let requests = requests.lock().clone();
    let secrets: BTreeSet<&str> = requests
        .iter()
        .filter(|(_, path)| path.contains("secrets"))
        .map(|(method, path)| {
            assert_eq!(method, "GET", "{path}");
            path.as_str()
        })
        .collect();
    assert_eq!(
        secrets,
        BTreeSet::from([
            "/api/v1/namespaces/admin/secrets/stage",
            "/api/v1/namespaces/team/secrets/used"
        ]),
        "{requests:#?}"
    );
    for (method, path) in &requests {
        if path.starts_with("/api/v1/pods") {
            assert!(
                path.contains("fieldSelector=spec.nodeName%3Dnode-"),
                "{method} {path}: pods are read only by node"
            );
        }
        for listed in [
            "/api/v1/secrets",
            "/api/v1/persistentvolumeclaims",
            "/api/v1/persistentvolumes?",
            "/apis/storage.k8s.io/v1/volumeattachments?",
        ] {
            assert!(
                !path.starts_with(listed),
                "{method} {path}: a node may not list it"
            );
        }
    }
    for read in [
        "/api/v1/namespaces/team/persistentvolumeclaims/claim",
        "/api/v1/persistentvolumes/pv",
    ] {
        assert!(
            requests.iter().any(|(m, p)| m == "GET" && p == read),
            "{read} was not read: {requests:#?}"
        );
    }
    // Nodes are created (a POST, as `registerWithAPIServer`), not applied over what others set.
    let created = requests
        .iter()
        .filter(|(m, path)| m == "POST" && path.starts_with("/api/v1/nodes?"))
        .count();
    assert_eq!(created, 2, "{requests:#?}");
    for node in ["node-1", "node-2"] {
        let applied = |p: &str| {
            requests.iter().any(|(m, path)| {
                m == "PATCH" && path.starts_with(p) && path.contains("fieldManager=kubelet-sim")
            })
        };
        assert!(
            applied(&format!("/api/v1/nodes/{node}/status?")),
            "{requests:#?}"
        );
        assert!(
            applied(&format!(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}?"
            )),
            "{requests:#?}"
        );
    }
}

/// An API server that goes away for a while (12 s here, past one heartbeat): the hollow nodes lose
/// nothing (their pod and its Secret stay, nothing is torn down), and once it is back they renew their
/// Leases and watch their pods again.
#[tokio::test(flavor = "multi_thread")]
async fn hollow_nodes_ride_out_an_api_server_that_goes_away() {
    let requests: Requests = Arc::default();
    let api = Api::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (down, down_rx) = tokio::sync::watch::channel(false);
    let tasks = Cluster::start(
        mock(Arc::clone(&requests), down_rx),
        Arc::clone(&api),
        vec!["node-1".into()],
        "cri-fake://0.1.0".into(),
        stopped,
    )
    .await
    .expect("the node registers");
    let held = || {
        api.peek::<ApiPod>("team", "web").is_some() && api.peek::<Secret>("team", "used").is_some()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(api.sources_ready() && held()) {
        assert!(Instant::now() < deadline, "{:#?}", requests.lock());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    down.send(true).unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(held(), "the outage lost the pod or its Secret");
    let during = requests.lock().len();
    down.send(false).unwrap();

    let renewed = |requests: &[(String, String)]| {
        let lease = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1?";
        let watched = requests.iter().any(|(m, p)| {
            m == "GET" && p.starts_with("/api/v1/pods?") && p.contains("nodeName%3Dnode-1")
        });
        let leased = requests
            .iter()
            .any(|(m, p)| m == "PATCH" && p.starts_with(lease));
        watched && leased
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !renewed(&requests.lock()[during..]) {
        assert!(
            Instant::now() < deadline,
            "no Lease renewal or pod watch after the outage: {:#?}",
            &requests.lock()[during..]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(held(), "the pod or its Secret was lost after the outage");
    stop.send(true).unwrap();
    for task in tasks {
        task.await.unwrap();
    }
}
