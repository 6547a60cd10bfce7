//! The `kubernetes.io/projected` plugin (`pkg/volume/projected`): Secrets, ConfigMaps, the downward API and
//! service-account tokens projected into one directory, on a tmpfs, written as `AtomicWriter` writes them
//! and again on every pass (a changed object, a rotated token). What every pod of a 1.21+ cluster carries
//! as `kube-api-access-*`: a bound token, `kube-root-ca.crt`'s `ca.crt` and the namespace.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ProjectedVolumeSource, VolumeProjection};

use crate::{InlineVolume, VolumeSource};

use super::atomic_writer::FileProjection;
use super::config_map::config_map_data;
use super::downward_api::collect_data;
use super::empty_dir::{DirPlugin, DirVolume};
use super::secret::{DEFAULT_MODE, make_payload, secret_data, set_up_projected};
use super::{Mounter, MounterArgs, PodInfo, TokenRequestArgs, VolumeError, VolumeHost, aggregate};

/// `projected`.
pub struct ProjectedVolume;

/// The `kubernetes.io/projected` plugin.
pub type ProjectedPlugin = DirPlugin<ProjectedVolume>;

impl DirVolume for ProjectedVolume {
    const NAME: &'static str = "kubernetes.io/projected";
    /// Its sources change and its tokens rotate: the files are written again on every pass.
    const REQUIRES_REMOUNT: bool = true;

    fn is(volume: &InlineVolume) -> bool {
        volume.projected().is_some()
    }

    fn reconstructed(name: &str) -> InlineVolume {
        InlineVolume::new(name, VolumeSource::Projected(Arc::default()))
    }

    fn mounter(
        host: Arc<dyn VolumeHost>,
        path: PathBuf,
        volume: &InlineVolume,
        pod: &PodInfo,
    ) -> Box<dyn Mounter> {
        Box::new(ProjectedMounter {
            host,
            path,
            source: volume.projected().cloned().unwrap_or_default(),
            pod: pod.clone(),
        })
    }
}

struct ProjectedMounter {
    host: Arc<dyn VolumeHost>,
    path: PathBuf,
    source: ProjectedVolumeSource,
    pod: PodInfo,
}

#[async_trait]
impl Mounter for ProjectedMounter {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    async fn set_up_at(&self, dir: &Path, args: &MounterArgs) -> Result<(), VolumeError> {
        let payload = self.collect_data(args).await?;
        set_up_projected(&self.host, dir, Some(0), payload, args.fs_group).await
    }
}

impl ProjectedMounter {
    /// `collectData`: every source's files in one payload (a later source's file wins a path); each
    /// source that fails is an error, all of them reported together, and nothing is written then.
    async fn collect_data(
        &self,
        args: &MounterArgs,
    ) -> Result<BTreeMap<String, FileProjection>, VolumeError> {
        let default_mode = self.source.default_mode.unwrap_or(DEFAULT_MODE);
        let mut payload = BTreeMap::new();
        let mut errors = Vec::new();
        for source in self.source.sources.iter().flatten() {
            match self.source_files(source, default_mode, args).await {
                Ok(files) => payload.extend(files),
                Err(e) => errors.push(e),
            }
        }
        match errors.is_empty() {
            true => Ok(payload),
            false => Err(VolumeError::transient(aggregate(&errors))),
        }
    }

    async fn source_files(
        &self,
        source: &VolumeProjection,
        default_mode: i32,
        args: &MounterArgs,
    ) -> Result<BTreeMap<String, FileProjection>, String> {
        let namespace = &self.pod.namespace;
        if let Some(secret) = &source.secret {
            let optional = secret.optional.unwrap_or(false);
            let data = match self.host.secret(namespace, &secret.name).await? {
                Some(object) => secret_data(object),
                None if optional => Default::default(),
                None => return Err(format!("secret {:?} not found", secret.name)),
            };
            return make_payload(
                data,
                secret.items.as_deref(),
                Some(default_mode),
                optional,
                |key| format!("references non-existent secret key: {key}"),
            )
            .map_err(|e| e.message);
        }
        if let Some(config_map) = &source.config_map {
            let optional = config_map.optional.unwrap_or(false);
            let data = match self.host.config_map(namespace, &config_map.name).await? {
                Some(object) => config_map_data(object),
                None if optional => Default::default(),
                None => return Err(format!("configmap {:?} not found", config_map.name)),
            };
            return make_payload(
                data,
                config_map.items.as_deref(),
                Some(default_mode),
                optional,
                |key| format!("configmap references non-existent config key: {key}"),
            )
            .map_err(|e| e.message);
        }
        if let Some(downward) = &source.downward_api {
            let items = downward.items.as_deref().unwrap_or_default();
            return collect_data(items, &self.pod, self.host.as_ref(), Some(default_mode))
                .map_err(|e| e.message);
        }
        if let Some(token) = &source.service_account_token {
            // With an fsGroup the file is 0600 here, and 0640 once SetVolumeOwnership gives it the group.
            let mode = match args.fs_group {
                Some(_) => 0o600,
                None => default_mode,
            };
            let (value, _expires) = self
                .host
                .service_account_token(TokenRequestArgs {
                    namespace: namespace.clone(),
                    service_account: self.pod.service_account.clone(),
                    audience: token.audience.clone().unwrap_or_default(),
                    // The API's default for a projection that names none.
                    expiration_seconds: token.expiration_seconds.or(Some(3600)),
                    pod: (self.pod.name.clone(), self.pod.uid.clone()),
                })
                .await?;
            let file = FileProjection {
                data: value.into_bytes(),
                mode: (mode as u32) & 0o777,
            };
            return Ok(BTreeMap::from([(token.path.clone(), file)]));
        }
        // ClusterTrustBundle (beta, off by default) and PodCertificate (alpha) projections: an API server
        // with their gates off drops them, so a pod that has one asks for what this kubelet lacks.
        Err(
            "projected source not supported by this kubelet (clusterTrustBundle, podCertificate)"
                .into(),
        )
    }
}
