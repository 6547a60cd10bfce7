//! pod-info/*: the pod information the kubelet adds to volume_context, as the CSIDriver object says at
//! each SetUp (e2e `csimock/csi_workload.go`, "CSI workload information using mock driver" and "CSI
//! PodInfoOnMount Update"), against the driver under test.

use super::*;

/// The pod-info/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![
        Check {
            id: "pod-info/disabled",
            expects: "with podInfoOnMount: false the driver is published without any csi.storage.k8s.io/ \
                      pod key (pod.name, pod.namespace, pod.uid, serviceAccount.name, ephemeral) and runs the \
                      pod",
            source: "e2e csimock/csi_workload.go \"should not be passed when podInfoOnMount=false\"; \
                     csi_mounter.go SetUpAt (podInfoEnabled)",
            applies: |c| {
                ephemeral(c)?;
                match c.info.csi_driver.spec.pod_info_on_mount {
                    Some(true) => Err(
                        "the CSIDriver sets podInfoOnMount: the driver is not used without \
                                       (pod-info/*-later change it on a live CSIDriver)"
                            .into(),
                    ),
                    _ => Ok(()),
                }
            },
            run: |env| Box::pin(disabled(env)),
        },
        Check {
            id: "pod-info/enabled-later",
            expects: "podInfoOnMount changed from false to true on the live CSIDriver: a pod started after \
                      the change gets the pod keys, one started before got none (a driver that needs them \
                      may refuse that one)",
            source: "e2e csimock/csi_workload.go \"should be passed when update from false to true\"; \
                     csi_plugin.go podInfoEnabled (the CSIDriver is read at each SetUp)",
            applies: ephemeral,
            run: |env| Box::pin(changed_live(env, false)),
        },
        Check {
            id: "pod-info/disabled-later",
            expects: "podInfoOnMount changed from true to false on the live CSIDriver: a pod started after \
                      the change gets no pod key (a driver that needs them may refuse it), one started \
                      before got them all",
            source: "e2e csimock/csi_workload.go \"should not be passed when update from true to false\"; \
                     csi_plugin.go podInfoEnabled",
            applies: ephemeral,
            run: |env| Box::pin(changed_live(env, true)),
        },
    ]
}

/// The keys `getPodInfoAttrs` adds.
const POD_INFO_KEYS: [&str; 5] = [
    "csi.storage.k8s.io/pod.name",
    "csi.storage.k8s.io/pod.namespace",
    "csi.storage.k8s.io/pod.uid",
    "csi.storage.k8s.io/serviceAccount.name",
    "csi.storage.k8s.io/ephemeral",
];

async fn disabled(env: &mut CheckEnv) -> Outcome {
    env.edit_csi_driver(|spec| spec.pod_info_on_mount = Some(false))
        .await?;
    let publish = one_pod(env, "pod-info-disabled", InlineVolume::named("data")).await?;
    without_pod_info(&publish)?;
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(String::new())
}

/// Starts a pod with pod info `first`, flips podInfoOnMount, starts another; each gets what the
/// CSIDriver said when its SetUp ran. The pod without pod info may be refused when the driver's own
/// CSIDriver sets podInfoOnMount (it needs the keys).
async fn changed_live(env: &mut CheckEnv, first: bool) -> Outcome {
    let mut volume_ids = Vec::new();
    let mut note = String::new();
    for (pod, enabled) in [("before", first), ("after", !first)] {
        env.edit_csi_driver(|spec| spec.pod_info_on_mount = Some(enabled))
            .await?;
        match start_pod(env, pod, InlineVolume::named("data")).await? {
            Ok(publish) => {
                match enabled {
                    true => with_pod_info(env, pod, &publish)?,
                    false => without_pod_info(&publish)?,
                }
                volume_ids.push(publish.volume_id);
                env.delete(&[pod]).await?;
            }
            Err(refusal)
                if !enabled && env.conf.info.csi_driver.spec.pod_info_on_mount == Some(true) =>
            {
                note = format!(
                    "the driver needs pod info (its CSIDriver sets podInfoOnMount) and refused \
                                the pod without: {refusal}"
                );
                env.delete(&[pod]).await?;
            }
            Err(refusal) => return Err(format!("pod {pod}: {refusal}")),
        }
    }
    env.nothing_left(&volume_ids).await?;
    Ok(note)
}

/// Fails when the publish carries any pod key.
fn without_pod_info(publish: &CsiCall) -> Result<(), String> {
    let present: Vec<&str> = POD_INFO_KEYS
        .into_iter()
        .filter(|k| publish.volume_context.contains_key(*k))
        .collect();
    match present.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "published without podInfoOnMount, yet with {present:?}"
        )),
    }
}

/// Fails unless the publish carries every pod key with pod `pod`'s values.
fn with_pod_info(env: &CheckEnv, pod: &str, publish: &CsiCall) -> Result<(), String> {
    let expected = [
        pod.to_string(),
        NAMESPACE.to_string(),
        env.uid(pod),
        "default".to_string(),
        "true".to_string(),
    ];
    for (key, value) in POD_INFO_KEYS.into_iter().zip(expected) {
        if publish.volume_context.get(key) != Some(&value) {
            return Err(format!(
                "volume_context[{key:?}] is {:?}, expected {value:?}",
                publish.volume_context.get(key)
            ));
        }
    }
    Ok(())
}
