//! End to end on a real runtime: a private containerd (its own root, state and socket in a temp dir), two
//! real registries (`docker-registry`, one open, one behind basic auth), images built here by code, and
//! `kubelet-sim run --cri` against containerd:
//!
//! 1. a pod whose busybox container prints a file of an in-tree image volume of a private image (pulled by
//!    containerd with the pod's pull secret), checked in the container's own log;
//! 2. a pod with a writable inline CSI image volume (inlet's image driver on containerd's snapshots) that
//!    writes into it and prints what it wrote;
//! 3. a pod whose command checks the image volume's files (one through a subPath) and ends `Succeeded`,
//!    and one checking a file the image lacks that ends `Failed` (restartPolicy Never): kubelet-sim follows
//!    containerd's containers to completion;
//! 4. after teardown, containerd holds no snapshot or lease of inlet's, and nothing is mounted.
//!
//! Needs root and Debian's `containerd`, `runc`, `docker-registry` and `busybox-static` (`.ci/run` installs
//! them); otherwise it says SKIPPED and passes. Every daemon it starts is stopped when it ends.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cri_fake::containerd::{ContainerdOptions, PrivateContainerd};
use cri_fake::layout::{ImageBuilder, push};
use cri_fake::registry::LocalRegistry;
use inlet_host::mount::can_mount;
use oci_client::secrets::RegistryAuth;

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-sim");
const BUSYBOX: &str = "/bin/busybox";

fn missing_prerequisite() -> Option<String> {
    if !can_mount() {
        return Some("not root".into());
    }
    for binary in ["containerd", "runc", "ctr", cri_fake::registry::BINARY] {
        if !cri_fake::registry::installed(binary) {
            return Some(format!("{binary} is not installed"));
        }
    }
    if !Path::new(BUSYBOX).exists() {
        return Some(format!("{BUSYBOX} (busybox-static) is not installed"));
    }
    None
}

/// busybox with the applets the pods use, and a command.
fn busybox(cmd: &[&str]) -> ImageBuilder {
    let binary = std::fs::read(BUSYBOX).unwrap();
    let mut image = ImageBuilder::new().file_with_mode("bin/busybox", binary, 0o755);
    for applet in ["sh", "cat", "sleep", "echo", "ls"] {
        image = image.symlink(&format!("bin/{applet}"), "busybox");
    }
    image.cmd(cmd)
}

fn unmount_all_under(dir: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Unmounts whatever is left under a dir when dropped, so a failing run does not leave mounts behind.
struct UnmountOnDrop(PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        unmount_all_under(&self.0);
    }
}

