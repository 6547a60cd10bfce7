//! CSI Controller calls of the local driver. Each method's doc says how a repeated call behaves.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use csi::controller_service_capability::{Rpc, Type as CapType, rpc::Type as Cap};
use inlet_proto::csi::v1::{self as csi, volume_content_source::Type as SourceType};

use super::LocalDriver;
use super::store::{AccessType, ContentSource, SnapshotRecord, VolumeRecord};
use crate::keys::KUBERNETES_KEY_PREFIX;
use crate::validate;
use inlet_host::error::{Error, Result};
use inlet_host::quantity::format_bytes;

impl LocalDriver {
    /// The controller capabilities: PUBLISH_UNPUBLISH_VOLUME only when attach is enabled.
    pub fn controller_capabilities(&self) -> Vec<csi::ControllerServiceCapability> {
        let mut caps = vec![
            Cap::CreateDeleteVolume,
            Cap::CreateDeleteSnapshot,
            Cap::ListSnapshots,
            Cap::ListVolumes,
            Cap::GetCapacity,
            Cap::CloneVolume,
            Cap::ExpandVolume,
            Cap::GetVolume,
            Cap::VolumeCondition,
            Cap::SingleNodeMultiWriter,
        ];
        if self.config.enable_attach {
            caps.extend([Cap::PublishUnpublishVolume, Cap::ListVolumesPublishedNodes]);
        }
        caps.into_iter()
            .map(|c| csi::ControllerServiceCapability {
                r#type: Some(CapType::Rpc(Rpc { r#type: c as i32 })),
            })
            .collect()
    }

