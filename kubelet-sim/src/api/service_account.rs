//! The ServiceAccount admission plugin (`plugin/pkg/admission/serviceaccount/admission.go`) and what the
//! controller manager keeps in every namespace (the `default` ServiceAccount, the root-ca-cert-publisher's
//! `kube-root-ca.crt`), so that the embedded API gives pods what a 1.21+ cluster gives them: a projected
//! `kube-api-access-<5 chars>` volume (a bound token, the root CA, the namespace) mounted read-only at
//! `/var/run/secrets/kubernetes.io/serviceaccount` in every container, unless the pod or its service account
//! opts out (`automountServiceAccountToken: false`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath,
    ObjectFieldSelector, Pod, ProjectedVolumeSource, ServiceAccount, ServiceAccountTokenProjection,
    Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::Api;

/// The default service account's name.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Where the token volume is mounted (`DefaultAPITokenMountPath`).
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The token volume's name prefix (`ServiceAccountVolumeName`).
pub const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";
/// The root CA's ConfigMap (`RootCACertConfigMapName`).
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
/// The token's lifetime in the volume (`WarnOnlyBoundTokenExpirationSeconds`: 1 h 7 s).
const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// The projected volume's mode, set explicitly (`ProjectedVolumeSourceDefaultMode`, kubernetes#104464).
const PROJECTED_DEFAULT_MODE: i32 = 0o644;
/// The mirror pod annotation: such pods are not changed (`MirrorPodAnnotationKey`).
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Admits `pod` as the ServiceAccount plugin does: the default account named when none is, the account
/// looked up (the `default` one made, as the service-account controller makes it in each namespace), the
/// token volume mounted when it should be, and the account's image pull secrets when the pod has none.
/// The error is the API server's refusal (`pods "x" is forbidden: error looking up service account ...`).
pub fn admit(api: &Api, pod: &mut Pod) -> Result<(), String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION));
    let Some(spec) = pod.spec.as_mut() else {
        return Ok(());
    };
    if mirror {
        return Ok(());
    }
    let account_name = spec
        .service_account_name
        .get_or_insert_with(|| DEFAULT_SERVICE_ACCOUNT.into())
        .clone();
    let account = match api.peek::<ServiceAccount>(&namespace, &account_name) {
        Some(account) => account,
        None if account_name == DEFAULT_SERVICE_ACCOUNT => {
            ensure_namespace_objects(api, &namespace);
            api.peek::<ServiceAccount>(&namespace, &account_name)
                .ok_or_else(|| format!("serviceaccount {account_name:?} not found"))?
        }
        None => {
            return Err(format!(
                "pods {name:?} is forbidden: error looking up service account {namespace}/{account_name}: serviceaccount {account_name:?} not found"
            ));
        }
    };
    ensure_namespace_objects(api, &namespace);
    // The pod's preference wins, then the account's; true by default.
    let automount = spec
        .automount_service_account_token
        .or(account.automount_service_account_token)
        .unwrap_or(true);
    if automount {
        mount_token(spec);
    }
    if spec.image_pull_secrets.as_ref().is_none_or(Vec::is_empty) {
        if let Some(secrets) = account.image_pull_secrets.clone().filter(|s| !s.is_empty()) {
            spec.image_pull_secrets = Some(secrets);
        }
    }
    Ok(())
}

/// `mountServiceAccountToken`: every init and regular container that has no mount at the token path gets
/// the token volume's mount; the volume is added (named `kube-api-access-` and 5 random characters) when a
/// container needs it and the pod has none.
fn mount_token(spec: &mut k8s_openapi::api::core::v1::PodSpec) {
    let existing = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with(TOKEN_VOLUME_PREFIX))
        .map(|v| v.name.clone());
    let volume_name = existing
        .clone()
        .unwrap_or_else(|| format!("{TOKEN_VOLUME_PREFIX}{}", random_suffix()));
    let mount = VolumeMount {
        name: volume_name.clone(),
        read_only: Some(true),
        mount_path: TOKEN_MOUNT_PATH.into(),
        ..Default::default()
    };
    let mut needed = false;
    let containers = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    for container in containers {
        let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
        if !mounts.iter().any(|m| m.mount_path == TOKEN_MOUNT_PATH) {
            mounts.push(mount.clone());
            needed = true;
        }
    }
    if existing.is_none() && needed {
        spec.volumes
            .get_or_insert_with(Vec::new)
            .push(token_volume(volume_name));
    }
}

/// `TokenVolumeSource`: the token, the root CA and the namespace.
fn token_volume(name: String) -> Volume {
    Volume {
        name,
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(PROJECTED_DEFAULT_MODE),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(TOKEN_EXPIRATION_SECONDS),
                        audience: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: ROOT_CA_CONFIG_MAP.into(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".into(),
                            path: "ca.crt".into(),
                            mode: None,
                        }]),
                        optional: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".into()),
                                field_path: "metadata.namespace".into(),
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
        }),
        ..Default::default()
    }
}

/// `utilrand.String(5)`: 5 characters of `bcdfghjklmnpqrstvwxz2456789` (no vowels, no confusable digits).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// What the controller manager keeps in each namespace: the `default` ServiceAccount (the
/// service-account controller) and `kube-root-ca.crt` (the root-ca-cert-publisher).
pub fn ensure_namespace_objects(api: &Api, namespace: &str) {
    if api
        .peek::<ServiceAccount>(namespace, DEFAULT_SERVICE_ACCOUNT)
        .is_none()
    {
        api.put(ServiceAccount {
            metadata: ObjectMeta {
                name: Some(DEFAULT_SERVICE_ACCOUNT.into()),
                namespace: Some(namespace.into()),
                uid: Some(uuid::Uuid::new_v4().to_string()),
                ..Default::default()
            },
            ..Default::default()
        });
    }
    if api
        .peek::<ConfigMap>(namespace, ROOT_CA_CONFIG_MAP)
        .is_none()
    {
        match api.tokens.root_ca_pem() {
            Ok(pem) => api.put(ConfigMap {
                metadata: ObjectMeta {
                    name: Some(ROOT_CA_CONFIG_MAP.into()),
                    namespace: Some(namespace.into()),
                    annotations: Some(BTreeMap::from([(
                        "kubernetes.io/description".to_string(),
                        "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.".to_string(),
                    )])),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([("ca.crt".to_string(), pem)])),
                ..Default::default()
            }),
            Err(e) => tracing::error!(namespace, "publishing {ROOT_CA_CONFIG_MAP}: {e}"),
        }
    }
}
