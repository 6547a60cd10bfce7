//! What a cluster's control plane does with claims, for the simulation's own API (with `--kubeconfig` the
//! cluster runs its own): each pass, on every API change,
//!
//! 1. the ephemeral-volume controller (`pkg/controller/volume/ephemeral/controller.go`) creates the claim
//!    `<pod>-<volume>` of each generic ephemeral volume from its template, owned by the pod;
//! 2. the garbage collector deletes a claim whose owning pod is gone;
//! 3. the external-provisioner (`kubernetes-csi/external-provisioner`, `pkg/controller/controller.go`)
//!    creates a volume for each unbound claim of a StorageClass whose provisioner is a registered CSI
//!    driver (CreateVolume named `pvc-<claim uid>`), and its PV, pre-bound to the claim; with
//!    `WaitForFirstConsumer` only once a pod using the claim is on a node (the scheduler's
//!    `volume.kubernetes.io/selected-node`);
//! 4. the PV controller binds them ([`bind_claims`]);
//! 5. the external-resizer grows a claim's volume when its request grows ([`super::resizer`]);
//! 6. a provisioned PV whose claim is gone is released: with `reclaimPolicy: Delete` the provisioner
//!    deletes its volume (DeleteVolume) and the PV, once no VolumeAttachment names it.
//!
//! A driver here is a node's (an in-process `local` driver keeps its volumes on its node), so a volume is
//! created by the driver of the node its first consumer runs on, and deleted by the same one: the PV
//! carries that node in [`PROVISIONED_ON`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_proto::csi::v1::{self as csi, volume_capability::access_mode::Mode};
use inlet_volume::InlineVolume;
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, Volume,
};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use parking_lot::Mutex;

use super::pv_binder::bind_claims;
use crate::api::{Api, ApiPod, PodFeed};
use crate::node::registry::DriverDirectory;
use crate::operations::{BackoffPolicy, OpKey, Operations};

/// The annotation the external-provisioner puts on the PVs it makes.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The node whose driver made a PV's volume (kubelet-sim's own: its drivers are per node).
pub const PROVISIONED_ON: &str = "inlet.dev/provisioned-on";
/// The scheduler's choice of node for a `WaitForFirstConsumer` claim.
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The annotation that makes a StorageClass the default one.
const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// The provisioner's identity before the driver's name: when it started (ms since the epoch) and a random
/// number, chosen once per process as the external-provisioner does.
static PROVISIONER_IDENTITY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{started}-{}", fastrand::u32(..10000))
});
/// How often at most a pass runs.
const PERIOD: Duration = Duration::from_millis(100);

/// The claim controllers.
pub struct Claims {
    pub(super) api: Arc<Api>,
    pub(super) drivers: Arc<DriverDirectory>,
    /// The nodes, in order: an `Immediate` claim without a consumer is provisioned on the first that
    /// has its driver.
    pub(super) nodes: Vec<String>,
    /// Back-off of failed provisioning, resizing and deletion, by claim or PV.
    pub(super) ops: Mutex<Operations>,
    /// The pods that changed since the last pass.
    pod_feed: Arc<PodFeed>,
    /// Changes to objects of no node (claims, PVs, classes): a pass then looks at every pod.
    cluster: Mutex<tokio::sync::watch::Receiver<u64>>,
}

impl Claims {
    /// The controllers over `api`, reaching drivers through `drivers`.
    pub fn new(
        api: Arc<Api>,
        drivers: Arc<DriverDirectory>,
        nodes: Vec<String>,
        backoff: BackoffPolicy,
    ) -> Arc<Self> {
        let (pod_feed, mut cluster) = (api.pod_feed(), api.watch_cluster());
        // The first pass looks at every pod.
        cluster.mark_changed();
        Arc::new(Self {
            api,
            drivers,
            nodes,
            ops: Mutex::new(Operations::new(backoff)),
            pod_feed,
            cluster: Mutex::new(cluster),
        })
    }

