//! gRPC clients other than Go's and tonic: Python's grpcio (Debian's `python3-grpcio`, which `.ci/run`
//! installs) sends the socket's path as the HTTP/2 `:authority` on unix sockets, which h2 alone would reset
//! with PROTOCOL_ERROR. The driver must answer it (issue #9, item 6; kubelets before 1.26 do the same).
//! Without `/usr/bin/python3` and grpcio the test says SKIPPED.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inlet_testkit::kit;

const BIN: &str = env!("CARGO_BIN_EXE_inlet-plugin");
const PYTHON: &str = "/usr/bin/python3";

/// Calls GetPluginInfo with grpcio over `unix://SOCKET`, twice: with the authority this grpcio sends by
/// itself (Debian's 1.51 sends `localhost`), and with the socket's path as the authority, as newer grpcio
/// releases and kubelets before 1.26 send it. Prints both raw replies.
const CLIENT: &str = r#"
import sys, grpc
for options in ([], [("grpc.default_authority", sys.argv[1])]):
    channel = grpc.insecure_channel("unix://" + sys.argv[1], options=options)
    call = channel.unary_unary(
        "/csi.v1.Identity/GetPluginInfo",
        request_serializer=lambda _: b"",
        response_deserializer=lambda raw: raw,
    )
    sys.stdout.write(repr(call(None, timeout=10)) + "\n")
"#;

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        kit::terminate(&mut self.0);
    }
}

fn grpcio_installed() -> bool {
    Command::new(PYTHON)
        .args(["-c", "import grpc"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn wait_for(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the driver did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn pythons_grpcio_is_answered_on_a_unix_socket() {
    if !grpcio_installed() {
        eprintln!(
            "SKIPPED grpcio client: {PYTHON} with grpcio (Debian's python3-grpcio) is not installed"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    std::fs::create_dir_all(dir.path().join("kubelet")).unwrap();
    let _driver = Driver(
        Command::new(BIN)
            .args([
                "serve",
                "--driver",
                "local",
                "--name",
                "local.inlet.dev",
                "--node-id",
                "n1",
            ])
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!(
                "--state-dir={}",
                dir.path().join("state").display()
            ))
            .arg(format!(
                "--kubelet-dir={}",
                dir.path().join("kubelet").display()
            ))
            .args(["--mounter", "recording"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&socket);
    let out = Command::new(PYTHON)
        .args(["-c", CLIENT])
        .arg(&socket)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "grpcio failed: {stderr}");
    assert_eq!(stdout.matches("local.inlet.dev").count(), 2, "{stdout}");
}
