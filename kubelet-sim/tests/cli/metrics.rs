//! `kubelet-sim run --metrics-address`: a scrape while pods wait shows the kubelet's storage metrics with
//! upstream's names and labels, counting the operations and calls the run made.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::common::BIN;

/// One pod served by the local driver, one whose driver never registers: the run waits until its
/// `--timeout`, with one volume mounted and one failing.
const PODS: &str = r#"
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: local.inlet.dev}
spec: {volumeLifecycleModes: [Ephemeral]}
---
apiVersion: v1
kind: Pod
metadata: {name: served, namespace: default}
spec:
  containers: [{name: app, image: busybox}]
  volumes: [{name: data, csi: {driver: local.inlet.dev}}]
---
apiVersion: v1
kind: Pod
metadata: {name: waiting, namespace: default}
spec:
  containers: [{name: app, image: busybox}]
  volumes: [{name: data, csi: {driver: missing.inlet.dev}}]
"#;

fn scrape(address: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    Some(reply)
}

fn sample(scrape: &str, key: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn a_scrape_shows_the_kubelets_storage_metrics() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pods.yaml"), PODS).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");
    let mut child = Command::new(BIN)
        .args([
            "run",
            "--driver",
            "local.inlet.dev=local",
            "--mounter",
            "recording",
        ])
        .args(["--timeout", "20s", "--metrics-address", &address])
        .arg("--manifests")
        .arg(dir.path().join("pods.yaml"))
        .arg("--root")
        .arg(dir.path().join("root"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let csi = "csi_operations_seconds_count{driver_name=\"local.inlet.dev\",method_name=\"/csi.v1.Node/NodePublishVolume\",grpc_status_code=\"OK\",migrated=\"false\"}";
    let mount = |status: &str, driver: &str| {
        format!(
            "storage_operation_duration_seconds_count{{volume_plugin=\"kubernetes.io/csi:{driver}\",operation_name=\"volume_mount\",status=\"{status}\",migrated=\"false\"}}"
        )
    };
    let actual = "volume_manager_total_volumes{plugin_name=\"kubernetes.io/csi:local.inlet.dev\",state=\"actual_state_of_world\"}";
    let deadline = Instant::now() + Duration::from_secs(15);
    let body = loop {
        if let Some(body) = scrape(&address)
            && sample(&body, csi).is_some()
            && sample(&body, &mount("success", "local.inlet.dev")).is_some()
            && sample(&body, &mount("fail-unknown", "missing.inlet.dev")).is_some()
            && sample(&body, actual).is_some()
        {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no scrape showed the calls: {:?}",
            scrape(&address)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(sample(&body, csi), Some(1.0), "{body}");
    assert_eq!(
        sample(&body, &mount("success", "local.inlet.dev")),
        Some(1.0),
        "{body}"
    );
    let total = |driver: &str, state: &str| {
        sample(
            &body,
            &format!(
                "volume_manager_total_volumes{{plugin_name=\"kubernetes.io/csi:{driver}\",state=\"{state}\"}}"
            ),
        )
    };
    assert_eq!(
        total("local.inlet.dev", "desired_state_of_world"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        total("local.inlet.dev", "actual_state_of_world"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        total("missing.inlet.dev", "desired_state_of_world"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        total("missing.inlet.dev", "actual_state_of_world"),
        None,
        "{body}"
    );
    assert!(
        body.contains("# HELP storage_operation_duration_seconds Storage operation duration"),
        "{body}"
    );
    assert!(body.contains("process_resident_memory_bytes"), "{body}");
}

#[test]
fn a_metrics_port_in_use_ends_the_run_before_it_starts() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pods.yaml"), PODS).unwrap();
    let out = Command::new(BIN)
        .args([
            "run",
            "--mounter",
            "recording",
            "--metrics-address",
            &address,
        ])
        .arg("--manifests")
        .arg(dir.path().join("pods.yaml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr.contains(&format!(
            "--metrics-address {address}: cannot listen: Address already in use"
        )),
        "{stderr}"
    );
}
