//! The catalogue: each check is named after the KEP-596 or CSI behaviour it shows, says what it expects
//! and where that comes from, decides whether it applies to the driver (its capabilities and CSIDriver),
//! and runs as pods through the simulated kubelet. `conform.md` beside this crate explains each one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use futures::future::BoxFuture;
use inlet_plugin::volume::csi::{CsiCall, TOKENS_KEY};
use inlet_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::json;

use super::env::{CheckEnv, Conformance, InlineVolume, NAMESPACE};
use super::proxy::INJECTED_DEADLINE;
use crate::api::manifest::Object;

/// What a check's run returns: a note on a pass (what could not be observed), or why it failed.
pub type Outcome = Result<String, String>;

/// One check of the catalogue.
pub struct Check {
    /// `group/name`, what `--only` matches.
    pub id: &'static str,
    /// What the driver must do, in one sentence.
    pub expects: &'static str,
    /// The upstream file or spec section the expectation comes from.
    pub source: &'static str,
    /// Ok when the check applies to this driver; else why it is skipped.
    pub applies: fn(&Conformance) -> Result<(), String>,
    /// Runs the check in a fresh environment.
    pub run: fn(&mut CheckEnv) -> BoxFuture<'_, Outcome>,
}

/// Every check, in the order they run.
pub fn catalogue() -> Vec<Check> {
    vec![
        Check {
            id: "ephemeral/lifecycle",
            expects: "an inline volume is published once at the kubelet's target path, never staged or attached; \
                      the pod runs; once the pod is deleted the volume is unpublished and nothing is left: no \
                      mount, no directory, no volume in the driver",
            source: "KEP-596 Design (NodePublishVolume creates, NodeUnpublishVolume deletes); csi_plugin.go \
                     CanAttach, CanDeviceMount (no attach or stage for Ephemeral)",
            applies: ephemeral,
            run: |env| Box::pin(lifecycle(env)),
        },
        Check {
            id: "ephemeral/pod-info",
            expects: "with podInfoOnMount the driver gets pod.name, pod.namespace, pod.uid, serviceAccount.name \
                      and ephemeral=\"true\" and publishes with them (both modes without podInfoOnMount is \
                      noted: KEP-596's way to tell the modes apart is that flag)",
            source: "csi_mounter.go SetUpAt (podInfoOnMount keys, csi.storage.k8s.io/ephemeral); KEP-596 \
                     Design 9",
            applies: ephemeral,
            run: |env| Box::pin(pod_info(env)),
        },
        Check {
            id: "ephemeral/attributes-passed",
            expects: "every volumeAttribute of the pod reaches NodePublishVolume's volume_context unchanged, \
                      and the driver publishes with them",
            source: "KEP-596 Design 7 (volumeAttributes become volume_context); csi_mounter.go SetUpAt",
            applies: ephemeral,
            run: |env| Box::pin(attributes_passed(env)),
        },
        Check {
            id: "ephemeral/unknown-attribute-refused",
            expects: "a volume attribute the driver does not know fails NodePublishVolume with \
                      INVALID_ARGUMENT (a message that does not name it is noted); the pod gets a FailedMount \
                      event, nothing is mounted, and the pod can be deleted",
            source: "CSI spec, Error Scheme (\"Invalid or unsupported field in the request\": \
                     INVALID_ARGUMENT); KEP-596 Design 7 (attributes are driver-defined, so only the driver \
                     can refuse a typo)",
            applies: ephemeral,
            run: |env| Box::pin(unknown_attribute(env)),
        },
        Check {
            id: "idempotency/publish-retried-after-deadline",
            expects: "when the kubelet's deadline passes after the driver published, the kubelet's retry is \
                      answered OK with the volume mounted once, and one unpublish leaves nothing",
            source: "CSI spec, Idempotency and NodePublishVolume (\"already published at the specified \
                     target_path\": OK); operation_generator.go (a timeout leaves the mount uncertain and \
                     is retried); KEP-596 Design 6",
            applies: ephemeral,
            run: |env| Box::pin(publish_retried(env)),
        },
        Check {
            id: "idempotency/unpublish-repeated",
            expects: "when the kubelet's deadline passes after the driver unpublished (and deleted the \
                      volume), the repeated NodeUnpublishVolume is answered OK",
            source: "KEP-596 Design 6 (the driver handles a repeated unmount gracefully); CSI spec, \
                     NodeUnpublishVolume (\"MUST be idempotent\"; its table allows NOT_FOUND, but \
                     csi_mounter.go TearDownAt retries every error: kubernetes/kubernetes#90752)",
            applies: ephemeral,
            run: |env| Box::pin(unpublish_repeated(env)),
        },
        Check {
            id: "ephemeral/read-only",
            expects: "csi.readOnly: true reaches the driver as readonly and the container's mount is \
                      read-only (a target that takes writes is noted: KEP-596 lets a driver ignore the flag); \
                      a volume without it is writable",
            source: "CSI NodePublishVolumeRequest.readonly; KEP-596 (read-only volumes); e2e \
                     testsuites/ephemeral.go \"should create read-only inline ephemeral volume\", \"should \
                     create read/write inline ephemeral volume\"",
            applies: |c| ephemeral(c).and(real_mounts(c)),
            run: |env| Box::pin(read_only(env)),
        },
        Check {
            id: "ephemeral/fs-group-mount-group",
            expects: "a driver with VOLUME_MOUNT_GROUP gets the pod's fsGroup as volume_mount_group, and a \
                      file made in the volume belongs to that group (the kubelet chowns nothing)",
            source: "CSI VolumeCapability.MountVolume.volume_mount_group; csi_mounter.go SetUpAt \
                     (NodeSupportsVolumeMountGroup)",
            applies: |c| {
                ephemeral(c)?;
                if c.info.node_has("VOLUME_MOUNT_GROUP") {
                    Ok(())
                } else {
                    Err("the driver does not advertise VOLUME_MOUNT_GROUP (the kubelet applies fsGroup \
                         itself, per fsGroupPolicy)"
                        .into())
                }
            },
            run: |env| Box::pin(mount_group(env)),
        },
        Check {
            id: "republish/tokens",
            expects: "with requiresRepublish the driver is published again every period and answers OK each \
                      time, with the service account tokens of tokenRequests, without mounting again",
            source: "storage/v1 CSIDriverSpec requiresRepublish, tokenRequests, \
                     serviceAccountTokenInSecrets; csi_mounter.go SetUpAt \
                     (csi.storage.k8s.io/serviceAccount.tokens)",
            applies: |c| {
                ephemeral(c)?;
                if c.info.csi_driver.spec.requires_republish == Some(true) {
                    Ok(())
                } else {
                    Err("the CSIDriver does not set requiresRepublish".into())
                }
            },
            run: |env| Box::pin(republish(env)),
        },
        Check {
            id: "restart/kubelet",
            expects: "after a kubelet restart the volume is reconstructed from disk and published again, \
                      answered OK; the pod keeps running, and its teardown leaves nothing",
            source: "volumemanager/reconciler/reconstruct.go (reconstructed volumes are uncertain and set \
                     up again); csi_plugin.go ConstructVolumeSpec; KEP-596 GA criterion #79980",
            applies: ephemeral,
            run: |env| Box::pin(kubelet_restart(env)),
        },
        Check {
            id: "restart/driver",
            expects: "a driver restarted while its volumes are published unpublishes them afterwards (its \
                      state survives), leaves nothing, and publishes new volumes",
            source: "CSI spec, Idempotency; KEP-596 Design 6; csi-driver-host-path keeps its state in \
                     --statedir for this",
            applies: |c| {
                ephemeral(c)?;
                if c.setup.restartable() {
                    Ok(())
                } else {
                    Err("an external driver needs --restart-command to be restarted".into())
                }
            },
            run: |env| Box::pin(driver_restart(env)),
        },
        Check {
            id: "concurrency/many-pods",
            expects: "ten pods with two inline volumes each, created and deleted at once on one node, all \
                      run with twenty distinct volumes and leave nothing",
            source: "e2e testsuites/ephemeral.go \"should support multiple inline ephemeral volumes\"; \
                     operation_executor.go (operations on different volumes run in parallel)",
            applies: ephemeral,
            run: |env| Box::pin(many_pods(env)),
        },
        Check {
            id: "concurrency/same-definition",
            expects: "two pods with the same inline volume definition get two volume ids and both run (what \
                      one writes showing in the other is noted: a driver may share identical volumes)",
            source: "e2e testsuites/ephemeral.go \"should support two pods which have the same volume \
                     definition\" (isolation unless the driver is `shared`); KEP-596 Design 2 (a handle per \
                     pod); storage/v1 VolumeLifecycleEphemeral (reference counting of identical volumes)",
            applies: ephemeral,
            run: |env| Box::pin(same_definition(env)),
        },
        Check {
            id: "persistent/stage-publish",
            expects: "a PV of the driver is attached (ControllerPublishVolume when the CSIDriver requires \
                      attach and the driver has PUBLISH_UNPUBLISH_VOLUME), staged, then published with that \
                      staging path; on deletion unpublished before it is unstaged",
            source: "operation_generator.go (MountDevice before SetUp, UnmountDevice after the last \
                     TearDown); csi_attacher.go MountDevice; external-attacher main.go (a trivial handler \
                     for a driver without ControllerPublishUnpublish); CSI spec, Volume Lifecycle",
            applies: persistent,
            run: |env| Box::pin(stage_publish(env)),
        },
        Check {
            id: "persistent/shared-staging",
            expects: "two pods using one PV on a node share one NodeStageVolume; it is unstaged only after \
                      the second pod's unpublish",
            source: "operation_generator.go GenerateUnmountDeviceFunc (unmounted once no pod uses the \
                     device); csi_attacher.go",
            applies: |c| {
                persistent(c)?;
                if !c.info.node_has("STAGE_UNSTAGE_VOLUME") {
                    return Err("the driver does not advertise STAGE_UNSTAGE_VOLUME".into());
                }
                // Without it the kubelet sends SINGLE_NODE_WRITER, and the CSI spec lets a driver refuse
                // a second target path (FAILED_PRECONDITION).
                if !c.info.node_has("SINGLE_NODE_MULTI_WRITER") {
                    return Err("the driver does not advertise SINGLE_NODE_MULTI_WRITER".into());
                }
                Ok(())
            },
            run: |env| Box::pin(shared_staging(env)),
        },
        Check {
            id: "secrets/only-when-referenced",
            expects: "the volume that references a Secret gets its keys, from the pod's namespace only; a \
                      volume without a reference gets none; no other Secret is read; the driver publishes \
                      both",
            source: "csi_mounter.go SetUpAt (nodePublishSecretRef, namespace of the pod); KEP-596 Design 10",
            applies: ephemeral,
            run: |env| Box::pin(secrets(env)),
        },
    ]
}

