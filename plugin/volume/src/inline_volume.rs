//! A pod's volume as a [`Spec`](crate::Spec) keeps it: its name and the one source it sets.
//!
//! A k8s-openapi `Volume` carries each of its thirty sources inline, set or not: 3.2 KB a volume. A node
//! keeps a spec for every volume of every pod it runs, in its desired and actual state, so a copy of the
//! pod's `Volume` there cost more than the rest of the volume's state together (issue #28, heap profile
//! in bench/RESULTS.md). Upstream's `volume.Spec` points at the pod's `v1.Volume`; so does a spec here:
//! the simulator's API keeps a pod's volumes in this form too, and a spec shares them (`Arc`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use k8s_openapi::api::core::v1::{
    CSIVolumeSource, ConfigMapVolumeSource, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    ImageVolumeSource, ProjectedVolumeSource, SecretVolumeSource, Volume,
};

/// The source a pod volume sets, for the kinds the plugins here mount; any other is kept whole.
#[derive(Debug, Clone, PartialEq)]
pub enum VolumeSource {
    /// `csi`.
    Csi(CSIVolumeSource),
    /// `image`.
    Image(ImageVolumeSource),
    /// `emptyDir`.
    EmptyDir(EmptyDirVolumeSource),
    /// `secret`.
    Secret(SecretVolumeSource),
    /// `configMap`.
    ConfigMap(ConfigMapVolumeSource),
    /// `downwardAPI`.
    DownwardApi(DownwardAPIVolumeSource),
    /// `projected`: shared with every other pod volume of the same projection ([`shared_projection`]).
    Projected(Arc<ProjectedVolumeSource>),
    /// Any other source (hostPath, nfs, ...), which no plugin here supports.
    Other(Box<Volume>),
}

/// A pod's volume: its name and its source. Cheap to clone.
#[derive(Debug, Clone, PartialEq)]
pub struct InlineVolume(Arc<(String, VolumeSource)>);

impl InlineVolume {
    /// The volume `name` with `source`.
    pub fn new(name: impl Into<String>, source: VolumeSource) -> Self {
        Self(Arc::new((name.into(), source)))
    }

    /// `name`.
    pub fn name(&self) -> &str {
        &self.0.0
    }

    /// The source it sets.
    pub fn source(&self) -> &VolumeSource {
        &self.0.1
    }

    /// `csi`, when that is its source.
    pub fn csi(&self) -> Option<&CSIVolumeSource> {
        match self.source() {
            VolumeSource::Csi(s) => Some(s),
            _ => None,
        }
    }

    /// `image`, when that is its source.
    pub fn image(&self) -> Option<&ImageVolumeSource> {
        match self.source() {
            VolumeSource::Image(s) => Some(s),
            _ => None,
        }
    }

    /// `emptyDir`, when that is its source.
    pub fn empty_dir(&self) -> Option<&EmptyDirVolumeSource> {
        match self.source() {
            VolumeSource::EmptyDir(s) => Some(s),
            _ => None,
        }
    }

    /// `secret`, when that is its source.
    pub fn secret(&self) -> Option<&SecretVolumeSource> {
        match self.source() {
            VolumeSource::Secret(s) => Some(s),
            _ => None,
        }
    }

    /// `configMap`, when that is its source.
    pub fn config_map(&self) -> Option<&ConfigMapVolumeSource> {
        match self.source() {
            VolumeSource::ConfigMap(s) => Some(s),
            _ => None,
        }
    }

    /// `downwardAPI`, when that is its source.
    pub fn downward_api(&self) -> Option<&DownwardAPIVolumeSource> {
        match self.source() {
            VolumeSource::DownwardApi(s) => Some(s),
            _ => None,
        }
    }

    /// The whole volume, when its source is one kept whole ([`VolumeSource::Other`]: a claim, an
    /// ephemeral claim, hostPath, ...).
    pub fn other(&self) -> Option<&Volume> {
        match self.source() {
            VolumeSource::Other(v) => Some(v),
            _ => None,
        }
    }

    /// `projected`, when that is its source.
    pub fn projected(&self) -> Option<&ProjectedVolumeSource> {
        match self.source() {
            VolumeSource::Projected(s) => Some(s),
            _ => None,
        }
    }
}

impl From<Volume> for InlineVolume {
    /// Keeps the volume's name and its source. A volume sets exactly one source: the API server refuses
    /// any other (`validateVolumeSource`, "may not specify more than 1 volume type"), as the embedded
    /// API's admission does.
    fn from(mut volume: Volume) -> Self {
        let source = if let Some(s) = volume.csi.take() {
            VolumeSource::Csi(s)
        } else if let Some(s) = volume.image.take() {
            VolumeSource::Image(s)
        } else if let Some(s) = volume.empty_dir.take() {
            VolumeSource::EmptyDir(s)
        } else if let Some(s) = volume.secret.take() {
            VolumeSource::Secret(s)
        } else if let Some(s) = volume.config_map.take() {
            VolumeSource::ConfigMap(s)
        } else if let Some(s) = volume.downward_api.take() {
            VolumeSource::DownwardApi(s)
        } else if let Some(s) = volume.projected.take() {
            VolumeSource::Projected(shared_projection(s))
        } else {
            let name = volume.name.clone();
            return Self::new(name, VolumeSource::Other(Box::new(volume)));
        };
        Self::new(volume.name, source)
    }
}

