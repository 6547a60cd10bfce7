//! Kill `kubelet-sim run` (SIGKILL, at each of [`inlet_host::crash::KUBELET_POINTS`]: between writing
//! vol_data.json and NodePublishVolume, after NodePublishVolume, after NodeUnpublishVolume, between the
//! sandbox and the containers), then run it again on the same root, as a kubelet restarts:
//! - with the pod still wanted: it is reconstructed, runs, and a teardown leaves nothing;
//! - with the pod deleted meanwhile: its volume is reconstructed and torn down, and nothing is left.
//!
//! The in-process local driver and cri-fake die with it, as they would with their node. Needs root (real
//! mounts survive the process; the recording mounter's do not); otherwise SKIPPED.

use std::path::Path;
use std::process::Command;

use inlet_host::crash;
use inlet_host::mount::{LinuxMounter, MountLayer, can_mount};

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-sim");

const DRIVER: &str = "apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: local.inlet.dev}
spec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Ephemeral]}
";

const POD: &str = "---
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, csi: {driver: local.inlet.dev}}]
";

/// Runs kubelet-sim on `root` with `manifests`; (exit code, or None when a signal killed it; stdout).
fn run(
    root: &Path,
    manifests: &str,
    crash_at: Option<&str>,
    teardown: bool,
) -> (Option<i32>, String) {
    let file = root.with_extension("yaml");
    std::fs::write(&file, manifests).unwrap();
    let mut command = Command::new(BIN);
    command
        .args([
            "run",
            "--driver",
            "local.inlet.dev=local",
            "--timeout",
            "30s",
            "--manifests",
        ])
        .arg(&file)
        .arg("--root")
        .arg(root)
        .env_remove(crash::ENV);
    if teardown {
        command.arg("--teardown");
    }
    if let Some(point) = crash_at {
        // The teardown points are only reached by a teardown.
        command.env(crash::ENV, point).arg("--teardown");
    }
    let out = command.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Mount points under `dir`, and ephemeral volume content the local driver still holds.
fn leftovers(dir: &Path) -> Vec<String> {
    let mut left = Vec::new();
    for entry in walkdir::WalkDir::new(dir).into_iter().flatten() {
        if LinuxMounter.is_mount_point(entry.path()).unwrap_or(false) {
            left.push(format!("mounted: {}", entry.path().display()));
        }
    }
    let volumes = dir.join("node-1/plugins/local.inlet.dev/state/volumes");
    for entry in std::fs::read_dir(volumes).into_iter().flatten().flatten() {
        left.push(format!("volume content: {}", entry.path().display()));
    }
    left
}

#[test]
fn kubelet_sim_killed_at_any_crash_point_recovers_on_restart() {
    if !can_mount() {
        eprintln!("SKIPPED kubelet crash points: needs root for real mounts");
        return;
    }
    for point in crash::KUBELET_POINTS {
        for pod_still_wanted in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("root");
            let (code, stdout) = run(&root, &format!("{DRIVER}{POD}"), Some(point), false);
            assert_eq!(
                code, None,
                "{point}: kubelet-sim was not killed there:\n{stdout}"
            );
            let manifests = match pod_still_wanted {
                true => format!("{DRIVER}{POD}"),
                false => DRIVER.to_string(),
            };
            let (code, stdout) = run(&root, &manifests, None, true);
            assert_eq!(
                code,
                Some(0),
                "{point}, pod wanted {pod_still_wanted}:\n{stdout}"
            );
            assert!(
                stdout.contains("teardown: every pod deleted"),
                "{point}:\n{stdout}"
            );
            let left = leftovers(&root);
            assert!(
                left.is_empty(),
                "{point}, pod wanted {pod_still_wanted}: {left:#?}"
            );
        }
    }
}
