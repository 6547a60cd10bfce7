//! `kubelet-sim conform` as a driver author runs it in CI: against inlet's local driver (every applicable
//! check passes, the JUnit file says so), against a driver that fails a check (exit 1, the CSI calls as
//! evidence), and against an external driver on a socket (a check it cannot run is skipped with the reason).

use std::process::Command;

use crate::common::{BIN, run, serve_local_driver};

/// Every check's id, from `--list`.
fn catalogue() -> Vec<String> {
    let out = Command::new(BIN)
        .args(["conform", "--list"])
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with(' '))
        .map(String::from)
        .collect()
}

fn conform(args: &[&str]) -> (i32, String, String) {
    run(&[&["conform"], args].concat())
}

/// The local driver's CSIDriver with everything a check can exercise: attach, republish with a token.
const LOCAL_CSIDRIVER: &str = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: local.inlet.dev}\n\
    spec:\n  attachRequired: true\n  podInfoOnMount: true\n  volumeLifecycleModes: [Persistent, Ephemeral]\n  \
    fsGroupPolicy: File\n  requiresRepublish: true\n  tokenRequests: [{audience: conform.inlet.dev}]\n";

/// The local driver's e2e driver definition: a filesystem type, so fsGroup's ReadWriteOnceWithFSType runs.
const LOCAL_TESTDRIVER: &str = "DriverInfo:\n  Name: local.inlet.dev\n  SupportedFsType: {\"\": {}, ext4: {}}\n  \
    Capabilities: {persistence: true, fsGroup: true, exec: true, block: true, controllerExpansion: true}\nInlineVolumes:\n- Attributes: {}\n";

