//! `deploy/` checked against the binaries:
//! - every manifest parses strictly into k8s-openapi's types: a field the type does not have (a typo, a
//!   field of another release) is an error, not silently dropped;
//! - each DaemonSet's `inlet-plugin` container really runs: its args (with the runtime overlay's
//!   `--runtime-endpoint`) are given to the binary, with every absolute path moved under a temp dir; the
//!   driver must serve its endpoint and its registration socket, answer its liveness probe (`/healthz` on
//!   the port the probe names) and the probe's exec form,
//!   and every path it is given must lie inside a volume the container mounts (the kubelet dir at its host
//!   path, with Bidirectional propagation);
//! - each CSIDriver object agrees with its driver (name, attach) and the examples' copies with deploy's;
//! - the kustomize overlays render (with the kit's kubectl 1.20, whose kustomize is the oldest a user may
//!   have) into strict objects. Applying them to a real API server is in `real_node.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_proto::csi::v1 as csi;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    Container, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::CSIDriver;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use inlet_testkit::kit;

const BIN: &str = env!("CARGO_BIN_EXE_inlet-plugin");
/// Fields of an inline `csi` volume only the KEP-596 draft had (`examples/40-persistent-inline.yaml`).
const DRAFT_INLINE_FIELDS: [&str; 3] = [
    "volumeHandle",
    "controllerPublishSecretRef",
    "nodeStageSecretRef",
];

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The YAML documents of a file.
fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .expect("YAML")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// Every Kubernetes manifest under deploy/ (not kustomize's own files, JSON patches or kind's config).
fn manifests() -> Vec<(PathBuf, Value)> {
    let mut found = Vec::new();
    let files = walkdir::WalkDir::new(deploy())
        .sort_by_file_name()
        .into_iter();
    for entry in files
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
    {
        let entry = entry.into_path();
        let name = entry.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".yaml") || name == "kustomization.yaml" {
            continue;
        }
        for doc in documents(&std::fs::read_to_string(&entry).unwrap()) {
            // JSON patches are lists; kind's config is not a Kubernetes object.
            if doc
                .get("apiVersion")
                .is_some_and(|v| v != "kind.x-k8s.io/v1alpha4")
            {
                found.push((entry.clone(), doc));
            }
        }
    }
    found
}

/// The fields of `original` that `typed` (the same object through a k8s-openapi type) lost: unknown ones.
fn lost_fields(original: &Value, typed: &Value, at: &str, lost: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(fields), Value::Object(kept)) => {
            for (key, value) in fields {
                let path = format!("{at}.{key}");
                // The early KEP-596 draft's persistent inline fields, which kubelet-sim reads on purpose
                // (`kubelet-sim/src/api/manifest.rs`): no real API server keeps them.
                if at.ends_with(".csi") && DRAFT_INLINE_FIELDS.contains(&key.as_str()) {
                    continue;
                }
                match kept.get(key) {
                    Some(kept) => lost_fields(value, kept, &path, lost),
                    // k8s-openapi leaves empty lists and maps out when it writes an object.
                    None if is_empty(value) => {}
                    None => lost.push(path),
                }
            }
        }
        (Value::Array(items), Value::Array(kept)) => {
            for (i, (item, kept)) in items.iter().zip(kept).enumerate() {
                lost_fields(item, kept, &format!("{at}[{i}]"), lost);
            }
        }
        _ => {}
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn strict<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let mut lost = Vec::new();
    lost_fields(doc, &serde_json::to_value(&typed).unwrap(), "", &mut lost);
    if lost.is_empty() {
        Ok(typed)
    } else {
        Err(format!("unknown fields {lost:?}"))
    }
}

/// Parses `doc` strictly as the type its kind names.
fn check_strictly(doc: &Value) -> Result<(), String> {
    match doc["kind"].as_str().unwrap_or_default() {
        "CSIDriver" => strict::<CSIDriver>(doc).map(drop),
        "DaemonSet" => strict::<DaemonSet>(doc).map(drop),
        "Deployment" => strict::<Deployment>(doc).map(drop),
        "Namespace" => strict::<Namespace>(doc).map(drop),
        "ClusterRole" => strict::<ClusterRole>(doc).map(drop),
        "ClusterRoleBinding" => strict::<ClusterRoleBinding>(doc).map(drop),
        "ServiceAccount" => strict::<ServiceAccount>(doc).map(drop),
        "Pod" => strict::<Pod>(doc).map(drop),
        "Secret" => strict::<Secret>(doc).map(drop),
        "PersistentVolume" => strict::<PersistentVolume>(doc).map(drop),
        "PersistentVolumeClaim" => strict::<PersistentVolumeClaim>(doc).map(drop),
        other => Err(format!("no check for kind {other:?}: add it here")),
    }
}

