//! idempotency/*: the kubelet's retries after a deadline, answered as the CSI spec asks.

use super::*;

pub(super) async fn publish_retried(env: &mut CheckEnv) -> Outcome {
    env.proxy.deadline_after_success("NodePublishVolume", 1);
    let publish = one_pod(env, "retried", InlineVolume::named("data")).await?;
    let publishes = env.calls_at("NodePublishVolume", "retried", "data");
    if publishes.len() < 2 {
        return Err("the kubelet did not retry the publish whose deadline passed".into());
    }
    let target = env.target("retried", "data");
    if env.conf.mounter.1 && mounts_at(&target) > 1 {
        return Err(format!(
            "the retried publish mounted again: {} mounts at {}",
            mounts_at(&target),
            target.display()
        ));
    }
    env.delete(&["retried"]).await?;
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(deletion_note(env))
}

pub(super) async fn unpublish_repeated(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "repeated", InlineVolume::named("data")).await?;
    env.proxy.deadline_after_success("NodeUnpublishVolume", 1);
    env.delete(&["repeated"]).await.map_err(|e| {
        format!(
            "{e} (NOT_FOUND for a volume already deleted is in the CSI spec's table, but the kubelet \
             retries a failed teardown for ever: kubernetes/kubernetes#90752)"
        )
    })?;
    let unpublishes = env.calls_at("NodeUnpublishVolume", "repeated", "data");
    if unpublishes.len() < 2 {
        return Err("the kubelet did not repeat the unpublish whose deadline passed".into());
    }
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(deletion_note(env))
}
