//! Containers after they start, as the kubelet follows them: a periodic relist of the runtime (the PLEG's
//! `relist`, `pleg/generic.go`) finds containers that exited; each is restarted per the pod's
//! `restartPolicy` with the kubelet's crash-loop back-off (`kuberuntime_manager.go` `doBackOff`: the first
//! restart at once, then 10 s doubling to 5 min), or the pod ends `Succeeded` or `Failed` (`getPhase` in
//! `kubelet_pods.go`). A pod that ended stops its sandbox and its volumes are torn down, as a terminal
//! pod's are; it stays in the API until deleted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_proto::runtime::v1 as cri;
use k8s_openapi::api::core::v1::Pod;

use super::Kubelet;
use super::kuberuntime::{ContainerReport, ContainerState};
use super::pod_worker::PodState;
use crate::operations::OpKey;

/// How many log lines the report keeps per container.
const LOG_LINES: usize = 20;

impl Kubelet {
    /// Relists the runtime's exited containers once per relist period, then restarts or ends pods.
    pub(super) async fn relist(self: &Arc<Self>) {
        {
            let mut last = self.last_relist.lock();
            if last.is_some_and(|at| at.elapsed() < self.config.containers.relist_period) {
                return;
            }
            *last = Some(Instant::now());
        }
        if !self.has_running_pods() {
            return;
        }
        let filter = cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerExited as i32,
            }),
            ..Default::default()
        };
        let Ok(exited) = self
            .cri
            .runtime
            .clone()
            .list_containers(cri::ListContainersRequest {
                filter: Some(filter),
            })
            .await
        else {
            return;
        };
        let mut ended: HashMap<String, Vec<cri::Container>> = HashMap::new();
        for container in exited.into_inner().containers {
            if let Some(uid) = container.labels.get("io.kubernetes.pod.uid") {
                ended.entry(uid.clone()).or_default().push(container);
            }
        }
        for pod in self.my_pods() {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            self.sync_containers(&pod, &uid, ended.remove(&uid).unwrap_or_default())
                .await;
        }
    }

    /// Records the exits of one running pod's containers, restarts those due, and settles its phase.
    async fn sync_containers(self: &Arc<Self>, pod: &Pod, uid: &str, exited: Vec<cri::Container>) {
        let policy = restart_policy(pod);
        let (mut containers, sandbox_id) = {
            let pods = self.pods.lock();
            match pods.get(uid) {
                // Work only for a running pod with an exit to record or a restart pending.
                Some(rt)
                    if rt.state == PodState::Running
                        && (!exited.is_empty()
                            || rt.containers.iter().any(|c| c.restart_at.is_some())) =>
                {
                    (rt.containers.clone(), rt.sandbox_id.clone())
                }
                _ => return,
            }
        };
        let mut changed = false;
        for report in containers.iter_mut() {
            let Some(exit) = exited.iter().find(|c| c.id == report.id) else {
                continue;
            };
            if report.state != ContainerState::Running {
                continue;
            }
            changed = true;
            self.record_exit(pod, report, exit).await;
            if restarts(policy, report.exit_code.unwrap_or_default()) {
                let delay = back_off(&self.config.containers.backoff, report.restart_count);
                report.restart_at = Some(Instant::now() + delay);
                if !delay.is_zero() {
                    report.state = ContainerState::Waiting;
                    report.reason = "CrashLoopBackOff".into();
                    self.api.record_event(
                        pod,
                        "Warning",
                        "BackOff",
                        &format!(
                            "Back-off restarting failed container {} in pod {}",
                            report.name,
                            format_pod(pod)
                        ),
                    );
                }
            }
        }
        if let Some(sandbox_id) = sandbox_id {
            for report in containers.iter_mut() {
                if report.restart_at.is_some_and(|at| at <= Instant::now()) {
                    changed |= self.restart(pod, &sandbox_id, report).await;
                }
            }
        }
        if !changed {
            return;
        }
        let phase = phase(policy, &containers);
        if let Some(rt) = self.pods.lock().get_mut(uid) {
            rt.containers = containers.clone();
        }
        self.set_status(pod, &containers, phase);
        if phase != "Running" {
            // A pod that ended: stop its sandbox; its volumes go as a terminated pod's do.
            self.set_state(uid, PodState::Killing);
            let key = OpKey::Pod(uid.to_string());
            let object = Arc::new(pod.clone());
            self.spawn_pod_op(key, uid, PodState::Running, move |me| me.kill(object));
        }
    }

    /// One container's run ended: its exit code, the runtime's reason and the tail of its log.
    async fn record_exit(&self, pod: &Pod, report: &mut ContainerReport, exit: &cri::Container) {
        let status = self
            .cri
            .runtime
            .clone()
            .container_status(cri::ContainerStatusRequest {
                container_id: exit.id.clone(),
                verbose: false,
            })
            .await
            .ok()
            .and_then(|r| r.into_inner().status)
            .unwrap_or_default();
        report.state = ContainerState::Terminated;
        report.exit_code = Some(status.exit_code);
        report.reason = status.reason;
        report.logs = self.log_tail(pod, &report.name, report.restart_count);
    }

    /// Starts the next run of a crashed container, and removes the run before it.
    async fn restart(&self, pod: &Pod, sandbox_id: &str, report: &mut ContainerReport) -> bool {
        let Some(spec) = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .find(|c| c.name == report.name)
        else {
            return false;
        };
        let config = self.sandbox_config(pod);
        match self
            .start_container(pod, spec, sandbox_id, &config, report.restart_count + 1)
            .await
        {
            Ok(next) => {
                let _ = self
                    .cri
                    .runtime
                    .clone()
                    .remove_container(cri::RemoveContainerRequest {
                        container_id: report.id.clone(),
                    })
                    .await;
                *report = ContainerReport {
                    logs: std::mem::take(&mut report.logs),
                    exit_code: report.exit_code,
                    ..next
                };
                true
            }
            Err(e) => {
                self.api
                    .record_event(pod, "Warning", "Failed", &format!("Error: {}", e.message));
                report.restart_at = Some(Instant::now() + self.config.containers.backoff.initial);
                false
            }
        }
    }

    /// The last lines of a container run's CRI log, without the CRI's time and stream prefix.
    fn log_tail(&self, pod: &Pod, container: &str, attempt: u32) -> Vec<String> {
        let dir = self.config.root.join("logs").join(format!(
            "{}_{}_{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default()
        ));
        let Ok(text) = std::fs::read_to_string(dir.join(container).join(format!("{attempt}.log")))
        else {
            return Vec::new();
        };
        let lines: Vec<String> = text
            .lines()
            .map(|line| line.splitn(4, ' ').nth(3).unwrap_or(line).to_string())
            .collect();
        lines[lines.len().saturating_sub(LOG_LINES)..].to_vec()
    }
}

