//! Every long-running command stops in order on SIGINT or SIGTERM, mid-run: `bench pods`, `bench
//! csi-ephemeral` and `bench image` here; `conform` in `hostile.rs`, `run` in `commands.rs`, `inlet-plugin
//! serve` in its own tests. Each exits with 128 + the signal's number and leaves nothing mounted under its
//! root.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::common::{BIN, mounted_under, walk};

/// Starts `kubelet-sim ARGS`, waits until `ready` sees its root at work, sends `signal`, and checks that
/// it stopped in order: exit status 128 + the signal, `SIG…: stopped` on stderr, nothing mounted under
/// `root`. Returns its stderr.
fn signal_mid_run(
    args: &[&str],
    root: &Path,
    ready: impl Fn(&Path) -> bool,
    signal: Signal,
) -> String {
    let child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(root) {
        assert!(Instant::now() < deadline, "{args:?} never got to work");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.code(),
        Some(128 + signal as i32),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stderr.contains(&format!("{signal}: stopped")), "{stderr}");
    assert!(
        mounted_under(root).is_empty(),
        "left mounted: {:?}",
        mounted_under(root)
    );
    stderr
}

/// Some inline volume's target exists below `root`.
fn a_volume_is_published(root: &Path) -> bool {
    walk(root)
        .iter()
        .any(|p| p.ends_with("mount") && p.to_string_lossy().contains("kubernetes.io~csi"))
}

#[test]
fn bench_pods_stops_on_sigint_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    signal_mid_run(
        &[
            "bench",
            "pods",
            "--pods",
            "2000",
            "--nodes",
            "4",
            "--volumes",
            "2",
            "--root",
            root.to_str().unwrap(),
        ],
        &root,
        a_volume_is_published,
        Signal::SIGINT,
    );
}

#[test]
fn bench_csi_ephemeral_stops_on_sigterm_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    signal_mid_run(
        &[
            "bench",
            "csi-ephemeral",
            "--driver",
            "local.inlet.dev=local",
            "--cycles",
            "1000000",
            "--concurrency",
            "4",
            "--published",
            "64",
            "--root",
            root.to_str().unwrap(),
        ],
        &root,
        a_volume_is_published,
        Signal::SIGTERM,
    );
    let published: Vec<_> = walk(&root)
        .into_iter()
        .filter(|p| p.ends_with("mount"))
        .filter(|p| std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_some()))
        .collect();
    assert!(
        published.is_empty(),
        "volumes left with content: {published:?}"
    );
}

#[test]
fn bench_image_stops_on_sigint_and_leaves_nothing() {
    if !cri_fake::registry::LocalRegistry::available() {
        eprintln!(
            "SKIPPED bench_image_stops_on_sigint_and_leaves_nothing: docker-registry is not installed"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    signal_mid_run(
        &[
            "bench",
            "image",
            "--size",
            "2Mi",
            "--layers",
            "2",
            "--volumes",
            "100000",
            "--cycles",
            "1",
            "--copies",
            "0",
            "--root",
            root.to_str().unwrap(),
        ],
        &root,
        |root| walk(root).iter().any(|p| p.ends_with("mount")),
        Signal::SIGINT,
    );
    // What the bench made under the root (registry, runtime, drivers' state) is removed.
    let left: Vec<_> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left under the root: {left:?}");
}
