//! The external-resizer (`kubernetes-csi/external-resizer`, `pkg/controller/controller.go`), for the
//! simulation's own API: a bound claim whose request grew beyond its capacity, of a class with
//! `allowVolumeExpansion`, is expanded in the controller (ControllerExpandVolume, when the driver has
//! EXPAND_VOLUME there; otherwise the trivial resizer leaves it all to the node), and its PV's capacity
//! becomes the new size. When the node must finish (the driver says so, or expands only on the node) the
//! claim gets the `FileSystemResizePending` condition the kubelet acts on (and `NodeResizePending` in
//! `allocatedResourceStatuses`, 1.34+); otherwise its status capacity is the new size.

use std::collections::BTreeMap;

use inlet_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::claims::{Claims, PROVISIONED_ON};
use crate::operations::OpKey;

/// The condition the kubelet finishes a resize on.
pub const FS_RESIZE_PENDING: &str = "FileSystemResizePending";

/// The bytes of a claim's or PV's `storage` quantity, if any.
pub fn storage_bytes(quantities: Option<&BTreeMap<String, Quantity>>) -> Option<u64> {
    let quantity = quantities?.get("storage")?;
    inlet_host::quantity::parse_bytes(&quantity.0).ok()
}

/// The PV's volume capability, as the resizer sends it (`GetVolumeCapabilities`): its first access mode, a
/// block device or a filesystem of its `fsType` and mount options.
fn capability(pv: &k8s_openapi::api::core::v1::PersistentVolumeSpec) -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    let mode = match pv.access_modes.iter().flatten().next().map(String::as_str) {
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter,
        _ => Mode::SingleNodeWriter,
    };
    let access_type = match pv.volume_mode.as_deref() {
        Some("Block") => AccessType::Block(Default::default()),
        _ => AccessType::Mount(MountVolume {
            fs_type: pv
                .csi
                .as_ref()
                .and_then(|c| c.fs_type.clone())
                .unwrap_or_default(),
            mount_flags: pv.mount_options.clone().unwrap_or_default(),
            volume_mount_group: String::new(),
        }),
    };
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(access_type),
    }
}

impl Claims {
    /// Resizes `claim`'s volume when its request grew beyond its PV's capacity.
    pub(super) async fn resize(&self, claim: &PersistentVolumeClaim) {
        let spec = claim.spec.clone().unwrap_or_default();
        let (Some(pv_name), Some(class_name)) = (&spec.volume_name, &spec.storage_class_name)
        else {
            return;
        };
        let requested = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
        let Some(pv) = self.api.peek::<PersistentVolume>("", pv_name) else {
            return;
        };
        let pv_spec = pv.spec.clone().unwrap_or_default();
        let (Some(wanted), Some(has)) = (
            storage_bytes(requested),
            storage_bytes(pv_spec.capacity.as_ref()),
        ) else {
            return;
        };
        let allowed = self
            .api
            .peek::<StorageClass>("", class_name)
            .is_some_and(|c| c.allow_volume_expansion == Some(true));
        let Some(source) = pv_spec.csi.as_ref().filter(|_| allowed && wanted > has) else {
            return;
        };
        let annotations = pv.metadata.annotations.clone().unwrap_or_default();
        let node = annotations.get(PROVISIONED_ON).cloned().or_else(|| {
            self.nodes
                .iter()
                .find(|n| self.drivers.client(n, &source.driver).is_some())
                .cloned()
        });
        let Some(client) = node.and_then(|n| self.drivers.client(&n, &source.driver)) else {
            return;
        };
        let key = OpKey::Claim(format!("resize/{pv_name}"));
        if !self.ops.lock().try_start(&key, "resize") {
            return;
        }
        let new_size = i64::try_from(wanted).unwrap_or(i64::MAX);
        let expands = client.controller_capabilities().await.map(|caps| {
            caps.contains(&csi::controller_service_capability::rpc::Type::ExpandVolume)
        });
        let expanded = match expands {
            Err(status) => Err(status),
            Ok(false) => Ok((new_size, true)),
            Ok(true) => client
                .controller_expand(csi::ControllerExpandVolumeRequest {
                    volume_id: source.volume_handle.clone(),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: new_size,
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(capability(&pv_spec)),
                    ..Default::default()
                })
                .await
                .map(|r| (r.capacity_bytes.max(new_size), r.node_expansion_required)),
        };
        self.ops.lock().finish(&key, "resize", expanded.is_ok());
        let (capacity, on_node) = match expanded {
            Ok(done) => done,
            Err(status) => {
                tracing::warn!(pv = %pv_name, "resize volume {:?} failed: {}", pv_name, status.message());
                return;
            }
        };
        let capacity = Quantity(capacity.to_string());
        self.api.update::<PersistentVolume>("", pv_name, |p| {
            let spec = p.spec.get_or_insert_with(Default::default);
            spec.capacity
                .get_or_insert_with(Default::default)
                .insert("storage".into(), capacity.clone());
        });
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        self.api.update::<PersistentVolumeClaim>(&namespace, &name, |c| {
            let status = c.status.get_or_insert_with(Default::default);
            let storage = |q: Quantity| BTreeMap::from([("storage".to_string(), q)]);
            status.allocated_resources = Some(storage(capacity.clone()));
            if on_node {
                status.allocated_resource_statuses =
                    Some(BTreeMap::from([("storage".into(), "NodeResizePending".into())]));
                let conditions = status.conditions.get_or_insert_with(Vec::new);
                conditions.retain(|c| c.type_ != FS_RESIZE_PENDING);
                conditions.push(PersistentVolumeClaimCondition {
                    type_: FS_RESIZE_PENDING.into(),
                    status: "True".into(),
                    last_transition_time: Some(crate::api::store::now()),
                    message: Some(
                        "Waiting for user to (re-)start a pod to finish file system resize of volume on node."
                            .into(),
                    ),
                    ..Default::default()
                });
            } else {
                status.capacity = Some(storage(capacity.clone()));
                status.allocated_resource_statuses = None;
            }
        });
    }
}
