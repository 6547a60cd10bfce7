//! Steps of the pod status scenarios (`features/init_containers.feature`, `features/pod_status.feature`):
//! the pod's conditions and container statuses as the API has them, and the order containers started in.

use std::time::Duration;

use cucumber::{given, then, when};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};
use kubelet_sim::api::ApiPod;
use kubelet_sim::report::Report;

use super::Sim;

impl Sim {
    /// The pod as the API has it now.
    fn api_pod(&self, name: &str) -> Pod {
        let pods = self.sim().api.list::<ApiPod>();
        let pod = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name));
        pod.unwrap_or_else(|| panic!("no pod {name:?} in the API"))
            .to_pod()
    }
}

fn condition_of(
    r: &Report,
    pod: &str,
    type_: &str,
) -> Option<(String, Option<String>, Option<String>)> {
    let pod = r.pods.iter().find(|p| p.name == pod)?;
    let c = pod.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[then(
    regex = r#"^pod "([^"]+)" has condition "([^"]+)" "(True|False)"(?: with reason "([^"]*)")?(?: and message "(.*)")?$"#
)]
async fn has_condition(
    w: &mut Sim,
    pod: String,
    type_: String,
    status: String,
    reason: String,
    message: String,
) {
    let wanted = (
        status,
        Some(reason).filter(|r| !r.is_empty()),
        Some(message).filter(|m| !m.is_empty()),
    );
    w.wait(
        &format!("pod {pod} has condition {type_} {wanted:?}"),
        |r| condition_of(r, &pod, &type_).as_ref() == Some(&wanted),
    )
    .await;
}

#[then(regex = r#"^pod "([^"]+)" has the conditions "([^"]+)" in this order$"#)]
fn conditions_in_order(w: &mut Sim, pod: String, types: String) {
    let report = w.report();
    let pod = report.pods.iter().find(|p| p.name == pod).expect("pod");
    let seen: Vec<&str> = pod.conditions.iter().map(|c| c.type_.as_str()).collect();
    let wanted: Vec<&str> = types.split(", ").collect();
    assert_eq!(seen, wanted);
}

#[then(regex = r#"^pod "([^"]+)" started its containers in the order "([^"]+)"$"#)]
async fn started_in_order(w: &mut Sim, pod: String, names: String) {
    let wanted: Vec<String> = names
        .split(", ")
        .map(|n| format!("Started container {n}"))
        .collect();
    w.wait(&format!("pod {pod} started {names}"), |r| {
        let Some(p) = r.pods.iter().find(|p| p.name == pod) else {
            return false;
        };
        let started: Vec<&String> = p
            .events
            .iter()
            .filter(|e| e.reason == "Started")
            .map(|e| &e.message)
            .collect();
        started
            .iter()
            .map(|s| s.as_str())
            .eq(wanted.iter().map(String::as_str))
    })
    .await;
}

#[then(regex = r#"^pod "([^"]+)" has an? "([^"]+)" event about (the pod itself|\S+)$"#)]
async fn event_about(w: &mut Sim, pod: String, reason: String, about: String) {
    // An event about the pod itself has no fieldPath.
    let field_path = (about != "the pod itself").then_some(about.clone());
    // From the API's events, which outlive the pod.
    let api = w.sim().api.clone();
    let uid = w.uid(&pod);
    w.wait(
        &format!("pod {pod} has a {reason} event about {about}"),
        |_| {
            api.events_for(&uid).iter().any(|e| {
                e.reason.as_deref() == Some(reason.as_str())
                    && e.involved_object.field_path == field_path
            })
        },
    )
    .await;
}

#[then(regex = r#"^pod "([^"]+)" got no "([^"]+)" event$"#)]
fn no_event(w: &mut Sim, pod: String, reason: String) {
    let report = w.report();
    let events = report
        .pods
        .iter()
        .find(|p| p.name == pod)
        .map(|p| p.events.clone());
    // A pod that is gone has no events left to show: the teardown's record is the API's events.
    let events = events.unwrap_or_else(|| {
        w.sim()
            .api
            .events_for(&w.uid(&pod))
            .into_iter()
            .map(kubelet_sim::report::EventReport::from)
            .collect()
    });
    assert!(!events.iter().any(|e| e.reason == reason), "{events:#?}");
}

#[then(regex = r#"^container "([^"]+)" of pod "([^"]+)" never started$"#)]
fn never_started(w: &mut Sim, name: String, pod: String) {
    let report = w.report();
    let p = report.pods.iter().find(|p| p.name == pod).expect("pod");
    let started = format!("Started container {name}");
    assert!(
        !p.events.iter().any(|e| e.message == started),
        "{:#?}",
        p.events
    );
    assert!(
        !p.containers
            .iter()
            .any(|c| c.name == name && !c.id.is_empty())
    );
}

/// A container's API status, once `done` holds for it.
async fn api_status(
    w: &Sim,
    pod: &str,
    name: &str,
    what: &str,
    done: impl Fn(&ContainerStatus) -> bool,
) {
    let found = |_: &Report| {
        let object = w.api_pod(pod);
        let status = object.status.unwrap_or_default();
        let all = status
            .container_statuses
            .into_iter()
            .flatten()
            .chain(status.init_container_statuses.into_iter().flatten());
        all.into_iter().any(|s| s.name == name && done(&s))
    };
    w.wait(&format!("{pod}/{name} {what}"), found).await;
}

#[then(
    regex = r#"^the API status of container "([^"]+)" of pod "([^"]+)" waits with reason "([^"]+)"(?: and a message starting "(.*)")?$"#
)]
async fn api_waiting(w: &mut Sim, name: String, pod: String, reason: String, message: String) {
    api_status(w, &pod, &name, &format!("waits with {reason}"), |s| {
        s.state
            .as_ref()
            .and_then(|st| st.waiting.as_ref())
            .is_some_and(|wt| {
                wt.reason.as_deref() == Some(&reason)
                    && wt
                        .message
                        .as_deref()
                        .unwrap_or_default()
                        .starts_with(&message)
            })
    })
    .await;
}

