//! Hollow nodes as good citizens of a current cluster, on the kit's API server with bound service-account
//! tokens (`KIT_BOUND_TOKENS=1`, a 1.21+ cluster's projected `kube-api-access-*` volume in every pod):
//!
//! - the token a hollow node wrote for a pod created with kubectl authenticates to that API server as the
//!   pod's service account;
//! - a hollow node with a node's own credential (`system:node:<name>` in `system:nodes`, minted with the
//!   kit's CA as the kit mints its kubelet's) runs a pod with an inline CSI volume, a secret reference and
//!   its token volume, and the Node authorizer and NodeRestriction forbid none of its requests
//!   (each `rest_client_requests_total{code="403"}` is a request the Node authorizer refused for a
//!   moment because its graph had not seen the pod yet, reported with upstream's text in the node's log
//!   or on the pod);
//! - a second process claiming the same node refuses with a clear error.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use inlet_testkit::kit::{Kit, wait};

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-sim");
const WAIT: Duration = Duration::from_secs(90);

/// The first service-account token file under `root` (a pod's `kube-api-access-*/token`).
pub fn token_under(root: &Path) -> Option<PathBuf> {
    walkdir::WalkDir::new(root)
        .into_iter()
        .flatten()
        .map(|e| e.into_path())
        .find(|p| {
            p.file_name().is_some_and(|n| n == "token")
                && p.to_string_lossy()
                    .contains("kubernetes.io~projected/kube-api-access-")
        })
}

/// Who the API server says the bearer of `token` is: kubectl's answer to a request the account may not
/// make names the user.
pub fn identify(kit: &Kit, token: &str) -> String {
    let out = Command::new(kit.bin("kubectl"))
        .args([
            "--kubeconfig",
            "/dev/null",
            "--server",
            "https://127.0.0.1:16443",
        ])
        .arg("--certificate-authority")
        .arg(kit.run.join("run/pki/ca.crt"))
        .args(["--token", token, "get", "nodes"])
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn scrape(address: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).expect("the metrics endpoint");
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

const POD: &str = r#"apiVersion: v1
kind: Secret
metadata: {name: node-used}
stringData: {token: s3cr3t-node}
---
apiVersion: v1
kind: Pod
metadata: {name: credentialed}
spec:
  nodeName: cred-node-1
  containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, csi: {driver: local.inlet.dev, volumeAttributes: {size: 8Mi}, nodePublishSecretRef: {name: node-used}}}]
"#;

/// A hollow node with a node's credential: nothing forbidden, and one node name held by one process.
pub fn node_credential_is_enough(kit: &mut Kit, dir: &Path) {
    let kubeconfig = kit.node_kubeconfig(dir, "cred-node-1");
    let root = dir.join("cred-root");
    let metrics = "127.0.0.1:19471";
    let node_args = |root: &Path| {
        let mut command = Command::new(BIN);
        command
            .args(["run", "--nodes", "1", "--node-name-prefix", "cred-node"])
            .args(["--driver", "local.inlet.dev=local"])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--root")
            .arg(root);
        command
    };
    let sim = kit.start(
        "kubelet-sim-node",
        node_args(&root).args(["--metrics-address", metrics]),
    );
    wait("cred-node-1 Ready", WAIT, || {
        let out = kit.try_kubectl(&["get", "node", "cred-node-1", "-o", "name"]);
        out.status.success()
    });
    kit.apply("credentialed", POD);
    wait("credentialed Running", WAIT, || {
        kit.phase("credentialed") == "Running"
    });
    let token = std::fs::read_to_string(token_under(&root).expect("a token volume")).unwrap();
    let who = identify(kit, &token);
    assert!(
        who.contains("system:serviceaccount:default:default"),
        "{who}"
    );

    // A second process claiming the node refuses.
    let out = node_args(&dir.join("other-root")).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("node cred-node-1 is held by another kubelet-sim"),
        "{stderr}"
    );

    // What the node reported on the pod (a refused TokenRequest fails the mount: a FailedMount event),
    // read before the pod and its events go.
    let events = kit.kubectl(&[
        "get",
        "events",
        "--field-selector=involvedObject.name=credentialed",
        "-o",
        "jsonpath={range .items[*]}{.count} {.message}{\"\\n\"}{end}",
    ]);
    kit.kubectl(&[
        "delete",
        "pod",
        "credentialed",
        "--wait=true",
        "--timeout=90s",
    ]);
    let scraped = scrape(metrics);
    let forbidden: f64 = scraped
        .lines()
        .filter(|l| l.starts_with("rest_client_requests_total{") && l.contains("code=\"403\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        scraped.contains("rest_client_requests_total{code=\"201\""),
        "{scraped}"
    );
    assert!(kit.stop(sim).success(), "{}", kit.log("kubelet-sim-node"));
    let log = kit.log("kubelet-sim-node");
    // The Node authorizer learns of a pod from its own watch, so a read of what a new pod refers to can
    // come before its graph has the edge, and is refused for a moment with "no relationship found between
    // node" (plugin/pkg/auth/authorizer/node/node_authorizer.go; "expected until the graph the node
    // authorizer uses observes the creation", kubernetes/kubernetes#49880, also #128910). A kubelet logs
    // it and reads again, as the node does. Any other refusal is a request a node may not make.
    // Refusals show in the node's log (a read) or on the pod (a mount that failed on one).
    let graph_lag = |l: &&str| l.contains("no relationship found between node");
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("forbidden")).collect();
    assert!(refusals.iter().all(graph_lag), "forbidden: {refusals:#?}");
    let on_the_pod: Vec<&str> = events.lines().filter(|l| l.contains("forbidden")).collect();
    assert!(
        on_the_pod.iter().all(graph_lag),
        "forbidden: {on_the_pod:#?}"
    );
    let reported: f64 = on_the_pod
        .iter()
        .map(|l| {
            l.split(' ')
                .next()
                .and_then(|c| c.parse::<f64>().ok())
                .unwrap_or(1.0)
        })
        .sum::<f64>()
        + refusals.len() as f64;
    assert!(
        forbidden <= reported,
        "{forbidden} requests forbidden, {reported} reported: {scraped}\n{events}"
    );
    assert!(!log.contains(token.trim()), "the token was logged");
}
