//! `kubelet-sim run` as a user runs it: the examples, an external CSI driver and an external CRI runtime
//! on their own sockets (served from this test process; kubelet-sim is a separate process), the JSON
//! report's contract, and clear errors with Unix exit codes.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use crate::common::{BIN, mounted_under, run, run_logging, serve_local_driver, walk};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples")
}

/// The last lines of a long output.
fn tail(text: &str) -> String {
    let lines: Vec<_> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The README's main command, on a root and report of the test's own.
#[test]
fn the_examples_run_and_the_report_keeps_its_contract() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let root = dir.path().join("root");
    let site = format!(
        "example.inlet.dev/site={}",
        examples().join("../images/site").display()
    );
    // Every log line at every level, to check that no secret value reaches any of them.
    let (code, stdout, stderr) = run_logging(
        &[
            "run",
            "--manifests",
            examples().to_str().unwrap(),
            "--driver",
            "local.inlet.dev=local",
            "--driver",
            "image.inlet.dev=image",
            "--image-layout",
            &site,
            "--teardown",
            "--root",
            root.to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
        ],
        "trace",
    );
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{}", tail(&stderr));
    assert!(
        stdout.contains("Running") && stdout.contains("teardown: every pod deleted"),
        "{stdout}"
    );
    assert!(stderr.lines().count() > 100, "trace logging is on");
    for (name, out) in [("stdout", &stdout), ("stderr", &stderr)] {
        let leaked: Vec<_> = out
            .lines()
            .filter(|l| l.contains("not-a-real-password"))
            .collect();
        assert!(leaked.is_empty(), "a secret value in {name}: {leaked:#?}");
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let pod = &report["pods"][0];
    for field in [
        "namespace",
        "name",
        "uid",
        "node",
        "phase",
        "events",
        "containers",
    ] {
        assert!(!pod[field].is_null(), "pods[].{field} missing");
    }
    let mount = &report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "scratch")
        .unwrap()["containers"][0]["mounts"][0];
    for field in ["container_path", "host_path", "readonly"] {
        assert!(
            !mount[field].is_null(),
            "pods[].containers[].mounts[].{field} missing"
        );
    }
    let call = &report["csi_calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["method"] == "NodePublishVolume")
        .unwrap()
        .clone();
    for field in [
        "driver",
        "method",
        "volume_id",
        "target_path",
        "staging_path",
        "readonly",
        "volume_context",
        "secret_keys",
        "publish_context",
        "code",
    ] {
        assert!(!call[field].is_null(), "csi_calls[].{field} missing");
    }
    let read = &report["api_reads"][0];
    for field in ["verb", "kind", "namespace", "name"] {
        assert!(!read[field].is_null(), "api_reads[].{field} missing");
    }
    assert!(report["volume_attachments"].is_array());
    for field in [
        "complete",
        "leftover_mounts",
        "leftover_pod_dirs",
        "leftover_attachments",
        "leftover_image_state",
    ] {
        assert!(
            !report["teardown"][field].is_null(),
            "teardown.{field} missing"
        );
    }
    let site_mounts = &report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "site")
        .unwrap()["containers"][0]["mounts"];
    assert_eq!(
        site_mounts[0]["readonly"], true,
        "image volumes are read-only"
    );
    let text = report.to_string();
    assert!(
        !text.contains("not-a-real-password"),
        "secret values never reach the report"
    );
    assert!(text.contains("\"password\""), "secret key names do");
    let leftovers: Vec<_> = walk(&root)
        .into_iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "pods"))
        .collect();
    assert!(
        leftovers.iter().all(|p| p.ends_with("pods")),
        "pod dirs left: {leftovers:?}"
    );
}

/// A manifest of the CSIDriver `driver` and a pod `web` with one inline volume of it.
const INLINE_POD: &str = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: DRIVER}\nspec: {volumeLifecycleModes: [Ephemeral], podInfoOnMount: true}\n---\n\
     apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: app, image: busybox, volumeMounts: [{name: v, mountPath: /v}]}]\n  volumes: [{name: v, csi: {driver: DRIVER}}]\n";

