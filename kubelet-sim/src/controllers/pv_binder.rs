//! The PV controller's binding of pre-bound volumes (no dynamic provisioning): a claim naming a PV, or a PV
//! whose `claimRef` names a claim, binds both, as `pkg/controller/volume/persistentvolume` does for them.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};

use crate::api::Api;

/// Binds every unbound claim that names a PV, or that a PV's `claimRef` names: the claim gets
/// `spec.volumeName` and phase Bound, the PV its `claimRef` and phase Bound.
pub fn bind_claims(api: &Api) {
    for pvc in api.list::<PersistentVolumeClaim>() {
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
            continue;
        }
        let (namespace, name) = (
            pvc.metadata.namespace.clone().unwrap_or_default(),
            pvc.metadata.name.clone().unwrap_or_default(),
        );
        let claimed_by = |pv: &Arc<PersistentVolume>| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .is_some_and(|r| {
                    r.name.as_deref() == Some(&name) && r.namespace.as_deref() == Some(&namespace)
                })
        };
        let named = pvc.spec.as_ref().and_then(|s| s.volume_name.clone());
        let pv = match named {
            Some(pv_name) => api.peek::<PersistentVolume>("", &pv_name),
            None => api.list::<PersistentVolume>().into_iter().find(claimed_by),
        };
        let Some(pv) = pv else { continue };
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        // The claim's status takes the PV's capacity and access modes (`bindClaimToVolume`), which the
        // kubelet compares with the PV's after a resize.
        let pv_spec = pv.spec.clone().unwrap_or_default();
        api.update::<PersistentVolumeClaim>(&namespace, &name, |c| {
            c.spec.get_or_insert_with(Default::default).volume_name = Some(pv_name.clone());
            let status = c.status.get_or_insert_with(Default::default);
            status.phase = Some("Bound".into());
            status.capacity = pv_spec.capacity.clone();
            status.access_modes = pv_spec.access_modes.clone();
        });
        api.update::<PersistentVolume>("", &pv_name, |p| {
            let spec = p.spec.get_or_insert_with(Default::default);
            spec.claim_ref.get_or_insert_with(|| ObjectReference {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            });
            p.status.get_or_insert_with(Default::default).phase = Some("Bound".into());
        });
    }
}