// ---- applicability ----

fn ephemeral(c: &Conformance) -> Result<(), String> {
    if c.info.ephemeral() {
        Ok(())
    } else {
        Err("the CSIDriver's volumeLifecycleModes has no Ephemeral".into())
    }
}

fn persistent(c: &Conformance) -> Result<(), String> {
    if !c.info.modes().contains("Persistent") {
        return Err("the CSIDriver's volumeLifecycleModes has no Persistent".into());
    }
    if !c.info.controller_has("CREATE_DELETE_VOLUME") {
        return Err(
            "the driver cannot create a volume to test with (no CREATE_DELETE_VOLUME)".into(),
        );
    }
    Ok(())
}

fn real_mounts(c: &Conformance) -> Result<(), String> {
    if c.mounter.1 {
        Ok(())
    } else {
        Err("needs real mounts (root)".into())
    }
}

// ---- helpers ----

/// Runs one pod with one inline volume `data`; returns its successful publish.
async fn one_pod(env: &mut CheckEnv, pod: &str, volume: InlineVolume) -> Result<CsiCall, String> {
    let name = volume.name.clone();
    let pod_object = env.pod(pod, &[volume], json!({}));
    env.run_pods(vec![pod_object]).await?;
    env.published(pod, &name)
}

/// Fails when any call of `method` at one pod volume's target was not answered OK.
fn all_ok(env: &CheckEnv, method: &str, pod: &str, volume: &str) -> Result<(), String> {
    let failed: Vec<String> = env
        .calls_at(method, pod, volume)
        .into_iter()
        .filter(|c| c.code != "OK" && c.message != INJECTED_DEADLINE)
        .map(|c| format!("{} {}: {}", c.method, c.code, c.message))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// How many mounts `/proc/self/mountinfo` has at `target`.
fn mounts_at(target: &Path) -> usize {
    let target = target.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(target.as_str()))
        .count()
}

