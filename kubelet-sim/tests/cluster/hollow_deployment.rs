//! Hollow nodes as pods of the cluster (`deploy/hollow-nodes/`, kubemark's shape with real volume logic),
//! on the kit: the image `deploy/build-images.sh` builds is loaded into the kit's containerd, the
//! Deployment's 2 replicas × 10 hollow nodes register (in-cluster config, each pod's own service account),
//! workload pods with inline CSI volumes bound to nodes of both replicas reach Running, and scaling to 1
//! removes the 10 nodes of the pod it stops: they are drained (their pods deleted and torn down) and
//! deleted, while the other replica's nodes and pods stay.
//!
//! The kit has no kube-proxy, so the Service IP the in-cluster config names is not routed there: the test
//! runs the pods on the host network with `KUBERNETES_SERVICE_HOST` set to the API server's address (as a
//! cluster without kube-proxy would), and without the metrics port and probe, which two host-network
//! replicas on one node would share. Nothing else of the manifests is changed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use inlet_testkit::kit::{Kit, wait};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `deploy/hollow-nodes` rendered by the kit's kubectl, with the kit's changes (see the module's doc).
fn manifests(kit: &Kit) -> Value {
    let rendered = kit.kubectl(&[
        "kustomize",
        repo().join("deploy/hollow-nodes").to_str().unwrap(),
    ]);
    let mut items = Vec::new();
    for document in rendered.split("\n---\n") {
        let mut object: Value = serde_saphyr::from_str(document).expect("a manifest");
        if object["kind"] == "Deployment" {
            let pod = &mut object["spec"]["template"]["spec"];
            pod["hostNetwork"] = json!(true);
            let container = &mut pod["containers"][0];
            let args = container["args"].as_array_mut().unwrap();
            args.retain(|a| !a.as_str().unwrap().starts_with("--metrics-address"));
            let env = container["env"].as_array_mut().unwrap();
            env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}));
            env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": "16443"}));
            let container = container.as_object_mut().unwrap();
            container.remove("livenessProbe");
            container.remove("ports");
        }
        items.push(object);
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// The hollow nodes the Deployment's pods registered, by name.
fn hollow_nodes(kit: &Kit) -> Vec<String> {
    kit.kubectl(&["get", "nodes", "-o", "name"])
        .lines()
        .filter_map(|l| l.strip_prefix("node/"))
        .filter(|n| n.starts_with("hollow-nodes-"))
        .map(String::from)
        .collect()
}

/// The replica a hollow node belongs to: its name less `-<n>`.
fn replica(node: &str) -> &str {
    node.rsplit_once('-').map_or(node, |(pod, _)| pod)
}

pub fn hollow_nodes_as_a_deployment(kit: &mut Kit) {
    let archive = match inlet_testkit::images::archive("kubelet-sim") {
        Ok(archive) => archive,
        Err(why) => {
            println!("SKIPPED hollow-node Deployment: {why}");
            return;
        }
    };
    let address = kit.cri_endpoint().trim_start_matches("unix://").to_string();
    let out = Command::new("ctr")
        .args(["--address", &address, "-n", "k8s.io", "images", "import"])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    kit.apply("hollow-node-deployment", &manifests(kit).to_string());

    wait("20 hollow nodes Ready", WAIT, || {
        let nodes = hollow_nodes(kit);
        nodes.len() == 20
            && nodes
                .iter()
                .all(|n| super::hollow_nodes::node_ready(kit, n))
    });
    let nodes = hollow_nodes(kit);
    let replicas: std::collections::BTreeSet<&str> = nodes.iter().map(|n| replica(n)).collect();
    assert_eq!(replicas.len(), 2, "{nodes:?}");
    // Two workload pods on a node of each replica.
    let mut manifest = String::new();
    let mut placed = Vec::new();
    for (i, replica) in replicas.iter().enumerate() {
        for n in [1, 10] {
            let (pod, node) = (format!("work-{i}-{n}"), format!("{replica}-{n}"));
            manifest.push_str(&super::hollow_nodes::pod(&pod, &node, false));
            placed.push((pod, replica.to_string()));
        }
    }
    kit.apply("hollow-workload", &manifest);
    for (pod, _) in &placed {
        wait(&format!("{pod} Running"), WAIT, || {
            kit.phase(pod) == "Running"
        });
    }

    kit.kubectl(&[
        "scale",
        "deployment",
        "hollow-nodes",
        "-n",
        "kubelet-sim",
        "--replicas=1",
    ]);
    wait("10 hollow nodes left", WAIT, || {
        hollow_nodes(kit).len() == 10
    });
    let left = hollow_nodes(kit);
    let kept: std::collections::BTreeSet<&str> = left.iter().map(|n| replica(n)).collect();
    assert_eq!(kept.len(), 1, "the nodes of one replica stay: {left:?}");
    assert!(
        left.iter().all(|n| super::hollow_nodes::node_ready(kit, n)),
        "{left:?}"
    );
    let kept = kept.into_iter().next().unwrap().to_string();
    for (pod, replica) in &placed {
        if *replica == kept {
            assert_eq!(kit.phase(pod), "Running", "{pod} on a node that stays");
        } else {
            wait(&format!("{pod} evicted"), WAIT, || {
                !kit.try_kubectl(&["get", "pod", pod]).status.success()
            });
        }
    }
    let pods: Vec<String> = placed.iter().map(|(p, _)| p.clone()).collect();
    let mut delete = vec![
        "delete",
        "pod",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=90s",
    ];
    delete.extend(pods.iter().map(String::as_str));
    kit.kubectl(&delete);
    kit.kubectl(&[
        "delete",
        "namespace",
        "kubelet-sim",
        "--wait=true",
        "--timeout=90s",
    ]);
}
