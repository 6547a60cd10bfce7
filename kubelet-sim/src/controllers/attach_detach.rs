//! The attach/detach controller (kube-controller-manager) and the external attacher (csi-attacher sidecar),
//! together, over VolumeAttachment objects.
//!
//! - Attach: for every attachable volume of a pod bound to a node, the CSI plugin's `Attacher` writes a
//!   VolumeAttachment (csi-sha256(handle + driver + node)); pods on one node using one handle share it.
//! - External attacher: ControllerPublishVolume for each unattached VolumeAttachment (with the
//!   controllerPublishSecretRef's secret), then `status.attached` and the publish context; an error becomes
//!   `status.attachError` and a FailedAttachVolume event on every pod waiting for it. A driver without
//!   PUBLISH_UNPUBLISH_VOLUME is attached trivially, as csi-attacher does.
//! - Detach: when no pod on the node wants the volume and the node no longer reports it in
//!   `status.volumesInUse`, the attachment is deleted; the attacher calls ControllerUnpublishVolume, then
//!   removes it. A persistent inline attachment carries its own copy of the source, so detach needs no pod;
//!   its secret is the one the granting PersistentVolume names (`inlet_volume::csi::grant`), read at
//!   detach time. If that secret was deleted, the detach fails and is retried (the volume stays attached).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_host::mount::RecordingMounter;
use inlet_proto::csi::v1::{
    self as csi, controller_service_capability::rpc::Type as ControllerCap,
};
use inlet_proto::csi_call::rpc_error;
use inlet_volume::csi::{CsiClient, CsiPlugin};
use inlet_volume::{PodInfo, VolumePlugin};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Node, PersistentVolume, PersistentVolumeSpec, Secret,
};
use k8s_openapi::api::storage::v1::{
    CSINode, VolumeAttachment, VolumeAttachmentStatus, VolumeError as ApiVolumeError,
};
use parking_lot::Mutex;

use crate::api::{Api, ApiPod, Key, PodFeed, now};
use crate::node::host::NodeHost;
use crate::node::registry::DriverDirectory;
use crate::node::token_manager::TokenManager;
use crate::operations::{BackoffPolicy, OpKey, Operations};
use crate::specs::{Reads, volume_spec};

/// A VolumeAttachment as the report lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AttachmentReport {
    /// Its name.
    pub name: String,
    /// The driver.
    pub attacher: String,
    /// The node.
    pub node: String,
    /// The volume handle.
    pub volume_handle: String,
    /// Attached when last seen.
    pub attached: bool,
    /// The last attach error, if any.
    pub attach_error: Option<String>,
    /// The last detach error, if any.
    pub detach_error: Option<String>,
    /// Deleted (detached) by the end of the run.
    pub deleted: bool,
}

/// The shortest time between two passes.
const RECONCILER_PERIOD: Duration = Duration::from_millis(100);

/// The controller. One per simulation.
pub struct AttachDetach {
    api: Arc<Api>,
    /// The controller's own CSI plugin (upstream's controller probes its attachable plugins with a host of
    /// its own, `attach_detach_controller.go`): it decides what attaches and writes VolumeAttachments.
    plugin: CsiPlugin,
    /// Where each node's drivers answer, for the external attacher.
    drivers: Arc<DriverDirectory>,
    ops: Mutex<Operations>,
    /// Every attachment seen, for the report.
    seen: Mutex<BTreeMap<String, AttachmentReport>>,
    /// The pods that changed since the last pass.
    pod_feed: Arc<PodFeed>,
    /// Pods to look at on every pass: they want an attachment, or are not resolved yet.
    pending: Mutex<HashSet<Key>>,
    /// Pods known to have no attachable volume, with their UID (a pod recreated under the same name is
    /// looked at again).
    no_attach: Mutex<HashMap<Key, String>>,
}