/// Writes and removes a file in `dir`: Ok when writes are allowed.
fn try_write(dir: &Path) -> std::io::Result<()> {
    let file = dir.join(".conform-probe");
    std::fs::write(&file, b"conform")?;
    std::fs::remove_file(file)
}

// ---- checks ----

async fn lifecycle(env: &mut CheckEnv) -> Outcome {
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

/// What a pass could not see: whether the driver deleted the volume, when it cannot be asked.
fn deletion_note(env: &CheckEnv) -> String {
    if env.can_see_driver_volumes() {
        String::new()
    } else {
        "the driver's deletion of the volume is not observable (no LIST_VOLUMES)".into()
    }
}

async fn pod_info(env: &mut CheckEnv) -> Outcome {
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

async fn attributes_passed(env: &mut CheckEnv) -> Outcome {
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

/// The values of the Secrets the secrets check creates: never shown, even if a driver echoes them.
pub const SECRET_VALUES: [&str; 2] = ["conform-secret-value-1", "conform-secret-value-2"];

/// The attribute no driver knows.
const UNKNOWN_ATTRIBUTE: &str = "conform.inlet.dev/not-an-attribute";

async fn unknown_attribute(env: &mut CheckEnv) -> Outcome {
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

async fn publish_retried(env: &mut CheckEnv) -> Outcome {
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

async fn unpublish_repeated(env: &mut CheckEnv) -> Outcome {
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

async fn read_only(env: &mut CheckEnv) -> Outcome {
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
const FS_GROUP: u32 = 4321;

async fn mount_group(env: &mut CheckEnv) -> Outcome {
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

async fn republish(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "republish", InlineVolume::named("data")).await?;
    let again = |env: &CheckEnv| env.calls_at("NodePublishVolume", "republish", "data").len() >= 3;
    if !env.sim.wait_for(env.conf.wait, |_| again(env)).await {
        return Err("NodePublishVolume was not called again (requiresRepublish)".into());
    }
    all_ok(env, "NodePublishVolume", "republish", "data")?;
    let spec = &env.conf.info.csi_driver.spec;
    let in_secrets = spec.service_account_token_in_secrets == Some(true);
    if spec.token_requests.as_ref().is_some_and(|t| !t.is_empty()) {
        for call in env.calls_at("NodePublishVolume", "republish", "data") {
            let carried = if in_secrets {
                call.secret_keys.iter().any(|k| k == TOKENS_KEY)
            } else {
                call.volume_context.contains_key(TOKENS_KEY)
            };
            if !carried {
                return Err(format!("a republish carried no {TOKENS_KEY}"));
            }
        }
    }
    let target = env.target("republish", "data");
    if env.conf.mounter.1 && mounts_at(&target) > 1 {
        return Err(format!(
            "republishing mounted again: {} mounts",
            mounts_at(&target)
        ));
    }
    env.running("republish").await?;
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(String::new())
}

async fn kubelet_restart(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "restart", InlineVolume::named("data")).await?;
    env.restart_kubelet().await?;
    let node = env.sim.node(super::env::NODE).ok_or("the node is gone")?;
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

async fn driver_restart(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "before", InlineVolume::named("data")).await?;
    env.restart_driver().await?;
    env.delete(&["before"]).await?;
    let after = one_pod(env, "after", InlineVolume::named("data")).await?;
    env.delete(&["after"]).await?;
    env.nothing_left(&[publish.volume_id, after.volume_id])
        .await?;
    Ok(deletion_note(env))
}

async fn many_pods(env: &mut CheckEnv) -> Outcome {
    let names: Vec<String> = (1..=10).map(|i| format!("many-{i}")).collect();
    let volumes = [InlineVolume::named("one"), InlineVolume::named("two")];
    let pods = names
        .iter()
        .map(|n| env.pod(n, &volumes, json!({})))
        .collect();
    env.run_pods(pods).await?;
    let mut ids = BTreeSet::new();
    for name in &names {
        for volume in ["one", "two"] {
            ids.insert(env.published(name, volume)?.volume_id);
        }
    }
    if ids.len() != 20 {
        return Err(format!("20 volumes got {} distinct volume ids", ids.len()));
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    env.delete(&refs).await?;
    env.nothing_left(&ids.into_iter().collect::<Vec<_>>())
        .await?;
    Ok(deletion_note(env))
}

async fn same_definition(env: &mut CheckEnv) -> Outcome {
    let volume = [InlineVolume::named("data")];
    let pods = vec![
        env.pod("first", &volume, json!({})),
        env.pod("second", &volume, json!({})),
    ];
    env.run_pods(pods).await?;
    let (first, second) = (
        env.published("first", "data")?,
        env.published("second", "data")?,
    );
    if first.volume_id == second.volume_id {
        return Err(format!("both pods got volume id {}", first.volume_id));
    }
    let mut note = String::new();
    if env.conf.mounter.1 {
        let written = env.target("first", "data").join("conform-first");
        match std::fs::write(&written, b"first") {
            Ok(()) if env.target("second", "data").join("conform-first").exists() => {
                note = "the two volumes share their content (a shared driver, as e2e's `shared`)"
                    .into();
            }
            Ok(()) => {}
            Err(e) => note = format!("the volume is not writable ({e}): isolation not looked at"),
        }
    } else {
        note = "not root: isolation not looked at".into();
    }
    env.nothing_left(&[first.volume_id, second.volume_id])
        .await?;
    Ok(note)
}

/// Creates a 16 MiB mount volume through the driver's controller; returns its id and context.
async fn create_volume(env: &CheckEnv, name: &str) -> Result<csi::Volume, String> {
    let mut controller = env.controller().await?;
    let request = csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 16 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_capability()],
        ..Default::default()
    };
    controller
        .create_volume(request)
        .await
        .map_err(|s| format!("CreateVolume: {} {}", s.code(), s.message()))?
        .into_inner()
        .volume
        .ok_or_else(|| "CreateVolume returned no volume".into())
}

async fn delete_volume(env: &CheckEnv, id: &str) -> Result<(), String> {
    let mut controller = env.controller().await?;
    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.to_string(),
            secrets: Default::default(),
        })
        .await
        .map_err(|s| format!("DeleteVolume {id}: {} {}", s.code(), s.message()))?;
    Ok(())
}

fn mount_capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    }
}

/// A PV of the created volume, a claim bound to it, and pods using the claim; runs the pods.
async fn run_on_pv(env: &mut CheckEnv, volume: &csi::Volume, pods: &[&str]) -> Result<(), String> {
    let driver = env.conf.setup.name().to_string();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "conform-pv"},
        "spec": {
            "capacity": {"storage": "16Mi"},
            "accessModes": ["ReadWriteOnce"],
            "claimRef": {"name": "conform-claim", "namespace": NAMESPACE},
            "csi": {"driver": driver, "volumeHandle": volume.volume_id,
                    "volumeAttributes": volume.volume_context},
        },
    }))
    .map_err(|e| e.to_string())?;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "conform-claim", "namespace": NAMESPACE},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "conform-pv",
                 "resources": {"requests": {"storage": "16Mi"}}},
    }))
    .map_err(|e| e.to_string())?;
    env.create(vec![
        Object::PersistentVolume(Box::new(pv)),
        Object::PersistentVolumeClaim(Box::new(claim)),
    ])
    .await?;
    let pods =
        pods.iter()
            .map(|name| {
                let mut pod = env.pod(name, &[], json!({}));
                let spec = pod.spec.get_or_insert_with(Default::default);
                spec.volumes =
                    Some(vec![serde_json::from_value(json!(
                {"name": "data", "persistentVolumeClaim": {"claimName": "conform-claim"}}
            ))
            .unwrap_or_default()]);
                if let Some(container) = spec.containers.first_mut() {
                    container.volume_mounts = Some(vec![
                        serde_json::from_value(json!(
                            {"name": "data", "mountPath": "/mnt/data"}
                        ))
                        .unwrap_or_default(),
                    ]);
                }
                pod
            })
            .collect();
    env.run_pods(pods).await
}

