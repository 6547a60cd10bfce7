//! Pre-provisioning a static PV's volume on inlet's `local` driver: the step an administrator takes
//! before writing a static PV (CreateVolume named by the PV's handle, of the PV's capacity). Volumes of
//! other drivers are the user's to create.

use inlet_proto::csi::v1 as csi;
use inlet_proto::csi::v1::controller_client::ControllerClient;
use k8s_openapi::api::core::v1::PersistentVolume;

use crate::drivers::DriverHandle;

/// Why a PV's volume could not be pre-provisioned (the text becomes the manifest's rejection).
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// `spec.capacity.storage` is not a quantity.
    #[error("PersistentVolume {pv:?}: spec.capacity.storage: {reason}")]
    Capacity {
        /// The PV's name.
        pv: String,
        /// What is wrong with the quantity.
        reason: String,
    },
    /// The driver's socket did not answer.
    #[error("{0}")]
    Dial(#[from] inlet_proto::uds::EndpointError),
    /// The driver refused CreateVolume.
    #[error("pre-provisioning PersistentVolume {pv:?} on {node}: {}", status.message())]
    CreateVolume {
        /// The PV's name.
        pv: String,
        /// The node whose driver refused.
        node: String,
        /// The driver's answer.
        #[source]
        status: tonic::Status,
    },
}

/// The annotation that keeps a PV from being pre-provisioned (`"false"`): its volume is missing on the
/// driver, as when an administrator wrote the PV before (or without) creating the volume.
pub const PRE_PROVISION_ANNOTATION: &str = "inlet.dev/pre-provision";

/// Creates `pv`'s volume on each of `local_drivers` (the in-process `local` drivers of the PV's driver
/// name, one per node); nothing when the PV is not a CSI one, or says not to.
pub async fn pre_provision(
    pv: &PersistentVolume,
    local_drivers: &[&DriverHandle],
) -> Result<(), ProvisionError> {
    let Some(source) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
        return Ok(());
    };
    let annotations = pv.metadata.annotations.as_ref();
    if annotations
        .and_then(|a| a.get(PRE_PROVISION_ANNOTATION))
        .map(String::as_str)
        == Some("false")
    {
        return Ok(());
    }
    let name = pv.metadata.name.clone().unwrap_or_default();
    let storage = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "1Gi".into());
    let bytes =
        inlet_host::quantity::parse_bytes(&storage).map_err(|reason| ProvisionError::Capacity {
            pv: name.clone(),
            reason,
        })?;
    // A Block PV's volume is created for raw block access, as the external-provisioner asks for one.
    let block = pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let access_type = match block {
        true => csi::volume_capability::AccessType::Block(Default::default()),
        false => csi::volume_capability::AccessType::Mount(Default::default()),
    };
    for handle in local_drivers {
        let channel = inlet_proto::uds::connect(&handle.socket).await?;
        let request = csi::CreateVolumeRequest {
            name: source.volume_handle.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
                limit_bytes: 0,
            }),
            volume_capabilities: vec![csi::VolumeCapability {
                access_mode: Some(csi::volume_capability::AccessMode {
                    mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(access_type.clone()),
            }],
            ..Default::default()
        };
        ControllerClient::new(channel)
            .create_volume(request)
            .await
            .map_err(|status| ProvisionError::CreateVolume {
                pv: name.clone(),
                node: handle.node.clone(),
                status,
            })?;
    }
    Ok(())
}