/// `restartPolicy`: Always unless the pod says OnFailure or Never.
fn restart_policy(pod: &Pod) -> &str {
    match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
        Some("OnFailure") => "OnFailure",
        Some("Never") => "Never",
        _ => "Always",
    }
}

/// Whether a container that exited with `code` runs again.
fn restarts(policy: &str, code: i32) -> bool {
    policy == "Always" || (policy == "OnFailure" && code != 0)
}

/// The wait before restart number `restarts + 1`: none for the first, then `initial` doubling to `max`.
fn back_off(policy: &super::BackoffPolicy, restarts: u32) -> Duration {
    match restarts {
        0 => Duration::ZERO,
        n => policy
            .initial
            .saturating_mul(1 << (n - 1).min(16))
            .min(policy.max),
    }
}

/// `getPhase` for a started pod: Running while a container runs or will run again; once all have ended
/// for good, Succeeded when every one exited 0, else Failed.
fn phase(policy: &str, containers: &[ContainerReport]) -> &'static str {
    let all_ended = containers
        .iter()
        .all(|c| c.state == ContainerState::Terminated && c.restart_at.is_none());
    match (policy, all_ended) {
        ("Always", _) | (_, false) => "Running",
        _ if containers.iter().all(|c| c.exit_code == Some(0)) => "Succeeded",
        _ => "Failed",
    }
}

/// `format.Pod`: `name_namespace(uid)`.
fn format_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(code: i32) -> ContainerReport {
        ContainerReport {
            state: ContainerState::Terminated,
            exit_code: Some(code),
            ..Default::default()
        }
    }

    #[test]
    fn phases_follow_the_restart_policy() {
        assert_eq!(phase("Never", &[ended(0), ended(0)]), "Succeeded");
        assert_eq!(phase("Never", &[ended(0), ended(2)]), "Failed");
        assert_eq!(phase("OnFailure", &[ended(0)]), "Succeeded");
        assert_eq!(phase("Always", &[ended(0)]), "Running");
        let mut crashed = ended(1);
        crashed.restart_at = Some(Instant::now());
        assert_eq!(phase("OnFailure", &[crashed]), "Running");
        assert!(restarts("OnFailure", 1) && !restarts("OnFailure", 0) && !restarts("Never", 1));
    }

    #[test]
    fn back_off_doubles_to_its_cap() {
        let policy = crate::node::BackoffPolicy {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
        };
        let waits: Vec<u64> = (0..8).map(|n| back_off(&policy, n).as_secs()).collect();
        assert_eq!(waits, [0, 10, 20, 40, 80, 160, 300, 300]);
    }
}
