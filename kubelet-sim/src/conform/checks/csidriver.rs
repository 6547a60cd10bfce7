//! csidriver/*: inline volumes of a driver whose CSIDriver object does not allow them. The kubelet refuses
//! them before it calls the driver (`csi_plugin.go` supportsVolumeLifecycleMode): a driver without a
//! CSIDriver is taken as Persistent only.

use super::*;

/// The csidriver/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![
        Check {
            id: "csidriver/missing",
            expects: "without a CSIDriver object an inline volume is refused with the kubelet's text (no \
                      CSIDriver object), the driver is never called for it, and the pod can be deleted",
            source: "csi_plugin.go supportsVolumeLifecycleMode (no CSIDriver: Persistent only); e2e \
                     csimock/csi_workload.go \"should not be passed when CSIDriver does not exist\"",
            applies: ephemeral,
            run: |env| {
                Box::pin(async move {
                    env.delete_csi_driver().await?;
                    refused(env, "(no CSIDriver object)").await
                })
            },
        },
        Check {
            id: "csidriver/ephemeral-not-listed",
            expects: "with volumeLifecycleModes: [Persistent] an inline volume is refused with the kubelet's \
                      text, the driver is never called for it, and the pod can be deleted",
            source: "csi_plugin.go supportsVolumeLifecycleMode; storage/v1 CSIDriverSpec \
                     volumeLifecycleModes; KEP-596 (a driver opts in to Ephemeral)",
            applies: ephemeral,
            run: |env| {
                Box::pin(async move {
                    env.edit_csi_driver(|spec| {
                        spec.volume_lifecycle_modes = Some(vec!["Persistent".into()])
                    })
                    .await?;
                    refused(env, "(only supports [\"Persistent\"])").await
                })
            },
        },
    ]
}

/// A pod's inline volume is refused with `volume mode "Ephemeral" not supported by driver <name> <why>`,
/// and no NodePublishVolume reaches the driver.
async fn refused(env: &mut CheckEnv, why: &str) -> Outcome {
    let text = format!(
        "volume mode \"Ephemeral\" not supported by driver {} {why}",
        env.conf.setup.name()
    );
    let refusal = match start_pod(env, "refused", InlineVolume::named("data")).await? {
        Ok(_) => return Err("the pod runs: the inline volume was published".into()),
        Err(refusal) => refusal,
    };
    if !refusal.contains(&text) {
        return Err(format!(
            "the FailedMount event says {refusal:?}, not {text:?}"
        ));
    }
    let called = env.calls_at("NodePublishVolume", "refused", "data");
    if !called.is_empty() {
        return Err(format!(
            "NodePublishVolume was called {} times",
            called.len()
        ));
    }
    env.delete(&["refused"]).await?;
    env.nothing_left(&[]).await?;
    Ok(String::new())
}