/// `--plugins-registry`: no `--driver`; the driver serves its registration socket (as `inlet-plugin serve
/// --registration-dir` does) and kubelet-sim's plugin watcher registers it, tells it so, and serves the pod.
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_registers_itself_through_the_plugins_registry() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let registry = dir.path().join("plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    let driver_socket = serve_local_driver(dir.path(), &root, "self.inlet.dev").await;
    let registrar = inlet_plugin::registration::Registrar::new("self.inlet.dev", &driver_socket);
    let mut outcome = registrar.outcome();
    let serving = registry.clone();
    tokio::spawn(async move { registrar.serve(&serving, std::future::pending()).await });
    let manifests = dir.path().join("pod.yaml");
    std::fs::write(&manifests, INLINE_POD.replace("DRIVER", "self.inlet.dev")).unwrap();
    let report = dir.path().join("report.json");
    let out = tokio::process::Command::new(BIN)
        .arg("run")
        .arg("--manifests")
        .arg(&manifests)
        .arg("--plugins-registry")
        .arg(&registry)
        .arg("--root")
        .arg(&root)
        .args(["--teardown", "--report"])
        .arg(&report)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["pods"][0]["phase"], "Running");
    assert_eq!(*outcome.borrow_and_update(), Some(Ok(())));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_external_driver_and_an_external_runtime_on_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    // The driver a user is developing, on its own socket.
    let driver_socket = serve_local_driver(dir.path(), &root, "ext.inlet.dev").await;
    // A runtime on its own socket.
    let runtime =
        Arc::new(cri_fake::FakeRuntime::new(dir.path().join("cri"), Default::default()).unwrap());
    let cri_socket = dir.path().join("cri.sock");
    let serving = Arc::clone(&runtime);
    let path = cri_socket.clone();
    tokio::spawn(async move { cri_fake::serve(&path, serving, std::future::pending()).await });
    while !cri_socket.exists() {
        tokio::task::yield_now().await;
    }

    let manifests = dir.path().join("pod.yaml");
    std::fs::write(&manifests, INLINE_POD.replace("DRIVER", "ext.inlet.dev")).unwrap();
    let report = dir.path().join("report.json");
    let args = [
        "run".to_string(),
        "--manifests".into(),
        manifests.display().to_string(),
        "--driver".into(),
        format!("ext.inlet.dev=unix://{}", driver_socket.display()),
        "--cri".into(),
        format!("unix://{}", cri_socket.display()),
        "--root".into(),
        root.display().to_string(),
        "--teardown".into(),
        "--report".into(),
        report.display().to_string(),
    ];
    let out = tokio::process::Command::new(BIN)
        .args(&args)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["pods"][0]["phase"], "Running");
    let drivers: Vec<&str> = report["csi_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["driver"].as_str().unwrap())
        .collect();
    assert!(
        drivers.iter().all(|d| *d == "ext.inlet.dev") && drivers.len() >= 3,
        "{drivers:?}"
    );
    let methods: Vec<&str> = runtime.calls().into_iter().map(|c| c.method).collect();
    for method in [
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopPodSandbox",
        "RemovePodSandbox",
    ] {
        assert!(
            methods.contains(&method),
            "the external runtime got no {method}: {methods:?}"
        );
    }
}

