//! `kubelet-sim conform --kubeconfig` on the kit's real kubelet, in the differential test's kit (one kit
//! start for both): inlet's local driver, registered by conform itself, passes a subset of the checks as
//! real pods, the checks that need the simulation or a newer kubelet are skipped with their reasons, and
//! nothing is left on the node: no pod, no registration socket, no mount or directory of a check's pods.
//! conform.md's side-by-side table has the whole suite's figures.

use std::path::Path;
use std::process::Command;

use inlet_testkit::kit::Kit;

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-sim");
const DRIVER: &str = "local.inlet.dev";
const RESTART: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/cluster/kit-restart-kubelet.sh"
);

/// The checks that must pass (a few, each about 10 to 20 s on a real kubelet): a lifecycle, the kubelet's
/// retry after a lost answer (the proxy's injected deadline), a restart of the kubelet
/// (`kit-restart-kubelet.sh`), a Secret looked up in the pod's namespace only, and pod info changed on
/// the live CSIDriver.
const PASS: [&str; 5] = [
    "ephemeral/lifecycle",
    "idempotency/publish-retried-after-deadline",
    "restart/kubelet",
    "secrets/only-when-referenced",
    "pod-info/disabled-later",
];
/// The checks that must be skipped on this node, and a word of the reason.
const SKIP: [(&str, &str); 3] = [
    (
        "regression/127229-deleted-while-kubelet-down",
        "on a real node",
    ),
    ("persistent/stage-publish", "simulated control plane"),
    ("tokens/audiences", "predates CSIServiceAccountToken"),
];

/// Runs the checks against the driver serving on `socket` (which must not be registered by anyone else).
pub fn on_the_kit(kit: &Kit, socket: &Path, dir: &Path) {
    let report = dir.join("conform-kit.json");
    let mut command = Command::new(BIN);
    command
        .arg("conform")
        .arg("--driver")
        .arg(format!("{DRIVER}=unix://{}", socket.display()))
        .arg("--kubeconfig")
        .arg(kit.kubeconfig())
        .arg("--kubelet-dir")
        .arg(kit.kubelet_dir())
        .args(["--pod-image", "localhost/kit/busybox:1.35"])
        .arg("--kubelet-restart-command")
        .arg(format!("sh {RESTART}"))
        .env("KIT_RUN", &kit.run)
        .arg("--report")
        .arg(&report);
    for id in PASS.iter().chain(SKIP.iter().map(|(id, _)| id)) {
        command.args(["--only", id]);
    }
    let out = command.output().expect("kubelet-sim conform runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("the report")).expect("JSON");
    let check = |id: &str| {
        json["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} is in the report: {stdout}"))
            .clone()
    };
    for id in PASS {
        assert_eq!(check(id)["result"], "pass", "{id}: {stdout}");
    }
    for (id, why) in SKIP {
        let check = check(id);
        assert_eq!(check["result"], "skip", "{id}: {stdout}");
        let reason = check["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(why), "{id} skipped for {reason:?}");
    }
    let pods = kit.kubectl(&["get", "pods", "-n", "conform", "-o", "name"]);
    assert_eq!(pods.trim(), "", "conform's pods are gone");
    let registration = kit.plugins_registry().join(format!("{DRIVER}-reg.sock"));
    assert!(!registration.exists(), "conform deregistered the driver");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let pods_dir = kit.kubelet_dir().join("pods");
    let left: Vec<&str> = mounts
        .lines()
        .filter(|l| l.contains(&*pods_dir.to_string_lossy()) && l.contains("kubernetes.io~csi"))
        .collect();
    assert!(
        left.is_empty(),
        "CSI mounts left under the kubelet: {left:?}"
    );
}
