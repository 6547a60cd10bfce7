//! Upstream's CSI conformance suite, csi-sanity (kubernetes-csi/csi-test v5.4.0), against the driver
//! binaries, as a driver author runs it. The local driver must pass every spec. The image driver is
//! node-only (no CONTROLLER_SERVICE): it is run as csi-test says node-only plugins are
//! (`-ginkgo.skip='\[Controller.Server\]'`, csi-test#208), and must pass the Identity specs. Its Node specs
//! cannot run on v5.4.0: their BeforeEach asks ControllerGetCapabilities for EXPAND_VOLUME without first
//! checking for CONTROLLER_SERVICE, and fails on the empty list a node-only plugin gives (csi-test#595, fixed
//! by csi-test#597 after v5.4.0). The test pins that down, so it speaks up when a fixed csi-sanity lands;
//! the image driver's node behaviour is covered by `image_driver.rs` and the kubelet-level scenarios. The binary comes from `$CSI_SANITY`, or is
//! unpacked from the kit's `bin/csi-sanity.xz` (`$INLET_KIT`, default `../shared/kit` beside the
//! workspace); without either the test says SKIPPED.
//!
//! Target and staging dirs lie inside `--kubelet-dir`: the driver refuses paths outside it (its
//! confinement), so csi-sanity's `--csi.mountdir` and `--csi.stagingdir` are given under that dir.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inlet_testkit::kit;

const BIN: &str = env!("CARGO_BIN_EXE_inlet-plugin");

/// csi-sanity, found or unpacked into `dir`; None when it is nowhere here.
fn csi_sanity(dir: &Path) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CSI_SANITY") {
        return Some(PathBuf::from(path));
    }
    kit::unpack("csi-sanity", dir)
}

/// Stops the driver when the test ends, however it ends.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        kit::terminate(&mut self.0);
    }
}

fn wait_for(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the driver did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs csi-sanity against `socket` with its mount and staging dirs under `kubelet`; (passed, report).
fn run_sanity(sanity: &Path, socket: &Path, kubelet: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(sanity)
        .arg(format!("--csi.endpoint={}", socket.display()))
        .arg(format!(
            "--csi.mountdir={}",
            kubelet.join("target").display()
        ))
        .arg(format!(
            "--csi.stagingdir={}",
            kubelet.join("staging").display()
        ))
        .arg("--ginkgo.no-color")
        .args(extra)
        .output()
        .expect("csi-sanity runs");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = report
        .lines()
        .filter(|l| l.contains("Passed") || l.contains("[FAIL]") || l.starts_with("Ran "))
        .collect::<Vec<_>>()
        .join("\n");
    println!("csi-sanity: {summary}");
    (out.status.success(), report)
}

/// Starts `inlet-plugin serve` with `args`, its socket, state and kubelet dirs under `dir`.
fn serve(dir: &Path, args: &[&str]) -> (Driver, PathBuf, PathBuf) {
    let kubelet = dir.join("kubelet");
    std::fs::create_dir_all(&kubelet).expect("kubelet dir");
    let socket = dir.join("csi.sock");
    let driver = Driver(
        Command::new(BIN)
            .arg("serve")
            .args(args)
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .args(["--node-id", "node-1"])
            .arg(format!("--state-dir={}", dir.join("state").display()))
            .arg(format!("--kubelet-dir={}", kubelet.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the driver starts"),
    );
    wait_for(&socket);
    (driver, socket, kubelet)
}

#[test]
fn local_driver_passes_csi_sanity() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(sanity) = csi_sanity(dir.path()) else {
        eprintln!("SKIPPED csi-sanity: set CSI_SANITY or provide the kit's bin/csi-sanity.xz");
        return;
    };
    let (_driver, socket, kubelet) = serve(
        dir.path(),
        &[
            "--driver",
            "local",
            "--name",
            "local.inlet.dev",
            "--enable-attach",
            "--capacity",
            "1Ti",
        ],
    );
    let (passed, report) = run_sanity(&sanity, &socket, &kubelet, &[]);
    assert!(passed, "csi-sanity failed:\n{report}");
}

#[test]
fn image_driver_passes_csi_sanity_as_a_node_only_plugin() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(sanity) = csi_sanity(dir.path()) else {
        eprintln!("SKIPPED csi-sanity: set CSI_SANITY or provide the kit's bin/csi-sanity.xz");
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let cri_socket = dir.path().join("cri.sock");
    let fake = std::sync::Arc::new(
        cri_fake::FakeRuntime::new(dir.path().join("cri"), Default::default()).expect("cri-fake"),
    );
    let serving = cri_socket.clone();
    runtime.spawn(async move { cri_fake::serve(&serving, fake, std::future::pending()).await });
    wait_for(&cri_socket);
    let runtime_endpoint = format!("unix://{}", cri_socket.display());
    let (_driver, socket, kubelet) = serve(
        dir.path(),
        &[
            "--driver",
            "image",
            "--name",
            "image.inlet.dev",
            "--runtime-endpoint",
            &runtime_endpoint,
        ],
    );
    let node_only = ["--ginkgo.skip=\\[Controller.Server\\]"];
    let (passed, report) = run_sanity(
        &sanity,
        &socket,
        &kubelet,
        &[node_only[0], "--ginkgo.focus=Identity Service"],
    );
    assert!(passed, "csi-sanity's Identity specs failed:\n{report}");
    // The Node specs meet csi-test#595 in their BeforeEach, and nothing else.
    let (passed, report) = run_sanity(
        &sanity,
        &socket,
        &kubelet,
        &[node_only[0], "--ginkgo.focus=Node Service"],
    );
    let bug = "<[]*csi.ControllerServiceCapability | len:0, cap:0>: nil";
    let failed_in_before_each = report.matches("[FAILED] in [BeforeEach]").count();
    let failed = report.matches("• [FAILED]").count();
    assert!(
        !passed
            && failed > 0
            && failed == failed_in_before_each
            && report.matches(bug).count() >= failed,
        "csi-sanity's Node specs no longer fail only on csi-test#595: run them for real now\n{report}"
    );
}
