//! `inlet-plugin serve --metrics-address`: the families a scrape returns after known calls, `/healthz`,
//! and the start-up errors an operator reads in `kubectl logs` (a port in use, a host path that is not there).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inlet_proto::csi::v1::{
    self as csi, NodePublishVolumeRequest, NodeUnpublishVolumeRequest, node_client::NodeClient,
};

const BIN: &str = env!("CARGO_BIN_EXE_inlet-plugin");

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port free now (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The local driver on `dir`, serving metrics at `metrics`, with `set` replacing flags' values.
fn local_driver(dir: &Path, metrics: &str, set: &[(&str, String)]) -> Command {
    std::fs::create_dir_all(dir.join("kubelet")).unwrap();
    let mut flags = vec![
        (
            "--endpoint",
            format!("unix://{}", dir.join("csi.sock").display()),
        ),
        ("--state-dir", dir.join("state").display().to_string()),
        ("--kubelet-dir", dir.join("kubelet").display().to_string()),
        ("--metrics-address", metrics.to_string()),
    ];
    for (flag, value) in set {
        match flags.iter_mut().find(|(f, _)| f == flag) {
            Some(slot) => slot.1 = value.clone(),
            None => flags.push((flag, value.clone())),
        }
    }
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--driver", "local", "--name", "local.inlet.dev"])
        .args(["--node-id", "n1", "--mounter", "recording", "--ephemeral"])
        .args(flags.iter().map(|(flag, value)| format!("{flag}={value}")))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// `GET /metrics`, over a plain socket: status line and body.
fn scrape(address: &str) -> (String, String) {
    get(address, "/metrics")
}

/// `GET path`, over a plain socket: head and body.
fn get(address: &str, path: &str) -> (String, String) {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    (head.to_string(), body.to_string())
}

/// Waits (10 s at most) for the driver's socket to appear.
fn wait_for_socket(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the driver never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each sample of a scrape, by its name and labels as written.
fn samples(body: &str) -> HashMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn publish_request(dir: &Path, target: &str) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: "csi-0a1b".into(),
        target_path: dir.join("kubelet").join(target).display().to_string(),
        volume_capability: Some(csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        }),
        volume_context: [(
            "csi.storage.k8s.io/ephemeral".to_string(),
            "true".to_string(),
        )]
        .into(),
        secrets: [("password".to_string(), "hunter2-secret".to_string())].into(),
        ..Default::default()
    }
}

#[test]
fn a_scrape_counts_the_calls_made_and_the_volumes_published() {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let _driver = Driver(local_driver(dir.path(), &address, &[]).spawn().unwrap());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut node = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(channel) = inlet_proto::uds::connect(&dir.path().join("csi.sock")).await {
                return NodeClient::new(channel);
            }
            assert!(Instant::now() < deadline, "the driver never listened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    runtime.block_on(async {
        node.node_publish_volume(publish_request(dir.path(), "pod/a"))
            .await
            .unwrap();
        // Twice the same: idempotent, OK again. Then one the driver refuses (no capability).
        node.node_publish_volume(publish_request(dir.path(), "pod/a"))
            .await
            .unwrap();
        let mut bad = publish_request(dir.path(), "pod/b");
        bad.volume_capability = None;
        let refused = node.node_publish_volume(bad).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    });
    let (head, body) = scrape(&address);
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(head.contains("application/openmetrics-text"), "{head}");
    let got = samples(&body);
    let calls = |method: &str, code: &str| {
        got.get(&format!(
            "csi_operations_seconds_count{{driver_name=\"local.inlet.dev\",method_name=\"/csi.v1.Node/{method}\",grpc_status_code=\"{code}\"}}"
        ))
        .copied()
    };
    assert_eq!(calls("NodePublishVolume", "OK"), Some(2.0), "{body}");
    assert_eq!(
        calls("NodePublishVolume", "InvalidArgument"),
        Some(1.0),
        "{body}"
    );
    let published = |mode: &str| {
        got.get(&format!(
            "inlet_volumes_published{{driver_name=\"local.inlet.dev\",mode=\"{mode}\"}}"
        ))
        .copied()
    };
    assert_eq!(published("ephemeral"), Some(1.0), "{body}");
    assert_eq!(published("persistent"), Some(0.0), "{body}");
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(got.contains_key(process), "{process} missing: {body}");
    }
    assert!(body.contains("# HELP csi_operations_seconds Container Storage Interface operation duration with gRPC error code status total"), "{body}");
    assert!(!body.contains("hunter2"), "a secret reached the metrics");

    runtime.block_on(async {
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: "csi-0a1b".into(),
            target_path: dir.path().join("kubelet/pod/a").display().to_string(),
        })
        .await
        .unwrap();
    });
    let got = samples(&scrape(&address).1);
    assert_eq!(
        got.get("inlet_volumes_published{driver_name=\"local.inlet.dev\",mode=\"ephemeral\"}"),
        Some(&0.0)
    );
    assert_eq!(
        got.get("csi_operations_seconds_count{driver_name=\"local.inlet.dev\",method_name=\"/csi.v1.Node/NodeUnpublishVolume\",grpc_status_code=\"OK\"}"),
        Some(&1.0)
    );
    // Anything but /metrics is not served.
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    stream.write_all(b"GET /debug HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(reply.contains(" 404 "), "{reply}");
}

