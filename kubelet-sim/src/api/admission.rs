//! Admission in the embedded API: defaults the API server would set, validation with the API server's
//! message shapes, the operator's inline-driver policy, each namespace's Pod Security level against its
//! inline drivers' profiles ([`super::inline_profile`]), and persistent inline grants
//! ([`super::inline_grant`]).
//!
//! # The inline-driver policy
//! The successor of PodSecurityPolicy's `allowedCSIDrivers`. `None` (no `--allowed-inline-drivers`) allows
//! every driver inline. A list allows only the drivers it names; an **empty list allows none**: an operator
//! who sets the policy and lists nothing has asked for no inline drivers (the KEP's own wording, and the
//! opposite of the 2019 PSP API comment, which is why it is written down here).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, Pod, Secret, Volume,
};
use k8s_openapi::api::storage::v1::CSIDriver;

use inlet_host::names::{csi_driver_name_errors, dns1123_subdomain_errors};
// Field errors as the API server joins them: one alone, several in brackets.
use inlet_volume::aggregate;

use super::{Api, now};

/// Why an object was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Rejected(pub String);

/// The admission settings.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    /// Drivers allowed in inline `csi` volumes; None allows all (see the module doc).
    pub allowed_inline_drivers: Option<BTreeSet<String>>,
    /// The `PersistentInlineCSI` gate: persistent inline sources must be granted to the pod's namespace,
    /// and inline drivers' profiles are checked against namespaces' Pod Security levels.
    pub persistent_inline: bool,
}

/// The API's names: DNS-1123 subdomains (`IsDNS1123Subdomain`).
fn valid_subdomain(name: &str) -> bool {
    dns1123_subdomain_errors(name).is_empty()
}

/// `IsDNS1123Label` of apimachinery's `util/validation`: the messages for a name that is not a DNS label
/// (empty when it is one). Pod volume names must be labels.
fn dns_label_errors(name: &str) -> Vec<&'static str> {
    let mut errors = Vec::new();
    if name.len() > 63 {
        errors.push("must be no more than 63 characters");
    }
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let label = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && edge(name.chars().next())
        && edge(name.chars().last());
    if !label {
        errors.push(if valid_subdomain(name) {
            "must not contain dots"
        } else {
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        });
    }
    errors
}

fn sources(volume: &Volume) -> usize {
    let v = serde_json::to_value(volume).unwrap_or_default();
    v.as_object()
        .map_or(0, |o| o.keys().filter(|k| *k != "name").count())
}