    /// CreateVolume. The volume's id is its name. Idempotent by name: the same name with the same size,
    /// access type, parameters and source returns the existing volume; any difference is ALREADY_EXISTS.
    pub fn create_volume(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse> {
        let name = validate::id("name", &req.name)?;
        let access_type = validate::capabilities("volume_capabilities", &req.volume_capabilities)?;
        let parameters = driver_parameters(&req.parameters)?;
        let source = self.content_source(req.volume_content_source.as_ref(), access_type)?;
        let source_size = match &source {
            Some(ContentSource::Snapshot(id)) => self.store.snapshots()[id].size_bytes,
            Some(ContentSource::Volume(id)) => self.store.volumes()[id].capacity_bytes,
            None => 0,
        };
        let capacity_bytes = self.size_for(req.capacity_range.as_ref(), source_size)?;

        if let Some(existing) = self.store.volume(name) {
            if existing.ephemeral {
                return Err(Error::AlreadyExists(format!(
                    "volume {name:?} is an ephemeral inline volume"
                )));
            }
            let differs = [
                (existing.capacity_bytes != capacity_bytes, "size"),
                (existing.access_type != access_type, "access type"),
                (existing.parameters != parameters, "parameters"),
                (existing.content_source != source, "content source"),
            ];
            if let Some((_, what)) = differs.iter().find(|(d, _)| *d) {
                return Err(Error::AlreadyExists(format!(
                    "volume {name:?} already exists with a different {what}"
                )));
            }
            return Ok(csi::CreateVolumeResponse {
                volume: Some(volume_message(&existing)),
            });
        }

        self.check_allocation(capacity_bytes)?;
        // The id is the name: stable, and an administrator can name it in a pre-provisioned PV.
        let volume = VolumeRecord {
            id: name.to_string(),
            capacity_bytes,
            access_type,
            parameters,
            content_source: source,
            ephemeral: false,
            attached_to: BTreeMap::new(),
            staged_at: None,
            published: litemap::LiteMap::new(),
        };
        let copy_from = match &volume.content_source {
            Some(ContentSource::Snapshot(id)) => Some(self.store.snapshot_data(id, access_type)),
            Some(ContentSource::Volume(id)) => Some(self.store.volume_data(id, access_type)),
            None => None,
        };
        self.create_content(&volume, copy_from.as_deref())?;
        inlet_host::crash::point("volume.content-created");
        if let Err(err) = self.store.put_volume(volume.clone()) {
            let _ = super::remove_content(&self.store.volume_data(&volume.id, access_type));
            return Err(err);
        }
        tracing::info!(volume_id = %volume.id, name, size = %format_bytes(capacity_bytes), "created volume");
        Ok(csi::CreateVolumeResponse {
            volume: Some(volume_message(&volume)),
        })
    }

    /// DeleteVolume. An unknown id is already deleted (OK). A volume still attached, staged or published is
    /// FAILED_PRECONDITION, so content in use is never removed.
    pub fn delete_volume(
        &self,
        req: csi::DeleteVolumeRequest,
    ) -> Result<csi::DeleteVolumeResponse> {
        let id = validate::id("volume_id", &req.volume_id)?;
        let Some(volume) = self.store.volume(id) else {
            return Ok(csi::DeleteVolumeResponse {});
        };
        if volume.ephemeral || !volume.published.is_empty() || volume.staged_at.is_some() {
            return Err(Error::FailedPrecondition(format!(
                "volume {id:?} is in use on node {}",
                self.config.node_id
            )));
        }
        if !volume.attached_to.is_empty() {
            let nodes: Vec<&String> = volume.attached_to.keys().collect();
            return Err(Error::FailedPrecondition(format!(
                "volume {id:?} is still published to nodes {nodes:?}"
            )));
        }
        self.delete_volume_data(id)?;
        tracing::info!(volume_id = id, "deleted volume");
        Ok(csi::DeleteVolumeResponse {})
    }

    /// ControllerPublishVolume (attach). Repeating it for the same node and read-only flag is OK; the same
    /// node with another read-only flag is ALREADY_EXISTS. This driver's volumes can only go to its own node.
    pub fn controller_publish(
        &self,
        req: csi::ControllerPublishVolumeRequest,
    ) -> Result<csi::ControllerPublishVolumeResponse> {
        self.require_attach()?;
        let id = validate::id("volume_id", &req.volume_id)?;
        let node = validate::required("node_id", &req.node_id)?;
        let cap = validate::capability("volume_capability", req.volume_capability.as_ref())?;
        let volume = self.volume(id)?;
        if node != self.config.node_id {
            return Err(Error::not_found("node", node));
        }
        if cap.access_type != volume.access_type {
            return Err(access_type_mismatch(id, volume.access_type));
        }
        match volume.attached_to.get(node) {
            Some(&ro) if ro == req.readonly => {}
            Some(_) => {
                return Err(Error::AlreadyExists(format!(
                    "volume {id:?} is already published to node {node:?} with readonly={}",
                    !req.readonly
                )));
            }
            None => {
                let mut volume = volume.clone();
                volume.attached_to.insert(node.to_string(), req.readonly);
                self.store.put_volume(volume)?;
                tracing::info!(volume_id = id, node, "attached volume");
            }
        }
        Ok(csi::ControllerPublishVolumeResponse {
            publish_context: HashMap::new(),
        })
    }

    /// ControllerUnpublishVolume (detach). An unknown volume, or one not published to the node, is already
    /// unpublished (OK). An empty node_id unpublishes from every node.
    pub fn controller_unpublish(
        &self,
        req: csi::ControllerUnpublishVolumeRequest,
    ) -> Result<csi::ControllerUnpublishVolumeResponse> {
        self.require_attach()?;
        let id = validate::id("volume_id", &req.volume_id)?;
        if let Some(volume) = self.store.volume(id) {
            let mut volume = volume.clone();
            let before = volume.attached_to.len();
            volume
                .attached_to
                .retain(|node, _| !req.node_id.is_empty() && node != &req.node_id);
            if volume.attached_to.len() != before {
                self.store.put_volume(volume)?;
                tracing::info!(volume_id = id, node = req.node_id, "detached volume");
            }
        }
        Ok(csi::ControllerUnpublishVolumeResponse {})
    }

    /// ValidateVolumeCapabilities: confirms the capabilities (and parameters, when given) or says in `message`
    /// which one this volume cannot honour. An unknown volume is NOT_FOUND.
    pub fn validate_volume_capabilities(
        &self,
        req: csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse> {
        let id = validate::id("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(Error::invalid(
                "volume_capabilities",
                "required: at least one capability",
            ));
        }
        let volume = self.volume(id)?;
        let unconfirmed = |message: String| csi::ValidateVolumeCapabilitiesResponse {
            confirmed: None,
            message,
        };
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            match validate::capability(&format!("volume_capabilities[{i}]"), Some(cap)) {
                Err(err) => return Ok(unconfirmed(err.to_string())),
                Ok(c) if c.access_type != volume.access_type => {
                    return Ok(unconfirmed(
                        access_type_mismatch(id, volume.access_type).to_string(),
                    ));
                }
                Ok(_) => {}
            }
        }
        if !req.parameters.is_empty() && driver_parameters(&req.parameters)? != volume.parameters {
            return Ok(unconfirmed(
                "parameters differ from those the volume was created with".into(),
            ));
        }
        let confirmed = csi::validate_volume_capabilities_response::Confirmed {
            volume_context: req.volume_context,
            volume_capabilities: req.volume_capabilities,
            parameters: req.parameters,
            mutable_parameters: req.mutable_parameters,
        };
        Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(confirmed),
            message: String::new(),
        })
    }

    /// ListVolumes, ordered by id, paginated (see `paginate`). Ephemeral volumes are node-local objects the
    /// CO never created through the controller, so they are not listed.
    pub fn list_volumes(&self, req: csi::ListVolumesRequest) -> Result<csi::ListVolumesResponse> {
        // A copy, so the store is not locked while the page is made.
        let volumes: Vec<VolumeRecord> = self
            .store
            .volumes()
            .values()
            .filter(|v| !v.ephemeral)
            .cloned()
            .collect();
        let (page, next_token) = paginate(&volumes, req.max_entries, &req.starting_token)?;
        let entries = page
            .iter()
            .map(|v| csi::list_volumes_response::Entry {
                volume: Some(volume_message(v)),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: self.published_nodes(v),
                    volume_condition: Some(self.condition(v)),
                }),
            })
            .collect();
        Ok(csi::ListVolumesResponse {
            entries,
            next_token,
        })
    }

    /// ControllerGetVolume. An unknown volume is NOT_FOUND.
    pub fn controller_get_volume(
        &self,
        req: csi::ControllerGetVolumeRequest,
    ) -> Result<csi::ControllerGetVolumeResponse> {
        let volume = self.volume(validate::id("volume_id", &req.volume_id)?)?;
        Ok(csi::ControllerGetVolumeResponse {
            volume: Some(volume_message(&volume)),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: self.published_nodes(&volume),
                volume_condition: Some(self.condition(&volume)),
            }),
        })
    }

    /// GetCapacity: the bytes still free. Capabilities this driver cannot serve have no capacity (0).
    pub fn get_capacity(&self, req: csi::GetCapacityRequest) -> Result<csi::GetCapacityResponse> {
        let supported = req
            .volume_capabilities
            .iter()
            .all(|c| validate::capability("volume_capabilities", Some(c)).is_ok());
        let available = if supported { self.available_bytes() } else { 0 };
        Ok(csi::GetCapacityResponse {
            available_capacity: to_i64(available),
            maximum_volume_size: Some(to_i64(self.config.max_volume_bytes.min(available))),
            minimum_volume_size: None,
        })
    }

    /// ControllerExpandVolume. Growing to a size already reached is OK (no shrink); block volumes then need
    /// NodeExpandVolume so the loop device sees the new size.
    pub fn controller_expand(
        &self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse> {
        let id = validate::id("volume_id", &req.volume_id)?;
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| Error::invalid("capacity_range", "required"))?;
        let volume = self.volume(id)?.clone();
        let wanted = self.size_for(Some(range), 0)?;
        if wanted > volume.capacity_bytes {
            let growth = wanted - volume.capacity_bytes;
            if wanted > self.config.max_volume_bytes || growth > self.available_bytes() {
                return Err(Error::OutOfRange(format!(
                    "cannot expand volume {id:?} to {}: the maximum is {} and {} is free",
                    format_bytes(wanted),
                    format_bytes(self.config.max_volume_bytes),
                    format_bytes(self.available_bytes())
                )));
            }
            if volume.access_type == AccessType::Block {
                super::grow_file(&self.store.volume_data(id, AccessType::Block), wanted)?;
            }
            self.store.put_volume(VolumeRecord {
                capacity_bytes: wanted,
                ..volume.clone()
            })?;
            tracing::info!(volume_id = id, size = %format_bytes(wanted), "expanded volume");
        }
        Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: to_i64(wanted.max(volume.capacity_bytes)),
            node_expansion_required: volume.access_type == AccessType::Block,
        })
    }

    /// CreateSnapshot: a copy of the volume's content. Idempotent by name; the same name for another source
    /// volume is ALREADY_EXISTS. An unknown source volume is NOT_FOUND.
    pub fn create_snapshot(
        &self,
        req: csi::CreateSnapshotRequest,
    ) -> Result<csi::CreateSnapshotResponse> {
        let source_id = validate::id("source_volume_id", &req.source_volume_id)?;
        let name = validate::id("name", &req.name)?;
        let existing = self
            .store
            .snapshots()
            .values()
            .find(|s| s.name == name)
            .cloned();
        if let Some(existing) = existing {
            if existing.source_volume_id != source_id {
                return Err(Error::AlreadyExists(format!(
                    "snapshot {name:?} already exists for volume {:?}",
                    existing.source_volume_id
                )));
            }
            return Ok(csi::CreateSnapshotResponse {
                snapshot: Some(snapshot_message(&existing)),
            });
        }
        let source = self.volume(source_id)?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let snapshot = SnapshotRecord {
            id: uuid::Uuid::new_v4().to_string(),
            name: name.to_string(),
            source_volume_id: source_id.to_string(),
            size_bytes: source.capacity_bytes,
            access_type: source.access_type,
            created_seconds: now.as_secs() as i64,
            created_nanos: now.subsec_nanos() as i32,
        };
        let data = self.store.snapshot_data(&snapshot.id, snapshot.access_type);
        super::copy_tree(
            &self.store.volume_data(source_id, source.access_type),
            &data,
        )?;
        if let Err(err) = self.store.put_snapshot(snapshot.clone()) {
            let _ = super::remove_content(&data);
            return Err(err);
        }
        tracing::info!(snapshot_id = %snapshot.id, source_volume_id = source_id, "created snapshot");
        Ok(csi::CreateSnapshotResponse {
            snapshot: Some(snapshot_message(&snapshot)),
        })
    }

    /// DeleteSnapshot. An unknown id is already deleted (OK).
    pub fn delete_snapshot(
        &self,
        req: csi::DeleteSnapshotRequest,
    ) -> Result<csi::DeleteSnapshotResponse> {
        let id = validate::id("snapshot_id", &req.snapshot_id)?;
        let snapshot = self.store.snapshots().get(id).cloned();
        if let Some(snapshot) = snapshot {
            super::remove_content(&self.store.snapshot_data(id, snapshot.access_type))?;
            self.store.remove_snapshot(id)?;
            tracing::info!(snapshot_id = id, "deleted snapshot");
        }
        Ok(csi::DeleteSnapshotResponse {})
    }

    /// ListSnapshots, ordered by id, filtered by snapshot_id or source_volume_id, paginated. A filter that
    /// matches nothing gives an empty list, not an error.
    pub fn list_snapshots(
        &self,
        req: csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse> {
        let matching: Vec<SnapshotRecord> = self
            .store
            .snapshots()
            .values()
            .filter(|s| req.snapshot_id.is_empty() || s.id == req.snapshot_id)
            .filter(|s| {
                req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id
            })
            .cloned()
            .collect();
        let (page, next_token) = paginate(&matching, req.max_entries, &req.starting_token)?;
        let entries = page
            .iter()
            .map(|s| csi::list_snapshots_response::Entry {
                snapshot: Some(snapshot_message(s)),
            })
            .collect();
        Ok(csi::ListSnapshotsResponse {
            entries,
            next_token,
        })
    }

    fn require_attach(&self) -> Result<()> {
        if self.config.enable_attach {
            return Ok(());
        }
        Err(Error::Unimplemented(
            "attach is not enabled on this driver (start it with --enable-attach)".into(),
        ))
    }

    /// The size to allocate for a capacity range: required_bytes if set, else the default (capped by
    /// limit_bytes), and never less than the content it is created from.
    fn size_for(&self, range: Option<&csi::CapacityRange>, at_least: u64) -> Result<u64> {
        let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
        if required < 0 || limit < 0 {
            return Err(Error::invalid(
                "capacity_range",
                "bytes may not be negative",
            ));
        }
        let (required, limit) = (required as u64, limit as u64);
        if limit > 0 && required > limit {
            return Err(Error::invalid(
                "capacity_range",
                "required_bytes is larger than limit_bytes",
            ));
        }
        let mut size = if required > 0 {
            required
        } else {
            self.config.default_volume_bytes.max(at_least)
        };
        if limit > 0 {
            size = size.min(limit);
        }
        if size < at_least {
            return Err(Error::OutOfRange(format!(
                "capacity_range allows at most {} but the content source holds {}",
                format_bytes(size),
                format_bytes(at_least)
            )));
        }
        if size > self.config.max_volume_bytes {
            return Err(Error::OutOfRange(format!(
                "requested {} exceeds the maximum volume size {}",
                format_bytes(size),
                format_bytes(self.config.max_volume_bytes)
            )));
        }
        Ok(size)
    }

    fn content_source(
        &self,
        source: Option<&csi::VolumeContentSource>,
        access: AccessType,
    ) -> Result<Option<ContentSource>> {
        let source = match source.and_then(|s| s.r#type.as_ref()) {
            None => return Ok(None),
            Some(SourceType::Snapshot(s)) => {
                let id =
                    validate::id("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?;
                let snapshot = self
                    .store
                    .snapshots()
                    .get(id)
                    .cloned()
                    .ok_or_else(|| Error::not_found("snapshot", id))?;
                if snapshot.access_type != access {
                    return Err(Error::invalid(
                        "volume_content_source",
                        "the snapshot's access type differs",
                    ));
                }
                ContentSource::Snapshot(id.to_string())
            }
            Some(SourceType::Volume(v)) => {
                let id = validate::id("volume_content_source.volume.volume_id", &v.volume_id)?;
                if self.volume(id)?.access_type != access {
                    return Err(Error::invalid(
                        "volume_content_source",
                        "the source volume's access type differs",
                    ));
                }
                ContentSource::Volume(id.to_string())
            }
        };
        Ok(Some(source))
    }

    fn published_nodes(&self, volume: &VolumeRecord) -> Vec<String> {
        volume.attached_to.keys().cloned().collect()
    }
}

/// The parameters a CreateVolume may carry: the local driver takes none of its own, and accepts the
/// `csi.storage.k8s.io/` ones external-provisioner may add. Anything else is named in the error.
fn driver_parameters(params: &HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    if let Some(key) = params
        .keys()
        .find(|k| !k.starts_with(KUBERNETES_KEY_PREFIX))
    {
        return Err(Error::invalid(
            format!("parameters[{key:?}]"),
            "unknown parameter; the local driver takes none",
        ));
    }
    Ok(params.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// One page of `items` after `starting_token` (an index this driver issued). `max_entries` 0 means all.
/// A token it could not have issued is ABORTED, as the spec asks.
fn paginate<'a, T>(
    items: &'a [T],
    max_entries: i32,
    starting_token: &str,
) -> Result<(&'a [T], String)> {
    if max_entries < 0 {
        return Err(Error::invalid("max_entries", "may not be negative"));
    }
    let start = match starting_token {
        "" => 0,
        token => token
            .parse::<usize>()
            .ok()
            .filter(|&i| i <= items.len())
            .ok_or_else(|| Error::Aborted(format!("starting_token {token:?} is not valid")))?,
    };
    let end = match max_entries {
        0 => items.len(),
        n => (start + n as usize).min(items.len()),
    };
    let next = if end < items.len() {
        end.to_string()
    } else {
        String::new()
    };
    Ok((&items[start..end], next))
}

fn access_type_mismatch(id: &str, actual: AccessType) -> Error {
    Error::invalid(
        "volume_capability.access_type",
        format!("volume {id:?} is a {actual:?} volume"),
    )
}

fn to_i64(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

fn volume_message(v: &VolumeRecord) -> csi::Volume {
    let content_source = v.content_source.as_ref().map(|s| csi::VolumeContentSource {
        r#type: Some(match s {
            ContentSource::Snapshot(id) => {
                SourceType::Snapshot(csi::volume_content_source::SnapshotSource {
                    snapshot_id: id.clone(),
                })
            }
            ContentSource::Volume(id) => {
                SourceType::Volume(csi::volume_content_source::VolumeSource {
                    volume_id: id.clone(),
                })
            }
        }),
    });
    csi::Volume {
        capacity_bytes: to_i64(v.capacity_bytes),
        volume_id: v.id.clone(),
        volume_context: HashMap::new(),
        content_source,
        accessible_topology: Vec::new(),
    }
}

fn snapshot_message(s: &SnapshotRecord) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: to_i64(s.size_bytes),
        snapshot_id: s.id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: s.created_seconds,
            nanos: s.created_nanos,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pagination_walks_every_item_once() {
        let items: Vec<u32> = (0..5).collect();
        let (page, next) = paginate(&items, 2, "").unwrap();
        assert_eq!((page, next.as_str()), (&items[0..2], "2"));
        let (page, next) = paginate(&items, 2, "4").unwrap();
        assert_eq!((page, next.as_str()), (&items[4..5], ""));
        assert_eq!(paginate(&items, 0, "").unwrap().0.len(), 5);
        assert!(matches!(paginate(&items, 1, "9"), Err(Error::Aborted(_))));
        assert!(matches!(paginate(&items, 1, "x"), Err(Error::Aborted(_))));
        assert!(matches!(
            paginate(&items, -1, ""),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
