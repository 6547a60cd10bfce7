//! restart/*: a kubelet restart (reconstruction) and a driver restart with volumes published.

use super::*;

/// The restart/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![
        Check {
            id: "restart/kubelet",
            expects: "after a kubelet restart the volume is reconstructed from disk and published again, \
                  answered OK; the pod keeps running, and its teardown leaves nothing",
            source: "volumemanager/reconciler/reconstruct.go (reconstructed volumes are uncertain and set \
                 up again); csi_plugin.go ConstructVolumeSpec; KEP-596 GA criterion #79980; \
                 kubernetes/kubernetes#75353 (reconstruction)",
            applies: |c| {
                ephemeral(c)?;
                match &c.cluster {
                    Some(node) if node.kubelet_restart_command.is_none() => {
                        Err("on a real node: conform restarts a real kubelet only with \
                         --kubelet-restart-command"
                            .into())
                    }
                    _ => Ok(()),
                }
            },
            run: |env| Box::pin(restart::kubelet_restart(env)),
        },
        Check {
            id: "restart/driver",
            expects: "a driver restarted while its volumes are published unpublishes them afterwards (its \
                  state survives), leaves nothing, and publishes new volumes",
            source: "CSI spec, Idempotency; KEP-596 Design 6; csi-driver-host-path keeps its state in \
                 --statedir for this",
            applies: |c| {
                ephemeral(c)?;
                if c.setup.restartable() {
                    Ok(())
                } else {
                    Err("an external driver needs --restart-command to be restarted".into())
                }
            },
            run: |env| Box::pin(restart::driver_restart(env)),
        },
    ]
}

pub(super) async fn kubelet_restart(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "restart", InlineVolume::named("data")).await?;
    let before = env.calls_at("NodePublishVolume", "restart", "data").len();
    env.restart_kubelet().await?;
    // The new kubelet has taken up what the old one left once it has looked at the disk; a real one says
    // so only by publishing the volume again.
    if let Ok(sim) = env.sim() {
        let node = sim
            .node(crate::conform::env::NODE)
            .ok_or("the node is gone")?;
        if !env.until(|_| node.reconstructed()).await {
            return Err("the restarted kubelet did not reconstruct its volumes".into());
        }
    }
    // After the restart (a kubelet with requiresRepublish publishes again without one).
    let again =
        |env: &CheckEnv| env.calls_at("NodePublishVolume", "restart", "data").len() > before;
    if !env.until(again).await {
        return Err("the reconstructed volume was not published again".into());
    }
    env.running("restart").await?;
    all_ok(env, "NodePublishVolume", "restart", "data")?;
    env.delete(&["restart"]).await?;
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(String::new())
}

pub(super) async fn driver_restart(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "before", InlineVolume::named("data")).await?;
    env.restart_driver().await?;
    env.delete(&["before"]).await?;
    let after = one_pod(env, "after", InlineVolume::named("data")).await?;
    env.delete(&["after"]).await?;
    env.nothing_left(&[publish.volume_id, after.volume_id])
        .await?;
    Ok(deletion_note(env))
}