/// The position of the first call of `method` for `handle` that was answered OK.
fn first_ok(calls: &[CsiCall], method: &str, handle: &str) -> Option<usize> {
    calls
        .iter()
        .position(|c| c.method == method && c.volume_id == handle && c.code == "OK")
}

/// The position of the last call of `method` for `handle` that was answered OK.
fn last_ok(calls: &[CsiCall], method: &str, handle: &str) -> Option<usize> {
    calls
        .iter()
        .rposition(|c| c.method == method && c.volume_id == handle && c.code == "OK")
}

async fn stage_publish(env: &mut CheckEnv) -> Outcome {
    let volume = create_volume(env, "conform-stage-publish").await?;
    let outcome = stage_publish_on(env, &volume).await;
    let deleted = delete_volume(env, &volume.volume_id).await;
    outcome.and_then(|note| deleted.map(|()| note))
}

async fn stage_publish_on(env: &mut CheckEnv, volume: &csi::Volume) -> Outcome {
    let handle = volume.volume_id.as_str();
    run_on_pv(env, volume, &["staged"]).await?;
    let publish = env
        .calls()
        .into_iter()
        .find(|c| c.method == "NodePublishVolume" && c.volume_id == handle && c.code == "OK")
        .ok_or("no successful NodePublishVolume")?;
    let calls = env.calls();
    let published = first_ok(&calls, "NodePublishVolume", handle);
    // Attach is required unless the CSIDriver says otherwise; external-attacher calls
    // ControllerPublishVolume only for a driver with PUBLISH_UNPUBLISH_VOLUME (else it marks the
    // VolumeAttachment attached itself).
    if env.conf.info.csi_driver.spec.attach_required != Some(false)
        && env.conf.info.controller_has("PUBLISH_UNPUBLISH_VOLUME")
    {
        let attached = first_ok(&calls, "ControllerPublishVolume", handle);
        if attached.is_none() || attached > published {
            return Err(
                "NodePublishVolume came before a successful ControllerPublishVolume".into(),
            );
        }
    }
    let staging = env.conf.info.node_has("STAGE_UNSTAGE_VOLUME");
    if staging {
        let staged = first_ok(&calls, "NodeStageVolume", handle);
        let Some(stage) = staged.map(|i| &calls[i]) else {
            return Err("a driver with STAGE_UNSTAGE_VOLUME was never staged".into());
        };
        if staged > published || publish.staging_path != stage.staging_path {
            return Err(format!(
                "NodePublishVolume's staging path {:?} is not the staged {:?}",
                publish.staging_path, stage.staging_path
            ));
        }
    }
    env.delete(&["staged"]).await?;
    env.nothing_left(&[]).await?;
    let calls = env.calls();
    if staging {
        let unpublished = last_ok(&calls, "NodeUnpublishVolume", handle);
        let unstaged = last_ok(&calls, "NodeUnstageVolume", handle);
        if unstaged.is_none() || unstaged < unpublished {
            return Err("the volume was not unstaged after its unpublish".into());
        }
    }
    Ok(String::new())
}

