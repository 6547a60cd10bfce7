//! The differential test: the same manifests (`tests/differential/manifests.yaml`: an ephemeral inline
//! volume with a publish secret, a read-only one, a claim of a static PV mounted read-only, a claim of a
//! `volumeMode: Block` PV given to a container as a device) through the kit's
//! real kubelet (v1.20.2 on containerd, `../shared/kit`) and through kubelet-sim, each against inlet's local
//! driver serving in this process and logging every Node call it receives (`--call-log`'s [`CallLog`]).
//!
//! The volume lifecycle calls (NodeStage/Publish/Unpublish/UnstageVolume) are normalised (paths relative to
//! the kubelet's root, pod UIDs replaced by pod names) and compared volume by volume: methods in order,
//! target and staging paths, volume context, secrets' key names, readonly, access mode and type. A block
//! PV's calls are keyed by the PV, its publish path's pod UID left out (1.20 sends no pod info for them),
//! and its differences named `block METHOD.field`. Every difference
//! must be listed, with the release that explains it, in `kep/upstream-differences.md`: the test fails on a
//! difference the document does not name, and prints them all.
//!
//! The same kit then runs the lifecycle pods (`lifecycle.rs`), compared as a user sees them, and
//! `kubelet-sim conform --kubeconfig` against the same driver (`conform_on_kit.rs`).
//!
//! Registration is checked both ways on the real kubelet: through the kit's node-driver-registrar for the
//! comparison, then, the sidecar stopped, through inlet's own `--registration-dir` service ([`Registrar`]),
//! which the kubelet must accept and then serve a pod's inline volume through.
//!
//! Needs root and the kit (`$INLET_KIT`, default `../shared/kit` beside the workspace); it brings the kit up
//! under its own `KIT_RUN` and takes it down at the end, whatever happens. Otherwise it says SKIPPED.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use inlet_host::mount::{LinuxMounter, can_mount};
use inlet_plugin::call_log::CallLog;
use inlet_plugin::local::{LocalConfig, LocalDriver, LocalService};
use inlet_plugin::registration::Registrar;
use inlet_proto::csi_call::CsiCall;
use kit::{Kit, wait};

use inlet_testkit::kit;

use super::{conform_on_kit, lifecycle};

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-sim");
const DRIVER: &str = "local.inlet.dev";
const MANIFESTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/differential/manifests.yaml"
);
const DIFFERENCES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../kep/upstream-differences.md"
);
/// The PV's handle, created on each driver before the manifests are applied, as an administrator would.
const PV_HANDLE: &str = "diff-pv";
/// The block PV's handle, created likewise with block access.
const BLOCK_PV_HANDLE: &str = "diff-block-pv";
/// The calls compared: what a kubelet does to a volume. Capability and stats probes are not compared.
const LIFECYCLE: [&str; 4] = [
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
];

/// Registers the driver through the kit's node-driver-registrar sidecar; returns its index in the kit.
fn register_with_the_sidecar(kit: &mut Kit, socket: &Path) -> usize {
    let mut registrar = Command::new(kit.bin("csi-node-driver-registrar"));
    registrar
        .arg(format!("--csi-address={}", socket.display()))
        .arg(format!("--kubelet-registration-path={}", socket.display()))
        .arg(format!(
            "--plugin-registration-path={}",
            kit.plugins_registry().display()
        ));
    kit.start("registrar", &mut registrar)
}

/// inlet's local driver serving on `socket` in this process, logging to `log`; `kubelet_dir` confines it.
fn serve_driver(
    runtime: &tokio::runtime::Runtime,
    state: &Path,
    kubelet_dir: &Path,
    socket: &Path,
    log: &Path,
) {
    let config = LocalConfig {
        name: DRIVER.into(),
        node_id: nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "node-1".into()),
        state_dir: state.to_path_buf(),
        kubelet_dir: kubelet_dir.to_path_buf(),
        capacity_bytes: 1 << 30,
        max_volume_bytes: 1 << 30,
        default_volume_bytes: 16 << 20,
        enable_attach: false,
        ephemeral_default: false,
        volume_mount_group: false,
    };
    let driver = LocalDriver::open(config, Arc::new(LinuxMounter)).expect("the driver opens");
    let call_log = Arc::new(CallLog::open(log, DRIVER).expect("call log"));
    let socket = socket.to_path_buf();
    runtime.block_on(async {
        let incoming = inlet_proto::uds::listen(&socket).await.expect("listen");
        tokio::spawn(async move {
            let service = LocalService::new(driver);
            let shutdown = std::future::pending();
            inlet_plugin::server::serve_csi_on(
                incoming,
                &socket,
                service,
                true,
                Some(call_log),
                shutdown,
            )
            .await
        });
    });
}