impl AttachDetach {
    /// A controller over `api`, reaching drivers through `drivers`, with the feature `gates` the nodes
    /// have.
    pub fn new(
        api: Arc<Api>,
        drivers: Arc<DriverDirectory>,
        gates: &BTreeSet<String>,
        backoff: BackoffPolicy,
    ) -> Arc<Self> {
        // Attaching reads CSIDrivers and writes VolumeAttachments, nothing on a node: the host has no
        // root dir, no drivers, and a mount layer that is never called.
        let host = NodeHost {
            node: "attach-detach-controller".into(),
            root: PathBuf::new(),
            api: Arc::clone(&api),
            registry: None,
            mounter: Arc::new(RecordingMounter::new()),
            gates: gates.clone(),
            selinux: false,
            tokens: Arc::new(TokenManager::new(Arc::clone(&api))),
        };
        // Subscribed before the pods there are now are read: none is missed between the two.
        let pod_feed = api.pod_feed();
        let pending = Mutex::new(api.pod_keys().into_iter().collect());
        Arc::new(Self {
            plugin: CsiPlugin::new(Arc::new(host)),
            drivers,
            api,
            ops: Mutex::new(Operations::new(backoff)),
            seen: Mutex::default(),
            pod_feed,
            pending,
            no_attach: Mutex::default(),
        })
    }

    /// Runs until `stop`: one pass after API changes (at most one per [`RECONCILER_PERIOD`]), and when a
    /// backoff expires.
    pub async fn run(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut watch = self.api.watch();
        loop {
            let started = Instant::now();
            self.sync().await;
            let next = self
                .ops
                .lock()
                .next_retry()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            let passed = Instant::now();
            tokio::select! {
                _ = watch.changed() => {}
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = &mut stop => return,
            }
            // At most one pass per reconciler period (upstream's `reconcilerLoopPeriod`, 100 ms,
            // attach_detach_controller.go), since changes come by the thousand; and, as a pass may look at
            // many pods (all that wait for attachments), never more than a third of a CPU.
            let period = RECONCILER_PERIOD.max(2 * (passed - started));
            tokio::select! {
                _ = tokio::time::sleep_until((passed + period).into()) => {}
                _ = &mut stop => return,
            }
        }
    }

    /// Every attachment seen so far, with its last state.
    pub fn report(&self) -> Vec<AttachmentReport> {
        self.seen.lock().values().cloned().collect()
    }

    async fn sync(&self) {
        let waiting = self.attach_desired().await;
        self.detach_unwanted(&waiting);
        for attachment in self.api.list::<VolumeAttachment>() {
            self.external_attacher(&attachment, &waiting).await;
        }
    }

    /// The pods a pass looks at: those added, changed or removed since the last pass, and those that
    /// still want an attachment or could not be resolved yet. A pod found to attach nothing is left until
    /// it changes: a pod's volumes never change, nor does a CSIDriver's attachRequired (upstream's
    /// controller likewise acts on its pod informer's events, `podAdd`/`podUpdate`/`podDelete`).
    fn pods_to_visit(&self) -> Vec<Key> {
        let changed = self.pod_feed.drain();
        let mut pending = self.pending.lock();
        let mut no_attach = self.no_attach.lock();
        for key in changed {
            let pod = self.api.peek::<ApiPod>(&key.0, &key.1);
            let uid = pod.as_ref().and_then(|p| p.metadata.uid.as_deref());
            match (uid, no_attach.get(&key)) {
                (None, _) => {
                    no_attach.remove(&key);
                    pending.remove(&key);
                }
                (Some(uid), Some(known)) if known == uid => {}
                (Some(_), _) => {
                    no_attach.remove(&key);
                    pending.insert(key);
                }
            }
        }
        // In the order of their keys, as a list would give them.
        let mut keys: Vec<Key> = pending.iter().cloned().collect();
        keys.sort_unstable();
        keys
    }