/// `/healthz`, the DaemonSets' liveness probe: `ok` while the driver answers Probe through its socket; 500
/// naming the socket when that socket is gone (a driver the kubelet cannot reach is not alive), within
/// `--probe-timeout`; `ok` again once it is back. Other paths are 404.
#[test]
fn healthz_answers_for_the_driver_behind_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let set = [("--probe-timeout", "500ms".to_string())];
    let _driver = Driver(local_driver(dir.path(), &address, &set).spawn().unwrap());
    let socket = dir.path().join("csi.sock");
    wait_for_socket(&socket);
    let (head, body) = get(&address, "/healthz");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}: {body}");
    assert_eq!(body, "ok");

    let moved = dir.path().join("moved.sock");
    std::fs::rename(&socket, &moved).unwrap();
    let started = Instant::now();
    let (head, body) = get(&address, "/healthz");
    assert!(head.starts_with("HTTP/1.0 500"), "{head}: {body}");
    assert!(body.contains(&socket.display().to_string()), "{body}");
    assert!(started.elapsed() < Duration::from_secs(5));

    std::fs::rename(&moved, &socket).unwrap();
    let (head, body) = get(&address, "/healthz");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}: {body}");
    let (head, _) = get(&address, "/readyz");
    assert!(head.starts_with("HTTP/1.0 404"), "{head}");
}

/// Clients holding every connection slot (16, idle) do not fail the liveness probe: `/healthz` is answered
/// on a slot kept for it, where anything else is 503; once they are gone, scrapes work again.
#[test]
fn healthz_answers_while_idle_clients_hold_every_slot() {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let _driver = Driver(local_driver(dir.path(), &address, &[]).spawn().unwrap());
    wait_for_socket(&dir.path().join("csi.sock"));
    let idle: Vec<_> = (0..16)
        .map(|_| std::net::TcpStream::connect(&address).unwrap())
        .collect();
    // The server takes each connection in turn: let it reach the 16th.
    std::thread::sleep(Duration::from_millis(200));
    let (head, body) = get(&address, "/healthz");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}: {body}");
    let (head, _) = get(&address, "/metrics");
    assert!(head.starts_with("HTTP/1.0 503"), "{head}");
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));
    let (head, _) = scrape(&address);
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
}

#[test]
fn a_metrics_port_in_use_stops_the_start_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let out = local_driver(dir.path(), &address, &[])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!(
            "inlet-plugin: --metrics-address {address}: cannot listen: Address already in use"
        )),
        "{stderr}"
    );
    assert!(!dir.path().join("csi.sock").exists(), "nothing was served");
    let out = local_driver(dir.path(), "no-port", &[])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--metrics-address \"no-port\": not HOST:PORT")
    );
}

#[test]
fn a_missing_host_path_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let port = free_port();
    let cases: [(&str, String, &str); 3] = [
        (
            "--kubelet-dir",
            format!("{d}/nowhere"),
            "No such file or directory (os error 2); expected the kubelet's root dir, mounted at its host path",
        ),
        (
            "--registration-dir",
            format!("{d}/nowhere"),
            "No such file or directory (os error 2); expected the kubelet's plugins_registry dir",
        ),
        ("--state-dir", format!("{d}/file/state"), "cannot create it"),
    ];
    std::fs::write(dir.path().join("file"), "").unwrap();
    for (flag, path, expected) in cases {
        let set = [(flag, path.clone())];
        let out = local_driver(dir.path(), &format!("127.0.0.1:{port}"), &set)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.starts_with(&format!("inlet-plugin: {flag} {path}: "))
                && stderr.contains(expected),
            "{flag}: {stderr}"
        );
    }
}