    /// Runs a pass on every API change until `stop` resolves: at most one per [`PERIOD`], and, as a pass
    /// may visit every pod, at most one per twice its own length (as the attach/detach controller paces its
    /// passes), so a large cluster costs it a bounded share of a CPU.
    pub async fn run(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut watch = self.api.watch();
        loop {
            let started = Instant::now();
            self.sync().await;
            let period = PERIOD.max(2 * started.elapsed());
            let next = self
                .ops
                .lock()
                .next_retry()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            tokio::select! {
                _ = watch.changed() => {}
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = &mut stop => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = &mut stop => return,
            }
        }
    }

    async fn sync(&self) {
        // The pods that changed since the last pass (upstream's ephemeral volume controller handles its
        // pod informer's adds and updates), or every pod after a change to another kind: a claim deleted
        // under a pod that still needs it is created again (its `onPVCDelete` enqueues the pod).
        let changed = self.pod_feed.drain();
        let cluster_changed = {
            let mut cluster = self.cluster.lock();
            let changed = cluster.has_changed().unwrap_or(false);
            if changed {
                cluster.borrow_and_update();
            }
            changed
        };
        let pods: Vec<Arc<ApiPod>> = match cluster_changed {
            true => self.api.list::<ApiPod>(),
            false => changed
                .iter()
                .filter_map(|(namespace, name)| self.api.peek::<ApiPod>(namespace, name))
                .collect(),
        };
        for pod in &pods {
            self.create_ephemeral_claims(pod);
        }
        self.collect_garbage();
        let claims = self.api.list::<PersistentVolumeClaim>();
        // A claim waiting for its first consumer looks for it among every pod.
        let pods = match claims.is_empty() {
            true => Vec::new(),
            false => self.api.list::<ApiPod>(),
        };
        for claim in claims {
            self.provision(&claim, &pods).await;
        }
        bind_claims(&self.api);
        for claim in self.api.list::<PersistentVolumeClaim>() {
            self.resize(&claim).await;
        }
        for pv in self.api.list::<PersistentVolume>() {
            self.reclaim(&pv).await;
        }
    }

