//! `kubelet-sim bench` as a user runs it: the pod and image workloads small, their figures written (the
//! JSON contract, the SVG chart), nothing left behind. Figures are measured, never judged here.

use crate::common::run;

/// `kubelet-sim bench`: both workloads run small, print their table, and write JSON (the contract's field
/// names) and an SVG chart. Figures are not judged: a slow machine fails nothing.
#[test]
fn bench_writes_its_figures_as_json_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let (json, svg) = (dir.path().join("e.json"), dir.path().join("e.svg"));
    let (code, stdout, stderr) = run(&[
        "bench",
        "csi-ephemeral",
        "--driver",
        "a.inlet.dev=local",
        "--driver",
        "b.inlet.dev=local",
        "--cycles",
        "20",
        "--concurrency",
        "1,4",
        "--published",
        "0,5",
        "--json",
        json.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("CYCLES/S"), "{stdout}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let figures = report["figures"].as_array().unwrap();
    assert_eq!(
        figures.len(),
        8,
        "2 drivers x 2 concurrencies x 2 published"
    );
    for field in [
        "driver",
        "concurrency",
        "published",
        "samples",
        "per_second",
        "p50_us",
        "p90_us",
        "p99_us",
        "max_us",
    ] {
        assert!(figures[0].get(field).is_some(), "{field} in {}", figures[0]);
    }
    assert!(report["machine"]["cpus"].as_u64().unwrap() >= 1);
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));

    let json = dir.path().join("p.json");
    let (code, stdout, stderr) = run(&[
        "bench",
        "pods",
        "--pods",
        "20",
        "--nodes",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let figures = &report["figures"];
    assert_eq!(figures["settled"], true, "{stdout}");
    assert_eq!(figures["teardown_clean"], true, "{stdout}");
    assert_eq!(figures["pod_start"]["samples"], 20);
    let (peak, settled) = (
        figures["peak_rss_mib"].as_u64().unwrap(),
        figures["settled_peak_rss_mib"].as_u64().unwrap(),
    );
    assert!(0 < settled && settled <= peak, "{figures}");
    // Each of the 40 volumes published and unpublished once, every call counted by method and code.
    let by_method = &figures["csi_calls_by_method"];
    assert_eq!(by_method["NodePublishVolume"]["OK"], 40, "{by_method}");
    assert_eq!(by_method["NodeUnpublishVolume"]["OK"], 40, "{by_method}");
    let counted: u64 = by_method
        .as_object()
        .unwrap()
        .values()
        .flat_map(|codes| codes.as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        counted,
        figures["csi_calls"].as_u64().unwrap(),
        "{by_method}"
    );
}

#[test]
fn bench_image_weighs_volumes_beside_copies_and_leaves_nothing() {
    if !cri_fake::registry::LocalRegistry::available() {
        eprintln!(
            "SKIPPED bench_image_weighs_volumes_beside_copies_and_leaves_nothing: docker-registry is not installed"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (json, svg, root) = (
        dir.path().join("i.json"),
        dir.path().join("i.svg"),
        dir.path().join("root"),
    );
    // The disk figures are the growth of whole filesystems, which the tests running beside this one also
    // write to and free: only on a filesystem of its own are they the bench's alone.
    let isolated = own_tmpfs(&root);
    let (code, stdout, stderr) = run(&[
        "bench",
        "image",
        "--size",
        "2Mi",
        "--layers",
        "3",
        "--volumes",
        "20",
        "--cycles",
        "5",
        "--write",
        "1Mi",
        "--copies",
        "2",
        "--churn",
        "3s",
        "--churn-period",
        "100ms",
        "--root",
        root.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stderr.contains("pulling "), "progress on stderr: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let figures = &report["figures"];
    assert_eq!(figures["clean"], true, "{stdout}");
    assert_eq!(
        (figures["layers"].as_u64(), figures["files"].as_u64()),
        (Some(3), Some(9))
    );
    let driver = &figures["drivers"][0];
    assert_eq!(driver["driver"], "image.inlet.dev");
    assert_eq!(driver["readonly_publish"]["samples"], 20);
    assert_eq!(driver["writable_publish"]["samples"], 5);
    assert_eq!(driver["writable_written_bytes"], 1 << 20, "{driver}");
    // The churn removed the image under published volumes, which kept their files.
    let churn = &figures["churn"];
    assert!(churn["publishes"].as_u64().unwrap() >= 10, "{churn}");
    assert_eq!(churn["publishes"], churn["unpublishes"], "{churn}");
    assert!(churn["image_removals"].as_u64().unwrap() >= 1, "{churn}");
    if report["machine"]["real_mounts"] == true {
        assert_eq!(churn["empties"], 0, "{churn}");
    }
    if !isolated.mounted() {
        eprintln!(
            "disk figures not checked: the bench root has no filesystem of its own (not root)"
        );
    } else if report["machine"]["real_mounts"] == true {
        assert!(
            driver["disk_writable_bytes"].as_i64().unwrap() >= 1 << 20,
            "{driver}"
        );
        // The copies hold the image's files; the read-only volumes share them.
        let copy = figures["copy"]["disk_bytes_each"].as_i64().unwrap();
        assert!(copy >= 2 << 20, "{figures}");
        let further = driver["disk_readonly_bytes"]["tenth"].as_i64().unwrap()
            - driver["disk_readonly_bytes"]["first"].as_i64().unwrap();
        assert!(
            further < copy / 4,
            "9 further read-only volumes used {further} bytes"
        );
    }
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    let left: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left under the root: {left:?}");
}

/// A tmpfs of its own at a directory, unmounted when dropped (a failed assertion included).
struct OwnTmpfs(Option<std::path::PathBuf>);

impl OwnTmpfs {
    fn mounted(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for OwnTmpfs {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Mounts a tmpfs at `dir` (created) when root.
fn own_tmpfs(dir: &std::path::Path) -> OwnTmpfs {
    std::fs::create_dir_all(dir).unwrap();
    let mounted = nix::unistd::Uid::effective().is_root()
        && nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=512m"),
        )
        .is_ok();
    OwnTmpfs(mounted.then(|| dir.to_path_buf()))
}

/// More nodes than the process may open sockets for: refused at once, naming the limit and how to raise
/// it, with nothing started (the alternative was "Too many open files" from whichever node came last).
/// The limit is lowered with util-linux's `prlimit`.
#[test]
fn too_many_nodes_for_the_open_files_limit_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let out = std::process::Command::new("prlimit")
        .args(["--nofile=512:512", crate::common::BIN])
        .args(["bench", "pods", "--pods", "10", "--nodes", "100"])
        .args(["--mounter", "recording", "--root"])
        .arg(&root)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let refused = "100 nodes need about 1656 open files, and this process may open 512: raise the limit (ulimit -n 1656";
    assert!(stderr.contains(refused), "{stderr}");
    assert!(!root.join("node-1").exists(), "no node started");
}
