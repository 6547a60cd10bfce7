//! kubelet-sim on the kit's real runtimes: CRI-O 1.32, containerd 1.6 and containerd 2.1, each started
//! alone (`KIT_RUNTIME_ONLY=1`: no kubelet to fight over the pods). The lifecycle pods of the differential
//! test and the examples' filesystem pods (their image swapped for the kit's preloaded busybox) must each
//! reach their phase through `kubelet-sim run --cri`, and teardown must leave nothing. This is what a
//! sandbox or container config no kubelet would send breaks: a pod-wide PID namespace made CRI-O keep an
//! infra process this host cannot start, and a missing container log dir failed every CreateContainer.
//! The examples' image volumes are not run here: the example image is not in the runtimes' stores.

use std::path::Path;
use std::process::Command;

use inlet_testkit::kit::{self, Kit};

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-sim");
/// The kit's preloaded busybox, for the examples' `busybox:1.36`.
const KIT_BUSYBOX: &str = "localhost/kit/busybox:1.35";
/// Each lifecycle pod's phase once it settled, as the kit's kubelet shows it.
const LIFECYCLE_PHASES: [(&str, &str); 8] = [
    ("init-ok", "Succeeded"),
    ("init-fails", "Failed"),
    ("init-retries", "Pending"),
    ("crash-loop", "Running"),
    ("completes", "Succeeded"),
    ("fails", "Failed"),
    ("env-from-secret", "Succeeded"),
    ("env-missing-secret", "Pending"),
];
const EXAMPLES: [&str; 5] = [
    "00-drivers",
    "10-ephemeral",
    "20-secret-ref",
    "30-pv-pvc",
    "40-persistent-inline",
];

/// The lifecycle manifests with each pod's expected phase, so the run ends once they settled.
fn lifecycle_manifests(dir: &Path) {
    let mut yaml = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/differential/lifecycle.yaml"),
    )
    .expect("lifecycle.yaml");
    for (pod, phase) in LIFECYCLE_PHASES {
        let plain = format!("metadata: {{name: {pod}}}");
        assert!(yaml.contains(&plain), "lifecycle.yaml has pod {pod}");
        yaml = yaml.replace(
            &plain,
            &format!(
                "metadata: {{name: {pod}, annotations: {{inlet.dev/expected-phase: {phase}}}}}"
            ),
        );
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("lifecycle.yaml"), yaml).unwrap();
}

fn example_manifests(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    for name in EXAMPLES {
        let yaml = std::fs::read_to_string(examples.join(format!("{name}.yaml"))).unwrap();
        std::fs::write(
            dir.join(format!("{name}.yaml")),
            yaml.replace("busybox:1.36", KIT_BUSYBOX),
        )
        .unwrap();
    }
}

/// `kubelet-sim run` of `manifests` on the runtime at `endpoint`; its report.
fn run(endpoint: &str, manifests: &Path, root: &Path, drivers: &[&str]) -> serde_json::Value {
    let report = root.with_extension("json");
    let mut command = Command::new(BIN);
    command
        .args(["run", "--manifests"])
        .arg(manifests)
        .args([
            "--cri",
            endpoint,
            "--teardown",
            "--timeout",
            "90s",
            "--root",
        ])
        .arg(root)
        .arg("--report")
        .arg(&report);
    for driver in drivers {
        command.args(["--driver", driver]);
    }
    let out = command.output().expect("kubelet-sim runs");
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    assert!(
        out.status.success(),
        "kubelet-sim run on {endpoint} failed:\n{}\n{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).expect("the report is JSON")
}

/// Every pod reached its phase and teardown left nothing; the lifecycle pods' failures are the
/// commands' own (exit codes 2 and 3), not the runtime's.
fn check(runtime: &str, report: &serde_json::Value) {
    let pods = report["pods"].as_array().expect("pods");
    assert!(!pods.is_empty(), "{runtime}: no pods in {report:#}");
    for pod in pods {
        assert_eq!(
            pod["phase"], pod["expected_phase"],
            "{runtime}: pod {} {pod:#}",
            pod["name"]
        );
    }
    let teardown = &report["teardown"];
    for field in [
        "leftover_mounts",
        "leftover_pod_dirs",
        "leftover_attachments",
    ] {
        assert_eq!(
            teardown[field].as_array().map(Vec::len),
            Some(0),
            "{runtime}: {field} {teardown:#}"
        );
    }
}

#[test]
fn the_examples_and_lifecycle_pods_run_on_cri_o_containerd_1_6_and_containerd_2() {
    if let Some(why) = kit::missing() {
        eprintln!("SKIPPED kubelet-sim on the kit's runtimes: {why}");
        return;
    }
    let kit_dir = kit::find().expect("the kit");
    let dir = tempfile::tempdir().expect("temp dir");
    lifecycle_manifests(&dir.path().join("lifecycle"));
    example_manifests(&dir.path().join("examples"));
    for runtime in ["crio", "containerd", "containerd2"] {
        let kit = Kit::up_runtime_only(
            &kit_dir,
            &dir.path().join(format!("kit-{runtime}")),
            runtime,
        );
        let endpoint = kit.cri_endpoint();
        let lifecycle = run(
            &endpoint,
            &dir.path().join("lifecycle"),
            &dir.path().join(format!("{runtime}-lifecycle")),
            &[],
        );
        check(runtime, &lifecycle);
        let pods = lifecycle["pods"].as_array().unwrap();
        let fails = pods.iter().find(|p| p["name"] == "fails").unwrap();
        assert_eq!(
            fails["containers"][0]["exit_code"], 3,
            "{runtime}: the command's own exit code: {fails:#}"
        );
        let examples = run(
            &endpoint,
            &dir.path().join("examples"),
            &dir.path().join(format!("{runtime}-examples")),
            &["local.inlet.dev=local"],
        );
        check(runtime, &examples);
        drop(kit);
    }
}
