//! Manifests applied as an API server, the PV controller and a scheduler would: everything but pods
//! first, then each pod admitted and bound to a node; or, with `--kubeconfig`, created in the real
//! cluster's API server, which admits them.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PodStatus};

use super::Simulation;
use crate::api::ApiPod;
use crate::api::manifest::{EXPECTED_PHASE_ANNOTATION, Manifest, Object};
use crate::controllers::provisioner::pre_provision;
use crate::controllers::pv_binder::bind_claims;
use crate::drivers::{DriverHandle, DriverSource};
use crate::report::Rejection;

impl Simulation {
    /// Applies manifests: everything but pods first (so pods find their drivers, secrets and claims), then
    /// pods, each admitted and bound to a node. Refused objects are kept for the report. PVs of a `local`
    /// driver are pre-provisioned first, as an administrator would (see [`pre_provision`]).
    pub async fn apply(&mut self, manifests: Vec<Manifest>) {
        let mut admitted = Vec::with_capacity(manifests.len());
        for manifest in manifests {
            if let Object::PersistentVolume(pv) = &manifest.object {
                // Validated first: a PV the API server would refuse is neither provisioned nor stored.
                if let Err(e) = self.admission.validate_persistent_volume(pv) {
                    tracing::warn!(origin = manifest.origin, "{e}");
                    self.rejected.push(Rejection {
                        origin: manifest.origin,
                        message: e.0,
                        expected: false,
                    });
                    continue;
                }
                if let Err(e) = pre_provision(pv, &self.local_drivers(pv)).await {
                    self.rejected.push(Rejection {
                        origin: manifest.origin.clone(),
                        message: e.to_string(),
                        expected: false,
                    });
                }
            }
            admitted.push(manifest);
        }
        let (pods, others): (Vec<_>, Vec<_>) = admitted
            .into_iter()
            .partition(|m| matches!(m.object, Object::Pod(_)));
        if let Some(client) = self.config.cluster.clone() {
            return self
                .create_in_cluster(client, others.into_iter().chain(pods))
                .await;
        }
        for manifest in others.into_iter().chain(pods) {
            let expected = match &manifest.object {
                Object::Pod(pod) => pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(EXPECTED_PHASE_ANNOTATION))
                    .is_some_and(|e| e == "Rejected"),
                _ => false,
            };
            if let Err(message) = self.apply_one(manifest.object) {
                tracing::warn!(origin = manifest.origin, "{message}");
                self.rejected.push(Rejection {
                    origin: manifest.origin,
                    message,
                    expected,
                });
            }
        }
        bind_claims(&self.api);
        self.api.mark_sources_ready();
    }

    fn apply_one(&mut self, object: Object) -> Result<(), String> {
        match object {
            Object::Pod(pod) => {
                let mut pod = self.admission.admit_pod(&self.api, *pod).map_err(|e| e.0)?;
                let spec = pod.spec.get_or_insert_with(Default::default);
                let node = match &spec.node_name {
                    Some(node) => node.clone(),
                    None => {
                        let node = self
                            .scheduler
                            .schedule(self.nodes.iter().map(|n| n.config.name.as_str()));
                        spec.node_name = Some(node.clone());
                        node
                    }
                };
                pod.status = Some(PodStatus {
                    phase: Some("Pending".into()),
                    ..Default::default()
                });
                let (namespace, name) = (
                    pod.metadata.namespace.clone().unwrap_or_default(),
                    pod.metadata.name.clone().unwrap_or_default(),
                );
                if self.api.peek::<ApiPod>(&namespace, &name).is_some() {
                    return Err(format!("pods {name:?} already exists"));
                }
                let pod = ApiPod::from(pod);
                self.api.put(pod.clone());
                self.api.record_event(
                    &pod,
                    "Normal",
                    "Scheduled",
                    &format!("Successfully assigned {namespace}/{name} to {node}"),
                );
            }
            Object::Secret(secret) => self
                .api
                .put(self.admission.admit_secret(*secret).map_err(|e| e.0)?),
            Object::ConfigMap(mut cm) => {
                cm.metadata
                    .namespace
                    .get_or_insert_with(|| "default".into());
                self.api.put(*cm);
            }
            Object::CsiDriver(driver) => self
                .api
                .put(self.admission.admit_csi_driver(*driver).map_err(|e| e.0)?),
            // The API server's defaults (`SetDefaults_StorageClass`): Delete, Immediate.
            Object::StorageClass(mut class) => {
                class.reclaim_policy.get_or_insert_with(|| "Delete".into());
                class
                    .volume_binding_mode
                    .get_or_insert_with(|| "Immediate".into());
                self.api.put(*class);
            }
            // Validated in `apply`, before provisioning.
            Object::PersistentVolume(pv) => self.api.put(*pv),
            Object::PersistentVolumeClaim(mut pvc) => {
                pvc.metadata
                    .namespace
                    .get_or_insert_with(|| "default".into());
                self.api.put(*pvc);
            }
            Object::ServiceAccount(mut sa) => {
                sa.metadata
                    .namespace
                    .get_or_insert_with(|| "default".into());
                sa.metadata
                    .uid
                    .get_or_insert_with(|| uuid::Uuid::new_v4().to_string());
                self.api.put(*sa);
            }
            // Kept for their labels (the Pod Security level inline drivers are checked against).
            Object::Namespace(namespace) => self.api.put(*namespace),
        }
        Ok(())
    }

    /// Creates the objects in the cluster's API server, which admits them; pods are bound to these nodes
    /// round robin unless they name one. The API server's refusals are kept for the report.
    async fn create_in_cluster(
        &mut self,
        client: kube::Client,
        manifests: impl Iterator<Item = Manifest>,
    ) {
        let cluster = crate::cluster::Cluster::new(client);
        let mut created = Vec::new();
        for manifest in manifests {
            // Every pod takes its turn, even one that names its node (the API server keeps that name).
            let (pod, node) = match &manifest.object {
                Object::Pod(pod) => {
                    let node = self
                        .scheduler
                        .schedule(self.nodes.iter().map(|n| n.config.name.as_str()));
                    let meta = &pod.metadata;
                    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
                    (
                        Some((namespace, meta.name.clone().unwrap_or_default())),
                        node,
                    )
                }
                _ => (None, String::new()),
            };
            match cluster.create(manifest.object, &node).await {
                Ok(()) => created.extend(pod),
                Err(e) => {
                    tracing::warn!(origin = manifest.origin, "{e}");
                    self.rejected.push(Rejection {
                        origin: manifest.origin,
                        message: e.to_string(),
                        expected: false,
                    });
                }
            }
        }
        // The pods reach the nodes by their watches: settling starts once they are all there.
        let arrived = |sim: &Self| {
            created
                .iter()
                .all(|(namespace, name)| sim.api.peek::<ApiPod>(namespace, name).is_some())
        };
        if !self.wait_for(Duration::from_secs(60), arrived).await {
            tracing::warn!("not every pod created reached its node's watch within 60 s");
        }
        self.created.extend(created);
    }

    /// The in-process `local` drivers (one per node) a PV of theirs is pre-provisioned on.
    fn local_drivers(&self, pv: &PersistentVolume) -> Vec<&DriverHandle> {
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
            return Vec::new();
        };
        let local = self
            .config
            .drivers
            .iter()
            .any(|d| d.name == csi.driver && matches!(d.source, DriverSource::Local { .. }));
        match local {
            true => self
                .drivers
                .iter()
                .filter(|h| h.name == csi.driver)
                .collect(),
            false => Vec::new(),
        }
    }
}
