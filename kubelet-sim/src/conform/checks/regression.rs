//! regression/*: kubelet bugs that hurt drivers, each named by its kubernetes/kubernetes issue, run as a
//! current kubelet behaves against the driver under test. (kubernetes#90752 is idempotency/unpublish-
//! repeated, kubernetes#75353 restart/kubelet.)

use super::*;
use crate::conform::proxy::INJECTED_FAILURE;

/// The regression/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![
        Check {
            id: "regression/121271-failed-republish",
            expects: "a republish the driver fails (INTERNAL, a final error) leaves the volume as it was: \
                      the mount directory, its vol_data.json and what the pod wrote stay, nothing is \
                      unpublished, the pod runs, and the next republish is answered OK",
            source: "kubernetes/kubernetes#121271 (fixed in 1.35 patch releases: csi_mounter.go SetUpAt \
                     skips removeMountDir on a remount); csi_client.go isFinalError",
            applies: |c| {
                ephemeral(c)?;
                service_account_tokens(c)?;
                match c.info.csi_driver.spec.requires_republish {
                    Some(true) => Ok(()),
                    _ => Err("the CSIDriver does not set requiresRepublish".into()),
                }
            },
            run: |env| Box::pin(failed_republish(env)),
        },
        Check {
            id: "regression/127229-deleted-while-kubelet-down",
            expects: "pods deleted while the kubelet is down (one gone from the API, one terminating) are \
                      unpublished by the next kubelet, and nothing is left",
            source: "kubernetes/kubernetes#127229, #92299 (volumes leaked when pods go while the kubelet is \
                     down or the node reboots); reconstruct.go (reconstructed volumes of pods no longer \
                     wanted are torn down)",
            applies: |c| ephemeral(c).and(simulated(c, "conform does not stop a real kubelet")),
            run: |env| Box::pin(deleted_while_down(env)),
        },
        Check {
            id: "regression/120086-missing-vol-data",
            expects: "a volume whose vol_data.json is gone when the kubelet starts is set up again for its \
                      running pod (NodePublishVolume on the published target, answered OK), its record is \
                      written again, and the pod's deletion unpublishes it",
            source: "kubernetes/kubernetes#120086; reconstruct.go (a volume that cannot be reconstructed \
                     is mounted again while its pod wants it); csi_mounter.go SetUpAt (saveVolumeData)",
            applies: |c| ephemeral(c).and(simulated(c, "conform does not stop a real kubelet")),
            run: |env| Box::pin(missing_vol_data(env)),
        },
    ]
}

async fn failed_republish(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "republish-fails", InlineVolume::named("data")).await?;
    let target = env.target("republish-fails", "data");
    let marker = target.join("conform-marker");
    let wrote = env.conf.mounter.1 && std::fs::write(&marker, b"conform").is_ok();
    env.proxy.fail_after_success("NodePublishVolume", 1);
    // The failed republish, then an OK one after it.
    let recovered = |env: &CheckEnv| {
        let calls = env.calls_at("NodePublishVolume", "republish-fails", "data");
        let failed = calls.iter().position(|c| c.message == INJECTED_FAILURE);
        failed.is_some_and(|i| calls[i + 1..].iter().any(|c| c.code == "OK"))
    };
    if !env.until(recovered).await {
        return Err("no republish was answered OK after the failed one".into());
    }
    let record = target.with_file_name(inlet_volume::csi::vol_data::FILE_NAME);
    for (what, path) in [("the mount directory", &target), ("vol_data.json", &record)] {
        if !path.exists() {
            return Err(format!(
                "{what} {} is gone after the failed republish",
                path.display()
            ));
        }
    }
    if wrote && !marker.exists() {
        return Err("a file the pod wrote is gone after the failed republish".into());
    }
    if !env
        .calls_at("NodeUnpublishVolume", "republish-fails", "data")
        .is_empty()
    {
        return Err("the volume was unpublished after the failed republish".into());
    }
    env.running("republish-fails").await?;
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(match wrote {
        true => String::new(),
        false => "the volume's content was not looked at (not root, or not writable)".into(),
    })
}

async fn deleted_while_down(env: &mut CheckEnv) -> Outcome {
    let volume = [InlineVolume::named("data")];
    let pods = vec![
        env.pod("gone", &volume, json!({})),
        env.pod("terminating", &volume, json!({})),
    ];
    env.run_pods(pods).await?;
    let ids = [
        env.published("gone", "data")?.volume_id,
        env.published("terminating", "data")?.volume_id,
    ];
    env.stop_kubelet().await?;
    // A force delete (or the pod GC, after a long absence), and a graceful one left to the kubelet.
    env.sim()?
        .api
        .remove::<crate::api::ApiPod>(NAMESPACE, "gone");
    env.delete_pod("terminating").await?;
    env.start_kubelet().await?;
    let unpublished = |env: &CheckEnv, pod: &str| {
        env.calls_at("NodeUnpublishVolume", pod, "data")
            .iter()
            .any(|c| c.code == "OK")
    };
    env.until(|env| unpublished(env, "gone") && unpublished(env, "terminating"))
        .await;
    for pod in ["gone", "terminating"] {
        if !unpublished(env, pod) {
            return Err(format!(
                "pod {pod}'s volume was not unpublished after the kubelet came back{}",
                env.last_failure(pod)
            ));
        }
    }
    env.nothing_left(&ids).await?;
    Ok(deletion_note(env))
}

async fn missing_vol_data(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "no-vol-data", InlineVolume::named("data")).await?;
    let target = env.target("no-vol-data", "data");
    let record = target.with_file_name(inlet_volume::csi::vol_data::FILE_NAME);
    env.stop_kubelet().await?;
    std::fs::remove_file(&record).map_err(|e| format!("removing {}: {e}", record.display()))?;
    env.start_kubelet().await?;
    let published_again = |env: &CheckEnv| {
        let calls = env.calls_at("NodePublishVolume", "no-vol-data", "data");
        calls.iter().filter(|c| c.code == "OK").count() >= 2
    };
    if !env.until(published_again).await {
        return Err(format!(
            "the volume was not published again by the new kubelet{}",
            env.last_failure("no-vol-data")
        ));
    }
    if !record.exists() {
        return Err(format!("{} was not written again", record.display()));
    }
    env.running("no-vol-data").await?;
    env.delete(&["no-vol-data"]).await?;
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(deletion_note(env))
}
