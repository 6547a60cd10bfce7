//! stats/*: the kubelet's stats provider polling a running pod's volume (e2e
//! `csimock/csi_node_volume_stats.go`, `csi_node_volume_health.go`): NodeGetVolumeStats at the target
//! path, and, with the `CSIVolumeHealth` gate conform turns on, the volume's condition.

use super::*;

/// Why the stats checks are the simulation's only: they read what the kubelet's stats provider got, and
/// a real kubelet polls every minute (`--volume-stats-agg-period`).
const STATS_PROVIDER: &str = "they read the kubelet's stats provider, polled every minute";

/// The stats/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![
        Check {
            id: "stats/node-get-volume-stats",
            expects: "the kubelet's stats provider asks for a running pod's volume with NodeGetVolumeStats at \
                      its target path, and the driver answers OK with its usage in bytes",
            source: "e2e csimock/csi_node_volume_stats.go \"return normal volume stats\"; \
                     volume_stat_calculator.go; metrics_csi.go GetMetrics",
            applies: |c| {
                ephemeral(c)?;
                simulated(c, STATS_PROVIDER)?;
                node_has(c, "GET_VOLUME_STATS")
            },
            run: |env| Box::pin(volume_stats(env, false)),
        },
        Check {
            id: "stats/volume-condition",
            expects: "with the CSIVolumeHealth gate, the stats carry the volume's condition, and the pod gets \
                      a VolumeConditionAbnormal event (\"Volume <name>: <message>\") exactly when it is \
                      abnormal; a volume just published reported abnormal is noted (when is the driver's call)",
            source: "e2e csimock/csi_node_volume_health.go \"return normal volume stats\"; \
                     volume_stat_calculator.go (VolumeConditionAbnormal); KEP-1432 (CSIVolumeHealth, alpha)",
            applies: |c| {
                ephemeral(c)?;
                simulated(c, STATS_PROVIDER)?;
                node_has(c, "GET_VOLUME_STATS")?;
                node_has(c, "VOLUME_CONDITION")
            },
            run: |env| Box::pin(volume_stats(env, true)),
        },
    ]
}

fn node_has(c: &Conformance, capability: &str) -> Result<(), String> {
    match c.info.node_has(capability) {
        true => Ok(()),
        false => Err(format!("the driver does not advertise {capability}")),
    }
}

async fn volume_stats(env: &mut CheckEnv, condition: bool) -> Outcome {
    let publish = one_pod(env, "stats", InlineVolume::named("data")).await?;
    let uid = env.uid("stats");
    let node = env
        .sim()?
        .node(crate::conform::env::NODE)
        .ok_or("the node is gone")?;
    let polled = |env: &CheckEnv| {
        let asked = env.calls_at("NodeGetVolumeStats", "stats", "data");
        asked.iter().any(|c| c.code != "OK") || node.volume_stats(&uid).contains_key("data")
    };
    if !env.until(polled).await {
        return Err("the kubelet's stats provider did not get the volume's stats".into());
    }
    all_ok(env, "NodeGetVolumeStats", "stats", "data")?;
    let stats = node.volume_stats(&uid).remove("data").unwrap_or_default();
    if stats.capacity.is_none() && stats.used.is_none() {
        return Err("NodeGetVolumeStats answered no usage in bytes".into());
    }
    let mut note = String::new();
    if condition {
        let abnormal = stats
            .abnormal
            .ok_or("NodeGetVolumeStats answered no volume_condition")?;
        let message = stats.message.unwrap_or_default();
        let expected = format!("Volume data: {message}");
        let events = env.warnings("stats");
        let reported = events
            .into_iter()
            .find(|e| e.reason == "VolumeConditionAbnormal");
        // The event comes from the same pass as the stats: it is there already.
        match (abnormal, reported) {
            (true, Some(event)) if event.message == expected => {
                note = format!("note: a volume just published is reported abnormal: {message}");
            }
            (true, Some(event)) => {
                return Err(format!(
                    "VolumeConditionAbnormal says {:?}, expected {expected:?}",
                    event.message
                ));
            }
            (true, None) => {
                return Err("an abnormal volume, and no VolumeConditionAbnormal event".into());
            }
            (false, Some(event)) => {
                return Err(format!(
                    "a normal volume got VolumeConditionAbnormal: {}",
                    event.message
                ));
            }
            (false, None) => {}
        }
    }
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(note)
}