/// The calls the real kubelet made, and what its lifecycle pods showed.
fn through_the_kit(
    kit_dir: &Path,
    dir: &Path,
    runtime: &tokio::runtime::Runtime,
) -> (Vec<CsiCall>, BTreeMap<String, lifecycle::Observed>) {
    let mut kit = Kit::up(kit_dir, &dir.join("kit"), "containerd");
    let socket = kit
        .kubelet_dir()
        .join("plugins")
        .join(DRIVER)
        .join("csi.sock");
    let log = dir.join("kit-calls.jsonl");
    serve_driver(
        runtime,
        &dir.join("kit-state"),
        &kit.kubelet_dir(),
        &socket,
        &log,
    );
    runtime.block_on(kit::create_volume(&socket, PV_HANDLE));
    runtime.block_on(kit::create_block_volume(&socket, BLOCK_PV_HANDLE));
    let registrar = register_with_the_sidecar(&mut kit, &socket);
    wait(
        "the kubelet to register the driver",
        Duration::from_secs(60),
        || kit.drivers_in_csinode().contains(DRIVER),
    );
    kit.kubectl(&["apply", "-f", MANIFESTS]);
    kit.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/inline",
        "pod/claim",
        "pod/block",
        "--timeout=180s",
    ]);
    kit.kubectl(&[
        "delete",
        "pod",
        "inline",
        "claim",
        "block",
        "--wait=true",
        "--timeout=180s",
    ]);
    // A PV's staging outlives its pod's object: wait for both PVs' unstage.
    wait(
        "NodeUnstageVolume of both PVs",
        Duration::from_secs(180),
        || {
            CallLog::read(&log)
                .unwrap_or_default()
                .iter()
                .filter(|c| c.method == "NodeUnstageVolume" && c.code == "OK")
                .count()
                >= 2
        },
    );
    let calls = CallLog::read(&log).expect("the kit's call log");
    kit.stop(registrar);
    registers_without_the_sidecar(&kit, runtime, &socket);
    let pods = lifecycle::on_the_kit(&kit);
    conform_on_kit::on_the_kit(&kit, &socket, dir);
    drop(kit);
    (calls, pods)
}

/// The same driver registered by inlet itself (`--registration-dir`'s [`Registrar`]) once the sidecar is
/// gone: the real kubelet accepts it, and serves a pod's inline volume through it.
fn registers_without_the_sidecar(kit: &Kit, runtime: &tokio::runtime::Runtime, socket: &Path) {
    let registry = kit.kubelet_dir().join("plugins_registry");
    let registrar = Registrar::new(DRIVER, socket);
    let mut outcome = registrar.outcome();
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    runtime.spawn(async move {
        registrar
            .serve(&registry, async { drop(stopped.await) })
            .await
    });
    let said = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), outcome.wait_for(Option::is_some))
            .await
            .map(|o| o.ok().and_then(|o| o.clone()))
    });
    assert_eq!(
        said,
        Ok(Some(Ok(()))),
        "the kubelet's word on inlet's own registration"
    );
    assert!(kit.drivers_in_csinode().contains(DRIVER));
    let pod = kit.run.join("again.yaml");
    std::fs::write(&pod, AGAIN).expect("manifest");
    kit.kubectl(&["apply", "-f", pod.to_str().expect("path")]);
    kit.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/again",
        "--timeout=120s",
    ]);
    kit.kubectl(&["delete", "pod", "again", "--wait=true", "--timeout=120s"]);
}

/// A pod with an inline volume, for the driver once inlet registered it itself.
const AGAIN: &str = "apiVersion: v1
kind: Pod
metadata: {name: again}
spec:
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  containers:
  - {name: app, image: localhost/kit/busybox:1.35, imagePullPolicy: IfNotPresent, command: [sleep, '3600'],
     volumeMounts: [{name: data, mountPath: /data}]}
  volumes: [{name: data, csi: {driver: local.inlet.dev}}]
