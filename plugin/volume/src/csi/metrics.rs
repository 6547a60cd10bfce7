//! A mounted CSI volume's usage and condition, as the kubelet's stats provider reads them
//! (`metrics_csi.go` GetMetrics, `csi_client.go` NodeGetVolumeStats): only from a driver that advertises
//! GET_VOLUME_STATS, the condition only with the `CSIVolumeHealth` gate (alpha, off by default) and
//! VOLUME_CONDITION.

use inlet_proto::csi::v1::{self as csi, node_service_capability::rpc::Type as NodeCap};

use inlet_proto::csi_call::rpc_error;

use super::{PLUGIN_NAME, VolData, client_with_capabilities};
use crate::{Metrics, VolumeError, VolumeHost};

/// The gate that lets the kubelet read a volume's condition.
pub const CSI_VOLUME_HEALTH: &str = "CSIVolumeHealth";

/// The metrics of the pod's volume `spec_name`; `Ok(None)` when the driver does not report any.
pub(super) async fn get(
    host: &dyn VolumeHost,
    spec_name: &str,
    pod_uid: &str,
) -> Result<Option<Metrics>, VolumeError> {
    // A filesystem volume's record is beside its mount; a raw block one's in its device data dir, and it
    // is asked at the pod's published device (`csi_block.go`: blockPath + "/" + pod UID).
    let dir = host.pod_volume_dir(pod_uid, PLUGIN_NAME, spec_name);
    let (data, target) = match VolData::load(&dir) {
        Ok(data) => (data, dir.join("mount")),
        Err(_) => {
            let data = VolData::load(&super::block::data_dir(host, spec_name)).map_err(|e| {
                VolumeError::transient(format!(
                    "metrics: failed to load volume data of {spec_name}: {e}"
                ))
            })?;
            (data, super::block::publish_path(host, spec_name, pod_uid))
        }
    };
    let (client, capabilities) = client_with_capabilities(host, &data.driver_name).await?;
    if !capabilities.contains(&NodeCap::GetVolumeStats) {
        return Ok(None);
    }
    let response = client
        .node_volume_stats(&data.volume_handle, &target.display().to_string())
        .await
        .map_err(|s| VolumeError::from_csi(&s, rpc_error(&s)))?;
    if response.usage.is_empty() {
        return Err(VolumeError::transient(
            "failed to get usage from response. usage is nil",
        ));
    }
    let mut metrics = Metrics::default();
    for usage in &response.usage {
        let (used, total, free) = (Some(usage.used), Some(usage.total), Some(usage.available));
        match csi::volume_usage::Unit::try_from(usage.unit) {
            Ok(csi::volume_usage::Unit::Bytes) => {
                (metrics.used, metrics.capacity, metrics.available) = (used, total, free)
            }
            Ok(csi::volume_usage::Unit::Inodes) => {
                (metrics.inodes_used, metrics.inodes, metrics.inodes_free) = (used, total, free)
            }
            _ => tracing::error!(unit = usage.unit, "unknown key in usage"),
        }
    }
    if host.feature_enabled(CSI_VOLUME_HEALTH) && capabilities.contains(&NodeCap::VolumeCondition) {
        let condition = response.volume_condition.unwrap_or_default();
        metrics.abnormal = Some(condition.abnormal);
        metrics.message = Some(condition.message);
    }
    Ok(Some(metrics))
}
