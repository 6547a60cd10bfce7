//! idempotency/*: the kubelet's retries after a deadline, answered as the CSI spec asks.

use super::*;

/// The idempotency/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![
        Check {
            id: "idempotency/publish-retried-after-deadline",
            expects: "when the kubelet's deadline passes after the driver published, the kubelet's retry is \
                  answered OK with the volume mounted once, and one unpublish leaves nothing",
            source: "CSI spec, Idempotency and NodePublishVolume (\"already published at the specified \
                 target_path\": OK); operation_generator.go (a timeout leaves the mount uncertain and \
                 is retried); KEP-596 Design 6",
            applies: ephemeral,
            run: |env| Box::pin(idempotency::publish_retried(env)),
        },
        Check {
            id: "idempotency/unpublish-repeated",
            expects: "when the kubelet's deadline passes after the driver unpublished (and deleted the \
                  volume), the repeated NodeUnpublishVolume is answered OK",
            source: "KEP-596 Design 6 (the driver handles a repeated unmount gracefully); CSI spec, \
                 NodeUnpublishVolume (\"MUST be idempotent\"; its table allows NOT_FOUND, but \
                 csi_mounter.go TearDownAt retries every error: kubernetes/kubernetes#90752)",
            applies: ephemeral,
            run: |env| Box::pin(idempotency::unpublish_repeated(env)),
        },
    ]
}

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
