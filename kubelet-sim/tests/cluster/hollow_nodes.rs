//! kubelet-sim as hollow nodes of a real cluster: the kit's API server (v1.20.2 with bound service-account
//! tokens, as every 1.21+ cluster has them; its controller-manager and scheduler, and its own real node
//! beside).
//!
//! 1. `kubelet-sim run --kubeconfig --nodes 3` with no manifests serves as nodes until SIGTERM: its Nodes
//!    become Ready with Leases; pods created with kubectl, bound by nodeName, reach Running with their
//!    inline CSI volumes (and the projected `kube-api-access-*` volume the API server adds, whose token
//!    authenticates to it); CSINode lists the driver and the Node its node id;
//!    events reach the API; the only Secret read is the one a pod refers to; deleting the pods with
//!    kubectl tears their volumes down and removes their objects; SIGTERM ends it with 0 and a report.
//! 2. `kubelet-sim run --kubeconfig --manifests deploy/examples/... --teardown` applies the examples (a PV
//!    bound by the real PV controller included), settles them on its nodes, tears down through the API
//!    server, and exits 0 with nothing left.
//! 3. A hollow node with a node's own credential (`node_credentials.rs`).
//! 4. Hollow nodes as a Deployment's pods, scaled from 2 to 1 (`hollow_deployment.rs`).
//!
//! Needs root and the kit; otherwise it says SKIPPED. It takes the kit down at the end.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kit::{Kit, wait};

use inlet_testkit::kit;

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-sim");
const WAIT: Duration = Duration::from_secs(90);

fn examples(names: &[&str]) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    names
        .iter()
        .map(|n| dir.join(n).display().to_string())
        .collect()
}

const OBJECTS: &str = r#"apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: local.inlet.dev}
spec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Persistent, Ephemeral]}
---
apiVersion: v1
kind: Secret
metadata: {name: used}
stringData: {token: s3cr3t-used}
---
apiVersion: v1
kind: Secret
metadata: {name: unused}
stringData: {token: s3cr3t-unused}
"#;

/// A pod bound to `node` with an inline CSI volume of the local driver (and its secret reference).
pub fn pod(name: &str, node: &str, secret: bool) -> String {
    let secret_ref = if secret {
        ", nodePublishSecretRef: {name: used}"
    } else {
        ""
    };
    format!(
        r#"---
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeName: {node}
  containers: [{{name: app, image: busybox, volumeMounts: [{{name: data, mountPath: /data}}]}}]
  volumes: [{{name: data, csi: {{driver: local.inlet.dev, volumeAttributes: {{size: 8Mi}}{secret_ref}}}}}]
"#
    )
}

pub fn node_ready(kit: &Kit, node: &str) -> bool {
    let out = kit.try_kubectl(&[
        "get",
        "node",
        node,
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
    ]);
    String::from_utf8_lossy(&out.stdout) == "True"
}