#[test]
fn a_bad_manifest_names_the_file_and_document() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\nspec: {containers: [{name: a, image: b}]}\n---\napiVersion: apps/v1\nkind: Deployment\n").unwrap();
    let (code, _, stderr) = run(&[
        "run",
        "--manifests",
        file.to_str().unwrap(),
        "--driver",
        "d=local",
    ]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("bad.yaml#2: kind \"Deployment\" is not supported"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["run", "--manifests", "/nonexistent/inlet.yaml"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("/nonexistent/inlet.yaml"), "{stderr}");
}

#[test]
fn bad_flags_exit_2_and_name_the_flag() {
    for (args, needle) in [
        (
            vec!["run", "--manifests", "x", "--driver", "nameonly"],
            "--driver",
        ),
        (
            vec!["run", "--manifests", "x", "--feature-gates", "Nope=true"],
            "Nope",
        ),
        (
            vec!["run", "--manifests", "x", "--timeout", "soon"],
            "--timeout",
        ),
        (vec!["run"], "--manifests"),
        (
            vec![
                "run",
                "--manifests",
                "x",
                "--image-pull-credentials-verification-policy",
                "Sometimes",
            ],
            "NeverVerifyPreloadedImages",
        ),
        (
            vec![
                "run",
                "--manifests",
                "x",
                "--preloaded-images-verification-allowlist",
                "registry.example/team/tool,registry.example/*/x",
            ],
            "not a valid wildcard pattern, only patterns ending with '/*' are allowed: registry.example/*/x",
        ),
        (
            vec!["run", "--manifests", "x", "--selinux", "maybe"],
            "--selinux",
        ),
    ] {
        let (code, _, stderr) = run(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let (code, stdout, _) = run(&["run", "--help"]);
    assert_eq!(code, 0);
    for flag in [
        "--manifests",
        "--driver",
        "--cri",
        "--root",
        "--nodes",
        "--feature-gates",
        "--allowed-inline-drivers",
        "--teardown",
        "--timeout",
        "--report",
        "--image-pull-credentials-verification-policy",
    ] {
        assert!(stdout.contains(flag), "--help does not explain {flag}");
    }
}

/// A driver name is a directory under the root: names that would leave it are refused wherever they come
/// from (`--driver`, a CSIDriver, a PV, an inline volume), as the API server refuses them.
#[test]
fn driver_names_that_would_leave_the_root_are_refused() {
    let (code, _, stderr) = run(&[
        "run",
        "--manifests",
        "x",
        "--driver",
        "../../../../tmp/x=local",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--driver") && stderr.contains("a lowercase RFC 1123 subdomain"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["run", "--manifests", "x", "--driver", "/tmp/x=local"]);
    assert_eq!(code, 2, "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let escape = "../../../../../../../../../../..".to_string()
        + &dir.path().join("escaped").display().to_string();
    for (file, yaml) in [
        (
            "driver.yaml",
            format!(
                "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {escape:?}}}\nspec: {{volumeLifecycleModes: [Ephemeral]}}\n"
            ),
        ),
        (
            "pod.yaml",
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  containers: [{{name: c, image: busybox, command: [sleep, '3600'], volumeMounts: [{{name: v, mountPath: /v}}]}}]\n  volumes: [{{name: v, csi: {{driver: {escape:?}}}}}]\n"
            ),
        ),
    ] {
        std::fs::write(manifests.join(file), yaml).unwrap();
    }
    let root = dir.path().join("root");
    let (code, stdout, _) = run(&[
        "run",
        "--manifests",
        manifests.to_str().unwrap(),
        "--driver",
        "local.inlet.dev=local",
        "--root",
        root.to_str().unwrap(),
        "--teardown",
        "--timeout",
        "10s",
    ]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("is invalid: name: Invalid value"),
        "{stdout}"
    );
    assert!(
        !dir.path().join("escaped").exists(),
        "nothing is written outside the root"
    );
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["manifests", "root"]);
}

#[test]
fn a_policy_violation_fails_the_run_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, _) = run(&[
        "run",
        "--manifests",
        examples().to_str().unwrap(),
        "--driver",
        "local.inlet.dev=local",
        "--allowed-inline-drivers",
        "other.example.com",
        "--root",
        dir.path().join("root").to_str().unwrap(),
        "--teardown",
        "--timeout",
        "10s",
    ]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("is forbidden: spec.volumes[0].csi.driver: Forbidden: inline CSI driver \"local.inlet.dev\""), "{stdout}");
}

/// One pod that runs (an ephemeral local volume) and one that never can (its driver is not there).
const HALF_SETTLING: &str = "apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: local.inlet.dev}
spec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Ephemeral]}
---
apiVersion: v1
kind: Pod
metadata: {name: runs}
spec:
  containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, csi: {driver: local.inlet.dev}}]
