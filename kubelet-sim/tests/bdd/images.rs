//! Steps of the image volume scenarios (`features/image_volumes*.feature`): images built by code into OCI
//! layouts for cri-fake, a private `docker-registry` behind basic auth, the image driver, pull timing, and
//! checks on what a container sees through its mounts.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use cri_fake::faults::Fault;
use cri_fake::layout::{ImageBuilder, push};
use cri_fake::registry::LocalRegistry;
use cucumber::gherkin::Step;
use cucumber::{given, then, when};
use inlet_host::mount::can_mount;
use inlet_image::pull::VerificationPolicy;
use oci_client::secrets::RegistryAuth;

use super::Sim;

/// The placeholder scenarios write for the private registry's `HOST:PORT`.
pub const REGISTRY_PLACEHOLDER: &str = "$REGISTRY";

fn files(step: &Step) -> ImageBuilder {
    let mut image = ImageBuilder::new();
    for row in step
        .table
        .as_ref()
        .map(|t| &t.rows[1..])
        .unwrap_or_default()
    {
        match row[0].as_str() {
            "(new layer)" => image = image.layer(),
            annotation if annotation.starts_with("(annotation) ") => {
                image = image.annotation(&annotation["(annotation) ".len()..], &row[1])
            }
            path if row[1] == "(deleted)" => image = image.remove(path),
            program if program.starts_with("(executable) ") => {
                let body = row[1].replace("\\n", "\n");
                image = image.file_with_mode(&program["(executable) ".len()..], body, 0o755)
            }
            path => image = image.file(path, row[1].replace("\\n", "\n")),
        }
    }
    image
}

fn split(reference: &str) -> (&str, &str) {
    reference
        .rsplit_once(':')
        .expect("an image reference with a tag")
}

#[given(regex = r#"^an image "([^"]+)" with files:$"#)]
fn image_with_files(w: &mut Sim, reference: String, step: &Step) {
    add_layout(w, &reference, files(step));
}

#[given(regex = r#"^an image "([^"]+)" with no layers$"#)]
fn image_without_layers(w: &mut Sim, reference: String) {
    add_layout(w, &reference, ImageBuilder::new());
}

fn add_layout(w: &mut Sim, reference: &str, image: ImageBuilder) {
    let (repository, tag) = split(reference);
    let dir = w
        .dir
        .path()
        .join("layouts")
        .join(w.images.layouts.len().to_string());
    image
        .write_layout(&dir, tag)
        .expect("the layout is written");
    w.images.layouts.push((repository.to_string(), dir));
}

#[given(regex = r#"^the image driver "([^"]+)"$"#)]
fn image_driver(w: &mut Sim, name: String) {
    w.drivers
        .push(format!("{name}=image").parse().expect("driver"));
}

#[given(regex = r"^the image pull credentials verification policy is (\w+)$")]
fn verification_policy(w: &mut Sim, policy: String) {
    w.images.verification = <VerificationPolicy as clap::ValueEnum>::from_str(&policy, false)
        .expect("a verification policy");
}

#[given(regex = r#"^the preloaded images verification allowlist is "([^"]*)"$"#)]
fn verification_allowlist(w: &mut Sim, list: String) {
    let address = w.registry.as_ref().map(|(r, ..)| r.address.clone());
    let list = list.replace(REGISTRY_PLACEHOLDER, &address.unwrap_or_default());
    let entries: Vec<String> = list
        .split(',')
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    w.images.allowlist =
        inlet_image::allowlist::Allowlist::parse(&entries).expect("a valid allowlist");
}

#[given(regex = r"^one mount attempt waits at most (\d+)ms for a pull$")]
fn pull_wait(w: &mut Sim, ms: u64) {
    w.images.pull_wait = Duration::from_millis(ms);
}

#[given(regex = r"^the runtime takes (\d+)ms to pull an image$")]
fn slow_pulls(w: &mut Sim, ms: u64) {
    let delay = Fault {
        delay: Some(Duration::from_millis(ms)),
        ..Default::default()
    };
    w.faults.push(("PullImage".into(), delay));
}

