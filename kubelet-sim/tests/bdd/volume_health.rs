//! Steps about the stats provider: how often it polls, the stats a node keeps for each pod volume, and a
//! local driver's volume whose content goes missing (the driver then reports it abnormal).

use std::time::Duration;

use cucumber::{given, then, when};

use super::{Sim, WAIT};

#[given(regex = r"^the kubelet asks for volume stats every (\d+) ms$")]
fn stats_period(w: &mut Sim, millis: u64) {
    w.stats_period = Duration::from_millis(millis);
}

#[when(regex = r#"^the driver "([^"]+)" loses the content of "([^"]+)" in pod "([^"]+)"$"#)]
fn loses_content(w: &mut Sim, driver: String, volume: String, pod: String) {
    let id = w.publish_of(&pod, &volume).volume_id;
    let content = w
        .dir
        .path()
        .join("root/node-1/plugins")
        .join(driver)
        .join("state/volumes")
        .join(id);
    std::fs::remove_dir_all(&content).unwrap_or_else(|e| panic!("{}: {e}", content.display()));
}

/// Waits until the node's last stats of the pod's volume satisfy `done`.
async fn stats_until(
    w: &Sim,
    pod: &str,
    volume: &str,
    what: &str,
    done: impl Fn(&inlet_volume::Metrics) -> bool,
) {
    let node = w.sim().node("node-1").expect("node-1");
    let uid = w.uid(pod);
    let seen =
        |_: &kubelet_sim::sim::Simulation| node.volume_stats(&uid).get(volume).is_some_and(&done);
    if !w.sim().wait_for(WAIT, seen).await {
        panic!(
            "timed out waiting until the stats of {volume} in pod {pod} {what}: {:?}",
            node.volume_stats(&uid)
        );
    }
}

#[then(regex = r#"^the stats of "([^"]+)" in pod "([^"]+)" are (not abnormal|abnormal)$"#)]
async fn stats_condition(w: &mut Sim, volume: String, pod: String, condition: String) {
    let abnormal = condition == "abnormal";
    stats_until(w, &pod, &volume, &format!("are {condition}"), |m| {
        m.abnormal == Some(abnormal) && m.capacity.is_some()
    })
    .await;
}

#[then(regex = r#"^the stats of "([^"]+)" in pod "([^"]+)" have no condition$"#)]
async fn no_condition(w: &mut Sim, volume: String, pod: String) {
    stats_until(w, &pod, &volume, "have no condition", |m| {
        m.abnormal.is_none() && m.capacity.is_some()
    })
    .await;
}

#[when(regex = r#"^the kubelet asks for the stats of "([^"]+)" in pod "([^"]+)" again$"#)]
async fn asked_again(w: &mut Sim, volume: String, pod: String) {
    let before = w.calls_for("NodeGetVolumeStats", &pod, &volume).len();
    w.wait("NodeGetVolumeStats is called again", |r| {
        let dir = format!("/volumes/kubernetes.io~csi/{volume}/mount");
        let asked = r
            .csi_calls
            .iter()
            .filter(|c| c.method == "NodeGetVolumeStats" && c.target_path.ends_with(&dir));
        asked.count() > before
    })
    .await;
}

#[then(regex = r#"^pod "([^"]+)" has no "([^"]+)" event$"#)]
fn no_event(w: &mut Sim, pod: String, reason: String) {
    let events = w.sim().api.events_for(&w.uid(&pod));
    let found: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason.as_str()))
        .map(|e| e.message.clone().unwrap_or_default())
        .collect();
    assert!(found.is_empty(), "{reason} events: {found:?}");
}