async fn shared_staging(env: &mut CheckEnv) -> Outcome {
    let volume = create_volume(env, "conform-shared-staging").await?;
    let outcome = shared_staging_on(env, &volume).await;
    let deleted = delete_volume(env, &volume.volume_id).await;
    outcome.and_then(|note| deleted.map(|()| note))
}

async fn shared_staging_on(env: &mut CheckEnv, volume: &csi::Volume) -> Outcome {
    let handle = volume.volume_id.as_str();
    run_on_pv(env, volume, &["first", "second"]).await?;
    let count = |env: &CheckEnv, method: &str| {
        env.calls()
            .iter()
            .filter(|c| c.method == method && c.volume_id == handle && c.code == "OK")
            .count()
    };
    if count(env, "NodeStageVolume") != 1 || count(env, "NodePublishVolume") != 2 {
        return Err(format!(
            "two pods made {} NodeStageVolume and {} NodePublishVolume, expected 1 and 2",
            count(env, "NodeStageVolume"),
            count(env, "NodePublishVolume")
        ));
    }
    env.delete(&["first"]).await?;
    if count(env, "NodeUnstageVolume") != 0 {
        return Err("the volume was unstaged while the second pod still used it".into());
    }
    env.delete(&["second"]).await?;
    env.nothing_left(&[]).await?;
    if count(env, "NodeUnstageVolume") != 1 {
        return Err("the volume was not unstaged after the last pod".into());
    }
    Ok(String::new())
}