#[given(regex = r"^the runtime hangs (\d+)ms in (\w+) once$")]
fn runtime_hangs_once(w: &mut Sim, ms: u64, method: String) {
    let delay = Fault {
        delay: Some(Duration::from_millis(ms)),
        times: Some(1),
        ..Default::default()
    };
    w.faults.push((method, delay));
}

#[given(regex = r"^the runtime fails (\w+) with (\w+)$")]
fn runtime_fails(w: &mut Sim, method: String, code: String) {
    let fault = cri_fake::faults::parse_error_flag(&format!("{method}={code}:connection refused"))
        .expect("a CRI method and a gRPC code");
    w.faults.push(fault);
}

#[given(regex = r#"^a private registry with user "([^"]+)" and password "([^"]+)"$"#)]
fn private_registry(w: &mut Sim, user: String, password: String) {
    let registry = LocalRegistry::start(&w.dir.path().join("registry"), Some((&user, &password)))
        .expect(
            "docker-registry starts (scenarios tagged @registry run only when it is installed)",
        );
    w.images.insecure_registries.push(registry.address.clone());
    w.registry = Some((registry, user, password));
}

#[given(regex = r#"^the registry holds image "([^"]+)" with files:$"#)]
async fn registry_image(w: &mut Sim, reference: String, step: &Step) {
    let (registry, user, password) = w.registry.as_ref().expect("a private registry");
    let reference = reference.replace(REGISTRY_PLACEHOLDER, &registry.address);
    let image = files(step).build().expect("the image builds");
    push(
        &image,
        &reference.parse().expect("reference"),
        &RegistryAuth::Basic(user.clone(), password.clone()),
        std::slice::from_ref(&registry.address),
    )
    .await
    .expect("the image is pushed");
}

#[given(regex = r#"^the registry holds artifact "([^"]+)" with files:$"#)]
async fn registry_artifact(w: &mut Sim, reference: String, step: &Step) {
    use oci_client::client::{Config, ImageLayer};
    let (registry, user, password) = w.registry.as_ref().expect("a private registry");
    let reference = reference.replace(REGISTRY_PLACEHOLDER, &registry.address);
    let layers: Vec<ImageLayer> = step
        .table
        .as_ref()
        .map(|t| &t.rows[1..])
        .unwrap_or_default()
        .iter()
        .map(|row| {
            let title = std::collections::BTreeMap::from([(
                inlet_image::artifact::TITLE_ANNOTATION.to_string(),
                row[0].clone(),
            )]);
            ImageLayer::new(
                row[1].clone().into_bytes(),
                "application/vnd.example.data.v1".into(),
                Some(title),
            )
        })
        .collect();
    let config = Config::new(
        b"{}".to_vec(),
        "application/vnd.example.config.v1+json".into(),
        None,
    );
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::HttpsExcept(vec![registry.address.clone()]),
        ..Default::default()
    });
    client
        .push(
            &reference.parse().expect("reference"),
            &layers,
            config,
            &RegistryAuth::Basic(user.clone(), password.clone()),
            None,
        )
        .await
        .expect("the artifact is pushed");
}

#[given(
    regex = r#"^a pull secret "([^"/]+)/([^"]+)" for the registry with user "([^"]+)" and password "([^"]+)"$"#
)]
fn pull_secret(w: &mut Sim, namespace: String, name: String, user: String, password: String) {
    let (registry, ..) = w.registry.as_ref().expect("a private registry");
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let config = format!(
        r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#,
        registry.address
    );
    let data = base64::engine::general_purpose::STANDARD.encode(config);
    w.manifests.push(format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: kubernetes.io/dockerconfigjson\ndata: {{.dockerconfigjson: {data}}}\n"
    ));
}

/// Injects the scenario's runtime faults once cri-fake runs.
pub fn after_start(w: &Sim) {
    for (_, runtime) in w.sim().cri_fakes() {
        for (method, fault) in &w.faults {
            runtime.set_fault(method, fault.clone());
        }
    }
}

// ---- what containers see ----

