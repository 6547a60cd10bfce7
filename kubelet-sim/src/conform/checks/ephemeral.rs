//! ephemeral/*: an inline volume's life, the pod info and attributes it gets, read-only and fsGroup.

use super::*;

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
        .filter(|c| !["NodePublishVolume", "NodeUnpublishVolume"].contains(&c.method.as_str()))
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
    for (key, value) in &env.conf.attributes {
        if publish.volume_context.get(key) != Some(value) {
            return Err(format!(
                "volume_context[{key:?}] is {:?}, expected {value:?}",
                publish.volume_context.get(key)
            ));
        }
    }
    env.nothing_left(&[publish.volume_id]).await?;
    if env.conf.attributes.is_empty() {
        return Ok("no --volume-attribute given: published without attributes".into());
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
    env.sim.wait_for(env.conf.wait, |_| answered(env)).await;
    let publishes = env.calls_at("NodePublishVolume", "unknown-attribute", "data");
    if publishes.iter().any(|c| c.code == "OK") {
        return Err(format!(
            "NodePublishVolume with the attribute {UNKNOWN_ATTRIBUTE:?} was answered OK"
        ));
    }
    let first = publishes.first().ok_or("no NodePublishVolume was made")?;
    if first.code != "InvalidArgument" {
        return Err(format!(
            "NodePublishVolume failed with {} ({}), not InvalidArgument",
            first.code, first.message
        ));
    }
    env.delete(&["unknown-attribute"]).await?;
    env.nothing_left(std::slice::from_ref(&first.volume_id))
        .await?;
    if first.message.contains(UNKNOWN_ATTRIBUTE) {
        Ok(String::new())
    } else {
        Ok(format!(
            "the error does not name the attribute {UNKNOWN_ATTRIBUTE:?}: {}",
            first.message
        ))
    }
}

pub(super) async fn read_only(env: &mut CheckEnv) -> Outcome {
    let volumes = [
        InlineVolume::named("rw"),
        InlineVolume {
            read_only: true,
            ..InlineVolume::named("ro")
        },
    ];
    let pod = env.pod("read-only", &volumes, json!({}));
    env.run_pods(vec![pod]).await?;
    let (rw, ro) = (
        env.published("read-only", "rw")?,
        env.published("read-only", "ro")?,
    );
    if !ro.readonly || rw.readonly {
        return Err(format!(
            "the kubelet sent readonly={} for the read-only volume and {} for the other",
            ro.readonly, rw.readonly
        ));
    }
    if !env.container_mount_read_only("read-only", "/mnt/ro") {
        return Err("the container's mount of the read-only volume is not read-only".into());
    }
    if let Err(e) = try_write(&env.target("read-only", "rw")) {
        return Err(format!("the read-write volume refuses writes: {e}"));
    }
    let note = if try_write(&env.target("read-only", "ro")).is_ok() {
        "the driver mounts the read-only volume read-write (allowed: the container's mount is read-only)"
    } else {
        ""
    };
    env.nothing_left(&[rw.volume_id, ro.volume_id]).await?;
    Ok(note.into())
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
        let file = env.target("mount-group", "data").join(".conform-group");
        std::fs::write(&file, b"conform").map_err(|e| format!("writing in the volume: {e}"))?;
        let gid = std::fs::metadata(&file).map_err(|e| e.to_string())?.gid();
        let _ = std::fs::remove_file(&file);
        if gid != FS_GROUP {
            return Err(format!(
                "a file made in the volume has group {gid}, not the fsGroup {FS_GROUP}"
            ));
        }
    } else {
        note = "not root: the volume's group was not looked at".into();
    }
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(note)
}
