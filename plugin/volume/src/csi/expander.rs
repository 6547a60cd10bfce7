//! Growing a mounted PV's volume on the node (`csi_expander.go` NodeExpand), once the resizer grew it in
//! the controller and the claim waits for the file system (`FileSystemResizePending`): NodeExpandVolume at
//! the pod's mount path, with the staging path when the driver stages, only when the driver advertises
//! EXPAND_VOLUME on the node.

use std::path::Path;

use inlet_proto::csi::v1::{self as csi, node_service_capability::rpc::Type as NodeCap};
use inlet_proto::csi_call::rpc_error;
use k8s_openapi::api::core::v1::PersistentVolume;

use super::device_path_for;
use crate::{VolumeError, VolumeHost};

/// Expands `pv`'s volume mounted at `volume_path` to `new_size` bytes. `Ok(false)` when the driver does
/// not expand on the node (nothing to do there: the resize is done).
pub async fn node_expand(
    host: &dyn VolumeHost,
    pv: &PersistentVolume,
    volume_path: &Path,
    new_size: i64,
) -> Result<bool, VolumeError> {
    let spec = pv.spec.clone().unwrap_or_default();
    let source = spec
        .csi
        .ok_or_else(|| VolumeError::final_("Expander.NodeExpand found no CSI source"))?;
    let client = host
        .csi_client(&source.driver)
        .await
        .map_err(VolumeError::transient)?;
    let capabilities = client
        .node_capabilities()
        .await
        .map_err(|s| VolumeError::from_csi(&s, rpc_error(&s)))?;
    if !capabilities.contains(&NodeCap::ExpandVolume) {
        return Ok(false);
    }
    let staging_target_path = match capabilities.contains(&NodeCap::StageUnstageVolume) {
        true => device_path_for(host, &source.driver, &source.volume_handle)?
            .display()
            .to_string(),
        false => String::new(),
    };
    let request = csi::NodeExpandVolumeRequest {
        volume_id: source.volume_handle.clone(),
        volume_path: volume_path.display().to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: new_size,
            limit_bytes: 0,
        }),
        staging_target_path,
        // The kubelet asks as for a ReadWriteOnce filesystem (`csiResizeOptions.accessMode`).
        volume_capability: Some(csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(csi::volume_capability::AccessType::Mount(
                csi::volume_capability::MountVolume {
                    fs_type: source.fs_type.clone().unwrap_or_default(),
                    mount_flags: spec.mount_options.clone().unwrap_or_default(),
                    volume_mount_group: String::new(),
                },
            )),
        }),
        secrets: Default::default(),
    };
    client.node_expand(request).await.map_err(|s| {
        let message = format!(
            "Expander.NodeExpand failed to expand the volume : {}",
            rpc_error(&s)
        );
        VolumeError::from_csi(&s, message)
    })?;
    Ok(true)
}
