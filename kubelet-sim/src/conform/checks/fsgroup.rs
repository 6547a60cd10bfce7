//! fsgroup/*: the CSIDriver's fsGroupPolicy, as the kubelet applies it to an inline volume (e2e
//! `csimock/csi_fsgroup_policy.go`): a directory and a file made in the volume belong to the pod's
//! fsGroup when the policy says so (the kubelet's SetVolumeOwnership), and to root otherwise. A driver
//! with VOLUME_MOUNT_GROUP is given the fsGroup whatever the policy, and applies it itself.

use super::*;

/// The fsgroup/* checks.
pub(super) fn checks() -> Vec<Check> {
    let applies = |c: &Conformance| ephemeral(c).and(real_mounts(c)).and(needs_read_write(c, 1));
    vec![
        Check {
            id: "fsgroup/none",
            expects: "with fsGroupPolicy: None a file made in the volume of a pod with an fsGroup belongs \
                      to root (a driver with VOLUME_MOUNT_GROUP still gets it as volume_mount_group and \
                      applies it)",
            source: "e2e csimock/csi_fsgroup_policy.go \"should not modify fsGroup if fsGroupPolicy=None\"; \
                     csi_mounter.go supportsFSGroup",
            applies,
            run: |env| Box::pin(policy(env, "None", None, false)),
        },
        Check {
            id: "fsgroup/file",
            expects: "with fsGroupPolicy: File a file made in the volume belongs to the pod's fsGroup (with \
                      VOLUME_MOUNT_GROUP the driver gets it as volume_mount_group and applies it)",
            source: "e2e csimock/csi_fsgroup_policy.go \"should modify fsGroup if fsGroupPolicy=File\"; \
                     csi_mounter.go supportsFSGroup, SetUpAt (NodeSupportsVolumeMountGroup)",
            applies,
            run: |env| Box::pin(policy(env, "File", None, true)),
        },
        Check {
            id: "fsgroup/read-write-once-with-fstype",
            expects: "with fsGroupPolicy: ReadWriteOnceWithFSType (the default) and csi.fsType set, a file \
                      made in the volume belongs to the pod's fsGroup (inline volumes are mounted \
                      ReadWriteOnce)",
            source: "e2e csimock/csi_fsgroup_policy.go \"should modify fsGroup if fsGroupPolicy=default\"; \
                     csi_mounter.go supportsFSGroup (\"Inline CSI volumes are always mounted with RWO\")",
            applies: |c| {
                ephemeral(c)
                    .and(real_mounts(c))
                    .and(needs_read_write(c, 1))?;
                fs_type(c).map(|_| ()).ok_or_else(|| {
                    "no filesystem type to ask for: list one in --testdriver's DriverInfo.SupportedFsType"
                        .into()
                })
            },
            run: |env| {
                let fs_type = fs_type(&env.conf);
                Box::pin(policy(env, "ReadWriteOnceWithFSType", fs_type, true))
            },
        },
        Check {
            id: "fsgroup/read-write-once-without-fstype",
            expects: "with fsGroupPolicy: ReadWriteOnceWithFSType and no csi.fsType, the kubelet leaves the \
                      volume's ownership alone: a file made in it belongs to root",
            source: "csi_mounter.go supportsFSGroup (\"skipping fsGroup, fsType not provided\")",
            applies,
            run: |env| Box::pin(policy(env, "ReadWriteOnceWithFSType", None, false)),
        },
    ]
}

/// The pod's fsGroup (e2e picks one at random from 1024 up).
const FS_GROUP: u32 = 5555;

/// The first filesystem type other than the default one the test driver file lists.
fn fs_type(c: &Conformance) -> Option<String> {
    let types = &c.testdriver.as_ref()?.supported_fs_type;
    types.iter().find(|t| !t.is_empty()).cloned()
}

async fn policy(
    env: &mut CheckEnv,
    policy: &'static str,
    fs_type: Option<String>,
    applied: bool,
) -> Outcome {
    env.edit_csi_driver(|spec| spec.fs_group_policy = Some(policy.into()))
        .await?;
    let volume = InlineVolume {
        fs_type,
        ..InlineVolume::named("data")
    };
    let pod = env.pod(
        "fsgroup",
        &[volume],
        json!({"securityContext": {"fsGroup": FS_GROUP}}),
    );
    env.run_pods(vec![pod]).await?;
    let publish = env.published("fsgroup", "data")?;
    // A driver with VOLUME_MOUNT_GROUP gets the fsGroup whatever the policy, and applies it itself
    // (csi_mounter.go SetUpAt: driverSupportsCSIVolumeMountGroup).
    let mount_group = env.conf.info.node_has("VOLUME_MOUNT_GROUP");
    let expected_group = if mount_group {
        FS_GROUP.to_string()
    } else {
        String::new()
    };
    if publish.volume_mount_group != expected_group {
        return Err(format!(
            "volume_mount_group is {:?}, expected {expected_group:?}",
            publish.volume_mount_group
        ));
    }
    // As e2e: a directory of its own in the volume, and a file in it.
    let dir = env
        .volume_dir("fsgroup", "data")
        .await
        .join("conform-fsgroup");
    let file = dir.join("file");
    let made = std::fs::create_dir(&dir).and_then(|()| std::fs::write(&file, b"conform"));
    made.map_err(|e| format!("writing in the volume: {e}"))?;
    let gid = std::os::unix::fs::MetadataExt::gid(
        &std::fs::metadata(&file).map_err(|e| format!("{}: {e}", file.display()))?,
    );
    let expected = if applied || mount_group { FS_GROUP } else { 0 };
    // The CSI spec only says a mount group's entries SHOULD be the group's: a driver's own application
    // of it is a note; the kubelet's is checked.
    let note = match (gid == expected, mount_group) {
        (true, _) => String::new(),
        (false, true) => format!(
            "note: the driver was given volume_mount_group {FS_GROUP}, and a file made in the volume has group {gid}"
        ),
        (false, false) => {
            return Err(format!(
                "with fsGroupPolicy {policy} a file made in the volume has group {gid}, expected {expected}"
            ));
        }
    };
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(note)
}