impl Admission {
    /// Admits a pod: defaults (namespace, uid, service account), validation, then the inline policy.
    pub fn admit_pod(&self, api: &Api, mut pod: Pod) -> Result<Pod, Rejected> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let invalid = |detail: String| Rejected(format!("Pod {name:?} is invalid: {detail}"));
        if !valid_subdomain(&name) {
            return Err(invalid(format!(
                "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
            )));
        }
        pod.metadata
            .namespace
            .get_or_insert_with(|| "default".into());
        pod.metadata
            .uid
            .get_or_insert_with(|| uuid::Uuid::new_v4().to_string());
        pod.metadata.creation_timestamp.get_or_insert_with(now);
        let spec = pod
            .spec
            .as_mut()
            .ok_or_else(|| invalid("spec: Required value".into()))?;
        if spec.containers.is_empty() {
            return Err(invalid("spec.containers: Required value".into()));
        }
        let volumes = spec.volumes.clone().unwrap_or_default();
        let mut names = BTreeSet::new();
        for (i, volume) in volumes.iter().enumerate() {
            let path = format!("spec.volumes[{i}].name");
            if volume.name.is_empty() {
                return Err(invalid(format!("{path}: Required value")));
            }
            let errors: Vec<String> = dns_label_errors(&volume.name)
                .into_iter()
                .map(|e| format!("{path}: Invalid value: {:?}: {e}", volume.name))
                .collect();
            if !errors.is_empty() {
                return Err(invalid(aggregate(&errors)));
            }
            if !names.insert(volume.name.clone()) {
                return Err(invalid(format!(
                    "spec.volumes[{i}].name: Duplicate value: {:?}",
                    volume.name
                )));
            }
            match sources(volume) {
                0 => {
                    return Err(invalid(format!(
                        "spec.volumes[{i}]: Required value: must specify a volume type"
                    )));
                }
                1 => {}
                _ => {
                    return Err(invalid(format!(
                        "spec.volumes[{i}]: Forbidden: may not specify more than 1 volume type"
                    )));
                }
            }
            let errors = super::volume_validation::errors(volume, i);
            if !errors.is_empty() {
                return Err(invalid(aggregate(&errors)));
            }
            // `validateCSIVolumeSource`: the driver's name becomes a path on the node.
            if let Some(csi) = &volume.csi {
                let errors =
                    csi_driver_name_errors(&csi.driver, &format!("spec.volumes[{i}].csi.driver"));
                if !errors.is_empty() {
                    return Err(invalid(aggregate(&errors)));
                }
            }
            // The image volume source's validation (`validateImageVolumeSource`).
            if let Some(image) = &volume.image {
                if image.reference.as_deref().unwrap_or_default().is_empty() {
                    return Err(invalid(format!(
                        "spec.volumes[{i}].image.reference: Required value"
                    )));
                }
                if let Some(policy) = image
                    .pull_policy
                    .as_deref()
                    .filter(|p| !["Always", "IfNotPresent", "Never"].contains(p))
                {
                    return Err(invalid(format!(
                        "spec.volumes[{i}].image.pullPolicy: Unsupported value: {policy:?}: supported values: \"Always\", \"IfNotPresent\", \"Never\""
                    )));
                }
            }
        }
        for (c, container) in spec.containers.iter().enumerate() {
            if container.image.as_deref().unwrap_or_default().is_empty() {
                return Err(invalid(format!(
                    "spec.containers[{c}].image: Required value"
                )));
            }
            for (m, mount) in container.volume_mounts.iter().flatten().enumerate() {
                if !names.contains(&mount.name) {
                    return Err(invalid(format!(
                        "spec.containers[{c}].volumeMounts[{m}].name: Not found: {:?}",
                        mount.name
                    )));
                }
            }
        }
        if let Some(allowed) = &self.allowed_inline_drivers {
            for (i, volume) in volumes.iter().enumerate() {
                let Some(csi) = &volume.csi else { continue };
                if !allowed.contains(&csi.driver) {
                    let list = if allowed.is_empty() {
                        "none".to_string()
                    } else {
                        allowed.iter().cloned().collect::<Vec<_>>().join(", ")
                    };
                    return Err(Rejected(format!(
                        "pods {name:?} is forbidden: spec.volumes[{i}].csi.driver: Forbidden: inline CSI driver {:?} is not allowed by the inline-driver policy (allowed: {list})",
                        csi.driver
                    )));
                }
            }
        }
        // This proposal's admission (kep/596-inline-csi-volume-plugin), behind its gate as in alpha: it
        // changes what restricted and baseline namespaces accept.
        if self.persistent_inline {
            super::inline_profile::admit(api, &pod, &name).map_err(Rejected)?;
            super::inline_grant::admit(api, &pod, &name).map_err(Rejected)?;
        }
        // The ServiceAccount plugin, after validation here: what it adds is valid.
        super::service_account::admit(api, &mut pod).map_err(Rejected)?;
        Ok(pod)
    }

    /// Admits a CSIDriver: the API server's defaults, and validation of modes and token requests.
    pub fn admit_csi_driver(&self, mut driver: CSIDriver) -> Result<CSIDriver, Rejected> {
        let name = driver.metadata.name.clone().unwrap_or_default();
        let invalid = |detail: String| {
            Rejected(format!(
                "CSIDriver.storage.k8s.io {name:?} is invalid: {detail}"
            ))
        };
        // `ValidateCSIDriver` (`pkg/apis/storage/validation/validation.go`) checks the name first.
        let errors = csi_driver_name_errors(&name, "name");
        if !errors.is_empty() {
            return Err(invalid(aggregate(&errors)));
        }
        let spec = &mut driver.spec;
        spec.attach_required.get_or_insert(true);
        spec.pod_info_on_mount.get_or_insert(false);
        spec.requires_republish.get_or_insert(false);
        spec.storage_capacity.get_or_insert(false);
        spec.se_linux_mount.get_or_insert(false);
        spec.fs_group_policy
            .get_or_insert_with(|| "ReadWriteOnceWithFSType".into());
        let modes = spec.volume_lifecycle_modes.get_or_insert_with(Vec::new);
        if modes.is_empty() {
            modes.push("Persistent".into());
        }
        for (i, mode) in modes.iter().enumerate() {
            if mode != "Persistent" && mode != "Ephemeral" {
                return Err(invalid(format!(
                    "spec.volumeLifecycleModes[{i}]: Unsupported value: {mode:?}: supported values: \"Ephemeral\", \"Persistent\""
                )));
            }
        }
        if let Some(policy) = &spec.fs_group_policy {
            if !["None", "File", "ReadWriteOnceWithFSType"].contains(&policy.as_str()) {
                return Err(invalid(format!(
                    "spec.fsGroupPolicy: Unsupported value: {policy:?}"
                )));
            }
        }
        let mut audiences = BTreeSet::new();
        for (i, request) in spec.token_requests.iter().flatten().enumerate() {
            if !audiences.insert(request.audience.clone()) {
                return Err(invalid(format!(
                    "spec.tokenRequests[{i}].audience: Duplicate value: {:?}",
                    request.audience
                )));
            }
            if let Some(seconds) = request.expiration_seconds {
                if !(600..1 << 32).contains(&seconds) {
                    return Err(invalid(format!(
                        "spec.tokenRequests[{i}].expirationSeconds: Invalid value: {seconds}: may not be less than 10 minutes"
                    )));
                }
            }
        }
        Ok(driver)
    }

    /// Validates a PersistentVolume: the secret references of its CSI source need a name and a namespace
    /// (`validatePVSecretReference` in upstream's `validation.go`; it checks the controller-publish,
    /// controller-expand, node-publish and node-expand references, not node-stage).
    pub fn validate_persistent_volume(&self, pv: &PersistentVolume) -> Result<(), Rejected> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        // `ValidatePersistentVolumeName`: a block PV's name is a directory under `volumeDevices/`.
        let mut errors: Vec<String> = dns1123_subdomain_errors(&name)
            .into_iter()
            .map(|e| format!("metadata.name: Invalid value: {name:?}: {e}"))
            .collect();
        // `validateCSIPersistentVolumeSource`: the driver's name first.
        if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
            errors.extend(csi_driver_name_errors(&csi.driver, "spec.csi.driver"));
            errors.extend(secret_reference_errors(csi));
        }
        match errors.is_empty() {
            true => Ok(()),
            false => Err(Rejected(format!(
                "PersistentVolume {name:?} is invalid: {}",
                aggregate(&errors)
            ))),
        }
    }
}