/// The host path behind `container_path` in pod `pod`'s first container that mounts it.
pub(super) fn host_path(w: &Sim, pod: &str, container_path: &str) -> PathBuf {
    let report = w.report();
    let mount = report
        .pods
        .iter()
        .filter(|p| p.name == pod)
        .flat_map(|p| &p.containers)
        .flat_map(|c| &c.mounts)
        .find(|m| m.container_path == container_path)
        .unwrap_or_else(|| panic!("pod {pod} mounts nothing at {container_path}"));
    PathBuf::from(&mount.host_path)
}

pub(super) fn content_visible(what: &str) -> bool {
    if can_mount() {
        return true;
    }
    println!("SKIPPED (not root, no real mounts): {what}");
    false
}

#[then(regex = r#"^pod "([^"]+)" reads "(.+)" at "([^"]+)"$"#)]
fn reads(w: &mut Sim, pod: String, text: String, path: String) {
    let (mount, file) = split_mount(&path);
    if !content_visible(&format!("pod {pod} reads {path}")) {
        return;
    }
    let host = host_path(w, &pod, mount).join(file);
    let body = std::fs::read_to_string(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    assert_eq!(body.trim_end(), text.replace("\\n", "\n").trim_end());
}

#[then(regex = r#"^pod "([^"]+)" runs "([^"]+)", which prints "(.*)"$"#)]
fn runs_program(w: &mut Sim, pod: String, path: String, expected: String) {
    let (mount, file) = split_mount(&path);
    if !content_visible(&format!("pod {pod} runs {path}")) {
        return;
    }
    // Executed through the volume's own mount, as the container's exec would be: a noexec mount refuses it.
    let host = host_path(w, &pod, mount).join(file);
    let out = std::process::Command::new(&host)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", host.display()));
    assert!(out.status.success(), "{}: {out:?}", host.display());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), expected);
}

#[then(regex = r#"^pod "([^"]+)" finds no "([^"]+)"$"#)]
fn finds_no(w: &mut Sim, pod: String, path: String) {
    let (mount, file) = split_mount(&path);
    if !content_visible(&format!("pod {pod} finds no {path}")) {
        return;
    }
    let host = host_path(w, &pod, mount).join(file);
    assert!(
        host.symlink_metadata().is_err(),
        "{} exists",
        host.display()
    );
}

#[then(regex = r#"^the file "([^"]+)" of pod "([^"]+)" has mode (\d+)$"#)]
fn file_mode(w: &mut Sim, path: String, pod: String, mode: String) {
    let (mount, file) = split_mount(&path);
    let host = host_path(w, &pod, mount).join(file);
    let found = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&host)
            .unwrap_or_else(|e| panic!("{}: {e}", host.display()))
            .permissions(),
    ) & 0o7777;
    assert_eq!(format!("{found:o}"), mode, "{}", host.display());
}

