//! Containers after they start, as the kubelet follows them: a periodic relist of the runtime (the PLEG's
//! `relist`, `pleg/generic.go`) finds containers that exited; each is restarted per the pod's
//! `restartPolicy` (a failed init container unless `Never`, a sidecar always) with the kubelet's crash-loop
//! back-off (`kuberuntime_manager.go` `doBackOff` over a `flowcontrol.Backoff`: the first restart at once,
//! then 10 s doubling to 5 min, forgotten after 2 × 5 min without a crash); an init container that
//! completed lets the next start (`computePodActions`); or the pod ends `Succeeded` or `Failed`
//! (`getPhase`, in `status.rs`). A pod that ended stops its sandbox and its volumes are torn down, as a
//! terminal pod's are; it stays in the API until deleted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_proto::runtime::v1 as cri;
use k8s_openapi::api::core::v1::Pod;

use super::Kubelet;
use super::kuberuntime::{ContainerReport, ContainerState, all_containers, next_to_start};
use super::pod_worker::PodState;
use super::status::is_sidecar;
use crate::api::ApiPod;
use crate::operations::{BackoffEntry, BackoffPolicy};

/// True for a running pod with an exit to record, a restart pending, or containers still to start.
fn has_work(pod: &Pod, rt: &super::PodRuntime, exited: bool) -> bool {
    may_have_work(rt, exited)
        && (exited
            || rt.containers.iter().any(|c| c.restart_at.is_some())
            || !next_to_start(pod, &rt.containers).is_empty())
}

/// [`has_work`] from what the node keeps of the pod alone, so that a relist of settled pods reads no
/// pod object: true for every pod `has_work` picks (a container still to start has no report, or one
/// without an ID), and for a few it does not (one whose init container runs).
fn may_have_work(rt: &super::PodRuntime, exited: bool) -> bool {
    rt.state == PodState::Running
        && (exited
            || rt.containers.len() < rt.containers_in_spec
            || rt
                .containers
                .iter()
                .any(|c| c.restart_at.is_some() || c.id.is_empty()))
}

/// How many log lines the report keeps per container.
const LOG_LINES: usize = 20;

