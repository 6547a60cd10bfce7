//! selinux/*: a driver whose CSIDriver says `seLinuxMount: true` mounts a volume with the SELinux context
//! the kubelet gives it (KEP-1710; e2e `csimock/csi_selinux_mount.go`). In 1.35 the kubelet gives one only
//! on a node that runs SELinux, only to a PV's volume, and (unless the `SELinuxMount` gate is on) only to a
//! ReadWriteOncePod one: a CSI inline volume never gets one, so no inline check exists.

use super::persistent::{create_volume, delete_volume, first_ok, run_on_pv};
use super::*;

/// The pod's context, every part set as e2e sets it so no system default matters.
const POD_LEVEL: &str = "s0:c0,c1";
/// The file label the kubelet makes of it (`SELinuxOptionsToFileLabel`).
const LABEL: &str = "system_u:object_r:container_file_t:s0:c0,c1";

/// The selinux/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![Check {
        id: "selinux/mount-context",
        expects: "with the CSIDriver's seLinuxMount: true, a ReadWriteOncePod PV used by a pod with an \
                  SELinux context is staged and published with context=\"<the pod's file label>\", and \
                  the published volume carries that label",
        source: "e2e csimock/csi_selinux_mount.go \"should pass SELinux mount option for RWOP volume and \
                 Pod with SELinux context set\"; pkg/volume/util/selinux.go (VolumeSupportsSELinuxMount, \
                 AddSELinuxMountOption); csi_mounter.go SetUpAt; csi_attacher.go MountDevice",
        applies: |c| {
            persistent(c)?;
            real_mounts(c)?;
            if c.info.csi_driver.spec.se_linux_mount != Some(true) {
                return Err("the CSIDriver does not say seLinuxMount: true".into());
            }
            if !inlet_host::selinux::enabled() {
                return Err(
                    "the node does not run SELinux: the kubelet gives no context \
                            (GetMountSELinuxLabel)"
                        .into(),
                );
            }
            Ok(())
        },
        run: |env| Box::pin(mount_context(env)),
    }]
}

async fn mount_context(env: &mut CheckEnv) -> Outcome {
    let volume = create_volume(env, "conform-selinux", false).await?;
    let outcome = mount_context_on(env, &volume).await;
    let deleted = delete_volume(env, &volume.volume_id).await;
    outcome.and_then(|note| deleted.map(|()| note))
}

async fn mount_context_on(env: &mut CheckEnv, volume: &csi::Volume) -> Outcome {
    let handle = volume.volume_id.as_str();
    let context = json!({"securityContext": {"seLinuxOptions": {
        "user": "system_u", "role": "system_r", "type": "container_t", "level": POD_LEVEL,
    }}});
    run_on_pv(
        env,
        volume,
        &["labelled"],
        false,
        "ReadWriteOncePod",
        context,
    )
    .await?;
    let calls = env.calls();
    let option = inlet_volume::selinux::mount_option(LABEL);
    let mut methods = vec!["NodePublishVolume"];
    if env.conf.info.node_has("STAGE_UNSTAGE_VOLUME") {
        methods.insert(0, "NodeStageVolume");
    }
    let mut target = String::new();
    for method in methods {
        let call = &calls
            [first_ok(&calls, method, handle).ok_or_else(|| format!("no successful {method}"))?];
        if !call.mount_flags.contains(&option) {
            return Err(format!(
                "{method} had mount flags {:?}, expected {option} among them",
                call.mount_flags
            ));
        }
        target.clone_from(&call.target_path);
    }
    // What the pod sees: the published directory's label, which only a mount with the context sets.
    let label = inlet_host::selinux::file_label(Path::new(&target))
        .map_err(|e| format!("the label of {target}: {e}"))?;
    if label.as_deref() != Some(LABEL) {
        return Err(format!(
            "the published volume is labelled {label:?}, expected {LABEL:?}: a driver whose CSIDriver \
             says seLinuxMount must mount with the context it is given"
        ));
    }
    env.delete(&["labelled"]).await?;
    env.nothing_left(&[]).await?;
    Ok(String::new())
}