/// Phase 1: hollow nodes serving pods created with kubectl.
fn serve_pods_created_with_kubectl(kit: &mut Kit, dir: &Path) {
    let report = dir.join("serve-report.json");
    let root = dir.join("serve-root");
    let sim = kit.start(
        "kubelet-sim",
        Command::new(BIN)
            .args(["run", "--nodes", "3", "--driver", "local.inlet.dev=local"])
            .arg("--kubeconfig")
            .arg(kit.kubeconfig())
            .arg("--root")
            .arg(&root)
            .arg("--report")
            .arg(&report),
    );
    for node in ["hollow-node-1", "hollow-node-2", "hollow-node-3"] {
        wait(&format!("{node} Ready"), WAIT, || node_ready(kit, node));
    }
    let leases = kit.kubectl(&["get", "lease", "-n", "kube-node-lease", "-o", "name"]);
    assert!(leases.contains("hollow-node-3"), "{leases}");

    let mut manifest = OBJECTS.to_string();
    for (name, node, secret) in [
        ("web-1", "hollow-node-1", true),
        ("web-2", "hollow-node-2", false),
        ("web-3", "hollow-node-3", false),
    ] {
        manifest.push_str(&pod(name, node, secret));
    }
    kit.apply("hollow-pods", &manifest);
    for pod in ["web-1", "web-2", "web-3"] {
        wait(&format!("{pod} Running"), WAIT, || {
            kit.phase(pod) == "Running"
        });
    }
    let csinode = kit.kubectl(&[
        "get",
        "csinode",
        "hollow-node-2",
        "-o",
        "jsonpath={.spec.drivers[*].name}",
    ]);
    assert_eq!(csinode, "local.inlet.dev");
    // The registration's labels survive the status posts since (a merge patch with `labels: null` once
    // deleted them all, and `bench hollow-nodes` then never found its nodes).
    let hollow = kit.kubectl(&[
        "get",
        "nodes",
        "-l",
        "inlet.dev/kubelet-sim=true,kubernetes.io/hostname=hollow-node-2",
        "-o",
        "name",
    ]);
    assert_eq!(hollow.trim(), "node/hollow-node-2");
    let events = kit.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=web-1",
        "-o",
        "jsonpath={.items[*].reason}",
    ]);
    assert!(events.contains("Started"), "{events}");
    let node_ids = kit.kubectl(&[
        "get",
        "node",
        "hollow-node-2",
        "-o",
        r#"jsonpath={.metadata.annotations.csi\.volume\.kubernetes\.io/nodeid}"#,
    ]);
    assert!(node_ids.contains("\"local.inlet.dev\""), "{node_ids}");
    let pod_ip = kit.kubectl(&["get", "pod", "web-1", "-o", "jsonpath={.status.podIP}"]);
    assert!(!pod_ip.is_empty(), "web-1 has no pod IP");
    let token = super::node_credentials::token_under(&root).expect("a kube-api-access token");
    let who =
        super::node_credentials::identify(kit, std::fs::read_to_string(token).unwrap().trim());
    assert!(
        who.contains("system:serviceaccount:default:default"),
        "{who}"
    );

    kit.kubectl(&[
        "delete",
        "pod",
        "web-1",
        "web-2",
        "web-3",
        "--wait=true",
        "--timeout=90s",
    ]);
    assert!(kit.stop(sim).success(), "{}", kit.log("kubelet-sim"));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("the report")).unwrap();
    let secrets: Vec<&str> = report["api_reads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "Secret")
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    // The one web-1 refers to, not the other.
    assert!(secrets.contains(&"used"), "{secrets:?}");
    assert!(!secrets.contains(&"unused"), "{secrets:?}");
    let log = kit.log("kubelet-sim");
    assert!(!log.contains("s3cr3t"), "a secret value was logged: {log}");
}

/// Phase 2: the examples applied by kubelet-sim to the cluster, settled and torn down.
fn apply_the_examples(kit: &Kit, dir: &Path) {
    let report = dir.join("examples-report.json");
    let out = Command::new(BIN)
        .args([
            "run",
            "--nodes",
            "2",
            "--driver",
            "local.inlet.dev=local",
            "--teardown",
        ])
        .arg("--kubeconfig")
        .arg(kit.kubeconfig())
        .arg("--root")
        .arg(dir.join("examples-root"))
        .arg("--report")
        .arg(&report)
        .arg("--manifests")
        .args(examples(&[
            "10-ephemeral.yaml",
            "20-secret-ref.yaml",
            "30-pv-pvc.yaml",
        ]))
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let running = report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["phase"] == "Running")
        .count();
    assert_eq!(running, 3, "{stdout}");
    let left = kit.kubectl(&["get", "pods", "-o", "name"]);
    assert!(left.is_empty(), "pods left in the API: {left}");
}

/// Runs `kubelet-sim bench <bench> <more>` on the kit (recorded mounts, a 90 s limit, `root` as its root),
/// asserts that it succeeded, and returns the JSON it wrote.
fn bench_report(kit: &Kit, root: &Path, bench: &[&str], more: &[&str]) -> serde_json::Value {
    std::fs::create_dir_all(root).unwrap();
    let json = root.join("figures.json");
    let out = Command::new(BIN)
        .arg("bench")
        .args(bench)
        .args(more)
        .args(["--timeout", "90s", "--mounter", "recording", "--kubeconfig"])
        .arg(kit.kubeconfig())
        .arg("--root")
        .arg(root)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap()
}