---
apiVersion: v1
kind: Pod
metadata: {name: waits}
spec:
  containers: [{name: app, image: busybox, volumeMounts: [{name: data, mountPath: /data}]}]
  volumes: [{name: data, csi: {driver: absent.example.com}}]
";

#[test]
fn sigterm_writes_the_report_tears_down_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("pods.yaml");
    std::fs::write(&manifests, HALF_SETTLING).unwrap();
    let (root, report) = (dir.path().join("root"), dir.path().join("report.json"));
    let child = Command::new(BIN)
        .args([
            "run",
            "--driver",
            "local.inlet.dev=local",
            "--timeout",
            "120s",
            "--manifests",
        ])
        .arg(&manifests)
        .arg("--root")
        .arg(&root)
        .arg("--report")
        .arg(&report)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first pod's volume is set up, then stop the run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !walk(&root)
        .iter()
        .any(|d| d.ends_with("kubernetes.io~csi/data/mount"))
    {
        assert!(std::time::Instant::now() < deadline, "no volume was set up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(143), "{stdout}\n{stderr}");
    assert!(stderr.contains("SIGTERM: stopping"), "{stderr}");
    assert!(stdout.contains("teardown: every pod deleted"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["teardown"]["complete"], true, "{report:#}");
    assert!(
        mounted_under(&root).is_empty(),
        "left mounted: {:?}",
        mounted_under(&root)
    );
}

#[test]
fn the_timeout_is_a_deadline_for_the_whole_settle_phase() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("pods.yaml");
    std::fs::write(&manifests, HALF_SETTLING).unwrap();
    let report = dir.path().join("report.json");
    let started = std::time::Instant::now();
    let (code, stdout, stderr) = run(&[
        "run",
        "--driver",
        "local.inlet.dev=local",
        "--timeout",
        "2s",
        "--teardown",
        "--manifests",
        manifests.to_str().unwrap(),
        "--root",
        dir.path().join("root").to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(stderr.contains("within 2s"), "{stderr}");
    assert!(report.exists(), "the report is written at the deadline");
    // Two deadlines of 2 s (settle, teardown), with room for a loaded machine; before, a run could go on
    // for minutes past its deadline.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(mounted_under(&dir.path().join("root")).is_empty());
}

/// A pod whose secret volume is refused (an item path or a subPath reaching out with `..`) is torn down
/// at once when deleted: its failed set-up leaves no tmpfs behind (`secret.go` SetUpAt tears down on a
/// failure), and the deletion does not wait out the start's back-off.
#[test]
fn a_pod_refused_for_a_secret_path_is_torn_down_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("pods.yaml");
    std::fs::write(
        &manifests,
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {k: v}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: items, annotations: {inlet.dev/expected-phase: Pending}}\nspec:\n  \
         containers: [{name: app, image: busybox, volumeMounts: [{name: s, mountPath: /s}]}]\n  \
         volumes: [{name: s, secret: {secretName: s, items: [{key: k, path: ../../etc}]}}]\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: subpath, annotations: {inlet.dev/expected-phase: Running}}\nspec:\n  \
         containers: [{name: app, image: busybox, volumeMounts: [{name: s, mountPath: /s, subPath: ../../etc}]}]\n  \
         volumes: [{name: s, secret: {secretName: s}}]\n",
    )
    .unwrap();
    let report = dir.path().join("report.json");
    let root = dir.path().join("root");
    let started = std::time::Instant::now();
    let (_, stdout, stderr) = run(&[
        "run",
        "--timeout",
        "8s",
        "--teardown",
        "--manifests",
        manifests.to_str().unwrap(),
        "--root",
        root.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(json["teardown"]["complete"], true, "{stdout}\n{stderr}");
    assert!(stdout.contains("teardown: every pod deleted"), "{stdout}");
    assert!(
        mounted_under(&root).is_empty(),
        "{:?}",
        mounted_under(&root)
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}