#[then(
    regex = r#"^the API status of container "([^"]+)" of pod "([^"]+)" was last terminated with exit code (\d+) and reason "([^"]+)"$"#
)]
async fn api_last_state(w: &mut Sim, name: String, pod: String, code: i32, reason: String) {
    api_status(w, &pod, &name, "has a last state", |s| {
        s.last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .is_some_and(|t| {
                t.exit_code == code
                    && t.reason.as_deref() == Some(&reason)
                    && t.finished_at.is_some()
                    && t.container_id.is_some()
            })
    })
    .await;
}

#[then(
    regex = r#"^the API status of container "([^"]+)" of pod "([^"]+)" is terminated with exit code (\d+) and reason "([^"]+)"(?: saying "(.*)")?$"#
)]
async fn api_terminated(
    w: &mut Sim,
    name: String,
    pod: String,
    code: i32,
    reason: String,
    message: String,
) {
    api_status(
        w,
        &pod,
        &name,
        &format!("is terminated with {reason}"),
        |s| {
            s.state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .is_some_and(|t| {
                    t.exit_code == code
                        && t.reason.as_deref() == Some(&reason)
                        && t.message
                            .as_deref()
                            .unwrap_or_default()
                            .starts_with(&message)
                })
        },
    )
    .await;
}

#[then(
    regex = r#"^the API status of container "([^"]+)" of pod "([^"]+)" runs with a containerID starting "([^"]+)" and an imageID$"#
)]
async fn api_ids(w: &mut Sim, name: String, pod: String, prefix: String) {
    api_status(w, &pod, &name, "runs with ids", |s| {
        s.state
            .as_ref()
            .is_some_and(|st| st.running.as_ref().is_some_and(|r| r.started_at.is_some()))
            && s.container_id
                .as_deref()
                .is_some_and(|id| id.starts_with(&prefix))
            && !s.image_id.is_empty()
    })
    .await;
}

fn transition_time(w: &Sim, pod: &str, type_: &str) -> String {
    let conditions: Vec<PodCondition> = w
        .api_pod(pod)
        .status
        .unwrap_or_default()
        .conditions
        .unwrap_or_default();
    let c = conditions
        .iter()
        .find(|c| c.type_ == type_)
        .expect("the condition");
    serde_json::to_string(&c.last_transition_time).unwrap_or_default()
}

