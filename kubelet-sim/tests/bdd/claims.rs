//! Steps about claims: generic ephemeral volumes' claims, what the provisioner made of them, what is left
//! once their pods are gone, and a claim resized while in use.

use cucumber::{then, when};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::Sim;

fn split(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("default", key))
}

#[then(regex = r#"^the claim "([^"]+)" is bound and controlled by pod "([^"]+)"$"#)]
async fn bound_and_owned(w: &mut Sim, claim: String, pod: String) {
    let (namespace, name) = split(&claim);
    let uid = w.uid(&pod);
    let api = std::sync::Arc::clone(&w.sim().api);
    w.wait(&format!("claim {claim} is bound"), |_| {
        api.peek::<PersistentVolumeClaim>(namespace, name)
            .is_some_and(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
    })
    .await;
    let object = api.peek::<PersistentVolumeClaim>(namespace, name).unwrap();
    let owner = object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    assert!(
        owner.is_some_and(|o| o.kind == "Pod" && o.name == pod && o.uid == uid),
        "claim {claim}'s controller: {owner:?}"
    );
}

#[then(regex = r#"^the driver created the volume of claim "([^"]+)"$"#)]
fn created(w: &mut Sim, claim: String) {
    let (namespace, name) = split(&claim);
    let object = w
        .sim()
        .api
        .peek::<PersistentVolumeClaim>(namespace, name)
        .expect("the claim");
    let pv = format!("pvc-{}", object.metadata.uid.clone().unwrap_or_default());
    let calls = w.report().csi_calls;
    assert!(
        calls
            .iter()
            .any(|c| c.method == "CreateVolume" && c.volume_id == pv && c.code == "OK"),
        "no CreateVolume named {pv}: {calls:#?}"
    );
    let bound = object.spec.as_ref().and_then(|s| s.volume_name.clone());
    assert_eq!(
        bound.as_deref(),
        Some(pv.as_str()),
        "the claim is bound to its PV"
    );
}

#[then(regex = r"^no claim or PersistentVolume is left$")]
async fn none_left(w: &mut Sim) {
    let api = std::sync::Arc::clone(&w.sim().api);
    w.wait("no claim or PersistentVolume is left", |_| {
        api.list::<PersistentVolumeClaim>().is_empty() && api.list::<PersistentVolume>().is_empty()
    })
    .await;
}

#[then(regex = r"^every volume the driver created was deleted$")]
fn all_deleted(w: &mut Sim) {
    let calls = w.report().csi_calls;
    let count = |method: &str| {
        calls
            .iter()
            .filter(|c| c.method == method && c.code == "OK")
            .count()
    };
    assert!(count("CreateVolume") > 0, "no CreateVolume");
    assert_eq!(count("CreateVolume"), count("DeleteVolume"), "{calls:#?}");
}

#[when(regex = r#"^the claim "([^"]+)" is resized to "([^"]+)"$"#)]
fn resized(w: &mut Sim, claim: String, size: String) {
    let (namespace, name) = split(&claim);
    let updated = w
        .sim()
        .api
        .update::<PersistentVolumeClaim>(namespace, name, |c| {
            let spec = c.spec.get_or_insert_with(Default::default);
            let resources = spec.resources.get_or_insert_with(Default::default);
            let requests = resources.requests.get_or_insert_with(Default::default);
            requests.insert("storage".into(), Quantity(size.clone()));
        });
    assert!(updated, "no claim {claim}");
}

#[then(
    regex = r#"^the claim "([^"]+)" has capacity "([^"]+)" and no FileSystemResizePending condition$"#
)]
async fn capacity(w: &mut Sim, claim: String, size: String) {
    let (namespace, name) = split(&claim);
    let api = std::sync::Arc::clone(&w.sim().api);
    w.wait(&format!("claim {claim} has capacity {size}"), |_| {
        api.peek::<PersistentVolumeClaim>(namespace, name)
            .is_some_and(|c| {
                let status = c.status.clone().unwrap_or_default();
                let capacity = status
                    .capacity
                    .as_ref()
                    .and_then(|c| c.get("storage"))
                    .map(|q| q.0.clone());
                let pending = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "FileSystemResizePending");
                capacity.is_some_and(|c| parse_bytes(&c) == parse_bytes(&size)) && !pending
            })
    })
    .await;
}

#[then(regex = r"^the driver got (\w+) calls?$")]
fn got(w: &mut Sim, method: String) {
    let calls = w.report().csi_calls;
    assert!(
        calls.iter().any(|c| c.method == method && c.code == "OK"),
        "no successful {method}: {calls:#?}"
    );
}

fn parse_bytes(quantity: &str) -> u64 {
    inlet_host::quantity::parse_bytes(quantity).unwrap_or_else(|e| panic!("{quantity}: {e}"))
}
