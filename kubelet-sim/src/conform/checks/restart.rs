//! restart/*: a kubelet restart (reconstruction) and a driver restart with volumes published.

use super::*;

pub(super) async fn kubelet_restart(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "restart", InlineVolume::named("data")).await?;
    env.restart_kubelet().await?;
    let node = env
        .sim
        .node(crate::conform::env::NODE)
        .ok_or("the node is gone")?;
    // The new kubelet has taken up what the old one left once it has looked at the disk.
    let taken_up = env
        .sim
        .wait_for(env.conf.wait, |_| node.reconstructed())
        .await;
    if !taken_up {
        return Err("the restarted kubelet did not reconstruct its volumes".into());
    }
    let again = |env: &CheckEnv| env.calls_at("NodePublishVolume", "restart", "data").len() >= 2;
    if !env.sim.wait_for(env.conf.wait, |_| again(env)).await {
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
