//! kubelet-sim on the kit's real runtimes: CRI-O 1.32, containerd 1.6 and containerd 2.1, each started
//! alone (`KIT_RUNTIME_ONLY=1`: no kubelet to fight over the pods). The lifecycle pods of the differential
//! test and the examples' filesystem pods (their image swapped for the kit's preloaded busybox) must each
//! reach their phase through `kubelet-sim run --cri`, and teardown must leave nothing. This is what a
//! sandbox or container config no kubelet would send breaks: a pod-wide PID namespace made CRI-O keep an
//! infra process this host cannot start, and a missing container log dir failed every CreateContainer.
//! The examples' image volumes are not run here: the example image is not in the runtimes' stores. An
//! image volume of the kit's busybox is, through both paths where the runtime has KEP-4639's image mounts
//! (CRI-O 1.32, containerd 2.1): the runtime's (`--image-volume-mounts runtime`) and inlet's kubelet-side
//! mount, which must show the pod the same files; containerd 1.6 has only the kubelet side, which `auto`
//! picks there, and where a runtime is asked all the same the container fails as KEP-4639 says (no host
//! path).

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

/// A pod that describes what its image volume shows: every path with its size, mode, owner and type
/// (hashed), a file read, a program of the image run from the volume, a write refused, where a subPath
/// (`etc`) points, and the filesystem under the mount (not compared: an overlay from the runtime, a bind
/// from the kubelet side).
const IMAGE_VOLUME_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: image-volume, annotations: {inlet.dev/expected-phase: Succeeded}}
spec:
  restartPolicy: Never
  containers:
  - name: look
    image: localhost/kit/busybox:1.35
    imagePullPolicy: Never
    command:
    - sh
    - -c
    - |
      cd /vol && find . | sort | while read f; do stat -c '%n %s %a %u %g %F' "$f"; done | md5sum
      head -1 /vol/etc/group
      /vol/bin/busybox echo ran from the volume
      touch /vol/x 2>&1 | sed 's/.*: //'
      if test -f /sub/group; then echo subPath shows etc; elif test -d /sub/etc; then echo subPath shows the image root; fi
      grep ' /vol ' /proc/mounts | cut -d' ' -f3
    volumeMounts: [{name: vol, mountPath: /vol}, {name: vol, mountPath: /sub, subPath: etc}]
  volumes: [{name: vol, image: {reference: localhost/kit/busybox:1.35, pullPolicy: Never}}]
"#;

/// containerd 1.6 asked to mount an image (`--image-volume-mounts runtime`): it drops `Mount.image` it does
/// not know, and fails the container on the empty host path; nothing is left.
fn image_volume_refused(endpoint: &str, dir: &Path) {
    let manifests = dir.join("image-volume-refused");
    std::fs::create_dir_all(&manifests).unwrap();
    let pod = IMAGE_VOLUME_POD.replace("expected-phase: Succeeded", "expected-phase: Pending");
    std::fs::write(manifests.join("pod.yaml"), pod).unwrap();
    let root = dir.join("containerd-image-volume-refused");
    let report = run(
        endpoint,
        &manifests,
        &root,
        &[],
        &["--image-volume-mounts=runtime"],
    );
    check("containerd", &report);
    let container = &report["pods"][0]["containers"][0];
    assert_eq!(container["reason"], "CreateContainerError", "{container:#}");
    let message = container["message"].as_str().unwrap_or_default();
    assert!(message.contains("failed to mkdir \"\""), "{message}");
}

/// The image volume pod through `mode` (`runtime`, `kubelet`, `auto`): its log lines, checked, and whether
/// the runtime mounted the volume.
fn image_volume(runtime: &str, endpoint: &str, dir: &Path, mode: &str) -> (Vec<String>, bool) {
    let manifests = dir.join("image-volume");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(manifests.join("pod.yaml"), IMAGE_VOLUME_POD).unwrap();
    let root = dir.join(format!("{runtime}-image-volume-{mode}"));
    let flag = format!("--image-volume-mounts={mode}");
    let report = run(endpoint, &manifests, &root, &[], &[&flag]);
    check(runtime, &report);
    let container = &report["pods"][0]["containers"][0];
    let logs: Vec<String> = serde_json::from_value(container["logs"].clone()).unwrap();
    let mount = container["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["container_path"] == "/vol")
        .expect("a mount at /vol");
    // The runtime reports the image it mounted (CRI-O its id, and the dir it mounted as the host path;
    // containerd the pod's reference); the kubelet side, the volume's dir.
    let by_runtime = mount["image"].is_string();
    assert!(
        by_runtime || mount["host_path"] != "",
        "{runtime} {mode}: {mount:#}"
    );
    assert_eq!(logs.len(), 6, "{runtime} {mode}: {logs:#?}");
    assert_eq!(logs[1], "root:x:0:", "{runtime} {mode}");
    assert_eq!(logs[2], "ran from the volume", "{runtime} {mode}");
    assert_eq!(logs[3], "Read-only file system", "{runtime} {mode}");
    (logs, by_runtime)
}

/// `kubelet-sim run` of `manifests` on the runtime at `endpoint` with `drivers` and `flags`; its report.
fn run(
    endpoint: &str,
    manifests: &Path,
    root: &Path,
    drivers: &[&str],
    flags: &[&str],
) -> serde_json::Value {
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
    command.args(flags);
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
            &[],
        );
        check(runtime, &examples);
        // The kubelet side everywhere, and `auto` picks it on all three (none drops nothing a 1.33+
        // kubelet sends); the runtime's own mount where it has one.
        let (kubelet_side, _) = image_volume(runtime, &endpoint, dir.path(), "kubelet");
        assert_eq!(kubelet_side[4], "subPath shows etc", "{runtime}");
        let (_, by_runtime) = image_volume(runtime, &endpoint, dir.path(), "auto");
        assert!(!by_runtime, "{runtime}: auto picks the kubelet side");
        if runtime == "containerd" {
            image_volume_refused(&endpoint, dir.path());
        } else {
            let (runtime_side, by_runtime) =
                image_volume(runtime, &endpoint, dir.path(), "runtime");
            assert!(by_runtime, "{runtime}: the runtime mounts");
            assert_eq!(
                runtime_side[..4],
                kubelet_side[..4],
                "{runtime}: the same files whichever side mounts"
            );
            // CRI-O 1.32 and containerd 2.1 drop image_sub_path (added in CRI-O 1.33, containerd 2.2):
            // kep/upstream-differences.md.
            assert_eq!(runtime_side[4], "subPath shows the image root", "{runtime}");
        }
        drop(kit);
    }
}