/// `bench hollow-nodes`, small, in this process and spread over two child processes: its nodes found
/// Ready (by their label), pods churned on them, and the nodes gone from the cluster after. Figures are
/// not judged.
fn bench_hollow_nodes(kit: &Kit, dir: &Path) {
    for processes in ["1", "2"] {
        let report = bench_report(
            kit,
            &dir.join(format!("bench-hollow-{processes}")),
            &[
                "hollow-nodes",
                "--nodes",
                "3",
                "--pods",
                "3",
                "--rounds",
                "1",
            ],
            &["--idle", "2s", "--processes", processes],
        );
        let figures = &report["figures"];
        assert_eq!(figures["nodes"], 3, "{report}");
        assert_eq!(figures["processes"].to_string(), processes, "{report}");
        assert!(
            figures["idle_rss_per_node_mib"].as_f64().unwrap() > 0.0,
            "{report}"
        );
        // The earlier phases' nodes stay, NotReady, as a stopped kubelet's do; the bench's must be gone.
        let nodes = kit.kubectl(&[
            "get",
            "nodes",
            "-l",
            "inlet.dev/kubelet-sim=true",
            "-o",
            "name",
        ]);
        let left: Vec<&str> = nodes
            .lines()
            .filter(|n| n.contains("bench-hollow"))
            .collect();
        assert!(
            left.is_empty(),
            "the bench's nodes left in the cluster: {left:?}"
        );
    }
}

/// `bench pods --kubeconfig`, small, over two child processes: every pod seen Running through the API
/// server's watch, its share read from its /metrics, and the pods and nodes gone after. Figures are not
/// judged.
fn bench_pods_on_the_cluster(kit: &Kit, dir: &Path) {
    let report = bench_report(
        kit,
        &dir.join("bench-pods"),
        &["pods", "--pods", "6", "--nodes", "2"],
        &["--processes", "2"],
    );
    let figures = &report["figures"];
    assert_eq!(figures["settled"], true, "{report}");
    assert_eq!(figures["pod_start"]["samples"], 6, "{report}");
    assert!(
        figures["api_server"]["requests"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let pods = kit.kubectl(&["get", "pods", "-l", "inlet.dev/bench=pods", "-o", "name"]);
    assert!(pods.is_empty(), "the bench's pods left: {pods}");
    let nodes = kit.kubectl(&["get", "nodes", "-o", "name"]);
    assert!(
        !nodes.contains("bench-pods"),
        "the bench's nodes left: {nodes}"
    );
}

/// `bench hollow-nodes --processes 2` stopped with SIGTERM while its nodes idle: it exits 143 after its
/// children stopped and its nodes left the cluster.
fn bench_hollow_nodes_stops_on_sigterm(kit: &Kit, dir: &Path) {
    let root = dir.join("bench-hollow-sigterm");
    std::fs::create_dir_all(&root).unwrap();
    let bench = Command::new(BIN)
        .args(["bench", "hollow-nodes", "--nodes", "2", "--processes", "2"])
        .args([
            "--idle",
            "600s",
            "--timeout",
            "90s",
            "--mounter",
            "recording",
        ])
        .arg("--kubeconfig")
        .arg(kit.kubeconfig())
        .arg("--root")
        .arg(&root)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for node in ["bench-hollow-p1-1", "bench-hollow-p2-1"] {
        wait(&format!("{node} Ready"), WAIT, || node_ready(kit, node));
    }
    let pid = nix::unistd::Pid::from_raw(bench.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = bench.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    let nodes = kit.kubectl(&["get", "nodes", "-o", "name"]);
    assert!(!nodes.contains("bench-hollow"), "{nodes}");
}

#[test]
fn hollow_nodes_join_the_kits_api_server() {
    if let Some(why) = kit::missing() {
        println!("SKIPPED hollow-node test: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut kit = Kit::up_with(
        &kit::find().unwrap(),
        &dir.path().join("kit"),
        "containerd",
        &[("KIT_BOUND_TOKENS", "1")],
    );
    serve_pods_created_with_kubectl(&mut kit, dir.path());
    apply_the_examples(&kit, dir.path());
    super::node_credentials::node_credential_is_enough(&mut kit, dir.path());
    super::hollow_deployment::hollow_nodes_as_a_deployment(&mut kit);
    bench_hollow_nodes(&kit, dir.path());
    bench_pods_on_the_cluster(&kit, dir.path());
    bench_hollow_nodes_stops_on_sigterm(&kit, dir.path());
    drop(kit);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&dir.path().display().to_string()),
        "mounts left under {}",
        dir.path().display()
    );
}