    /// `handleVolume`: the claim of each generic ephemeral volume of a pod not being deleted.
    fn create_ephemeral_claims(&self, pod: &ApiPod) {
        let ephemeral = |v: &Volume| v.persistent_volume_claim.is_none() && v.ephemeral.is_some();
        let volumes = pod.volumes().iter().filter_map(InlineVolume::other);
        // Every pass visits every pod of the cluster: most have no generic ephemeral volume, and cost
        // no more than that look.
        if pod.metadata.deletion_timestamp.is_some() || !volumes.clone().any(ephemeral) {
            return;
        }
        let (namespace, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        for volume in volumes.filter(|v| ephemeral(v)) {
            let Some(template) = volume
                .ephemeral
                .as_ref()
                .and_then(|e| e.volume_claim_template.as_ref())
            else {
                continue;
            };
            let claim_name = format!("{name}-{}", volume.name);
            // One that exists is left alone, even another's: the kubelet then refuses the volume.
            if self
                .api
                .peek::<PersistentVolumeClaim>(&namespace, &claim_name)
                .is_some()
            {
                continue;
            }
            let template_meta = template.metadata.clone().unwrap_or_default();
            let mut spec = template.spec.clone();
            if spec.storage_class_name.is_none() {
                spec.storage_class_name = self.default_class();
            }
            self.api.put(PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(claim_name),
                    namespace: Some(namespace.clone()),
                    uid: Some(uuid::Uuid::new_v4().to_string()),
                    creation_timestamp: Some(crate::api::store::now()),
                    labels: template_meta.labels,
                    annotations: template_meta.annotations,
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Pod".into(),
                        name: name.clone(),
                        uid: pod.metadata.uid.clone().unwrap_or_default(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    }]),
                    ..Default::default()
                },
                spec: Some(spec),
                status: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
                    phase: Some("Pending".into()),
                    ..Default::default()
                }),
            });
        }
    }

    /// The default StorageClass (the DefaultStorageClass admission plugin's choice), if one is marked.
    fn default_class(&self) -> Option<String> {
        let classes = self.api.list::<StorageClass>();
        let marked = classes.iter().find(|c| {
            let annotations = c.metadata.annotations.as_ref();
            annotations
                .and_then(|a| a.get(DEFAULT_CLASS))
                .map(String::as_str)
                == Some("true")
        });
        marked.and_then(|c| c.metadata.name.clone())
    }

    /// The garbage collector's part: a claim whose controlling pod (by UID) is gone goes too. The pod
    /// leaves the API only once its volumes are torn down, as the claim's pvc-protection finalizer
    /// would otherwise wait for.
    fn collect_garbage(&self) {
        for claim in self.api.list::<PersistentVolumeClaim>() {
            let namespace = claim.metadata.namespace.clone().unwrap_or_default();
            let owner = claim
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true) && o.kind == "Pod");
            let Some(owner) = owner else { continue };
            let alive = self
                .api
                .peek::<ApiPod>(&namespace, &owner.name)
                .is_some_and(|p| p.metadata.uid.as_deref() == Some(owner.uid.as_str()));
            if !alive {
                let name = claim.metadata.name.clone().unwrap_or_default();
                self.api.remove::<PersistentVolumeClaim>(&namespace, &name);
            }
        }
    }

    /// The external-provisioner's `Provision` for one claim, when it is unbound, of a class whose
    /// provisioner is registered, and (for `WaitForFirstConsumer`) has a consumer on a node.
    async fn provision(&self, claim: &PersistentVolumeClaim, pods: &[Arc<ApiPod>]) {
        let spec = claim.spec.clone().unwrap_or_default();
        if spec.volume_name.is_some() {
            return;
        }
        let Some(class) = spec
            .storage_class_name
            .as_deref()
            .and_then(|c| self.api.peek::<StorageClass>("", c))
        else {
            return;
        };
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let pv_name = format!("pvc-{uid}");
        // Provisioned already, or a PV waits for it by its `claimRef` (the PV controller binds those).
        let (namespace, name) = (
            claim.metadata.namespace.as_deref(),
            claim.metadata.name.as_deref(),
        );
        let awaited = self.api.list::<PersistentVolume>().into_iter().any(|pv| {
            let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.clone());
            claim_ref
                .is_some_and(|r| r.namespace.as_deref() == namespace && r.name.as_deref() == name)
        });
        if awaited {
            return;
        }
        let consumer_node = consumer_node(claim, pods);
        let wait = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
        let node = match (consumer_node, wait) {
            (Some(node), _) => node,
            (None, true) => return,
            (None, false) => match self
                .nodes
                .iter()
                .find(|n| self.drivers.client(n, &class.provisioner).is_some())
            {
                Some(node) => node.clone(),
                None => return,
            },
        };
        let Some(client) = self.drivers.client(&node, &class.provisioner) else {
            return;
        };
        let key = OpKey::Claim(format!("{}/{uid}", namespace.unwrap_or_default()));
        if !self.ops.lock().try_start(&key, "provision") {
            return;
        }
        if wait {
            // The scheduler's choice, on the claim.
            self.api.update::<PersistentVolumeClaim>(
                namespace.unwrap_or_default(),
                name.unwrap_or_default(),
                |c| {
                    let annotations = c.metadata.annotations.get_or_insert_with(Default::default);
                    annotations.insert(SELECTED_NODE.into(), node.clone());
                },
            );
        }
        // csi-lib-utils' access mode mapping asks for SINGLE_NODE_MULTI_WRITER's modes only of a driver
        // that has them.
        let created = match client.controller_capabilities().await {
            Ok(capabilities) => {
                let multi_writer = capabilities.contains(
                    &csi::controller_service_capability::rpc::Type::SingleNodeMultiWriter,
                );
                let request = create_request(&pv_name, &spec, &class, multi_writer);
                client.create_volume(request).await
            }
            Err(status) => Err(status),
        };
        self.ops.lock().finish(&key, "provision", created.is_ok());
        match created {
            Ok(volume) => self
                .api
                .put(provisioned_pv(&pv_name, claim, &class, &volume, &node)),
            Err(status) => tracing::warn!(
                claim = %claim.metadata.name.clone().unwrap_or_default(),
                "failed to provision volume with StorageClass {:?}: {}",
                class.metadata.name.clone().unwrap_or_default(),
                status.message()
            ),
        }
    }

    /// A provisioned PV whose claim is gone: Released; deleted with its volume under `Delete`.
    async fn reclaim(&self, pv: &PersistentVolume) {
        let annotations = pv.metadata.annotations.clone().unwrap_or_default();
        let (Some(driver), Some(node)) = (
            annotations.get(PROVISIONED_BY),
            annotations.get(PROVISIONED_ON),
        ) else {
            return;
        };
        let spec = pv.spec.clone().unwrap_or_default();
        let Some(claim_ref) = &spec.claim_ref else {
            return;
        };
        let claim = self.api.peek::<PersistentVolumeClaim>(
            claim_ref.namespace.as_deref().unwrap_or_default(),
            claim_ref.name.as_deref().unwrap_or_default(),
        );
        if claim.is_some_and(|c| c.metadata.uid == claim_ref.uid) {
            return;
        }
        let name = pv.metadata.name.clone().unwrap_or_default();
        if spec.persistent_volume_reclaim_policy.as_deref() != Some("Delete") {
            self.api.update::<PersistentVolume>("", &name, |p| {
                p.status.get_or_insert_with(Default::default).phase = Some("Released".into());
            });
            return;
        }
        // Not while it is attached: the provisioner waits ("persistentvolume %s is still attached to
        // node %s"), and the attach/detach controller needs the PV to detach it.
        let attached = self
            .api
            .list::<VolumeAttachment>()
            .into_iter()
            .any(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name.as_str()));
        if attached {
            return;
        }
        let (Some(client), Some(csi)) = (self.drivers.client(node, driver), &spec.csi) else {
            return;
        };
        let key = OpKey::Claim(format!("pv/{name}"));
        if !self.ops.lock().try_start(&key, "delete") {
            return;
        }
        let deleted = client.delete_volume(&csi.volume_handle).await;
        self.ops.lock().finish(&key, "delete", deleted.is_ok());
        match deleted {
            Ok(()) => drop(self.api.remove::<PersistentVolume>("", &name)),
            Err(status) => tracing::warn!(pv = %name, "DeleteVolume: {}", status.message()),
        }
    }
}

