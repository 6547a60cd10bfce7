//! Steps about a pod's containers as the runtime holds them: their mounts, their waiting reasons, their
//! ends, their logs and restarts.

use super::*;

/// The mount at `path` of a container, with the pod's directory on its node.
fn container_mount_at(
    w: &Sim,
    pod: &str,
    container: &str,
    path: &str,
) -> (kubelet_sim::node::MountReport, std::path::PathBuf) {
    let report = w.report();
    let pod = report.pods.iter().find(|p| p.name == pod).expect("pod");
    let pod_dir = w
        .dir
        .path()
        .join("root")
        .join(&pod.node)
        .join("pods")
        .join(&pod.uid);
    let mount = container_of(pod, container)
        .mounts
        .iter()
        .find(|m| m.container_path == path)
        .cloned()
        .unwrap_or_else(|| panic!("no mount at {path}"));
    (mount, pod_dir)
}

#[then(regex = r#"^container "([^"]+)" of pod "([^"]+)" mounts "([^"]+)" (read-only|read-write)$"#)]
fn container_mount(w: &mut Sim, container: String, pod: String, path: String, mode: String) {
    let (mount, _) = container_mount_at(w, &pod, &container, &path);
    assert_eq!(mount.readonly, mode == "read-only", "{mount:?}");
    assert!(
        std::path::Path::new(&mount.host_path).exists(),
        "the host path exists: {}",
        mount.host_path
    );
}

#[then(
    regex = r#"^container "([^"]+)" of pod "([^"]+)" mounts "([^"]+)" from its pod's "([^"]+)"$"#
)]
fn container_mount_from(w: &mut Sim, name: String, pod: String, path: String, from: String) {
    let (mount, pod_dir) = container_mount_at(w, &pod, &name, &path);
    assert_eq!(
        std::path::Path::new(&mount.host_path),
        pod_dir.join(from),
        "{mount:?}"
    );
}

#[then(regex = r#"^container "([^"]+)" of pod "([^"]+)" waits with reason "([^"]+)"$"#)]
fn container_waits(w: &mut Sim, name: String, pod: String, reason: String) {
    let c = container(w, &pod, &name);
    assert_eq!(
        (c.state.as_str(), c.reason.as_str()),
        ("waiting", reason.as_str()),
        "{c:#?}"
    );
}

fn container(w: &Sim, pod: &str, container: &str) -> kubelet_sim::node::ContainerReport {
    let report = w.report();
    let pod = report.pods.iter().find(|p| p.name == pod).expect("pod");
    container_of(pod, container).clone()
}

pub(super) fn container_of<'a>(
    pod: &'a kubelet_sim::report::PodReport,
    container: &str,
) -> &'a kubelet_sim::node::ContainerReport {
    pod.containers
        .iter()
        .chain(&pod.init_containers)
        .find(|c| c.name == container)
        .unwrap_or_else(|| panic!("no container {container}: {:#?}", pod.containers))
}

#[then(
    regex = r#"^container "([^"]+)" of pod "([^"]+)" ended with exit code (\d+) and reason "([^"]*)"$"#
)]
fn container_ended(w: &mut Sim, name: String, pod: String, code: i32, reason: String) {
    let c = container(w, &pod, &name);
    assert_eq!(
        (c.state.as_str(), c.exit_code, c.reason.as_str()),
        ("terminated", Some(code), reason.as_str()),
        "{c:#?}"
    );
}

#[then(regex = r#"^the log of container "([^"]+)" of pod "([^"]+)" says "(.*)"$"#)]
fn container_log(w: &mut Sim, name: String, pod: String, line: String) {
    let c = container(w, &pod, &name);
    assert!(c.logs.contains(&line), "{:?}", c.logs);
}

#[then(regex = r#"^container "([^"]+)" of pod "([^"]+)" is restarted at least (\d+) times$"#)]
async fn container_restarts(w: &mut Sim, name: String, pod: String, times: u32) {
    w.wait(&format!("{pod}/{name} restarted {times} times"), |r| {
        r.pods.iter().any(|p| {
            p.name == pod
                && p.containers
                    .iter()
                    .chain(&p.init_containers)
                    .any(|c| c.name == name && c.restart_count >= times)
        })
    })
    .await;
}
