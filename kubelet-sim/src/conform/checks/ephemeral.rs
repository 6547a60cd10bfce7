//! ephemeral/*: an inline volume's life, the pod info and attributes it gets, read-only and fsGroup.

use super::*;

/// The ephemeral/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![
        Check {
            id: "ephemeral/lifecycle",
            expects: "an inline volume is published once at the kubelet's target path, never staged or attached; \
                  the pod runs; once the pod is deleted the volume is unpublished and nothing is left: no \
                  mount, no directory, no volume in the driver",
            source: "KEP-596 Design (NodePublishVolume creates, NodeUnpublishVolume deletes); csi_plugin.go \
                 CanAttach, CanDeviceMount (no attach or stage for Ephemeral)",
            applies: ephemeral,
            run: |env| Box::pin(ephemeral::lifecycle(env)),
        },
        Check {
            id: "ephemeral/pod-info",
            expects: "with podInfoOnMount the driver gets pod.name, pod.namespace, pod.uid, serviceAccount.name \
                  and ephemeral=\"true\" and publishes with them (both modes without podInfoOnMount is \
                  noted: KEP-596's way to tell the modes apart is that flag)",
            source: "csi_mounter.go SetUpAt (podInfoOnMount keys, csi.storage.k8s.io/ephemeral); KEP-596 \
                 Design 9",
            applies: ephemeral,
            run: |env| Box::pin(ephemeral::pod_info(env)),
        },
        Check {
            id: "ephemeral/attributes-passed",
            expects: "every volumeAttribute of the pod reaches NodePublishVolume's volume_context unchanged, \
                  and the driver publishes with them",
            source: "KEP-596 Design 7 (volumeAttributes become volume_context); csi_mounter.go SetUpAt",
            applies: ephemeral,
            run: |env| Box::pin(ephemeral::attributes_passed(env)),
        },
        Check {
            id: "ephemeral/unknown-attribute-refused",
            expects: "a pod whose volume carries an attribute the driver does not know runs if the driver \
                  accepts it, can be deleted and leaves nothing either way; how it answered is noted \
                  (neither the CSI spec nor the kubelet requires a refusal; a refusal other than \
                  INVALID_ARGUMENT, or one that does not name the attribute, is noted too)",
            source: "CSI spec, Error Scheme (\"Invalid or unsupported field in the request\": \
                 INVALID_ARGUMENT); KEP-596 Design 7 (attributes are driver-defined, so only the driver \
                 can refuse a typo)",
            applies: ephemeral,
            run: |env| Box::pin(ephemeral::unknown_attribute(env)),
        },
        Check {
            id: "ephemeral/read-only",
            expects: "csi.readOnly: true reaches the driver as readonly and the container's mount is \
                  read-only (a target that takes writes is noted: KEP-596 lets a driver ignore the flag)",
            source: "CSI NodePublishVolumeRequest.readonly; csi_plugin.go getReadOnlyFromSpec (an inline \
                 volume's csi.readOnly); KEP-596 (read-only volumes)",
            applies: ephemeral,
            run: |env| Box::pin(ephemeral::read_only(env)),
        },
        Check {
            id: "ephemeral/read-only-mount",
            expects: "a volume mounted with volumeMounts[].readOnly runs its pod with a read-only container \
                  mount (the driver publishes it as usual: readonly follows csi.readOnly only)",
            source: "e2e testsuites/ephemeral.go \"should create read-only inline ephemeral volume\"",
            applies: ephemeral,
            run: |env| Box::pin(ephemeral::read_only_mount(env)),
        },
        Check {
            id: "ephemeral/read-write",
            expects: "a volume mounted read/write runs its pod with a read/write container mount, and (as \
                  root) takes writes",
            source: "e2e testsuites/ephemeral.go \"should create read/write inline ephemeral volume\" \
                 (skipped for a ReadOnly InlineVolumes entry)",
            applies: |c| ephemeral(c).and(needs_read_write(c, 1)),
            run: |env| Box::pin(ephemeral::read_write(env)),
        },
        Check {
            id: "ephemeral/symlinked-target",
            expects: "the driver publishes at the target path it is given: after NodePublishVolume the target is \
                  a directory (as root, a mount point), never a symlink put in its place, which would lead \
                  the kubelet's fsGroup walk, the container's bind and the teardown out of the kubelet dir",
            source: "CSI spec, NodePublishVolume (\"the SP SHALL place the mounted directory at target_path\"); \
                 volume_linux.go SetVolumeOwnership (walks the target); RELIABILITY.md",
            applies: ephemeral,
            run: |env| Box::pin(ephemeral::symlinked_target(env)),
        },
        Check {
            id: "ephemeral/outside-path",
            expects: "nothing the driver mounts for an inline volume lies outside the kubelet dir: the target \
                  resolves below it, and (as root) the volume mounted there is not also mounted outside it",
            source: "CSI spec, NodePublishVolume (target_path is the CO's); kubelet's volume layout \
                 (pods/<uid>/volumes/kubernetes.io~csi/<volume>/mount)",
            applies: ephemeral,
            run: |env| Box::pin(ephemeral::outside_path(env)),
        },
        Check {
            id: "ephemeral/fs-group-mount-group",
            expects: "a driver with VOLUME_MOUNT_GROUP gets the pod's fsGroup as volume_mount_group (the \
                  kubelet chowns nothing); a file made in the volume not of that group is noted (SHOULD)",
            source: "CSI VolumeCapability.MountVolume.volume_mount_group; csi_mounter.go SetUpAt \
                 (NodeSupportsVolumeMountGroup)",
            applies: |c| {
                ephemeral(c)?;
                kubelet_has(c, 23, "DelegateFSGroupToCSIDriver (VOLUME_MOUNT_GROUP)")?;
                if c.info.node_has("VOLUME_MOUNT_GROUP") {
                    Ok(())
                } else {
                    Err("the driver does not advertise VOLUME_MOUNT_GROUP (the kubelet applies fsGroup \
                     itself, per fsGroupPolicy)"
                    .into())
                }
            },
            run: |env| Box::pin(ephemeral::mount_group(env)),
        },
    ]
}

