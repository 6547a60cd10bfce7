//! Upstream's CSI conformance suite, csi-sanity (kubernetes-csi/csi-test v5.4.0), against the local driver
//! binary, as a driver author runs it: every spec must pass. The binary comes from `$CSI_SANITY`, or is
//! unpacked from the kit's `bin/csi-sanity.xz` (`$INLET_KIT`, default `../shared/kit` beside the
//! workspace); without either the test says SKIPPED.
//!
//! Target and staging dirs lie inside `--kubelet-dir`: the driver refuses paths outside it (its
//! confinement), so csi-sanity's `--csi.mountdir` and `--csi.stagingdir` are given under that dir.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_inlet-plugin");

/// csi-sanity, found or unpacked into `dir`; None when it is nowhere here.
fn csi_sanity(dir: &Path) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CSI_SANITY") {
        return Some(PathBuf::from(path));
    }
    let kit = std::env::var_os("INLET_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/kit"));
    let packed = kit.join("bin/csi-sanity.xz");
    if !packed.exists() {
        return None;
    }
    let binary = dir.join("csi-sanity");
    let unpacked = Command::new("sh")
        .arg("-c")
        .arg(r#"xz -dc "$1" > "$2" && chmod +x "$2""#)
        .args([
            "sh",
            &packed.display().to_string(),
            &binary.display().to_string(),
        ])
        .status()
        .ok()?;
    unpacked.success().then_some(binary)
}

/// Stops the driver when the test ends, however it ends.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the driver did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn local_driver_passes_csi_sanity() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(sanity) = csi_sanity(dir.path()) else {
        eprintln!("SKIPPED csi-sanity: set CSI_SANITY or provide the kit's bin/csi-sanity.xz");
        return;
    };
    let kubelet = dir.path().join("kubelet");
    std::fs::create_dir_all(&kubelet).expect("kubelet dir");
    let socket = dir.path().join("csi.sock");
    let _driver = Driver(
        Command::new(BIN)
            .args(["serve", "--driver", "local", "--name", "local.inlet.dev"])
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .args([
                "--node-id",
                "node-1",
                "--enable-attach",
                "--capacity",
                "1Ti",
            ])
            .arg(format!(
                "--state-dir={}",
                dir.path().join("state").display()
            ))
            .arg(format!("--kubelet-dir={}", kubelet.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the driver starts"),
    );
    wait_for(&socket);
    let out = Command::new(&sanity)
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
        .output()
        .expect("csi-sanity runs");
    let report = String::from_utf8_lossy(&out.stdout);
    let summary = report
        .lines()
        .filter(|l| l.contains("Passed") || l.contains("[FAIL]") || l.starts_with("Ran "))
        .collect::<Vec<_>>()
        .join("\n");
    println!("csi-sanity: {summary}");
    assert!(out.status.success(), "csi-sanity failed:\n{report}");
}
