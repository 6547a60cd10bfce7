//! inlet's drivers on a real node: the kit's kubelet v1.20.2 and API server, on containerd and then on
//! CRI-O 1.32, with the `inlet-plugin` binary run as a host process with the args of `deploy/`'s DaemonSets
//! (paths moved to the kit's; no container image can be built here). For each runtime:
//!
//! 1. `deploy/overlays/<runtime>` passes the API server's validation (`kubectl apply --dry-run=server`), and
//!    the drivers' CSIDriver objects are created from `deploy/`;
//! 2. the local driver registers itself (`--registration-dir`) and serves a pod with an ephemeral inline
//!    volume and a pod with a PV/PVC; both write into their volumes, and the files are on the published
//!    mounts;
//! 3. the image driver (`--storage auto`: containerd's snapshots on containerd, containers/storage on
//!    CRI-O) serves a pod a read-only CSI image volume of an image built here and pushed to a local
//!    `docker-registry`, pulled through the runtime's CRI; the container finds the image's file (Succeeded);
//! 4. the local driver restarts with its volumes published, this time registered through the kit's
//!    node-driver-registrar sidecar: the pods keep their volumes, and their deletion tears them down
//!    through the restarted driver;
//! 5. nothing is left: no mount under the kubelet dir, no image-driver state, no registration socket.
//!
//! Needs root, the kit and Debian's `docker-registry`; otherwise it says SKIPPED. It takes both kits down.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cri_fake::layout::{ImageBuilder, push};
use cri_fake::registry::LocalRegistry;
use kit::{Kit, wait};
use oci_client::secrets::RegistryAuth;
use serde_json::Value;

use inlet_testkit::kit;

const BIN: &str = env!("CARGO_BIN_EXE_inlet-plugin");
const LOCAL: &str = "local.inlet.dev";
const IMAGE: &str = "image.inlet.dev";
const PV_HANDLE: &str = "e2e-pv";
/// What the image's file says.
const SITE: &str = "inlet on a real node";
const WAIT: Duration = Duration::from_secs(120);

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .expect("hostname")
        .to_string_lossy()
        .into_owned()
}

/// The args of a deploy/ DaemonSet's driver, with the node's paths replaced by the kit's.
fn daemonset_args(driver_dir: &str, kit: &Kit, state: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(deploy().join(driver_dir).join("daemonset.yaml")).unwrap();
    let set: Value = serde_saphyr::from_str(&text).unwrap();
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    let kubelet = kit.kubelet_dir().display().to_string();
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let arg = a.as_str().unwrap();
            let arg = arg.replace("$(NODE_NAME)", &hostname());
            let arg = arg.replace("/var/lib/kubelet", &kubelet);
            match arg.split_once('=') {
                Some((flag @ "--state-dir", _)) => format!("{flag}={}", state.display()),
                _ => arg,
            }
        })
        .collect()
}

/// The value of `--flag=` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
        .unwrap_or_else(|| panic!("no --{name} in {args:?}"))
}

fn socket_of(args: &[String]) -> PathBuf {
    PathBuf::from(flag(args, "endpoint").trim_start_matches("unix://"))
}

/// Mount points under `dir` (one read of the mount table, once per check: this is a test).
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(String::from)
        .collect()
}

fn pods(image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolume
metadata: {{name: e2e-pv}}
spec:
  capacity: {{storage: 16Mi}}
  accessModes: [ReadWriteOnce]
  csi: {{driver: {LOCAL}, volumeHandle: {PV_HANDLE}}}
  claimRef: {{namespace: default, name: e2e-claim}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: e2e-claim}}