async fn secrets(env: &mut CheckEnv) -> Outcome {
    env.create(vec![
        Object::Secret(Box::new(CheckEnv::secret(
            NAMESPACE,
            "conform-secret",
            "conform-key",
            SECRET_VALUES[0],
        ))),
        Object::Secret(Box::new(CheckEnv::secret(
            "other",
            "conform-secret",
            "other-key",
            SECRET_VALUES[1],
        ))),
    ])
    .await?;
    let volumes = [
        InlineVolume {
            secret: Some("conform-secret".into()),
            ..InlineVolume::named("with-secret")
        },
        InlineVolume::named("without"),
    ];
    let pod = env.pod("secrets", &volumes, json!({}));
    env.run_pods(vec![pod]).await?;
    let (mut with, mut without) = (
        env.published("secrets", "with-secret")?,
        env.published("secrets", "without")?,
    );
    // With serviceAccountTokenInSecrets the tokens travel as a secret of every volume.
    for call in [&mut with, &mut without] {
        call.secret_keys.retain(|k| k != TOKENS_KEY);
    }
    if with.secret_keys != ["conform-key"] {
        return Err(format!(
            "the referencing volume got secret keys {:?}, expected [\"conform-key\"]",
            with.secret_keys
        ));
    }
    if !without.secret_keys.is_empty() {
        return Err(format!(
            "the volume without a reference got secret keys {:?}",
            without.secret_keys
        ));
    }
    let read = env.sim.report().secrets_read();
    if read != BTreeSet::from([format!("{NAMESPACE}/conform-secret")]) {
        return Err(format!("the kubelet read the Secrets {read:?}"));
    }
    env.nothing_left(&[with.volume_id, without.volume_id])
        .await?;
    Ok(String::new())
}