pub(super) async fn lifecycle(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "lifecycle", InlineVolume::named("data")).await?;
    let target = env.target("lifecycle", "data");
    if !target.exists() {
        return Err(format!(
            "the target path {} does not exist after NodePublishVolume",
            target.display()
        ));
    }
    let handle = publish.volume_id.clone();
    let wrong: Vec<String> = env
        .calls()
        .iter()
        .filter(|c| c.volume_id == handle)
        .filter(|c| {
            let attach_or_stage = [
                "ControllerPublishVolume",
                "ControllerUnpublishVolume",
                "NodeStageVolume",
                "NodeUnstageVolume",
            ];
            attach_or_stage.contains(&c.method.as_str())
        })
        .map(|c| c.method.clone())
        .collect();
    if !wrong.is_empty() {
        return Err(format!("an inline volume got {}", wrong.join(", ")));
    }
    env.delete(&["lifecycle"]).await?;
    let unpublished = env.calls_at("NodeUnpublishVolume", "lifecycle", "data");
    if !unpublished.iter().any(|c| c.code == "OK") {
        return Err("no successful NodeUnpublishVolume".into());
    }
    env.nothing_left(&[handle]).await?;
    Ok(deletion_note(env))
}

pub(super) async fn symlinked_target(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "symlinked-target", InlineVolume::named("data")).await?;
    let target = env.target("symlinked-target", "data");
    let kind = std::fs::symlink_metadata(&target)
        .map_err(|e| format!("the target path {}: {e}", target.display()))?
        .file_type();
    if kind.is_symlink() {
        return Err(format!(
            "the target path {} is a symlink the driver put in its place",
            target.display()
        ));
    }
    if !kind.is_dir() {
        return Err(format!(
            "the target path {} is not a directory",
            target.display()
        ));
    }
    if env.conf.mounter.1 && mounts_at(&target) == 0 {
        return Err(format!(
            "nothing is mounted at the target path {}",
            target.display()
        ));
    }
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(deletion_note(env))
}