#[then(
    regex = r#"^the condition "([^"]+)" of pod "([^"]+)" keeps its transition time while container "([^"]+)" restarts twice$"#
)]
async fn keeps_transition_time(w: &mut Sim, type_: String, pod: String, name: String) {
    let before = transition_time(w, &pod, &type_);
    let restarts = |r: &Report| {
        r.pods
            .iter()
            .find(|p| p.name == pod)
            .and_then(|p| p.containers.iter().find(|c| c.name == name))
            .map(|c| c.restart_count)
            .unwrap_or_default()
    };
    let start = restarts(&w.report());
    w.wait(&format!("{pod}/{name} restarts twice"), |r| {
        restarts(r) >= start + 2
    })
    .await;
    assert_eq!(transition_time(w, &pod, &type_), before);
}

#[when(
    regex = r#"^another controller sets the condition "([^"]+)" of pod "([^"]+)" to "(True|False)"$"#
)]
fn set_condition(w: &mut Sim, type_: String, pod: String, status: String) {
    let namespace = w.api_pod(&pod).metadata.namespace.unwrap_or_default();
    w.sim().api.update::<ApiPod>(&namespace, &pod, |p| {
        let status_of = p.status.get_or_insert_with(Default::default);
        let conditions = status_of.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != type_);
        conditions.push(PodCondition {
            type_: type_.clone(),
            status: status.clone(),
            ..Default::default()
        });
    });
    // Conditions are rewritten when the node next writes the status: make it write one.
    for node in &w.sim().nodes {
        node.wake();
    }
}

#[given(regex = r"^the kubelet waits (\d+) ms for volumes$")]
fn volume_wait(w: &mut Sim, ms: u64) {
    w.volume_wait = Duration::from_millis(ms);
}

/// For what must not happen: long enough for the kubelet to have done it.
#[when(regex = r"^(\d+) ms pass$")]
async fn time_passes(_: &mut Sim, ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

#[then(regex = r#"^pod "([^"]+)" got no event saying "(.*)"$"#)]
fn no_event_saying(w: &mut Sim, pod: String, text: String) {
    let events = w.sim().api.events_for(&w.uid(&pod));
    assert!(
        !events
            .iter()
            .any(|e| e.message.as_deref().unwrap_or_default().contains(&text)),
        "{events:#?}"
    );
}

#[then(
    regex = r#"^one of pods "([^"]+)" and "([^"]+)" is Running and the other has a Warning "([^"]+)" event saying "(.*)"$"#
)]
async fn one_runs_other_warned(w: &mut Sim, a: String, b: String, reason: String, text: String) {
    let shows = |r: &Report, running: &str, warned: &str| {
        let pod = |name: &str| r.pods.iter().find(|p| p.name == name);
        pod(running).is_some_and(|p| p.phase == "Running")
            && pod(warned).is_some_and(|p| {
                p.phase == "Pending"
                    && p.events.iter().any(|e| {
                        e.type_ == "Warning" && e.reason == reason && e.message.contains(&text)
                    })
            })
    };
    w.wait(
        &format!("one of {a} and {b} runs, the other is refused"),
        |r| shows(r, &a, &b) || shows(r, &b, &a),
    )
    .await;
}

#[then(regex = r#"^no (\w+) for handle "([^"]+)" failed$"#)]
fn no_failed_call(w: &mut Sim, method: String, handle: String) {
    let calls = w.report().csi_calls;
    let failed: Vec<_> = calls
        .iter()
        .filter(|c| c.method == method && c.volume_id == handle && c.code != "OK")
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

#[then(regex = r#"^pod "([^"]+)" has had at least (\d+) "([^"]+)" events$"#)]
async fn event_count(w: &mut Sim, pod: String, times: i32, reason: String) {
    w.wait(&format!("pod {pod} has had {times} {reason} events"), |r| {
        r.pods.iter().any(|p| {
            p.name == pod
                && p.events
                    .iter()
                    .filter(|e| e.reason == reason)
                    .map(|e| e.count)
                    .sum::<i32>()
                    >= times
        })
    })
    .await;
}