spec: {{accessModes: [ReadWriteOnce], storageClassName: "", volumeName: e2e-pv, resources: {{requests: {{storage: 16Mi}}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: ephemeral}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: app, image: localhost/kit/busybox:1.35, imagePullPolicy: Never, command: [sh, -c, "echo ephemeral > /data/f && sleep 3600"], volumeMounts: [{{name: data, mountPath: /data}}]}}
  volumes:
  - {{name: data, csi: {{driver: {LOCAL}, volumeAttributes: {{size: 16Mi}}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: claim}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: app, image: localhost/kit/busybox:1.35, imagePullPolicy: Never, command: [sh, -c, "echo claim > /data/f && sleep 3600"], volumeMounts: [{{name: data, mountPath: /data}}]}}
  volumes:
  - {{name: data, persistentVolumeClaim: {{claimName: e2e-claim}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: image}}
spec:
  restartPolicy: Never
  containers:
  - {{name: app, image: localhost/kit/busybox:1.35, imagePullPolicy: Never, command: [grep, -q, "{SITE}", /site/index.html], volumeMounts: [{{name: site, mountPath: /site}}]}}
  volumes:
  - {{name: site, csi: {{driver: {IMAGE}, readOnly: true, volumeAttributes: {{image: "{image}"}}}}}}
"#
    )
}

/// What the container wrote, read on the host from the volume's published mount.
fn written(kit: &Kit, pod: &str, volume: &str) -> String {
    let mount = kit
        .kubelet_dir()
        .join("pods")
        .join(kit.uid(pod))
        .join("volumes/kubernetes.io~csi")
        .join(volume)
        .join("mount/f");
    std::fs::read_to_string(&mount).unwrap_or_else(|e| panic!("{}: {e}", mount.display()))
}

fn wait_registered(kit: &Kit, driver: &str, registered: bool) {
    wait(&format!("{driver} registered: {registered}"), WAIT, || {
        kit.drivers_in_csinode().contains(driver) == registered
    });
}

fn on_runtime(
    kit_dir: &Path,
    dir: &Path,
    runtime: &tokio::runtime::Runtime,
    image: &str,
    name: &str,
) {
    let started = std::time::Instant::now();
    let mut kit = Kit::up(kit_dir, &dir.join(format!("kit-{name}")), name);
    let overlay = deploy().join("overlays").join(name);
    kit.kubectl(&["apply", "--dry-run=server", "-k", overlay.to_str().unwrap()]);
    for driver in ["local-driver", "image-driver"] {
        let object = deploy().join(driver).join("csidriver.yaml");
        kit.kubectl(&["apply", "-f", object.to_str().unwrap()]);
    }

    // The drivers, as their DaemonSets run them.
    let local_args = daemonset_args("local-driver", &kit, &dir.join(format!("local-{name}")));
    let local = kit.start("inlet-local", Command::new(BIN).args(&local_args));
    let mut image_args = daemonset_args("image-driver", &kit, &dir.join(format!("image-{name}")));
    image_args.push(format!("--runtime-endpoint={}", kit.cri_endpoint()));
    let image_state = PathBuf::from(flag(&image_args, "state-dir"));
    let image_driver = kit.start("inlet-image", Command::new(BIN).args(&image_args));
    wait_registered(&kit, LOCAL, true);
    wait_registered(&kit, IMAGE, true);
    let store = if name == "crio" {
        "containers-storage"
    } else {
        "containerd"
    };
    assert!(
        kit.log("inlet-image").contains(&format!(
            "\"message\":\"image store ready\",\"storage\":\"{store}\""
        )),
        "--storage auto on {name}: {}",
        kit.log("inlet-image")
    );

    // The PV's volume, as an administrator creates it before writing the PV.
    runtime.block_on(kit::create_volume(&socket_of(&local_args), PV_HANDLE));
    kit.apply("pods", &pods(image));
    kit.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/ephemeral",
        "pod/claim",
        "--timeout=120s",
    ]);
    wait("the image pod to succeed", WAIT, || {
        let phase = kit.phase("image");
        assert_ne!(
            phase, "Failed",
            "the image pod's container did not find {SITE:?}"
        );
        phase == "Succeeded"
    });
    assert_eq!(written(&kit, "ephemeral", "data"), "ephemeral\n");
    assert_eq!(written(&kit, "claim", "e2e-pv"), "claim\n");
    println!(
        "{name}: drivers registered and 3 pods served in {:?}",
        started.elapsed()
    );

    // The local driver restarts with its volumes published, registered through the sidecar this time.
    assert!(kit.stop(local).success(), "{}", kit.log("inlet-local"));
    wait_registered(&kit, LOCAL, false);
    let restarted_args: Vec<String> = local_args
        .iter()
        .filter(|a| !a.starts_with("--registration-dir="))
        .cloned()
        .collect();
    let restarted = kit.start("inlet-local-again", Command::new(BIN).args(&restarted_args));
    let socket = socket_of(&restarted_args);
    let registrar = kit.start(
        "registrar",
        Command::new(kit.bin("csi-node-driver-registrar"))
            .arg(format!("--csi-address={}", socket.display()))
            .arg(format!("--kubelet-registration-path={}", socket.display()))
            .arg(format!(
                "--plugin-registration-path={}",
                kit.plugins_registry().display()
            )),
    );
    wait_registered(&kit, LOCAL, true);
    assert_eq!(kit.phase("ephemeral"), "Running");
    assert_eq!(written(&kit, "ephemeral", "data"), "ephemeral\n");
    assert_eq!(written(&kit, "claim", "e2e-pv"), "claim\n");

    let uids: Vec<String> = ["ephemeral", "claim", "image"]
        .iter()
        .map(|pod| kit.uid(pod))
        .collect();
    kit.kubectl(&[
        "delete",
        "pod",
        "ephemeral",
        "claim",
        "image",
        "--wait=true",
        "--timeout=120s",
    ]);
    let pods_dir = kit.kubelet_dir().join("pods");
    // The PV's staging outlives its pod's object, and the kubelet removes pod dirs on its own time.
    wait("every volume mount and pod dir to go", WAIT, || {
        mounts_under(&pods_dir).is_empty()
            && mounts_under(&kit.kubelet_dir().join("plugins")).is_empty()
            && uids.iter().all(|uid| !pods_dir.join(uid).exists())
    });
    assert!(
        inlet_image::leftovers(&image_state).is_empty(),
        "{:?}",
        inlet_image::leftovers(&image_state)
    );
    let log = kit.log("inlet-local-again");
    assert!(
        log.contains("NodeUnpublishVolume") || log.contains("unpublished"),
        "{log}"
    );

    for (index, what) in [
        (image_driver, "inlet-image"),
        (restarted, "inlet-local-again"),
        (registrar, "registrar"),
    ] {
        assert!(kit.stop(index).success(), "{what}: {}", kit.log(what));
    }
    let left: Vec<_> = std::fs::read_dir(kit.plugins_registry())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "registration sockets left: {left:?}");
    println!(
        "{name}: restart, teardown and clean-up checked in {:?}",
        started.elapsed()
    );
}

#[test]
fn inlets_drivers_serve_a_real_kubelet_on_containerd_and_cri_o() {
    if let Some(why) = kit::missing() {
        println!("SKIPPED real-node test: {why}");
        return;
    }
    if !LocalRegistry::available() {
        println!(
            "SKIPPED real-node test: {} is not installed",
            cri_fake::registry::BINARY
        );
        return;
    }
    let kit_dir = kit::find().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let registry = LocalRegistry::start(&dir.path().join("registry"), None).unwrap();
    let image = format!("{}/e2e/site:v1", registry.address);
    let built = ImageBuilder::new()
        .file("index.html", format!("{SITE}\n"))
        .layer()
        .file("data/version.txt", "v1\n")
        .build()
        .unwrap();
    runtime
        .block_on(push(
            &built,
            &image.parse().unwrap(),
            &RegistryAuth::Anonymous,
            std::slice::from_ref(&registry.address),
        ))
        .unwrap();
    for name in ["containerd", "crio"] {
        on_runtime(&kit_dir, dir.path(), &runtime, &image, name);
    }
}