#[test]
fn the_local_driver_passes_every_check_and_the_junit_file_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let csidriver = dir.path().join("csidriver.yaml");
    std::fs::write(&csidriver, LOCAL_CSIDRIVER).unwrap();
    let testdriver = dir.path().join("testdriver.yaml");
    std::fs::write(&testdriver, LOCAL_TESTDRIVER).unwrap();
    let (junit, report, root) = (
        dir.path().join("conform.xml"),
        dir.path().join("conform.json"),
        dir.path().join("root"),
    );
    let (code, stdout, stderr) = conform(&[
        "--driver",
        "local.inlet.dev=local:attach,mount-group",
        "--csidriver",
        csidriver.to_str().unwrap(),
        "--testdriver",
        testdriver.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--root",
        root.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");

    let xml = std::fs::read_to_string(&junit).unwrap();
    let doc = roxmltree::Document::parse(&xml).expect("the JUnit file is XML");
    let suite = doc
        .descendants()
        .find(|n| n.has_tag_name("testsuite"))
        .expect("a test suite");
    assert_eq!(suite.attribute("failures"), Some("0"), "{xml}");
    let cases: Vec<_> = suite
        .children()
        .filter(|n| n.has_tag_name("testcase"))
        .collect();
    let names: Vec<String> = cases
        .iter()
        .map(|c| c.attribute("name").unwrap().to_string())
        .collect();
    assert_eq!(names, catalogue(), "a test case per check, in order");
    for case in &cases {
        let name = case.attribute("name").unwrap();
        assert_eq!(
            case.attribute("classname"),
            name.split('/').next(),
            "the class is the group"
        );
        assert!(
            !case.children().any(|c| c.has_tag_name("failure")),
            "{name} failed: {xml}"
        );
        // The CSIDriver sets podInfoOnMount and not seLinuxMount (the local driver's bind mounts cannot
        // take a context), and without root the checks that look at a mount cannot; everything else runs.
        if let Some(skipped) = case.children().find(|c| c.has_tag_name("skipped")) {
            let reason = skipped.attribute("message").unwrap_or_default();
            assert!(
                name == "pod-info/disabled"
                    || (name == "selinux/mount-context"
                        && reason.contains("the CSIDriver does not say seLinuxMount: true"))
                    || (reason == "needs real mounts (root)" && !inlet_host::mount::can_mount()),
                "{name} skipped: {reason}"
            );
        }
    }

    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(json["failed"], 0);
    assert_eq!(json["driver"]["name"], "local.inlet.dev");
    assert_eq!(json["csi_driver"]["spec"]["requiresRepublish"], true);
    assert_eq!(json["testdriver"]["name"], "local.inlet.dev");
    // Each check removed its node once nothing was mounted below it.
    let left: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left under the root: {left:?}");
}

/// inlet's image driver with its own CSIDriver: every check that applies to a node-only, read-mostly
/// driver passes (it refuses an unknown attribute since #13), the rest are skipped with their reason.
#[test]
fn the_image_driver_passes_every_applicable_check() {
    let manifest_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let layout = format!(
        "example.inlet.dev/site={}",
        manifest_dir.join("../deploy/images/site").display()
    );
    let csidriver = manifest_dir.join("../deploy/image-driver/csidriver.yaml");
    let (code, stdout, stderr) = conform(&[
        "--driver",
        "image.inlet.dev=image",
        "--csidriver",
        csidriver.to_str().unwrap(),
        "--image-layout",
        &layout,
        "--volume-attribute",
        "image=example.inlet.dev/site:v1",
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("pass   ephemeral/unknown-attribute-refused"),
        "{stdout}"
    );
    assert!(
        stdout.contains("skip   persistent/stage-publish")
            && stdout.contains("no CREATE_DELETE_VOLUME"),
        "{stdout}"
    );
}

#[test]
fn a_failing_check_exits_1_with_the_csi_calls_as_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let (junit, report) = (
        dir.path().join("conform.xml"),
        dir.path().join("conform.json"),
    );
    // The local driver refuses a size of zero: the attributes check fails on the driver's answer.
    let (code, stdout, stderr) = conform(&[
        "--driver",
        "local.inlet.dev=local",
        "--volume-attribute",
        "size=0",
        "--only",
        "ephemeral/attributes-*",
        "--junit",
        junit.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--timeout",
        "10s",
    ]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("FAIL   ephemeral/attributes-passed"),
        "{stdout}"
    );
    assert!(stdout.contains("0 passed, 1 failed, 0 skipped"), "{stdout}");
    assert!(
        stderr.contains("no --csidriver given") && stderr.contains("podInfoOnMount: true"),
        "the suggested CSIDriver is printed: {stderr}"
    );

    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let check = &json["checks"][0];
    assert_eq!(check["result"], "fail");
    assert!(
        check["reason"]
            .as_str()
            .unwrap()
            .contains("InvalidArgument"),
        "{check}"
    );
    let refused = check["csi_calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["method"] == "NodePublishVolume")
        .expect("the failed publish is evidence");
    assert_eq!(refused["code"], "InvalidArgument");
    assert!(
        refused["message"].as_str().unwrap().contains("size"),
        "{refused}"
    );

    let xml = std::fs::read_to_string(&junit).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let failure = doc
        .descendants()
        .find(|n| n.has_tag_name("failure"))
        .expect("a failure element");
    assert!(
        failure
            .attribute("message")
            .unwrap()
            .contains("InvalidArgument")
    );
    assert!(
        failure
            .text()
            .unwrap_or_default()
            .contains("NodePublishVolume")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_external_driver_is_tested_on_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let socket = serve_local_driver(dir.path(), &root, "ext.inlet.dev").await;
    let driver = format!("ext.inlet.dev=unix://{}", socket.display());
    let args = [
        "--driver",
        &driver,
        "--root",
        root.to_str().unwrap(),
        "--only",
        "ephemeral/lifecycle",
        "--only",
        "restart/*",
    ];
    let (code, stdout, stderr) = tokio::task::spawn_blocking({
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        move || conform(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("pass   ephemeral/lifecycle"), "{stdout}");
    assert!(stdout.contains("pass   restart/kubelet"), "{stdout}");
    assert!(
        stdout.contains("skip   restart/driver")
            && stdout.contains("an external driver needs --restart-command"),
        "{stdout}"
    );
}

#[test]
fn bad_flags_and_an_unknown_check_exit_2() {
    let (code, _, stderr) = conform(&["--driver", "local.inlet.dev=local", "--only", "nope/*"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--only matches no check"), "{stderr}");
    let (code, _, stderr) = conform(&["--driver", "x.dev=unix:///nonexistent/csi.sock"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("/nonexistent/csi.sock"), "{stderr}");
    let (code, _, stderr) = conform(&[
        "--driver",
        "local.inlet.dev=local",
        "--volume-attribute",
        "nokey",
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("expected KEY=VALUE"), "{stderr}");
    // A real node runs a driver of this host's, and only a real node's kubelet is restarted by command.
    let (code, _, stderr) = conform(&[
        "--driver",
        "local.inlet.dev=local",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
    ]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("serving on a socket of this host"),
        "{stderr}"
    );
    let (code, _, stderr) = conform(&[
        "--driver",
        "local.inlet.dev=local",
        "--kubelet-restart-command",
        "true",
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--kubeconfig"), "{stderr}");
}

/// A CSIDriver that says `seLinuxMount: true`: on a host without SELinux the kubelet gives no context, so
/// the check is skipped and says why; on an SELinux host (as root) the local driver, whose bind mounts
/// cannot take a context, refuses the flag and fails it.
#[test]
fn the_selinux_check_follows_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let csidriver = dir.path().join("csidriver.yaml");
    let yaml = LOCAL_CSIDRIVER.replace(
        "fsGroupPolicy: File",
        "fsGroupPolicy: File\n  seLinuxMount: true",
    );
    std::fs::write(&csidriver, yaml).unwrap();
    let report = dir.path().join("conform.json");
    let (code, stdout, stderr) = conform(&[
        "--driver",
        "local.inlet.dev=local",
        "--csidriver",
        csidriver.to_str().unwrap(),
        "--only",
        "selinux/mount-context",
        "--report",
        report.to_str().unwrap(),
    ]);
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let check = &json["checks"][0];
    assert_eq!(check["id"], "selinux/mount-context", "{stdout}");
    if !inlet_host::selinux::enabled() {
        assert_eq!(
            (code, &check["result"]),
            (0, &"skip".into()),
            "{stdout}{stderr}"
        );
        let reason = check["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("does not run SELinux"), "{reason}");
    } else if inlet_host::mount::can_mount() {
        assert_eq!(
            (code, &check["result"]),
            (1, &"fail".into()),
            "{stdout}{stderr}"
        );
    }
}

/// `--testdriver` takes e2e's file unchanged, says what e2e would ignore in it, and refuses one that
/// describes another driver.
#[test]
fn a_test_driver_file_is_checked_against_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("testdriver.yaml");
    std::fs::write(
        &file,
        "DriverInfo:\n  Name: local.inlet.dev\n  Capabilites: {block: true}\nInlineVolumes:\n- Attributes: {}\n  ReadOnly: true\n",
    )
    .unwrap();
    let (code, stdout, stderr) = conform(&[
        "--driver",
        "local.inlet.dev=local",
        "--testdriver",
        file.to_str().unwrap(),
        "--only",
        "ephemeral/read-write",
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("DriverInfo.Capabilites: unknown, e2e would ignore it"),
        "{stderr}"
    );
    assert!(
        stdout.contains(
            "inline ephemeral volume #0 is read-only, but the test needs a read/write volume"
        ),
        "{stdout}"
    );
    std::fs::write(&file, "DriverInfo: {Name: other.example}\n").unwrap();
    let (code, _, stderr) = conform(&[
        "--driver",
        "local.inlet.dev=local",
        "--testdriver",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains(
            "DriverInfo.Name is \"other.example\", but the driver under test is \"local.inlet.dev\""
        ),
        "{stderr}"
    );
}

#[test]
fn every_check_is_documented() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conform.md")).unwrap();
    for id in catalogue() {
        assert!(
            doc.contains(&format!("| `{id}` |")),
            "conform.md has no row for {id}"
        );
    }
}

use inlet_testkit::kit;

/// Kills the process whose pid is in the file when dropped (a driver started by a script).
struct KillOnDrop(std::path::PathBuf);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// The results conform.md records for csi-driver-host-path v1.16.1, kept true: its two failures and two
/// skips, everything else passing. Needs root and the kit's `hostpathplugin`.
#[test]
fn csi_driver_host_path_results_are_those_conform_md_records() {
    let dir = tempfile::tempdir().unwrap();
    if !inlet_host::mount::can_mount() {
        eprintln!("SKIPPED host-path conformance: not root");
        return;
    }
    let Some(binary) = kit::unpack("hostpathplugin", dir.path()) else {
        eprintln!("SKIPPED host-path conformance: the kit is missing (set INLET_KIT)");
        return;
    };
    let (socket, pid) = (dir.path().join("csi.sock"), dir.path().join("pid"));
    // Started and restarted as its DaemonSet would be, its state in --statedir.
    let start = dir.path().join("start.sh");
    std::fs::write(
        &start,
        format!(
            "#!/bin/sh\n{} --endpoint unix://{} --nodeid node-1 --statedir {} >>{} 2>&1 &\necho $! > {}\n",
            binary.display(),
            socket.display(),
            dir.path().join("state").display(),
            dir.path().join("log").display(),
            pid.display()
        ),
    )
    .unwrap();
    let restart = dir.path().join("restart.sh");
    std::fs::write(
        &restart,
        format!(
            "#!/bin/sh\np=$(cat {pid})\nkill $p\nwhile kill -0 $p 2>/dev/null; do sleep 0.05; done\nexec {start}\n",
            pid = pid.display(),
            start = start.display()
        ),
    )
    .unwrap();
    for script in [&start, &restart] {
        std::fs::set_permissions(script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    assert!(Command::new(&start).status().unwrap().success());
    let _driver = KillOnDrop(pid);
    kit::wait(
        "hostpathplugin serves",
        std::time::Duration::from_secs(10),
        || socket.exists(),
    );
    let csidriver = dir.path().join("csidriver.yaml");
    std::fs::write(
        &csidriver,
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: hostpath.csi.k8s.io}\n\
         spec: {volumeLifecycleModes: [Persistent, Ephemeral], podInfoOnMount: true, fsGroupPolicy: File}\n",
    )
    .unwrap();
    let report = dir.path().join("conform.json");
    let (code, stdout, stderr) = conform(&[
        "--driver",
        &format!("hostpath.csi.k8s.io=unix://{}", socket.display()),
        "--csidriver",
        csidriver.to_str().unwrap(),
        "--restart-command",
        restart.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--root",
        dir.path().join("root").to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let with = |verdict: &str| -> Vec<String> {
        json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["result"] == verdict)
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(with("fail"), ["idempotency/unpublish-repeated"], "{stdout}");
    assert_eq!(
        with("skip"),
        [
            "ephemeral/fs-group-mount-group",
            "republish/tokens",
            "persistent/raw-block",
            "pod-info/disabled",
            "fsgroup/read-write-once-with-fstype",
            "selinux/mount-context",
            "regression/121271-failed-republish"
        ],
        "{stdout}"
    );
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conform.md")).unwrap();
    assert!(
        doc.contains("csi-driver-host-path v1.16.1")
            && doc.contains(&format!(
                "{} passed, 1 failed, 7 skipped",
                catalogue().len() - 8
            ))
    );
}