impl Kubelet {
    /// Relists the runtime's exited containers once per relist period, then restarts or ends pods.
    pub(super) async fn relist(self: &Arc<Self>) {
        if !super::due(&self.last_relist, self.config.containers.relist_period) {
            return;
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
        let any_work = self
            .pods
            .lock()
            .iter()
            .any(|(uid, rt)| may_have_work(rt, ended.contains_key(uid)));
        if !any_work {
            return;
        }
        // Only the pods `has_work` picks: upstream's relist syncs only the pods whose containers changed
        // (`pleg/generic.go`), so a node's relist does not grow with its settled pods. By name, each read
        // again when its turn comes: while a list of them is held across one pod's calls, a status write
        // to any other makes the API copy it (see `Kubelet::sync`).
        let names: Vec<(String, String)> = {
            let pods = self.my_pods();
            let runtimes = self.pods.lock();
            pods.iter()
                .filter(|pod| {
                    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                    pod.metadata.deletion_timestamp.is_none()
                        && runtimes
                            .get(uid)
                            .is_some_and(|rt| has_work(pod, rt, ended.contains_key(uid)))
                })
                .map(|pod| {
                    let meta = &pod.metadata;
                    let name = meta.name.clone().unwrap_or_default();
                    (meta.namespace.clone().unwrap_or_default(), name)
                })
                .collect()
        };
        for (namespace, name) in names {
            let Some(pod) = self.api.peek::<ApiPod>(&namespace, &name) else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            self.sync_containers(&pod, &uid, ended.remove(&uid).unwrap_or_default())
                .await;
        }
    }

    /// Records the exits of one running pod's containers, restarts those due, starts what comes next, and
    /// settles its phase.
    async fn sync_containers(
        self: &Arc<Self>,
        pod: &Arc<ApiPod>,
        uid: &str,
        exited: Vec<cri::Container>,
    ) {
        let (mut containers, sandbox_id) = {
            let pods = self.pods.lock();
            match pods.get(uid) {
                Some(rt) if has_work(pod, rt, !exited.is_empty()) => {
                    (rt.containers.clone(), rt.sandbox_id.clone())
                }
                _ => return,
            }
        };
        let mut changed = false;
        for report in containers.iter_mut() {
            if !exited.iter().any(|c| c.id == report.id) {
                continue;
            }
            if report.state != ContainerState::Running {
                continue;
            }
            changed = true;
            self.record_exit(pod, report).await;
            if will_restart(pod, report) {
                let delay = restart_delay(&self.config.containers.backoff, report.backoff);
                report.restart_at = Some(Instant::now() + delay);
                if !delay.is_zero() {
                    self.back_off(pod, report, delay);
                }
            }
        }
        if let Some(sandbox_id) = sandbox_id {
            // A container that ran is restarted; one never created is `start_next`'s.
            for report in containers.iter_mut().filter(|r| !r.id.is_empty()) {
                if report.restart_at.is_some_and(|at| at <= Instant::now()) {
                    changed |= self.restart(pod, &sandbox_id, report).await;
                }
            }
            let config = self.sandbox_config(pod);
            changed |= self
                .start_next(pod, &sandbox_id, &config, &mut containers)
                .await;
        }
        if !changed {
            return;
        }
        if let Some(rt) = self.pods.lock().get_mut(uid) {
            rt.containers = containers.clone();
        }
        let phase = self.set_status(pod, &containers, done_for_good(pod, &containers));
        if matches!(phase, "Succeeded" | "Failed") {
            // A pod that ended: stop its sandbox; its volumes go as a terminated pod's do.
            self.spawn_kill(uid, PodState::Running, Arc::clone(pod));
        }
    }

    /// A crashed container waits out its back-off: `CrashLoopBackOff` with `doBackOff`'s message, and the
    /// `BackOff` event.
    fn back_off(&self, pod: &Pod, report: &mut ContainerReport, delay: Duration) {
        report.last_state = Some(report.run());
        report.state = ContainerState::Waiting;
        report.reason = "CrashLoopBackOff".into();
        report.message = format!(
            "back-off {} restarting failed container={} pod={}",
            go_duration(delay),
            report.name,
            format_pod(pod)
        );
        self.api.record_container_event(
            pod,
            &report.name,
            "Warning",
            "BackOff",
            &format!(
                "Back-off restarting failed container {} in pod {}",
                report.name,
                format_pod(pod)
            ),
        );
    }

    /// One container's run ended: its exit code, the runtime's reason and the tail of its log.
    pub(super) async fn record_exit(&self, pod: &Pod, report: &mut ContainerReport) {
        let status = self
            .cri
            .runtime
            .clone()
            .container_status(cri::ContainerStatusRequest {
                container_id: report.id.clone(),
                verbose: false,
            })
            .await
            .ok()
            .and_then(|r| r.into_inner().status)
            .unwrap_or_default();
        report.state = ContainerState::Terminated;
        report.exit_code = Some(status.exit_code);
        report.reason = status.reason;
        report.message = status.message;
        report.finished_at = super::kuberuntime::api_time(status.finished_at);
        report.logs = self.log_tail(pod, &report.name, report.restart_count);
    }

    /// Starts the next run of a crashed container, and removes the run before it.
    async fn restart(&self, pod: &ApiPod, sandbox_id: &str, report: &mut ContainerReport) -> bool {
        let Some(spec) = all_containers(pod).find(|c| c.name == report.name) else {
            return false;
        };
        let config = self.sandbox_config(pod);
        let attempt = report.restart_count + 1;
        let volumes = Box::pin(self.image_volumes(pod, &config)).await;
        match self
            .start_container(pod, spec, sandbox_id, &config, &volumes, attempt)
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
                // A container restarted at once is still terminated; one that waited out its back-off
                // already keeps its last run.
                let last_state = match report.state {
                    ContainerState::Terminated => Some(report.run()),
                    _ => report.last_state.take(),
                };
                *report = ContainerReport {
                    logs: std::mem::take(&mut report.logs),
                    exit_code: report.exit_code,
                    init: report.init,
                    last_state,
                    backoff: Some(self.config.containers.backoff.next(report.backoff)),
                    ..next
                };
                true
            }
            Err(e) => {
                let event = format!("Error: {}", e.event());
                self.api
                    .record_container_event(pod, &report.name, "Warning", "Failed", &event);
                // It waits with the error's reason, and is tried again after the pod workers' back-off.
                if report.state == ContainerState::Terminated {
                    report.last_state = Some(report.run());
                }
                report.state = ContainerState::Waiting;
                report.reason = e.reason.into();
                report.message = e.message;
                report.restart_at = Some(Instant::now() + self.config.containers.backoff.initial);
                true
            }
        }
    }

    /// The last lines of a container run's CRI log, without the CRI's time and stream prefix.
    fn log_tail(&self, pod: &Pod, container: &str, attempt: u32) -> Vec<String> {
        let dir = self.pod_log_dir(pod);
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

/// Whether `report`'s container, which just exited, runs again: a sidecar always; a regular init container
/// that failed, unless the pod's policy is `Never`; a regular container per the policy.
fn will_restart(pod: &Pod, report: &ContainerReport) -> bool {
    let policy = restart_policy(pod);
    let code = report.exit_code.unwrap_or_default();
    match all_containers(pod).find(|c| c.name == report.name) {
        Some(c) if report.init && is_sidecar(c) => true,
        Some(_) if report.init => policy != "Never" && code != 0,
        _ => restarts(policy, code),
    }
}

/// The wait before the next run (`IsInBackOffSince`): none for the first restart or after a long run
/// (the entry was forgotten), else the entry's delay.
fn restart_delay(policy: &BackoffPolicy, entry: Option<BackoffEntry>) -> Duration {
    policy.live(entry).map_or(Duration::ZERO, |e| e.delay)
}

/// True when none of the pod's regular containers will run again (`podIsTerminal` for a started pod).
fn done_for_good(pod: &Pod, containers: &[ContainerReport]) -> bool {
    let regular = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    regular.iter().all(|c| {
        containers.iter().any(|r| {
            r.name == c.name && r.state == ContainerState::Terminated && r.restart_at.is_none()
        })
    })
}

/// Go's `time.Duration` text, to the millisecond (back-off messages, pull times): `10s`, `1m20s`,
/// `5m0s`, `500ms`, `1.5s`.
pub(super) fn go_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let millis = d.as_millis();
    let (minutes, rest) = (millis / 60_000, millis % 60_000);
    let seconds = if rest % 1000 == 0 {
        format!("{}s", rest / 1000)
    } else {
        let text = format!("{}.{:03}", rest / 1000, rest % 1000);
        format!("{}s", text.trim_end_matches('0'))
    };
    match minutes {
        0 => seconds,
        m => format!("{m}m{seconds}"),
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

    #[test]
    fn restarts_follow_the_restart_policy() {
        assert!(restarts("OnFailure", 1) && !restarts("OnFailure", 0) && !restarts("Never", 1));
        assert!(restarts("Always", 0));
    }

    #[test]
    fn back_off_doubles_to_its_cap_and_is_forgotten_after_twice_the_cap() {
        let policy = BackoffPolicy {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
        };
        let mut entry = None;
        let mut waits = Vec::new();
        for _ in 0..8 {
            waits.push(restart_delay(&policy, entry).as_secs());
            entry = Some(policy.next(entry));
        }
        assert_eq!(waits, [0, 10, 20, 40, 80, 160, 300, 300]);
        let long_ago = Some(BackoffEntry {
            delay: policy.max,
            updated: Instant::now() - Duration::from_secs(601),
        });
        assert_eq!(restart_delay(&policy, long_ago), Duration::ZERO);
        assert_eq!(policy.next(long_ago).delay, policy.initial);
    }

    #[test]
    fn durations_read_as_go_prints_them() {
        let texts: Vec<String> = [500, 10_000, 80_000, 300_000, 1_500]
            .map(|ms| go_duration(Duration::from_millis(ms)))
            .to_vec();
        assert_eq!(texts, ["500ms", "10s", "1m20s", "5m0s", "1.5s"]);
    }
}