/// A strategic-merge patch (a DaemonSet without its required fields): strict on what it has.
fn is_patch(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "overlays")
}

#[test]
fn every_manifest_parses_strictly() {
    let all = manifests();
    assert!(all.len() >= 15, "{} manifests found", all.len());
    let mut failures = Vec::new();
    for (path, doc) in all.iter().filter(|(path, _)| !is_patch(path)) {
        if let Err(e) = check_strictly(doc) {
            failures.push(format!(
                "{}: {} {}: {e}",
                path.display(),
                doc["kind"],
                doc["metadata"]["name"]
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // The check itself catches a misspelt field.
    let mut typo = all
        .iter()
        .find(|(_, d)| d["kind"] == "DaemonSet")
        .unwrap()
        .1
        .clone();
    typo["spec"]["template"]["spec"]["hostNetwrk"] = Value::Bool(true);
    assert!(check_strictly(&typo).unwrap_err().contains("hostNetwrk"));
}

/// deploy/'s CSIDriver objects by name.
fn csidrivers(under: &str) -> BTreeMap<String, Value> {
    manifests()
        .into_iter()
        .filter(|(path, doc)| doc["kind"] == "CSIDriver" && path.starts_with(deploy().join(under)))
        .map(|(_, doc)| (doc["metadata"]["name"].as_str().unwrap().to_string(), doc))
        .collect()
}

#[test]
fn the_examples_use_the_drivers_csidriver_objects() {
    let examples = csidrivers("examples");
    for under in ["local-driver", "image-driver"] {
        for (name, object) in csidrivers(under) {
            assert_eq!(
                examples.get(&name).map(|e| &e["spec"]),
                Some(&object["spec"]),
                "{name}"
            );
        }
    }
}

/// The `--runtime-endpoint` an overlay adds to the image driver.
fn overlay_runtime_endpoint(overlay: &str) -> String {
    let path = deploy()
        .join("overlays")
        .join(overlay)
        .join("runtime-endpoint.yaml");
    let patch = documents(&std::fs::read_to_string(path).unwrap());
    patch[0][0]["value"].as_str().unwrap().to_string()
}

/// The driver container of a deploy/ DaemonSet.
fn daemonset(dir: &str) -> (DaemonSet, Container) {
    let doc =
        documents(&std::fs::read_to_string(deploy().join(dir).join("daemonset.yaml")).unwrap())
            .remove(0);
    let set: DaemonSet = strict(&doc).unwrap();
    let pod = set.spec.as_ref().unwrap().template.spec.clone().unwrap();
    let container = pod
        .containers
        .into_iter()
        .find(|c| c.name == "driver")
        .unwrap();
    (set, container)
}

/// An absolute path of the node moved under `root`.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// `--flag=/abs/path` and `unix:///abs/path` values moved under `root`; `$(NODE_NAME)` expanded.
fn moved_args(args: &[String], root: &Path) -> Vec<String> {
    args.iter()
        .map(|arg| {
            let arg = arg.replace("$(NODE_NAME)", "node-1");
            match arg.split_once('=') {
                Some((flag, value)) if value.starts_with("unix:///") => {
                    format!(
                        "{flag}=unix://{}",
                        under(root, &value["unix://".len()..]).display()
                    )
                }
                Some((flag, value)) if value.starts_with('/') => {
                    format!("{flag}={}", under(root, value).display())
                }
                _ => arg,
            }
        })
        .collect()
}

/// The value of `--flag=` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
}

/// Every path the driver is given lies inside a volume of its container; the kubelet dir is mounted at
/// its host path with Bidirectional propagation, so its mounts reach the kubelet and the endpoint it
/// registers is the one the kubelet dials.
fn check_mounts(set: &DaemonSet, container: &Container, args: &[String]) {
    let pod = set.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let mounts = container.volume_mounts.clone().unwrap_or_default();
    let host_path = |volume: &str| {
        pod.volumes
            .iter()
            .flatten()
            .find(|v| v.name == volume)
            .and_then(|v| v.host_path.as_ref())
            .map(|h| h.path.clone())
            .unwrap_or_else(|| panic!("volume {volume} is a hostPath"))
    };
    let kubelet_dir = flag(args, "kubelet-dir").unwrap();
    let kubelet = mounts
        .iter()
        .find(|m| m.mount_path == kubelet_dir)
        .expect("the kubelet dir is mounted");
    assert_eq!(
        host_path(&kubelet.name),
        kubelet_dir,
        "mounted at its host path"
    );
    assert_eq!(kubelet.mount_propagation.as_deref(), Some("Bidirectional"));
    for name in [
        "endpoint",
        "runtime-endpoint",
        "state-dir",
        "registration-dir",
    ] {
        let Some(value) = flag(args, name) else {
            continue;
        };
        let path = value.trim_start_matches("unix://");
        assert!(
            mounts
                .iter()
                .any(|m| Path::new(path).starts_with(&m.mount_path)),
            "--{name}={value} is outside every volume of the container"
        );
    }
    let endpoint = flag(args, "endpoint").unwrap();
    assert!(
        endpoint.starts_with(&format!("unix://{kubelet_dir}/plugins/")),
        "{endpoint}"
    );
}

/// A driver process, SIGTERMed on drop.
struct Driver(std::process::Child);

impl Driver {
    fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.0.wait().unwrap()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            self.terminate();
        }
    }
}

async fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the DaemonSet's driver as its args say (paths under a temp dir), probes it with its liveness
/// command, checks its registration socket and CSIDriver, and stops it.
async fn run_daemonset(dir: &str, extra: Option<String>) {
    let (set, container) = daemonset(dir);
    let mut args = container.args.clone().unwrap();
    // The overlays' runtime mounts are checked on the rendered overlays.
    check_mounts(&set, &container, &args);
    args.extend(extra);
    let root = tempfile::tempdir().unwrap();
    let mut moved = moved_args(&args, root.path());
    if !inlet_host::mount::can_mount() {
        println!("{dir}: not root: the driver runs with the recording mounter");
        moved.retain(|a| !a.starts_with("--mounter="));
        moved.push("--mounter=recording".into());
    }
    // The liveness probe asks /healthz on the port `--metrics-address` serves, within its timeoutSeconds.
    let probe = container.liveness_probe.as_ref().unwrap();
    let get = probe.http_get.as_ref().expect("an httpGet liveness probe");
    assert_eq!(get.path.as_deref(), Some("/healthz"));
    let IntOrString::String(port_name) = &get.port else {
        panic!("the probe names its port: {:?}", get.port)
    };
    let port = container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_ref() == Some(port_name))
        .unwrap_or_else(|| panic!("no container port {port_name}"));
    let metrics_address = flag(&moved, "metrics-address").unwrap();
    assert!(
        metrics_address.ends_with(&format!(":{}", port.container_port)),
        "{metrics_address} is not the probe's port {}",
        port.container_port
    );
    let probe_timeout = humantime::parse_duration(flag(&moved, "probe-timeout").unwrap()).unwrap();
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1) as u64);
    assert!(probe_timeout < timeout, "--probe-timeout {probe_timeout:?}");
    // The node's port may be taken on a test machine: a free one.
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    moved.retain(|a| !a.starts_with("--metrics-address="));
    moved.push(format!("--metrics-address=127.0.0.1:{metrics_port}"));
    for dir in ["kubelet-dir", "registration-dir"] {
        std::fs::create_dir_all(flag(&moved, dir).unwrap()).unwrap();
    }
    // The image driver's runtime: cri-fake on the overlay's socket.
    if let Some(endpoint) = flag(&moved, "runtime-endpoint") {
        let socket = PathBuf::from(endpoint.trim_start_matches("unix://"));
        let runtime = Arc::new(
            cri_fake::FakeRuntime::new(root.path().join("cri-fake"), Default::default()).unwrap(),
        );
        let serving = socket.clone();
        tokio::spawn(
            async move { cri_fake::serve(&serving, runtime, std::future::pending()).await },
        );
        wait_for(&socket).await;
    }
    let mut driver = Driver(
        Command::new(BIN)
            .args(&moved)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let name = flag(&moved, "name").unwrap().to_string();
    let endpoint = PathBuf::from(
        flag(&moved, "endpoint")
            .unwrap()
            .trim_start_matches("unix://"),
    );
    let registration =
        Path::new(flag(&moved, "registration-dir").unwrap()).join(format!("{name}-reg.sock"));
    wait_for(&endpoint).await;
    wait_for(&registration).await;

    // The liveness probe as the kubelet sends it, within its timeoutSeconds.
    let address = format!("127.0.0.1:{metrics_port}");
    let asked = http_get(&address, "/healthz");
    let (status, body) = tokio::time::timeout(timeout, asked)
        .await
        .expect("/healthz answers within the probe's timeoutSeconds");
    assert!(status.contains(" 200 "), "/healthz: {status}: {body}");
    assert_eq!(body, "ok");
    // Its exec form, run by the image's binary (deploy/Containerfile).
    let containerfile = std::fs::read_to_string(deploy().join("Containerfile")).unwrap();
    assert!(containerfile.contains("ENTRYPOINT [\"/inlet-plugin\"]"));
    let endpoint_flag = format!("--endpoint=unix://{}", endpoint.display());
    let status = Command::new(BIN)
        .args(["probe", &endpoint_flag])
        .status()
        .unwrap();
    assert!(status.success(), "inlet-plugin probe fails: {status}");

    // The CSIDriver object agrees with the driver.
    let object = &csidrivers(dir)[&name];
    let channel = inlet_proto::uds::connect(&endpoint).await.unwrap();
    let info = csi::identity_client::IdentityClient::new(channel.clone())
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, name);
    let caps = csi::controller_client::ControllerClient::new(channel)
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let attaches = caps.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(csi::controller_service_capability::Type::Rpc(r))
            if r.r#type == csi::controller_service_capability::rpc::Type::PublishUnpublishVolume as i32)
    });
    assert_eq!(
        object["spec"]["attachRequired"].as_bool(),
        Some(attaches),
        "{name}: attachRequired"
    );

    let status = driver.terminate();
    let mut stderr = String::new();
    std::io::Read::read_to_string(driver.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        !registration.exists() && !endpoint.exists(),
        "sockets left behind"
    );
}

