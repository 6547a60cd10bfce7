//! The catalogue: each check is named after the KEP-596 or CSI behaviour it shows, says what it expects
//! and where that comes from, decides whether it applies to the driver (its capabilities and CSIDriver),
//! and runs as pods through the simulated kubelet. `conform.md` beside this crate explains each one.
//!
//! The catalogue, when each check applies and the steps several share are here; each group's checks are
//! in a file named after the group (`ephemeral.rs` holds `ephemeral/*`).

mod concurrency;
mod ephemeral;
mod idempotency;
mod persistent;
mod republish;
mod restart;
mod secrets;

pub use secrets::SECRET_VALUES;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use futures::future::BoxFuture;
use inlet_proto::csi::v1 as csi;
use inlet_proto::csi_call::{CsiCall, TOKENS_KEY};
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
            expects: "a volume attribute the driver does not know fails NodePublishVolume with \
                      INVALID_ARGUMENT (a message that does not name it is noted); the pod gets a FailedMount \
                      event, nothing is mounted, and the pod can be deleted",
            source: "CSI spec, Error Scheme (\"Invalid or unsupported field in the request\": \
                     INVALID_ARGUMENT); KEP-596 Design 7 (attributes are driver-defined, so only the driver \
                     can refuse a typo)",
            applies: ephemeral,
            run: |env| Box::pin(ephemeral::unknown_attribute(env)),
        },
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
        Check {
            id: "ephemeral/read-only",
            expects: "csi.readOnly: true reaches the driver as readonly and the container's mount is \
                      read-only (a target that takes writes is noted: KEP-596 lets a driver ignore the flag); \
                      a volume without it is writable",
            source: "CSI NodePublishVolumeRequest.readonly; KEP-596 (read-only volumes); e2e \
                     testsuites/ephemeral.go \"should create read-only inline ephemeral volume\", \"should \
                     create read/write inline ephemeral volume\"",
            applies: |c| ephemeral(c).and(real_mounts(c)),
            run: |env| Box::pin(ephemeral::read_only(env)),
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
            run: |env| Box::pin(ephemeral::mount_group(env)),
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
            run: |env| Box::pin(republish::republish(env)),
        },
        Check {
            id: "restart/kubelet",
            expects: "after a kubelet restart the volume is reconstructed from disk and published again, \
                      answered OK; the pod keeps running, and its teardown leaves nothing",
            source: "volumemanager/reconciler/reconstruct.go (reconstructed volumes are uncertain and set \
                     up again); csi_plugin.go ConstructVolumeSpec; KEP-596 GA criterion #79980",
            applies: ephemeral,
            run: |env| Box::pin(restart::kubelet_restart(env)),
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
            run: |env| Box::pin(restart::driver_restart(env)),
        },
        Check {
            id: "concurrency/many-pods",
            expects: "ten pods with two inline volumes each, created and deleted at once on one node, all \
                      run with twenty distinct volumes and leave nothing",
            source: "e2e testsuites/ephemeral.go \"should support multiple inline ephemeral volumes\"; \
                     operation_executor.go (operations on different volumes run in parallel)",
            applies: ephemeral,
            run: |env| Box::pin(concurrency::many_pods(env)),
        },
        Check {
            id: "concurrency/same-definition",
            expects: "two pods with the same inline volume definition get two volume ids and both run (what \
                      one writes showing in the other is noted: a driver may share identical volumes)",
            source: "e2e testsuites/ephemeral.go \"should support two pods which have the same volume \
                     definition\" (isolation unless the driver is `shared`); KEP-596 Design 2 (a handle per \
                     pod); storage/v1 VolumeLifecycleEphemeral (reference counting of identical volumes)",
            applies: ephemeral,
            run: |env| Box::pin(concurrency::same_definition(env)),
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
            run: |env| Box::pin(persistent::stage_publish(env)),
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
            run: |env| Box::pin(persistent::shared_staging(env)),
        },
        Check {
            id: "secrets/only-when-referenced",
            expects: "the volume that references a Secret gets its keys, from the pod's namespace only; a \
                      volume without a reference gets none; no other Secret is read; the driver publishes \
                      both",
            source: "csi_mounter.go SetUpAt (nodePublishSecretRef, namespace of the pod); KEP-596 Design 10",
            applies: ephemeral,
            run: |env| Box::pin(secrets::secrets(env)),
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

/// The mounts of `/proc/self/mountinfo` as (filesystem `major:minor`, root within it, mount point).
fn mount_table() -> BTreeSet<(String, String, String)> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            Some((
                fields.get(2)?.to_string(),
                fields.get(3)?.to_string(),
                fields.get(4)?.to_string(),
            ))
        })
        .collect()
}

/// Writes and removes a file in `dir`: Ok when writes are allowed.
fn try_write(dir: &Path) -> std::io::Result<()> {
    let file = dir.join(".conform-probe");
    std::fs::write(&file, b"conform")?;
    std::fs::remove_file(file)
}

/// What a pass could not see: whether the driver deleted the volume, when it cannot be asked.
fn deletion_note(env: &CheckEnv) -> String {
    if env.can_see_driver_volumes() {
        String::new()
    } else {
        "the driver's deletion of the volume is not observable (no LIST_VOLUMES)".into()
    }
}
