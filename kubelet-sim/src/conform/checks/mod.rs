//! The catalogue: each check is named after the KEP-596 or CSI behaviour it shows, says what it expects
//! and where that comes from, decides whether it applies to the driver (its capabilities and CSIDriver),
//! and runs as pods through the simulated kubelet, or a real one (`--kubeconfig`). `conform.md` beside this
//! crate explains each one.
//!
//! The catalogue, when each check applies and the steps several share are here; each group's checks are
//! in a file named after the group (`ephemeral.rs` holds `ephemeral/*`).

mod concurrency;
mod csidriver;
mod ephemeral;
mod expansion;
mod fsgroup;
mod generic_ephemeral;
mod idempotency;
mod node;
mod persistent;
mod pod_info;
mod regression;
mod republish;
mod restart;
mod secrets;
mod selinux;
mod stats;
mod tokens;

pub use secrets::SECRET_VALUES;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use futures::future::BoxFuture;
use inlet_proto::csi::v1 as csi;
use inlet_proto::csi_call::{CsiCall, TOKENS_KEY};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::json;

use super::env::{CheckEnv, Conformance, InlineVolume, NAMESPACE, OTHER_NAMESPACE};
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

/// Every check, in the order they run: the groups in turn.
pub fn catalogue() -> Vec<Check> {
    [
        ephemeral::checks(),
        idempotency::checks(),
        republish::checks(),
        restart::checks(),
        concurrency::checks(),
        persistent::checks(),
        generic_ephemeral::checks(),
        expansion::checks(),
        secrets::checks(),
        pod_info::checks(),
        csidriver::checks(),
        fsgroup::checks(),
        selinux::checks(),
        tokens::checks(),
        stats::checks(),
        regression::checks(),
        node::checks(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

// ---- applicability ----

fn ephemeral(c: &Conformance) -> Result<(), String> {
    if !c.info.ephemeral() {
        return Err("the CSIDriver's volumeLifecycleModes has no Ephemeral".into());
    }
    // e2e's external driver: no InlineVolumes, no CSIInlineVolume tests.
    if c.inline_volumes.is_empty() {
        return Err("the test driver file lists no InlineVolumes".into());
    }
    Ok(())
}

/// e2e's TestEphemeral skip: the check mounts the first `volumes` definitions read/write.
fn needs_read_write(c: &Conformance, volumes: usize) -> Result<(), String> {
    match (0..volumes).find(|i| c.inline(*i).read_only) {
        Some(i) => Err(format!(
            "inline ephemeral volume #{i} is read-only, but the test needs a read/write volume"
        )),
        None => Ok(()),
    }
}

/// The check needs what only the simulation shows or does (`what`): skipped on a real node.
fn simulated(c: &Conformance, what: &str) -> Result<(), String> {
    match c.cluster {
        Some(_) => Err(format!("on a real node: {what}")),
        None => Ok(()),
    }
}

/// On a real node, whether its kubelet has `feature`, on by default from 1.`minor` (a kubelet that
/// predates that does not do what the check looks at, whatever the driver does).
fn kubelet_has(c: &Conformance, minor: u32, feature: &str) -> Result<(), String> {
    match &c.cluster {
        Some(node) if node.kubelet_minor().is_some_and(|m| m < minor) => Err(format!(
            "the node's kubelet {} predates {feature} (on by default from 1.{minor})",
            node.kubelet_version
        )),
        _ => Ok(()),
    }
}

/// CSIServiceAccountToken (KEP-1855): tokenRequests and requiresRepublish, beta in 1.21.
fn service_account_tokens(c: &Conformance) -> Result<(), String> {
    kubelet_has(
        c,
        21,
        "CSIServiceAccountToken (tokenRequests, requiresRepublish)",
    )
}

fn persistent(c: &Conformance) -> Result<(), String> {
    simulated(
        c,
        "its claims and PVs need the simulated control plane (provisioner, attacher, resizer)",
    )?;
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

/// Creates pod `pod` with one inline volume and waits until it runs (Ok: its successful publish) or the
/// kubelet reports a FailedMount (Err: the event's message); a step that fails otherwise is the outer Err.
async fn start_pod(
    env: &mut CheckEnv,
    pod: &str,
    volume: InlineVolume,
) -> Result<Result<CsiCall, String>, String> {
    let name = volume.name.clone();
    let object = env.pod(pod, &[volume], json!({}));
    env.create(vec![Object::Pod(Box::new(object))]).await?;
    let failed_mount = |env: &CheckEnv| {
        let warnings = env.warnings(pod).into_iter();
        warnings
            .filter(|e| e.reason == "FailedMount")
            .map(|e| e.message)
            .next()
    };
    let settled = |env: &CheckEnv| {
        env.phase(pod).as_deref() == Some("Running") || failed_mount(env).is_some()
    };
    env.until(settled).await;
    if let Some(message) = failed_mount(env) {
        return Ok(Err(message));
    }
    env.running(pod).await?;
    Ok(env.published(pod, &name))
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