impl From<&InlineVolume> for Volume {
    /// The volume again in the API's form, as a pod's `spec.volumes[i]` (for reports and the wire).
    fn from(volume: &InlineVolume) -> Self {
        let mut out = Volume {
            name: volume.name().to_string(),
            ..Default::default()
        };
        match volume.source() {
            VolumeSource::Csi(s) => out.csi = Some(s.clone()),
            VolumeSource::Image(s) => out.image = Some(s.clone()),
            VolumeSource::EmptyDir(s) => out.empty_dir = Some(s.clone()),
            VolumeSource::Secret(s) => out.secret = Some(s.clone()),
            VolumeSource::ConfigMap(s) => out.config_map = Some(s.clone()),
            VolumeSource::DownwardApi(s) => out.downward_api = Some(s.clone()),
            VolumeSource::Projected(s) => out.projected = Some(ProjectedVolumeSource::clone(s)),
            VolumeSource::Other(whole) => return Volume::clone(whole),
        }
        out
    }
}

/// How many distinct projections [`shared_projection`] remembers.
const PROJECTIONS_KEPT: usize = 64;

/// `source`, or an equal projection already in use: every pod's `kube-api-access` volume projects the
/// same token, root CA and namespace, 1.5 KB in k8s-openapi's layout, and a node keeps one for each pod
/// it runs (issue #28, bench/RESULTS.md). The latest [`PROJECTIONS_KEPT`] distinct ones still in use
/// are remembered; an equal one is found by comparison, as the API's types have no hash.
fn shared_projection(source: ProjectedVolumeSource) -> Arc<ProjectedVolumeSource> {
    static IN_USE: Mutex<VecDeque<Weak<ProjectedVolumeSource>>> = Mutex::new(VecDeque::new());
    let mut in_use = IN_USE.lock().unwrap_or_else(PoisonError::into_inner);
    in_use.retain(|seen| seen.strong_count() > 0);
    if let Some(same) = in_use
        .iter()
        .filter_map(Weak::upgrade)
        .find(|seen| **seen == source)
    {
        return same;
    }
    let shared = Arc::new(source);
    if in_use.len() == PROJECTIONS_KEPT {
        in_use.pop_front();
    }
    in_use.push_back(Arc::downgrade(&shared));
    shared
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::HostPathVolumeSource;

    #[test]
    fn keeps_the_name_and_the_one_source() {
        let volume = Volume {
            name: "data".into(),
            csi: Some(CSIVolumeSource {
                driver: "local.inlet.dev".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let inline = InlineVolume::from(volume);
        assert_eq!(inline.name(), "data");
        assert_eq!(
            inline.csi().map(|s| s.driver.as_str()),
            Some("local.inlet.dev")
        );
        assert!(inline.image().is_none() && inline.empty_dir().is_none());
    }

    #[test]
    fn equal_projections_are_shared_and_others_are_not() {
        use k8s_openapi::api::core::v1::{ServiceAccountTokenProjection, VolumeProjection};
        let projected = |path: &str| Volume {
            name: format!("kube-api-access-{path}"),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: path.into(),
                        expiration_seconds: Some(3607),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let shared = |v: &InlineVolume| match v.source() {
            VolumeSource::Projected(s) => Arc::clone(s),
            other => panic!("{other:?}"),
        };
        let (a, b) = (
            InlineVolume::from(projected("token")),
            InlineVolume::from(projected("token")),
        );
        assert!(Arc::ptr_eq(&shared(&a), &shared(&b)));
        assert_eq!(
            (a.name(), b.name()),
            ("kube-api-access-token", "kube-api-access-token")
        );
        let other = InlineVolume::from(projected("other-token"));
        assert!(!Arc::ptr_eq(&shared(&a), &shared(&other)));
        assert_eq!(
            other
                .projected()
                .and_then(|p| p.sources.as_ref())
                .map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn turns_back_into_the_same_volume() {
        let volumes = [
            Volume {
                name: "data".into(),
                csi: Some(CSIVolumeSource {
                    driver: "local.inlet.dev".into(),
                    read_only: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
            Volume {
                name: "host".into(),
                host_path: Some(HostPathVolumeSource {
                    path: "/var/log".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        for volume in volumes {
            assert_eq!(Volume::from(&InlineVolume::from(volume.clone())), volume);
        }
    }

    #[test]
    fn keeps_a_source_no_plugin_mounts_whole() {
        let volume = Volume {
            name: "host".into(),
            host_path: Some(HostPathVolumeSource {
                path: "/var/log".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let inline = InlineVolume::from(volume.clone());
        assert_eq!(inline.name(), "host");
        assert_eq!(inline.source(), &VolumeSource::Other(Box::new(volume)));
    }
}
