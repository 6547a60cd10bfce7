//! kubelet-sim and conform against a driver that lies (`inlet_testkit::hostile`): a symlink where its
//! target should be, a publish that never answers, an error meant for a terminal. Each must be refused or
//! survived, bounded, and shown safely.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use inlet_testkit::hostile::{Misbehaviour, serve_hostile_driver};

use crate::common::BIN;

const DRIVER: &str = "hostile.inlet.dev";

/// A CSIDriver for the hostile driver: ephemeral, fsGroup applied by the kubelet to any volume.
const CSIDRIVER: &str = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: hostile.inlet.dev}\n\
    spec: {volumeLifecycleModes: [Ephemeral], fsGroupPolicy: File, attachRequired: false, podInfoOnMount: true}\n";

async fn kubelet_sim(args: &[String]) -> (i32, String, String) {
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn driver_arg(socket: &Path) -> String {
    format!("{DRIVER}=unix://{}", socket.display())
}

/// `kubelet-sim conform` against the hostile driver misbehaving so, with the checks `only` names, each
/// step waiting `timeout`; the JSON report goes to `dir/conform.json`.
async fn conform_against(
    dir: &Path,
    misbehaviour: Misbehaviour,
    only: &str,
    timeout: &str,
) -> (i32, String, String) {
    let socket = serve_hostile_driver(dir, DRIVER, misbehaviour).await;
    let csidriver = dir.join("csidriver.yaml");
    std::fs::write(&csidriver, CSIDRIVER).unwrap();
    kubelet_sim(&[
        "conform".into(),
        "--driver".into(),
        driver_arg(&socket),
        "--csidriver".into(),
        csidriver.display().to_string(),
        "--only".into(),
        only.into(),
        "--timeout".into(),
        timeout.into(),
        "--report".into(),
        dir.join("conform.json").display().to_string(),
        "--root".into(),
        dir.join("root").display().to_string(),
    ])
    .await
}

fn conform_report(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("conform.json")).unwrap()).unwrap()
}

/// A driver that answers NodePublishVolume by putting a symlink to a host directory where its target
/// should be: the kubelet refuses the target (FailedMount naming the symlink), gives nothing below it to
/// the pod's fsGroup, and unpublishes it; the host file keeps its mode and group.
#[tokio::test(flavor = "multi_thread")]
async fn a_symlinked_target_is_refused_and_fs_group_never_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let secret = host.join("shadow");
    std::fs::write(&secret, "root only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = std::fs::metadata(&secret).unwrap();
    let socket = serve_hostile_driver(
        dir.path(),
        DRIVER,
        Misbehaviour::SymlinkTarget(host.clone()),
    )
    .await;

    let manifests = dir.path().join("pod.yaml");
    std::fs::write(
        &manifests,
        format!(
            "{CSIDRIVER}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  securityContext: {{fsGroup: 4242}}\n  \
             containers: [{{name: app, image: busybox, volumeMounts: [{{name: v, mountPath: /v}}]}}]\n  \
             volumes: [{{name: v, csi: {{driver: {DRIVER}}}}}]\n"
        ),
    )
    .unwrap();
    let root = dir.path().join("root");
    let report = dir.path().join("report.json");
    let (code, stdout, stderr) = kubelet_sim(&[
        "run".into(),
        "--manifests".into(),
        manifests.display().to_string(),
        "--driver".into(),
        driver_arg(&socket),
        "--root".into(),
        root.display().to_string(),
        "--timeout".into(),
        "5s".into(),
        "--teardown".into(),
        "--report".into(),
        report.display().to_string(),
    ])
    .await;
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let pod = &report["pods"][0];
    assert_ne!(pod["phase"], "Running", "{pod}");
    let refused = pod["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["reason"] == "FailedMount")
        .unwrap_or_else(|| panic!("no FailedMount: {pod}"));
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("mounter.SetUpAt refused the path the driver left at")
            && message.contains("is a symlink"),
        "{message}"
    );
    let after = std::fs::metadata(&secret).unwrap();
    assert_eq!(
        (after.mode(), after.gid()),
        (before.mode(), before.gid()),
        "the host file's mode and group are unchanged"
    );
    assert!(secret.exists(), "nothing of the host dir was removed");
    assert_eq!(
        report["teardown"]["complete"], true,
        "{}",
        report["teardown"]
    );
    let unpublished = report["csi_calls"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["method"] == "NodeUnpublishVolume" && c["code"] == "OK");
    assert!(unpublished, "the refused target is unpublished");
}

