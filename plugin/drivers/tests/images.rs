//! The images `deploy/build-images.sh` builds: `target/images/inlet-plugin.tar` runs under podman, and its
//! container, started with `testcontainers` against podman's Docker-compatible API (`podman system
//! service`, started here: there is no Docker engine), serves CSI on a socket in a mounted directory,
//! answers Probe and GetPluginInfo, and exits 0 on `stop` (SIGTERM), removing its socket.
//!
//! Needs root and podman, and builds the archive with `build-images.sh` when it is missing; otherwise it
//! says SKIPPED.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inlet_proto::csi::v1::{GetPluginInfoRequest, ProbeRequest, identity_client::IdentityClient};
use testcontainers::core::{Mount, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{GenericImage, ImageExt};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The archive of `name`, built when missing; Err says why it cannot be.
fn archive(name: &str) -> Result<PathBuf, String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("not root (podman's rootful storage)".into());
    }
    inlet_testkit::images::archive(name)
}

/// podman's rlimit defaults (nofile 1048576) exceed this sandbox's hard limits (no CAP_SYS_RESOURCE):
/// containers get the limits this process has instead.
fn ulimits() -> Vec<String> {
    // The hard limit, from `Max open files  SOFT  HARD  files`.
    let nofile = std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4)?.parse::<u64>().ok())
        .map_or(1024, |hard| hard.min(65536));
    vec![
        format!("--ulimit=nofile={nofile}:{nofile}"),
        "--ulimit=nproc=4096:4096".into(),
    ]
}

#[test]
fn the_archives_run_under_podman() {
    for name in ["inlet-plugin", "kubelet-sim"] {
        // The kubelet-sim image is checked when it was built (`deploy/build-images.sh` builds both; in the
        // test command, kubelet-sim's hollow-node test builds it, after this one).
        let built = repo().join(format!("target/images/{name}.tar"));
        if name == "kubelet-sim" && !built.exists() {
            println!("SKIPPED the kubelet-sim image: not built (run deploy/build-images.sh)");
            continue;
        }
        let archive = match archive(name) {
            Ok(archive) => archive,
            Err(why) => return println!("SKIPPED image test: {why}"),
        };
        let out = Command::new("podman")
            .args(["run", "--rm"])
            .args(ulimits())
            .arg(format!("oci-archive:{}", archive.display()))
            .arg("--version")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.trim() == format!("{name} {VERSION}"),
            "{name}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `podman system service` on a socket of the test's, stopped on drop.
struct PodmanService(Child);

impl Drop for PodmanService {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Set (with `DOCKER_HOST`) in the copy of this test binary that talks to podman's API: testcontainers
/// reads the Docker host from the environment, which this process (edition 2024, no unsafe code) cannot
/// change for itself.
const IN_CHILD: &str = "INLET_TEST_PODMAN_API";

#[test]
fn the_driver_container_serves_csi_on_a_mounted_socket() {
    if std::env::var_os(IN_CHILD).is_some() {
        return serve_csi_from_the_container();
    }
    let archive = match archive("inlet-plugin") {
        Ok(archive) => archive,
        Err(why) => return println!("SKIPPED image test: {why}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let load = Command::new("podman")
        .args(["load", "--quiet", "-i"])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stderr)
    );
    // The service's containers get this sandbox's limits (see `ulimits`), through containers.conf.
    let conf = dir.path().join("containers.conf");
    let limits: Vec<String> = ulimits()
        .iter()
        .map(|u| format!("{:?}", u.trim_start_matches("--ulimit=")))
        .collect();
    std::fs::write(
        &conf,
        format!("[containers]\ndefault_ulimits = [{}]\n", limits.join(", ")),
    )
    .unwrap();
    let api = dir.path().join("podman.sock");
    let _service = PodmanService(
        Command::new("podman")
            .env("CONTAINERS_CONF", &conf)
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", api.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !api.exists() {
        assert!(
            Instant::now() < deadline,
            "podman system service never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "the_driver_container_serves_csi_on_a_mounted_socket",
            "--exact",
            "--nocapture",
        ])
        .env(IN_CHILD, dir.path())
        .env("DOCKER_HOST", format!("unix://{}", api.display()))
        .output()
        .unwrap();
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && output.contains("1 passed"),
        "{output}"
    );
}

/// The container started through podman's API (`DOCKER_HOST`), its socket in `$IN_CHILD/csi`.
fn serve_csi_from_the_container() {
    let csi = PathBuf::from(std::env::var_os(IN_CHILD).unwrap()).join("csi");
    std::fs::create_dir_all(&csi).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let container = GenericImage::new("localhost/inlet-plugin", VERSION)
            .with_wait_for(WaitFor::message_on_stderr("serving CSI"))
            .with_mount(Mount::bind_mount(csi.display().to_string(), "/csi"))
            .with_cmd([
                "serve",
                "--driver=local",
                "--name=local.inlet.dev",
                "--node-id=container",
                "--endpoint=unix:///csi/csi.sock",
                "--kubelet-dir=/csi",
                "--state-dir=/state",
                "--mounter=recording",
            ])
            .with_startup_timeout(Duration::from_secs(60))
            .start()
            .await
            .expect("the container starts");
        let channel = inlet_proto::uds::connect(&csi.join("csi.sock"))
            .await
            .expect("the socket in the mounted dir");
        let mut identity = IdentityClient::new(channel);
        let probe = identity.probe(ProbeRequest {}).await.unwrap().into_inner();
        assert_ne!(probe.ready, Some(false));
        let info = identity
            .get_plugin_info(GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (info.name.as_str(), info.vendor_version.as_str()),
            ("local.inlet.dev", VERSION)
        );
        container.stop_with_timeout(Some(10)).await.unwrap();
        assert_eq!(
            container.exit_code().await.unwrap(),
            Some(0),
            "a clean stop"
        );
        container.rm().await.unwrap();
    });
    assert!(
        !csi.join("csi.sock").exists(),
        "the socket is removed on stop"
    );
}
