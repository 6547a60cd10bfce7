//! Admission of persistent inline volumes (gate `PersistentInlineCSI`): a pod's inline `csi` source that is
//! persistent (by its CSIDriver and handle, as the kubelet decides) must be granted to the pod's namespace
//! by the PersistentVolume of its handle, and may not name attach or stage secrets of its own
//! (`inlet_volume::csi::grant`). The kubelet and the attach/detach controller check again.

use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::CSIDriver;

use inlet_volume::csi::grant::granting_pv;
use inlet_volume::csi::source::{LifecycleMode, gated_inline_mode};

use super::Api;
use super::manifest::draft_fields;

/// Ok when every persistent inline volume of `pod` is granted; else the refusal, in the API server's
/// `Forbidden` shape.
pub fn admit(api: &Api, pod: &Pod, name: &str) -> Result<(), String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    for (i, volume) in volumes.into_iter().flatten().enumerate() {
        let Some(csi) = &volume.csi else { continue };
        let (handle, controller_secret, stage_secret) = draft_fields(pod, &volume.name);
        let driver = api.peek::<CSIDriver>("", &csi.driver);
        if gated_inline_mode(driver.as_deref(), handle.is_some()) != LifecycleMode::Persistent {
            continue;
        }
        let forbidden = |field: &str, why: String| {
            format!("pods {name:?} is forbidden: spec.volumes[{i}].csi.{field}: Forbidden: {why}")
        };
        for (field, set) in [
            ("controllerPublishSecretRef", controller_secret.is_some()),
            ("nodeStageSecretRef", stage_secret.is_some()),
        ] {
            if set {
                return Err(forbidden(
                    field,
                    "a persistent inline volume uses the secrets of the PersistentVolume that grants it".into(),
                ));
            }
        }
        let Some(handle) = handle else {
            // No handle: the attach says so (persistent_inline.feature), as the draft had it.
            continue;
        };
        let pvs: Vec<std::sync::Arc<PersistentVolume>> = api.list::<PersistentVolume>();
        granting_pv(
            pvs.iter().map(|pv| pv.as_ref()),
            &csi.driver,
            &handle,
            namespace,
        )
        .map_err(|why| forbidden("volumeHandle", why))?;
    }
    Ok(())
}