    /// Writes the attachments pods want; returns, per attachment, the pods waiting for it (for events).
    async fn attach_desired(&self) -> HashMap<String, Vec<(Arc<ApiPod>, String)>> {
        let mut waiting: HashMap<String, Vec<(Arc<ApiPod>, String)>> = HashMap::new();
        let keys = self.pods_to_visit();
        if keys.is_empty() {
            return waiting;
        }
        // Only nodes that exist are managed (upstream's desired state of world adds a node from its
        // Node object); read once a pass, not once a pod.
        let nodes: std::collections::HashSet<String> = self
            .api
            .list::<Node>()
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        for key in keys {
            let Some(pod) = self.api.peek::<ApiPod>(&key.0, &key.1) else {
                self.pending.lock().remove(&key);
                continue;
            };
            let Some(node) = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .filter(|n| nodes.contains(*n))
                .map(str::to_string)
            else {
                continue;
            };
            let info = PodInfo::from_pod(&pod);
            let (mut resolved, mut attaches) = (true, false);
            for volume in pod.volumes() {
                let outer = volume.name().to_string();
                let Ok((spec, _)) = volume_spec(&self.api, Reads::Cached, &pod, &info, volume)
                else {
                    resolved = false;
                    continue;
                };
                if !self.plugin.can_support(&spec) {
                    continue;
                }
                let Some(attachable) = self.plugin.attachable() else {
                    continue;
                };
                match attachable.can_attach(&spec, &info).await {
                    Ok(true) => attaches = true,
                    Ok(false) => continue,
                    Err(_) => {
                        resolved = false;
                        continue;
                    }
                }
                let op = OpKey::Attach {
                    pod: info.uid.clone(),
                    volume: outer.clone(),
                };
                if !self.ops.lock().try_start(&op, "volume_attach") {
                    continue;
                }
                let result = attachable.new_attacher().attach(&spec, &info, &node).await;
                self.ops.lock().finish(&op, "volume_attach", result.is_ok());
                match result {
                    Ok(name) => waiting.entry(name).or_default().push((pod.clone(), outer)),
                    Err(e) => {
                        let message = format!(
                            "AttachVolume.Attach failed for volume {outer:?} : {}",
                            e.message
                        );
                        self.api
                            .record_event(&pod, "Warning", "FailedAttachVolume", &message);
                    }
                }
            }
            if resolved && !attaches {
                self.pending.lock().remove(&key);
                self.no_attach.lock().insert(key, info.uid.clone());
            }
        }
        waiting
    }

    /// Deletes attachments no pod wants once their node stopped using the volume.
    fn detach_unwanted(&self, wanted: &HashMap<String, Vec<(Arc<ApiPod>, String)>>) {
        for attachment in self.api.list::<VolumeAttachment>() {
            let name = attachment.metadata.name.clone().unwrap_or_default();
            if wanted.contains_key(&name) || attachment.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Some((driver, handle)) = self
                .source_of(&attachment)
                .map(|s| (s.driver, s.volume_handle))
            else {
                continue;
            };
            let unique = format!("kubernetes.io/csi/{driver}^{handle}");
            let in_use = self
                .api
                .peek::<Node>("", &attachment.spec.node_name)
                .and_then(|n| n.status.clone())
                .and_then(|s| s.volumes_in_use)
                .is_some_and(|v| v.contains(&unique));
            if !in_use {
                self.api.update::<VolumeAttachment>("", &name, |va| {
                    va.metadata.deletion_timestamp.get_or_insert_with(now);
                });
            }
        }
    }

    /// The CSI source an attachment is for: its PV's, or the inline copy it carries.
    fn source_of(&self, attachment: &VolumeAttachment) -> Option<CSIPersistentVolumeSource> {
        let source = &attachment.spec.source;
        if let Some(inline) = &source.inline_volume_spec {
            return inline.csi.clone();
        }
        let pv = self
            .api
            .peek::<PersistentVolume>("", source.persistent_volume_name.as_deref()?)?;
        pv.spec.clone()?.csi
    }

