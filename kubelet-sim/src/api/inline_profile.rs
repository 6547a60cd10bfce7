//! Inline CSI drivers against each namespace's Pod Security level, as OpenShift's CSI inline volume
//! admission does it: a CSIDriver carries the profile of the volumes it gives inline
//! (`security.openshift.io/csi-ephemeral-volume-profile`: `restricted`, `baseline` or `privileged`; a driver
//! without the label is `privileged`), and a pod's inline `csi` volume is refused in a namespace whose Pod
//! Security enforce level (`pod-security.kubernetes.io/enforce`; none is `privileged`, Pod Security
//! admission's default) is below it. OpenShift's label is kept so drivers already labelled for it work
//! unchanged; it applies beside `--allowed-inline-drivers`, which must allow the driver too, with the
//! `PersistentInlineCSI` gate (kep/596-inline-csi-volume-plugin: this proposal's alpha).
//!
//! Not modelled: OpenShift's `warn` and `audit` levels (warnings and audit annotations), and
//! `enforce-version`.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::storage::v1::CSIDriver;

use super::Api;

/// The CSIDriver label naming the Pod Security level its inline volumes are safe at.
pub const PROFILE_LABEL: &str = "security.openshift.io/csi-ephemeral-volume-profile";
/// The namespace label of Pod Security admission's enforced level.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// Pod Security levels, least to most privileged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Restricted,
    Baseline,
    Privileged,
}

impl Level {
    fn parse(value: &str) -> Option<Self> {
        match value {
            "restricted" => Some(Self::Restricted),
            "baseline" => Some(Self::Baseline),
            "privileged" => Some(Self::Privileged),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Restricted => "restricted",
            Self::Baseline => "baseline",
            Self::Privileged => "privileged",
        }
    }
}

/// Ok when every inline `csi` volume of `pod` is within its namespace's level; else the refusal.
pub fn admit(api: &Api, pod: &Pod, name: &str) -> Result<(), String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let allowed = namespace_level(api, namespace);
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    for (i, volume) in volumes.into_iter().flatten().enumerate() {
        let Some(csi) = &volume.csi else { continue };
        let profile = driver_profile(api, &csi.driver);
        if profile > allowed {
            return Err(format!(
                "pods {name:?} is forbidden: spec.volumes[{i}].csi.driver: Forbidden: inline CSI driver {:?} has the ephemeral volume profile {:?} ({PROFILE_LABEL}), above namespace {namespace:?}'s Pod Security level {:?} ({ENFORCE_LABEL})",
                csi.driver,
                profile.as_str(),
                allowed.as_str()
            ));
        }
    }
    Ok(())
}

/// The namespace's enforced level: `privileged` without the label (or without a Namespace object), and
/// `restricted` for a value Pod Security admission would not know (it fails closed).
fn namespace_level(api: &Api, namespace: &str) -> Level {
    let object = api.peek::<Namespace>("", namespace);
    let label = object
        .as_ref()
        .and_then(|n| n.metadata.labels.as_ref())
        .and_then(|l| l.get(ENFORCE_LABEL));
    match label {
        None => Level::Privileged,
        Some(value) => Level::parse(value).unwrap_or(Level::Restricted),
    }
}

/// The driver's profile: `privileged` without the label, without a CSIDriver, or for a value not known.
fn driver_profile(api: &Api, driver: &str) -> Level {
    api.peek::<CSIDriver>("", driver)
        .as_ref()
        .and_then(|d| d.metadata.labels.as_ref())
        .and_then(|l| l.get(PROFILE_LABEL))
        .and_then(|value| Level::parse(value))
        .unwrap_or(Level::Privileged)
}