pub(super) async fn outside_path(env: &mut CheckEnv) -> Outcome {
    let before = mount_table();
    let publish = one_pod(env, "outside-path", InlineVolume::named("data")).await?;
    let root = env
        .node_root()
        .canonicalize()
        .map_err(|e| format!("the kubelet dir: {e}"))?;
    let target = env.target("outside-path", "data");
    let resolved = target
        .canonicalize()
        .map_err(|e| format!("the target path {}: {e}", target.display()))?;
    if !resolved.starts_with(&root) {
        return Err(format!(
            "the target path {} resolves to {}, outside the kubelet dir",
            target.display(),
            resolved.display()
        ));
    }
    // The mounts made while the pod started that show the target's volume (the same filesystem and root):
    // one outside the kubelet dir is the driver's. Other mounts of the host (other tests, other
    // drivers) do not count: the mount table is the host's.
    let after = mount_table();
    let shown = target.display().to_string();
    let volume: BTreeSet<(&String, &String)> = after
        .iter()
        .filter(|(_, _, point)| *point == shown)
        .map(|(dev, fs_root, _)| (dev, fs_root))
        .collect();
    let outside: Vec<String> = after
        .difference(&before)
        .filter(|(dev, fs_root, point)| {
            volume.contains(&(dev, fs_root)) && !Path::new(point).starts_with(&root)
        })
        .map(|(_, _, point)| point.clone())
        .collect();
    if !outside.is_empty() {
        return Err(format!(
            "the volume is also mounted outside the kubelet dir: {}",
            outside.join(", ")
        ));
    }
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(match env.conf.mounter.1 {
        true => deletion_note(env),
        false => "the mount table is not compared without real mounts (root)".into(),
    })
}

pub(super) async fn pod_info(env: &mut CheckEnv) -> Outcome {
    let spec = &env.conf.info.csi_driver.spec;
    if spec.pod_info_on_mount != Some(true) {
        if env.conf.info.modes().len() > 1 {
            return Ok(
                "warning: both lifecycle modes without podInfoOnMount: true; the driver must \
                       tell an inline volume from a PV some other way (KEP-596 suggests the flag)"
                    .into(),
            );
        }
        return Ok("podInfoOnMount is not set: the driver gets no pod info".into());
    }
    let publish = one_pod(env, "pod-info", InlineVolume::named("data")).await?;
    let expected = [
        ("csi.storage.k8s.io/pod.name", "pod-info".to_string()),
        ("csi.storage.k8s.io/pod.namespace", NAMESPACE.to_string()),
        ("csi.storage.k8s.io/pod.uid", env.uid("pod-info")),
        (
            "csi.storage.k8s.io/serviceAccount.name",
            "default".to_string(),
        ),
        ("csi.storage.k8s.io/ephemeral", "true".to_string()),
    ];
    for (key, value) in expected {
        if publish.volume_context.get(key) != Some(&value) {
            return Err(format!(
                "volume_context[{key:?}] is {:?}, expected {value:?}",
                publish.volume_context.get(key)
            ));
        }
    }
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(String::new())
}

pub(super) async fn attributes_passed(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "attributes", InlineVolume::named("data")).await?;
    let attributes = &env.conf.inline(0).attributes;
    for (key, value) in attributes {
        if publish.volume_context.get(key) != Some(value) {
            return Err(format!(
                "volume_context[{key:?}] is {:?}, expected {value:?}",
                publish.volume_context.get(key)
            ));
        }
    }
    env.nothing_left(&[publish.volume_id]).await?;
    if attributes.is_empty() {
        return Ok(
            "no attributes given (--volume-attribute, --testdriver): published without".into(),
        );
    }
    Ok(String::new())
}

/// The attribute no driver knows.
pub(super) const UNKNOWN_ATTRIBUTE: &str = "conform.inlet.dev/not-an-attribute";

pub(super) async fn unknown_attribute(env: &mut CheckEnv) -> Outcome {
    let volume = InlineVolume {
        extra_attributes: BTreeMap::from([(UNKNOWN_ATTRIBUTE.to_string(), "x".to_string())]),
        ..InlineVolume::named("data")
    };
    let pod = env.pod("unknown-attribute", &[volume], json!({}));
    env.create(vec![Object::Pod(Box::new(pod))]).await?;
    // Until the kubelet reports the failure, or the driver accepts the volume.
    let answered = |env: &CheckEnv| {
        env.warnings("unknown-attribute")
            .iter()
            .any(|e| e.reason == "FailedMount")
            || env.published("unknown-attribute", "data").is_ok()
    };
    env.until(answered).await;
    let publishes = env.calls_at("NodePublishVolume", "unknown-attribute", "data");
    let first = publishes
        .first()
        .cloned()
        .ok_or("no NodePublishVolume was made")?;
    // Neither the CSI spec nor the kubelet requires a refusal: how the driver answers is a note.
    let note = match first.code.as_str() {
        "OK" => format!(
            "note: the driver accepted the unknown attribute {UNKNOWN_ATTRIBUTE:?}: a misspelt attribute \
             in a pod goes unnoticed"
        ),
        "InvalidArgument" if first.message.contains(UNKNOWN_ATTRIBUTE) => String::new(),
        "InvalidArgument" => format!(
            "note: the refusal does not name the attribute {UNKNOWN_ATTRIBUTE:?}: {}",
            first.message
        ),
        code => format!(
            "note: refused with {code} ({}), where the CSI spec's error scheme says INVALID_ARGUMENT",
            first.message
        ),
    };
    // Accepted, the volume must work as any other.
    if first.code == "OK" {
        env.running("unknown-attribute").await?;
    }
    env.delete(&["unknown-attribute"]).await?;
    env.nothing_left(std::slice::from_ref(&first.volume_id))
        .await?;
    Ok(note)
}