/// conform against the same driver: no check that runs a pod passes, and the symlinked-target check names
/// the symlink.
#[tokio::test(flavor = "multi_thread")]
async fn conform_fails_every_check_of_a_driver_that_symlinks_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let symlink = Misbehaviour::SymlinkTarget(host.clone());
    let (code, stdout, stderr) = conform_against(dir.path(), symlink, "ephemeral/*", "4s").await;
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let json = conform_report(dir.path());
    let checks = json["checks"].as_array().unwrap();
    let passed: Vec<&str> = checks
        .iter()
        .filter(|c| c["result"] == "pass")
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert!(passed.is_empty(), "passed: {passed:?}\n{stdout}");
    for id in ["ephemeral/symlinked-target", "ephemeral/outside-path"] {
        let check = checks.iter().find(|c| c["id"] == id).unwrap();
        assert_eq!(check["result"], "fail", "{check}");
        assert!(
            check["reason"].as_str().unwrap().contains("is a symlink"),
            "{check}"
        );
    }
    assert!(
        std::fs::read_dir(&host).unwrap().next().is_none(),
        "nothing made in the host dir"
    );
}

/// conform against a driver whose NodePublishVolume never answers: the check ends within its `--timeout`
/// (the kubelet's CSI call carries the deadline conform can afford, not the kubelet's 2 minutes), and the
/// report shows the call that hung.
#[tokio::test(flavor = "multi_thread")]
async fn conform_is_bounded_by_its_timeout_and_reports_the_hung_call() {
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let (code, stdout, stderr) =
        conform_against(dir.path(), Misbehaviour::Hang, "ephemeral/lifecycle", "5s").await;
    let took = started.elapsed();
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    // The step's wait (5 s), the cleanup's (5 s at most), and starting: far from the kubelet's 120 s.
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    let json = conform_report(dir.path());
    let check = &json["checks"][0];
    assert!(
        check["reason"]
            .as_str()
            .unwrap()
            .contains("DeadlineExceeded"),
        "{check}"
    );
    let publishes: Vec<&serde_json::Value> = check["csi_calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["method"] == "NodePublishVolume")
        .collect();
    assert!(
        publishes
            .iter()
            .any(|c| c["code"] == "DeadlineExceeded" || c["code"] == "InFlight"),
        "the hung call is in the report: {check}"
    );
}

/// A driver's error text that would clear the terminal and forge a PASS line reaches conform's table
/// escaped, on one line.
#[tokio::test(flavor = "multi_thread")]
async fn a_drivers_error_text_is_printed_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = "bad\n\x1b[2J\x1b[31mPASS\x07\r all checks passed\0";
    let error = Misbehaviour::Error(hostile.into());
    let (code, stdout, stderr) =
        conform_against(dir.path(), error, "ephemeral/lifecycle", "4s").await;
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    for output in [&stdout, &stderr] {
        assert!(
            !output.chars().any(|c| c.is_control() && c != '\n'),
            "a control character reached the terminal: {output:?}"
        );
    }
    let row = stdout
        .lines()
        .find(|l| l.starts_with("FAIL   ephemeral/lifecycle"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(row.contains(r"bad\n\u{1b}[2J"), "{row}");
    assert!(
        !stdout.lines().any(|l| l.starts_with(" all checks passed")),
        "{stdout}"
    );
}

/// conform stops on SIGTERM while a driver hangs: at once, with 143, and nothing left mounted.
#[test]
fn conform_stops_on_sigterm_while_a_driver_hangs() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = runtime.block_on(serve_hostile_driver(dir.path(), DRIVER, Misbehaviour::Hang));
    let csidriver = dir.path().join("csidriver.yaml");
    std::fs::write(&csidriver, CSIDRIVER).unwrap();
    let root = dir.path().join("root");
    let child = std::process::Command::new(BIN)
        .args(["conform", "--driver", &driver_arg(&socket), "--csidriver"])
        .arg(&csidriver)
        .args(["--only", "ephemeral/*", "--timeout", "60s", "--root"])
        .arg(&root)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The kubelet's NodePublishVolume is in flight once the pod's volume dir is there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !crate::common::walk(&root)
        .iter()
        .any(|p| p.ends_with("kubernetes.io~csi/data"))
    {
        assert!(std::time::Instant::now() < deadline, "no check started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let signalled = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(
        signalled.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        signalled.elapsed()
    );
    assert!(crate::common::mounted_under(&root).is_empty());
}