fn log_of(root: &Path, pod: &str) -> String {
    let logs = root.join("node-1/logs");
    for entry in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("default_{pod}_"))
        {
            return std::fs::read_to_string(entry.path().join("app/0.log")).unwrap_or_default();
        }
    }
    String::new()
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volumes_on_containerd() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("SKIPPED image_volumes_on_containerd: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Dropped after containerd (declared later, dropped first): whatever a failed run left mounted goes.
    let _unmount = UnmountOnDrop(dir.path().to_path_buf());
    let open = LocalRegistry::start(&dir.path().join("open-registry"), None).unwrap();
    let private = LocalRegistry::start(
        &dir.path().join("private-registry"),
        Some(("bob", "hunter22")),
    )
    .unwrap();
    let insecure = vec![open.address.clone(), private.address.clone()];
    let anonymous = RegistryAuth::Anonymous;
    for (name, image) in [
        ("pause:1", busybox(&["/bin/sleep", "1000000"])),
        ("busybox:1", busybox(&["/bin/sh"])),
    ] {
        let reference = format!("{}/{name}", open.address).parse().unwrap();
        push(&image.build().unwrap(), &reference, &anonymous, &insecure)
            .await
            .unwrap();
    }
    let data = ImageBuilder::new()
        .file("hello.txt", "hello from a private image volume\n")
        .layer()
        .file("sub/more.txt", "more\n")
        .build()
        .unwrap();
    let data_ref = format!("{}/team/data:v1", private.address);
    push(
        &data,
        &data_ref.parse().unwrap(),
        &RegistryAuth::Basic("bob".into(), "hunter22".into()),
        &insecure,
    )
    .await
    .unwrap();

    let containerd_dir = dir.path().join("containerd");
    std::fs::create_dir_all(&containerd_dir).unwrap();
    let containerd = PrivateContainerd::launch(
        &containerd_dir,
        &ContainerdOptions {
            sandbox_image: Some(format!("{}/pause:1", open.address)),
            plain_http_registries: vec![open.address.clone(), private.address.clone()],
        },
    )
    .await
    .unwrap();

    let auth = base64_encode("bob:hunter22");
    let docker_config = base64_encode(&format!(
        r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#,
        private.address
    ));
    let manifests = dir.path().join("manifests.yaml");
    std::fs::write(
        &manifests,
        format!(
            r#"apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: image.inlet.dev}}
spec: {{attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Ephemeral], fsGroupPolicy: None}}
---
apiVersion: v1
kind: Secret
metadata: {{name: regcred}}
type: kubernetes.io/dockerconfigjson
data: {{.dockerconfigjson: {docker_config}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: reader}}
spec:
  hostNetwork: true
  imagePullSecrets: [{{name: regcred}}]
  containers:
    - name: app
      image: {open}/busybox:1
      command: ["/bin/sh", "-c", "cat /data/hello.txt /more/more.txt; sleep 1000000"]
      volumeMounts:
        - {{name: data, mountPath: /data}}
        - {{name: data, mountPath: /more, subPath: sub}}
  volumes:
    - name: data
      image: {{reference: "{data_ref}"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: checker, annotations: {{inlet.dev/expected-phase: Succeeded}}}}
spec:
  hostNetwork: true
  restartPolicy: Never
  imagePullSecrets: [{{name: regcred}}]
  containers:
    - name: app
      image: {open}/busybox:1
      command: ["/bin/sh", "-c", "read line < /data/hello.txt && [ \"$line\" = 'hello from a private image volume' ] && [ -f /more/more.txt ]"]
      volumeMounts:
        - {{name: data, mountPath: /data}}
        - {{name: data, mountPath: /more, subPath: sub}}
  volumes:
    - name: data
      image: {{reference: "{data_ref}"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: missing, annotations: {{inlet.dev/expected-phase: Failed}}}}
spec:
  hostNetwork: true
  restartPolicy: Never
  imagePullSecrets: [{{name: regcred}}]
  containers:
    - name: app
      image: {open}/busybox:1
      command: ["/bin/sh", "-c", "[ -f /data/not-in-the-image.txt ]"]
      volumeMounts: [{{name: data, mountPath: /data}}]
  volumes:
    - name: data
      image: {{reference: "{data_ref}"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: writer}}
spec:
  hostNetwork: true
  containers:
    - name: app
      image: {open}/busybox:1
      command: ["/bin/sh", "-c", "echo written > /work/new.txt && cat /work/new.txt /work/hello.txt; sleep 1000000"]
      volumeMounts:
        - {{name: work, mountPath: /work}}
  volumes:
    - name: work
      csi:
        driver: image.inlet.dev
        volumeAttributes: {{image: "{data_ref}"}}
        nodePublishSecretRef: {{name: regcred}}
"#,
            open = open.address,
        ),
    )
    .unwrap();

    let root = dir.path().join("sim");
    let report = dir.path().join("report.json");
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(["run", "--manifests"])
        .arg(&manifests)
        .arg("--cri")
        .arg(format!("unix://{}", containerd.socket.display()))
        .args(["--driver", "image.inlet.dev=image", "--root"])
        .arg(&root)
        .arg("--report")
        .arg(&report)
        .args(["--timeout", "120s"])
        .output()
        .expect("kubelet-sim runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("kubelet-sim took {:?}\n{stdout}", started.elapsed());
    let containerd_log = || containerd.log();
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}\ncontainerd:\n{}",
        containerd_log()
    );

    // What the containers printed, as containerd wrote it (CRI log lines: `time stream tag text`).
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut reader, mut writer) = (String::new(), String::new());
    while Instant::now() < deadline {
        reader = log_of(&root, "reader");
        writer = log_of(&root, "writer");
        if reader.contains("more") && writer.contains("hello") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        reader.contains("hello from a private image volume"),
        "reader log: {reader:?}"
    );
    assert!(reader.contains("stdout F more"), "reader log: {reader:?}");
    assert!(
        writer.contains("stdout F written"),
        "writer log: {writer:?}"
    );
    assert!(
        writer.contains("hello from a private image volume"),
        "writer log: {writer:?}"
    );
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(
        !text.contains("hunter22"),
        "the password reached the report"
    );
    assert!(
        !stderr.contains("hunter22"),
        "the password reached the logs"
    );

    // While the pods run: one view of the private image (in-tree), one writable snapshot (the driver).
    let snapshots = containerd.ctr(&["snapshots", "ls"]);
    assert_eq!(snapshots.matches("/inlet-ro-").count(), 1, "{snapshots}");
    assert_eq!(snapshots.matches("/inlet-rw-").count(), 1, "{snapshots}");
    assert_eq!(
        containerd.ctr(&["leases", "ls"]).matches("inlet/").count(),
        2
    );

    // The leases keep the snapshots (and their parents) through the image's removal and a synchronous
    // garbage collection: the volumes stay readable.
    let data_names: Vec<String> = containerd
        .ctr(&["images", "ls", "-q"])
        .lines()
        .filter(|n| !n.contains("/pause:") && !n.contains("/busybox:") && !n.contains("/busybox@"))
        .filter(|n| !n.contains("/pause@"))
        .map(str::to_string)
        .collect();
    assert!(
        data_names.iter().any(|n| n.contains("team/data")),
        "{data_names:?}"
    );
    let mut remove = vec!["images", "rm", "--sync"];
    remove.extend(data_names.iter().map(String::as_str));
    containerd.ctr(&remove);
    assert!(
        !containerd
            .ctr(&["images", "ls", "-q"])
            .contains("team/data")
    );
    let snapshots = containerd.ctr(&["snapshots", "ls"]);
    assert_eq!(snapshots.matches("/inlet-ro-").count(), 1, "{snapshots}");
    assert_eq!(snapshots.matches("/inlet-rw-").count(), 1, "{snapshots}");
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    let phase = |pod: &str| {
        report["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == pod)
            .map(|p| (p["phase"].clone(), p["containers"][0]["exit_code"].clone()))
    };
    assert_eq!(
        phase("checker"),
        Some(("Succeeded".into(), 0.into())),
        "{text}"
    );
    assert_eq!(
        phase("missing"),
        Some(("Failed".into(), 1.into())),
        "{text}"
    );
    let reader_mount = report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "reader")
        .and_then(|p| p["containers"][0]["mounts"][0]["host_path"].as_str())
        .unwrap()
        .to_string();
    assert_eq!(
        std::fs::read_to_string(Path::new(&reader_mount).join("hello.txt")).unwrap(),
        "hello from a private image volume\n",
        "the volume outlives its image"
    );

    // A new kubelet on the same root, with the pods gone from the API: it reconstructs the volumes from
    // disk, stops the orphaned sandboxes, tears the volumes down, and the engine releases its snapshots.
    let driver_only = dir.path().join("driver-only.yaml");
    std::fs::write(
        &driver_only,
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: image.inlet.dev}\nspec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Ephemeral]}\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["run", "--manifests"])
        .arg(&driver_only)
        .arg("--cri")
        .arg(format!("unix://{}", containerd.socket.display()))
        .args(["--driver", "image.inlet.dev=image", "--teardown", "--root"])
        .arg(&root)
        .args(["--timeout", "120s"])
        .output()
        .expect("kubelet-sim runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let leftover_mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|p| Path::new(p).starts_with(&root))
        .collect();
    unmount_all_under(&root);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        leftover_mounts.is_empty(),
        "left mounted: {leftover_mounts:#?}"
    );
    let snapshots = containerd.ctr(&["snapshots", "ls"]);
    assert!(!snapshots.contains("inlet/"), "snapshots left: {snapshots}");
    let leases = containerd.ctr(&["leases", "ls"]);
    assert!(!leases.contains("inlet/"), "leases left: {leases}");
}

fn base64_encode(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}