pub(super) async fn read_only(env: &mut CheckEnv) -> Outcome {
    let volume = InlineVolume {
        read_only: true,
        ..InlineVolume::named("ro")
    };
    let ro = one_pod(env, "read-only", volume).await?;
    if !ro.readonly {
        return Err("the kubelet did not send readonly for csi.readOnly: true".into());
    }
    let container = env.container_mount_read_only("read-only", "/mnt/ro").await;
    if container == Some(false) {
        return Err("the container's mount of the read-only volume is not read-only".into());
    }
    let note = match env.conf.mounter.1 && try_write(&env.target("read-only", "ro")).is_ok() {
        true => {
            "the driver mounts the read-only volume read-write (allowed: the container's mount is read-only)"
        }
        false => unseen(container),
    };
    env.nothing_left(&[ro.volume_id]).await?;
    Ok(note.into())
}

pub(super) async fn read_only_mount(env: &mut CheckEnv) -> Outcome {
    let volume = InlineVolume {
        mount_read_only: true,
        ..InlineVolume::named("my-volume-0")
    };
    let publish = one_pod(env, "read-only-mount", volume).await?;
    let container = env
        .container_mount_read_only("read-only-mount", "/mnt/my-volume-0")
        .await;
    if container == Some(false) {
        return Err("volumeMounts[].readOnly: the container's mount is not read-only".into());
    }
    env.nothing_left(&[publish.volume_id]).await?;
    let notes = [unseen(container).to_string(), deletion_note(env)];
    Ok(notes
        .into_iter()
        .filter(|n| !n.is_empty())
        .collect::<Vec<_>>()
        .join("; "))
}

pub(super) async fn read_write(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "read-write", InlineVolume::named("my-volume-0")).await?;
    let container_read_only = env
        .container_mount_read_only("read-write", "/mnt/my-volume-0")
        .await;
    if publish.readonly || container_read_only == Some(true) {
        return Err("a read/write volume was published or mounted read-only".into());
    }
    let note = match env.conf.mounter.1 {
        true => {
            try_write(&env.volume_dir("read-write", "my-volume-0").await)
                .map_err(|e| format!("the read/write volume refuses writes: {e}"))?;
            unseen(container_read_only).into()
        }
        false => "not root: writes were not tried".into(),
    };
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(note)
}

/// The note of a check that could not see the container's mount (`container_mount_read_only`).
fn unseen(container_read_only: Option<bool>) -> &'static str {
    match container_read_only {
        Some(_) => "",
        None => "the container's mount was not seen (no process of the pod found)",
    }
}

/// The fsGroup of the mount-group check's pod.
pub(super) const FS_GROUP: u32 = 4321;

pub(super) async fn mount_group(env: &mut CheckEnv) -> Outcome {
    let pod = env.pod(
        "mount-group",
        &[InlineVolume::named("data")],
        json!({"securityContext": {"fsGroup": FS_GROUP}}),
    );
    env.run_pods(vec![pod]).await?;
    let publish = env.published("mount-group", "data")?;
    if publish.volume_mount_group != FS_GROUP.to_string() {
        return Err(format!(
            "volume_mount_group is {:?}, expected \"{FS_GROUP}\"",
            publish.volume_mount_group
        ));
    }
    let mut note = String::new();
    if env.conf.mounter.1 {
        use std::os::unix::fs::MetadataExt;
        let file = env
            .volume_dir("mount-group", "data")
            .await
            .join(".conform-group");
        std::fs::write(&file, b"conform").map_err(|e| format!("writing in the volume: {e}"))?;
        let gid = std::fs::metadata(&file).map_err(|e| e.to_string())?.gid();
        let _ = std::fs::remove_file(&file);
        // VOLUME_MOUNT_GROUP's entries SHOULD be the group's (CSI spec): a note, not a failure.
        if gid != FS_GROUP {
            note = format!(
                "note: a file made in the volume has group {gid}, not the mount group {FS_GROUP}"
            );
        }
    } else {
        note = "not root: the volume's group was not looked at".into();
    }
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(note)
}