    /// csi-attacher: ControllerPublish unattached attachments, ControllerUnpublish deleted ones.
    async fn external_attacher(
        &self,
        attachment: &VolumeAttachment,
        waiting: &HashMap<String, Vec<(Arc<ApiPod>, String)>>,
    ) {
        let name = attachment.metadata.name.clone().unwrap_or_default();
        let deleting = attachment.metadata.deletion_timestamp.is_some();
        let attached = attachment.status.as_ref().is_some_and(|s| s.attached);
        self.remember(attachment);
        if !deleting && attached {
            return;
        }
        let key = OpKey::VolumeAttachment(name.clone());
        // A deletion is an update the attacher's queue takes at once, whatever the attach's back-off.
        let operation = match deleting {
            false => "ControllerPublishVolume",
            true => "ControllerUnpublishVolume",
        };
        if !self.ops.lock().try_start(&key, operation) {
            return;
        }
        let result = match deleting {
            false => self.publish(attachment).await.map(Some),
            true => self.unpublish(attachment).await.map(|()| None),
        };
        self.ops.lock().finish(&key, operation, result.is_ok());
        match (deleting, result) {
            (false, Ok(context)) => {
                self.api.update::<VolumeAttachment>("", &name, |va| {
                    va.status = Some(VolumeAttachmentStatus {
                        attached: true,
                        attachment_metadata: context.flatten(),
                        ..Default::default()
                    });
                });
            }
            (false, Err(message)) => {
                self.api.update::<VolumeAttachment>("", &name, |va| {
                    va.status = Some(VolumeAttachmentStatus {
                        attached: false,
                        attach_error: Some(ApiVolumeError {
                            message: Some(message.clone()),
                            time: Some(now()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    });
                });
                for (pod, outer) in waiting.get(&name).into_iter().flatten() {
                    self.api.record_event(
                        pod,
                        "Warning",
                        "FailedAttachVolume",
                        &format!("AttachVolume.Attach failed for volume {outer:?} : {message}"),
                    );
                }
            }
            (true, Ok(_)) => {
                self.api.remove::<VolumeAttachment>("", &name);
                if let Some(seen) = self.seen.lock().get_mut(&name) {
                    seen.deleted = true;
                    seen.attached = false;
                }
            }
            (true, Err(message)) => {
                tracing::warn!(attachment = name, "detach failed: {message}");
                self.api.update::<VolumeAttachment>("", &name, |va| {
                    let status = va.status.get_or_insert_with(Default::default);
                    status.detach_error = Some(ApiVolumeError {
                        message: Some(message.clone()),
                        time: Some(now()),
                        ..Default::default()
                    });
                });
            }
        }
    }

    fn remember(&self, attachment: &VolumeAttachment) {
        let name = attachment.metadata.name.clone().unwrap_or_default();
        let status = attachment.status.clone().unwrap_or_default();
        let report = AttachmentReport {
            name: name.clone(),
            attacher: attachment.spec.attacher.clone(),
            node: attachment.spec.node_name.clone(),
            volume_handle: self
                .source_of(attachment)
                .map(|s| s.volume_handle)
                .unwrap_or_default(),
            attached: status.attached,
            attach_error: status.attach_error.and_then(|e| e.message),
            detach_error: status.detach_error.and_then(|e| e.message),
            deleted: false,
        };
        self.seen.lock().insert(name, report);
    }

    /// ControllerPublishVolume for an attachment; the publish context (None for a trivial attach).
    async fn publish(
        &self,
        attachment: &VolumeAttachment,
    ) -> Result<Option<BTreeMap<String, String>>, String> {
        let (source, client, node_id) = self.target(attachment)?;
        let caps = client
            .controller_capabilities()
            .await
            .map_err(|s| rpc_error(&s))?;
        if !caps.contains(&ControllerCap::PublishUnpublishVolume) {
            return Ok(None);
        }
        let read_only = source.read_only.unwrap_or(false);
        let spec = self.volume_spec(attachment);
        let access_mode = access_mode(spec.as_ref());
        // A Block PV is published for raw block access (the external-attacher's capability).
        let block = spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
        let access_type = match block {
            true => csi::volume_capability::AccessType::Block(Default::default()),
            false => {
                csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
                    fs_type: source.fs_type.clone().unwrap_or_default(),
                    ..Default::default()
                })
            }
        };
        let request = csi::ControllerPublishVolumeRequest {
            volume_id: source.volume_handle.clone(),
            node_id,
            volume_capability: Some(csi::VolumeCapability {
                access_mode: Some(csi::volume_capability::AccessMode {
                    mode: access_mode as i32,
                }),
                access_type: Some(access_type),
            }),
            readonly: read_only,
            secrets: self.secrets(source.controller_publish_secret_ref.as_ref())?,
            volume_context: source
                .volume_attributes
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
        };
        let context = client
            .controller_publish(request)
            .await
            .map_err(|s| rpc_error(&s))?;
        Ok(Some(context.into_iter().collect()))
    }

    /// ControllerUnpublishVolume for a deleted attachment.
    async fn unpublish(&self, attachment: &VolumeAttachment) -> Result<(), String> {
        let (source, client, node_id) = self.target(attachment)?;
        let caps = client
            .controller_capabilities()
            .await
            .map_err(|s| rpc_error(&s))?;
        if !caps.contains(&ControllerCap::PublishUnpublishVolume) {
            return Ok(());
        }
        let request = csi::ControllerUnpublishVolumeRequest {
            volume_id: source.volume_handle.clone(),
            node_id,
            secrets: self.secrets(source.controller_publish_secret_ref.as_ref())?,
        };
        client
            .controller_unpublish(request)
            .await
            .map_err(|s| rpc_error(&s))
    }

    /// The attachment's source and its driver on the attachment's node: a client, and the node id from
    /// CSINode (csi-attacher's `getNodeID`, `csi_handler.go`).
    fn target(
        &self,
        attachment: &VolumeAttachment,
    ) -> Result<(CSIPersistentVolumeSource, CsiClient, String), String> {
        let (node, driver) = (&attachment.spec.node_name, &attachment.spec.attacher);
        let source = self
            .source_of(attachment)
            .ok_or_else(|| "the attachment's volume source is gone".to_string())?;
        let not_there = || format!("CSINode {node} does not contain driver {driver}");
        let node_id = self
            .api
            .peek::<CSINode>("", node)
            .and_then(|n| {
                n.spec
                    .drivers
                    .iter()
                    .find(|d| d.name == *driver)
                    .map(|d| d.node_id.clone())
            })
            .ok_or_else(not_there)?;
        let client = self.drivers.client(node, driver).ok_or_else(not_there)?;
        Ok((source, client, node_id))
    }

    /// The volume's spec: the attachment's inline one, else its PV's.
    fn volume_spec(&self, attachment: &VolumeAttachment) -> Option<PersistentVolumeSpec> {
        match &attachment.spec.source.inline_volume_spec {
            Some(spec) => Some(spec.clone()),
            None => attachment
                .spec
                .source
                .persistent_volume_name
                .as_deref()
                .and_then(|n| self.api.peek::<PersistentVolume>("", n))
                .and_then(|pv| pv.spec.clone()),
        }
    }

    /// The secret a reference names: every data key as a string. A missing secret fails the call.
    fn secrets(
        &self,
        reference: Option<&k8s_openapi::api::core::v1::SecretReference>,
    ) -> Result<HashMap<String, String>, String> {
        let Some(reference) = reference else {
            return Ok(HashMap::new());
        };
        let (namespace, name) = (
            reference.namespace.clone().unwrap_or_default(),
            reference.name.clone().unwrap_or_default(),
        );
        let secret = self
            .api
            .get_recorded::<Secret>(&namespace, &name)
            .ok_or_else(|| format!("secrets {name:?} not found in namespace {namespace:?}"))?;
        Ok(secret
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }
}

/// The CSI access mode of a volume's first Kubernetes one.
fn access_mode(spec: Option<&PersistentVolumeSpec>) -> csi::volume_capability::access_mode::Mode {
    use csi::volume_capability::access_mode::Mode;
    let first = spec.and_then(|s| s.access_modes.as_ref()?.first().cloned());
    match first.as_deref() {
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter,
        Some("ReadWriteOncePod") => Mode::SingleNodeSingleWriter,
        _ => Mode::SingleNodeWriter,
    }
}