#[then(regex = r#"^"([^"]+)" of pod "([^"]+)" is on a tmpfs$"#)]
fn on_tmpfs(w: &mut Sim, mount: String, pod: String) {
    if !content_visible(&format!("{mount} of pod {pod} is on a tmpfs")) {
        return;
    }
    let host = host_path(w, &pod, &mount);
    let fs = nix::sys::statfs::statfs(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    assert_eq!(
        fs.filesystem_type(),
        nix::sys::statfs::TMPFS_MAGIC,
        "{}",
        host.display()
    );
}

#[when(regex = r#"^pod "([^"]+)" writes "([^"]+)" to "([^"]+)"$"#)]
fn writes(w: &mut Sim, pod: String, text: String, path: String) {
    let (mount, file) = split_mount(&path);
    if !content_visible(&format!("pod {pod} writes {path}")) {
        return;
    }
    let host = host_path(w, &pod, mount).join(file);
    std::fs::write(&host, text).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
}

#[when(regex = r#"^pod "([^"]+)" makes "([^"]+)" a symlink to "([^"]+)"$"#)]
fn makes_symlink(w: &mut Sim, pod: String, path: String, to: String) {
    let (mount, file) = split_mount(&path);
    if !content_visible(&format!("pod {pod} makes {path} a symlink")) {
        return;
    }
    let host = host_path(w, &pod, mount).join(file);
    std::os::unix::fs::symlink(&to, &host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
}

#[when(regex = r#"^a process holds "([^"]+)" open in pod "([^"]+)"$"#)]
fn holds_open(w: &mut Sim, path: String, pod: String) {
    let (mount, file) = split_mount(&path);
    if !content_visible(&format!("a process holds {path} open in pod {pod}")) {
        return;
    }
    let host = host_path(w, &pod, mount).join(file);
    let open = std::fs::File::create(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    w.held.push(open);
}

#[when(regex = r"^the process lets go of its files$")]
fn lets_go(w: &mut Sim) {
    w.held.clear();
}

#[then(regex = r#"^pod "([^"]+)" cannot write to "([^"]+)"$"#)]
fn cannot_write(w: &mut Sim, pod: String, path: String) {
    let (mount, file) = split_mount(&path);
    if !content_visible(&format!("pod {pod} cannot write {path}")) {
        return;
    }
    let host = host_path(w, &pod, mount).join(file);
    let err = std::fs::write(&host, "x").expect_err("the write is refused");
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
}

/// `/mount/path:file/in/it` -> (`/mount/path`, `file/in/it`).
pub(super) fn split_mount(path: &str) -> (&str, &str) {
    path.split_once(':')
        .expect("write MOUNT_PATH:FILE, for example /data:hello.txt")
}

// ---- engine state ----

#[then(regex = r#"^node "([^"]+)" holds (\d+) shared read-only image mounts?$"#)]
fn shared_mounts(w: &mut Sim, node: String, count: usize) {
    let plugins = w.dir.path().join("root").join(&node).join("plugins");
    // The in-tree plugin's state, and each image driver's.
    let mut states = vec![plugins.join("kubernetes.io/image")];
    for driver in std::fs::read_dir(&plugins).into_iter().flatten().flatten() {
        states.push(driver.path().join("state"));
    }
    let found: Vec<PathBuf> = states
        .iter()
        .flat_map(|s| [s.join("images"), s.join("artifacts/images")])
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.join("rootfs").exists())
        .collect();
    assert_eq!(found.len(), count, "{found:#?}");
}

#[then(regex = r#"^the runtime got PullImage for "([^"]+)" (\d+) times?$"#)]
fn pulls(w: &mut Sim, reference: String, count: usize) {
    let reference = match &w.registry {
        Some((registry, ..)) => reference.replace(REGISTRY_PLACEHOLDER, &registry.address),
        None => reference,
    };
    let all: Vec<_> = w
        .sim()
        .cri_fakes()
        .flat_map(|(_, runtime)| runtime.calls())
        .collect();
    let calls: Vec<_> = all
        .iter()
        .filter(|c| c.method == "PullImage" && *c.subject == *reference)
        .collect();
    assert_eq!(calls.len(), count, "{all:#?}");
}

/// Replaces the registry placeholder in manifests.
pub fn resolve(w: &Sim, yaml: &str) -> String {
    match &w.registry {
        Some((registry, ..)) => yaml.replace(REGISTRY_PLACEHOLDER, &registry.address),
        None => yaml.to_string(),
    }
}

/// True when the scenarios tagged `@registry` can run here.
pub fn registry_available() -> bool {
    LocalRegistry::available()
}

/// A node's pulled-image records (KEP-2535), where the kubelet keeps them.
fn pulled_records(w: &Sim, node: &str) -> Vec<PathBuf> {
    let dir = w
        .dir
        .path()
        .join("root")
        .join(node)
        .join("image_manager/pulled");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(!files.is_empty(), "no record in {}", dir.display());
    files
}

#[when(regex = r#"^the pulled-image records of node "([^"]+)" are overwritten with garbage$"#)]
fn corrupt_pull_records(w: &mut Sim, node: String) {
    for path in pulled_records(w, &node) {
        std::fs::write(&path, b"\0garbage").unwrap();
    }
}

#[then(regex = r#"^the pulled-image records of node "([^"]+)" are left as they were$"#)]
fn pull_records_left(w: &mut Sim, node: String) {
    for path in pulled_records(w, &node) {
        let text = std::fs::read(&path).unwrap();
        assert_eq!(text, b"\0garbage", "{}", path.display());
    }
}