/// The node of a pod using the claim, if one is bound to a node (the scheduler's selected node).
fn consumer_node(claim: &PersistentVolumeClaim, pods: &[Arc<ApiPod>]) -> Option<String> {
    if let Some(node) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SELECTED_NODE))
    {
        return Some(node.clone());
    }
    let namespace = claim.metadata.namespace.as_deref();
    let name = claim.metadata.name.clone().unwrap_or_default();
    pods.iter()
        .filter(|p| p.metadata.namespace.as_deref() == namespace)
        .find(|p| {
            crate::cluster::references::referenced_claims(p)
                .iter()
                .any(|(_, c)| *c == name)
        })
        .and_then(|p| p.spec.as_ref()?.node_name.clone())
}

/// The CreateVolume the external-provisioner sends for a claim: its size, one capability per access mode
/// (filesystem with the class's `csi.storage.k8s.io/fstype` and mount options, or block), and the class's
/// parameters without the `csi.storage.k8s.io/` ones, which are the provisioner's own.
fn create_request(
    name: &str,
    spec: &k8s_openapi::api::core::v1::PersistentVolumeClaimSpec,
    class: &StorageClass,
    multi_writer: bool,
) -> csi::CreateVolumeRequest {
    let parameters = class.parameters.clone().unwrap_or_default();
    let fs_type = parameters
        .get("csi.storage.k8s.io/fstype")
        .cloned()
        .unwrap_or_default();
    let block = spec.volume_mode.as_deref() == Some("Block");
    let capability = |mode: Mode| csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(match block {
            true => csi::volume_capability::AccessType::Block(Default::default()),
            false => {
                csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
                    fs_type: fs_type.clone(),
                    mount_flags: class.mount_options.clone().unwrap_or_default(),
                    volume_mount_group: String::new(),
                })
            }
        }),
    };
    let modes = spec.access_modes.clone().unwrap_or_default();
    let volume_capabilities = modes
        .iter()
        .map(|m| match (m.as_str(), multi_writer) {
            ("ReadOnlyMany", _) => Mode::MultiNodeReaderOnly,
            ("ReadWriteMany", _) => Mode::MultiNodeMultiWriter,
            ("ReadWriteOncePod", true) => Mode::SingleNodeSingleWriter,
            (_, true) => Mode::SingleNodeMultiWriter,
            _ => Mode::SingleNodeWriter,
        })
        .map(capability)
        .collect();
    let requests = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    let requested = super::resizer::storage_bytes(requests).unwrap_or(0);
    csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: i64::try_from(requested).unwrap_or(i64::MAX),
            limit_bytes: 0,
        }),
        volume_capabilities,
        parameters: parameters
            .into_iter()
            .filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/"))
            .collect(),
        ..Default::default()
    }
}

