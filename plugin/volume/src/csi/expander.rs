//! Growing a mounted PV's volume on the node (`csi_expander.go` NodeExpand), once the resizer grew it in
//! the controller and the claim waits for the file system (`FileSystemResizePending`): NodeExpandVolume at
//! the pod's mount path, with the staging path when the driver stages; a driver without EXPAND_VOLUME on
//! the node cannot finish it.

use std::path::Path;

use inlet_proto::csi::v1::volume_capability::access_mode::Mode;
use inlet_proto::csi::v1::{self as csi, node_service_capability::rpc::Type as NodeCap};
use inlet_proto::csi_call::rpc_error;
use k8s_openapi::api::core::v1::PersistentVolume;

use super::{client_with_capabilities, device_path_for};
use crate::{VolumeError, VolumeHost};

/// Expands `pv`'s volume mounted at `volume_path` to `new_size` bytes. A driver that does not expand on
/// the node is an error (the resizer asked the node to finish), as upstream's.
pub async fn node_expand(
    host: &dyn VolumeHost,
    pv: &PersistentVolume,
    volume_path: &Path,
    new_size: i64,
) -> Result<(), VolumeError> {
    let spec = pv.spec.clone().unwrap_or_default();
    let source = spec
        .csi
        .ok_or_else(|| VolumeError::final_("Expander.NodeExpand found no CSI source"))?;
    let (client, capabilities) = client_with_capabilities(host, &source.driver).await?;
    if !capabilities.contains(&NodeCap::ExpandVolume) {
        return Err(VolumeError::final_(format!(
            "Expander.NodeExpand found CSI plugin {}/{} to not support node expansion",
            super::PLUGIN_NAME,
            source.driver
        )));
    }
    // The PV's first access mode, as the node's mapper sends it (ReadWriteOnce is SINGLE_NODE_MULTI_WRITER
    // for a driver that has it).
    let multi_writer = capabilities.contains(&NodeCap::SingleNodeMultiWriter);
    let first_mode = spec
        .access_modes
        .iter()
        .flatten()
        .next()
        .map(String::as_str);
    let mode = match (first_mode, multi_writer) {
        (Some("ReadOnlyMany"), _) => Mode::MultiNodeReaderOnly,
        (Some("ReadWriteMany"), _) => Mode::MultiNodeMultiWriter,
        (Some("ReadWriteOncePod"), true) => Mode::SingleNodeSingleWriter,
        (_, true) => Mode::SingleNodeMultiWriter,
        _ => Mode::SingleNodeWriter,
    };
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
        volume_capability: Some(csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
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
    Ok(())
}