/// `validatePVSecretReference` for the secret references of a PV's CSI source.
fn secret_reference_errors(csi: &CSIPersistentVolumeSource) -> Vec<String> {
    let mut errors = Vec::new();
    for (field, reference) in [
        (
            "controllerPublishSecretRef",
            &csi.controller_publish_secret_ref,
        ),
        (
            "controllerExpandSecretRef",
            &csi.controller_expand_secret_ref,
        ),
        ("nodePublishSecretRef", &csi.node_publish_secret_ref),
        ("nodeExpandSecretRef", &csi.node_expand_secret_ref),
    ] {
        let Some(reference) = reference else { continue };
        if reference.name.as_deref().unwrap_or_default().is_empty() {
            errors.push(format!("spec.csi.{field}.name: Required value"));
        }
        if reference
            .namespace
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            errors.push(format!("spec.csi.{field}.namespace: Required value"));
        }
    }
    errors
}

impl Admission {
    /// Admits a secret: `stringData` merged into `data`, as the API server does on write.
    pub fn admit_secret(&self, mut secret: Secret) -> Result<Secret, Rejected> {
        secret
            .metadata
            .namespace
            .get_or_insert_with(|| "default".into());
        if let Some(strings) = secret.string_data.take() {
            let data = secret.data.get_or_insert_with(Default::default);
            for (k, v) in strings {
                data.insert(k, k8s_openapi::ByteString(v.into_bytes()));
            }
        }
        Ok(secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        CSIVolumeSource, Container, PodSpec, ServiceAccount, VolumeMount,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(driver: &str, mount: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("busybox".into()),
                    volume_mounts: Some(vec![VolumeMount {
                        name: mount.into(),
                        mount_path: "/data".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }],
                volumes: Some(vec![Volume {
                    name: "data".into(),
                    csi: Some(CSIVolumeSource {
                        driver: driver.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn validates_like_the_api_server() {
        let api = Api::new();
        let open = Admission::default();
        let admitted = open.admit_pod(&api, pod("d.example.com", "data")).unwrap();
        assert_eq!(admitted.metadata.namespace.as_deref(), Some("default"));
        assert!(admitted.metadata.uid.is_some());
        assert!(
            api.peek::<ServiceAccount>("default", "default").is_some(),
            "the default service account exists"
        );
        // `ValidateCSIDriverName`: an empty name is both required and not a subdomain.
        let err = open.admit_pod(&api, pod("", "data")).unwrap_err().0;
        assert!(
            err.starts_with("Pod \"web\" is invalid: [spec.volumes[0].csi.driver: Required value, spec.volumes[0].csi.driver: Invalid value: \"\": a lowercase RFC 1123 subdomain"),
            "{err}"
        );
        // A driver name becomes a path on the node: one that would leave the root is refused.
        for driver in ["../../../../../../../../../tmp/x", "/tmp/x", "a_b"] {
            let err = open.admit_pod(&api, pod(driver, "data")).unwrap_err().0;
            assert!(
                err.starts_with(&format!("Pod \"web\" is invalid: spec.volumes[0].csi.driver: Invalid value: {driver:?}: a lowercase RFC 1123 subdomain")),
                "{err}"
            );
        }
        let err = open
            .admit_pod(&api, pod(&"d".repeat(64), "data"))
            .unwrap_err()
            .0;
        assert_eq!(
            err,
            "Pod \"web\" is invalid: spec.volumes[0].csi.driver: Too long: may not be more than 63 bytes"
        );
        admitted_upper_case(&open, &api);
        let err = open.admit_pod(&api, pod("d", "other")).unwrap_err().0;
        assert!(
            err.ends_with("spec.containers[0].volumeMounts[0].name: Not found: \"other\""),
            "{err}"
        );
    }

    #[test]
    fn the_inline_policy_allows_listed_drivers_and_an_empty_list_allows_none() {
        let api = Api::new();
        let policy = |drivers: &[&str]| Admission {
            allowed_inline_drivers: Some(drivers.iter().map(|d| d.to_string()).collect()),
            ..Default::default()
        };
        assert!(
            policy(&["a.example.com"])
                .admit_pod(&api, pod("a.example.com", "data"))
                .is_ok()
        );
        let err = policy(&["a.example.com"])
            .admit_pod(&api, pod("b.example.com", "data"))
            .unwrap_err()
            .0;
        assert!(err.starts_with("pods \"web\" is forbidden: spec.volumes[0].csi.driver: Forbidden: inline CSI driver \"b.example.com\""), "{err}");
        assert!(
            policy(&[])
                .admit_pod(&api, pod("a.example.com", "data"))
                .unwrap_err()
                .0
                .contains("(allowed: none)")
        );
    }

    #[test]
    fn csi_drivers_get_the_api_defaults() {
        let d = Admission::default()
            .admit_csi_driver(CSIDriver {
                metadata: ObjectMeta {
                    name: Some("d".into()),
                    ..Default::default()
                },
                ..Default::default()
            })
            .unwrap();
        assert_eq!(d.spec.attach_required, Some(true));
        assert_eq!(d.spec.pod_info_on_mount, Some(false));
        assert_eq!(
            d.spec.volume_lifecycle_modes,
            Some(vec!["Persistent".to_string()])
        );
        assert_eq!(
            d.spec.fs_group_policy.as_deref(),
            Some("ReadWriteOnceWithFSType")
        );
    }

    /// `ValidateCSIDriverName` lowercases before the subdomain check: upper case is a valid driver name.
    fn admitted_upper_case(open: &Admission, api: &Api) {
        open.admit_pod(api, pod("D.Example.COM", "data")).unwrap();
    }

    #[test]
    fn csi_driver_and_pv_names_that_would_leave_the_root_are_refused() {
        let open = Admission::default();
        let driver = |name: &str| CSIDriver {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let err = open.admit_csi_driver(driver("/tmp/x")).unwrap_err().0;
        assert!(
            err.starts_with(
                "CSIDriver.storage.k8s.io \"/tmp/x\" is invalid: name: Invalid value: \"/tmp/x\""
            ),
            "{err}"
        );
        open.admit_csi_driver(driver("local.inlet.dev")).unwrap();
        let pv = |name: &str, driver: &str| PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: driver.into(),
                    volume_handle: "h".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        open.validate_persistent_volume(&pv("data", "local.inlet.dev"))
            .unwrap();
        let err = open
            .validate_persistent_volume(&pv("data", "../../x"))
            .unwrap_err()
            .0;
        assert!(
            err.starts_with(
                "PersistentVolume \"data\" is invalid: spec.csi.driver: Invalid value: \"../../x\""
            ),
            "{err}"
        );
        let err = open
            .validate_persistent_volume(&pv("../pv", "local.inlet.dev"))
            .unwrap_err()
            .0;
        assert!(
            err.starts_with("PersistentVolume \"../pv\" is invalid: metadata.name: Invalid value"),
            "{err}"
        );
    }
}