/// The PV of a provisioned volume, pre-bound to its claim.
fn provisioned_pv(
    name: &str,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    volume: &csi::Volume,
    node: &str,
) -> PersistentVolume {
    let spec = claim.spec.clone().unwrap_or_default();
    let requested = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned();
    let capacity = match volume.capacity_bytes {
        0 => requested.unwrap_or_else(|| Quantity("0".into())),
        bytes => Quantity(bytes.to_string()),
    };
    // A block volume has no filesystem type.
    let fs_type = class
        .parameters
        .as_ref()
        .and_then(|p| p.get("csi.storage.k8s.io/fstype"))
        .filter(|_| spec.volume_mode.as_deref() != Some("Block"))
        .cloned();
    let annotations = BTreeMap::from([
        (PROVISIONED_BY.to_string(), class.provisioner.clone()),
        (PROVISIONED_ON.to_string(), node.to_string()),
    ]);
    // The provisioner's identity in every volume's attributes: `<start time in ms>-<random>-<driver>`.
    let mut attributes: BTreeMap<String, String> =
        volume.volume_context.clone().into_iter().collect();
    attributes.insert(
        "storage.kubernetes.io/csiProvisionerIdentity".into(),
        format!("{}-{}", *PROVISIONER_IDENTITY, class.provisioner),
    );
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            uid: Some(uuid::Uuid::new_v4().to_string()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: spec.access_modes.clone(),
            capacity: Some(BTreeMap::from([("storage".to_string(), capacity)])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: claim.metadata.namespace.clone(),
                name: claim.metadata.name.clone(),
                uid: claim.metadata.uid.clone(),
                ..Default::default()
            }),
            csi: Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                driver: class.provisioner.clone(),
                volume_handle: volume.volume_id.clone(),
                volume_attributes: Some(attributes),
                fs_type,
                ..Default::default()
            }),
            mount_options: class.mount_options.clone(),
            persistent_volume_reclaim_policy: class.reclaim_policy.clone(),
            storage_class_name: class.metadata.name.clone(),
            volume_mode: spec.volume_mode.clone(),
            ..Default::default()
        }),
        status: None,
    }
}