/// `GET path` over HTTP/1.0: the status line and the body.
async fn http_get(address: &str, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    (status, body.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_local_driver_daemonset_runs_as_its_args_say() {
    run_daemonset("local-driver", None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_image_driver_daemonset_runs_as_its_args_say_with_each_overlay() {
    for overlay in ["containerd", "crio"] {
        let endpoint = overlay_runtime_endpoint(overlay);
        // The overlay's runtime socket is mounted by the overlay's patch.
        let patch =
            std::fs::read_to_string(deploy().join("overlays").join(overlay).join("runtime.yaml"))
                .unwrap();
        let socket_dir = Path::new(endpoint.trim_start_matches("--runtime-endpoint=unix://"))
            .parent()
            .unwrap();
        assert!(
            patch.contains(&format!("mountPath: {}}}", socket_dir.display())),
            "{overlay}: {endpoint}"
        );
        run_daemonset("image-driver", Some(endpoint)).await;
    }
}

#[test]
fn the_overlays_render_into_strict_objects() {
    let dir = tempfile::tempdir().unwrap();
    // The kit's kubectl (v1.20.2), whose kustomize is the oldest a user may have.
    let Some(kubectl) = kit::unpack("kubectl", dir.path()) else {
        println!("SKIPPED: the kit's kubectl (../shared/kit/bin/kubectl.xz) is not there");
        return;
    };
    for overlay in ["containerd", "crio"] {
        let out = Command::new(&kubectl)
            .arg("kustomize")
            .arg(deploy().join("overlays").join(overlay))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{overlay}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let docs = documents(&String::from_utf8(out.stdout).unwrap());
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds.len(), 6, "{overlay}: {kinds:?}");
        for doc in &docs {
            check_strictly(doc).unwrap_or_else(|e| panic!("{overlay}: {} {e}", doc["kind"]));
        }
        let image = docs
            .iter()
            .find(|d| d["metadata"]["name"] == "inlet-image-driver" && d["kind"] == "DaemonSet")
            .unwrap();
        let set: DaemonSet = strict(image).unwrap();
        let container = &set
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        let args = container.args.clone().unwrap();
        assert_eq!(
            args.last().map(String::as_str),
            Some(overlay_runtime_endpoint(overlay).as_str())
        );
        check_mounts(&set, container, &args);
    }
}