";

/// The calls kubelet-sim made, through the `kubelet-sim run` binary and the same driver.
fn through_kubelet_sim(dir: &Path, runtime: &tokio::runtime::Runtime) -> Vec<CsiCall> {
    let root = dir.join("sim");
    std::fs::create_dir_all(&root).expect("root");
    let socket = dir.join("sim-driver/csi.sock");
    let log = dir.join("sim-calls.jsonl");
    serve_driver(runtime, &dir.join("sim-state"), &root, &socket, &log);
    runtime.block_on(kit::create_volume(&socket, PV_HANDLE));
    runtime.block_on(kit::create_block_volume(&socket, BLOCK_PV_HANDLE));
    let out = Command::new(BIN)
        .args(["run", "--manifests", MANIFESTS, "--teardown", "--root"])
        .arg(&root)
        .arg("--driver")
        .arg(format!("{DRIVER}=unix://{}", socket.display()))
        .args(["--timeout", "60s"])
        .output()
        .expect("kubelet-sim runs");
    assert!(
        out.status.success(),
        "kubelet-sim run:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    CallLog::read(&log).expect("kubelet-sim's call log")
}

/// One lifecycle call, normalised: the volume it is for, then what is compared.
type Normalised = (String, BTreeMap<String, String>);

/// Paths from `pods/` or `plugins/` on, pod UIDs as `<uid of NAME>`; successful lifecycle calls only.
fn normalise(calls: &[CsiCall]) -> Vec<Normalised> {
    let pods: BTreeMap<String, String> = calls
        .iter()
        .filter_map(|c| {
            let uid = c.volume_context.get("csi.storage.k8s.io/pod.uid")?;
            let name = c.volume_context.get("csi.storage.k8s.io/pod.name")?;
            Some((uid.clone(), format!("<uid of {name}>")))
        })
        .collect();
    let clean = |text: &str| {
        let start = ["pods/", "plugins/"]
            .iter()
            .filter_map(|p| text.find(p))
            .min()
            .unwrap_or(0);
        pods.iter()
            .fold(text[start..].to_string(), |t, (uid, name)| {
                t.replace(uid, name)
            })
    };
    calls
        .iter()
        .filter(|c| LIFECYCLE.contains(&c.method.as_str()) && c.code == "OK")
        .map(|c| {
            // The volume: the pod's name for it (target path), else the staging dir's.
            let path = if c.target_path.is_empty() {
                &c.staging_path
            } else {
                &c.target_path
            };
            let volume = clean(path);
            let mut fields: BTreeMap<String, String> = [
                ("method", c.method.clone()),
                ("target_path", clean(&c.target_path)),
                ("staging_path", clean(&c.staging_path)),
                ("readonly", c.readonly.to_string()),
                ("access_mode", c.access_mode.clone()),
                ("access_type", c.access_type.clone()),
                ("secret_keys", c.secret_keys.join(",")),
                ("volume_mount_group", c.volume_mount_group.clone()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            for (key, value) in &c.volume_context {
                fields.insert(format!("volume_context[{key}]"), clean(value));
            }
            (volume, fields)
        })
        .collect()
}

/// Each difference as `METHOD.field: kubelet <a> | kubelet-sim <b>`, volume by volume, call by call.
fn differences(kubelet: &[Normalised], sim: &[Normalised]) -> Vec<(String, String)> {
    // Calls are grouped per volume by their method sequence position; a volume's key is its kubelet-side
    // path with the staging layout taken out, so a PV's publish pairs with its publish.
    let group = |calls: &[Normalised]| {
        let mut by_method: BTreeMap<(String, String), Vec<BTreeMap<String, String>>> =
            BTreeMap::new();
        for (volume, fields) in calls {
            let key = match block_pv(volume) {
                Some(pv) => format!("<block {pv}>"),
                None if volume.starts_with("plugins/") => "<staging>".to_string(),
                None => volume.clone(),
            };
            by_method
                .entry((key, fields["method"].clone()))
                .or_default()
                .push(fields.clone());
        }
        by_method
    };
    let (a, b) = (group(kubelet), group(sim));
    let mut found = Vec::new();
    let name = |(volume, method): &(String, String), what: &str| {
        let block = if volume.starts_with("<block ") {
            "block "
        } else {
            ""
        };
        format!("{block}{method}.{what}")
    };
    for key in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
        let (x, y) = (a.get(key), b.get(key));
        let (calls_a, calls_b) = (x.map_or(0, Vec::len), y.map_or(0, Vec::len));
        if calls_a != calls_b {
            found.push((
                name(key, "calls"),
                format!("{}: kubelet {calls_a} | kubelet-sim {calls_b}", key.0),
            ));
        }
        let (Some(first_a), Some(first_b)) = (x.and_then(|v| v.first()), y.and_then(|v| v.first()))
        else {
            continue;
        };
        let paths = ["target_path", "staging_path"];
        for field in first_a
            .keys()
            .chain(first_b.keys())
            .collect::<BTreeSet<_>>()
        {
            let (mut va, mut vb) = (first_a.get(field).cloned(), first_b.get(field).cloned());
            if key.0.starts_with("<block ") && paths.contains(&field.as_str()) {
                // A block publish path ends in the pod's UID, which 1.20 never names (no pod info).
                (va, vb) = (va.map(without_pod_uid), vb.map(without_pod_uid));
            }
            if va != vb {
                found.push((
                    name(key, field),
                    format!(
                        "{}: kubelet {:?} | kubelet-sim {:?}",
                        key.0,
                        va.as_deref().unwrap_or("<none>"),
                        vb.as_deref().unwrap_or("<none>")
                    ),
                ));
            }
        }
    }
    found
}

/// The PV a block volume path is for: `plugins/kubernetes.io/csi/volumeDevices/{staging,publish}/<pv>[/<pod
/// uid>]` (`csi_block.go`'s layout, the same in 1.20 and 1.35).
fn block_pv(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("plugins/kubernetes.io/csi/volumeDevices/")?;
    let rest = rest
        .strip_prefix("staging/")
        .or_else(|| rest.strip_prefix("publish/"))?;
    rest.split('/').next()
}

/// A block publish path with its last part, the pod's UID, as `<pod uid>`.
fn without_pod_uid(path: String) -> String {
    match path.rsplit_once('/') {
        Some((dir, _)) if path.contains("volumeDevices/publish/") => format!("{dir}/<pod uid>"),
        _ => path,
    }
}

#[test]
fn the_kits_kubelet_and_kubelet_sim_make_the_same_csi_calls_and_show_the_same_pods() {
    let Some(kit_dir) = kit::find() else {
        eprintln!("SKIPPED differential test: the kit is missing (set INLET_KIT)");
        return;
    };
    if !can_mount() {
        eprintln!("SKIPPED differential test: needs root (the kit's kubelet and real mounts)");
        return;
    }
    if std::net::TcpStream::connect("127.0.0.1:16443").is_ok() {
        eprintln!(
            "SKIPPED differential test: a kit is already running here (port 16443); take it down first"
        );
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let (kubelet_calls, kubelet_pods) = through_the_kit(&kit_dir, dir.path(), &runtime);
    let kubelet = normalise(&kubelet_calls);
    let sim = normalise(&through_kubelet_sim(dir.path(), &runtime));
    let sim_pods = lifecycle::in_kubelet_sim(dir.path(), &runtime);
    assert!(
        kubelet
            .iter()
            .any(|(_, f)| f["method"] == "NodeUnstageVolume"),
        "the kubelet's calls: {kubelet:#?}"
    );
    let mut found = differences(&kubelet, &sim);
    found.extend(lifecycle::differences(&kubelet_pods, &sim_pods));
    let documented = std::fs::read_to_string(DIFFERENCES).expect("kep/upstream-differences.md");
    for (key, detail) in &found {
        println!("difference {key}: {detail}");
    }
    let unexplained: Vec<_> = found
        .iter()
        .filter(|(key, _)| !documented.contains(&format!("`{key}`")))
        .collect();
    assert!(
        unexplained.is_empty(),
        "differences from kubelet v1.20.2 that kep/upstream-differences.md does not list: {unexplained:#?}"
    );
}
