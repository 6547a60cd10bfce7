//! What a CSIDriver object decides for a volume: the lifecycle-mode check, the fsGroup policy, pod info on
//! mount and service-account tokens (`csi_mounter.go`, `csi_util.go`), with upstream's error texts.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::CSIDriver;

use super::source::LifecycleMode;
use crate::{PodInfo, TokenRequestArgs, VolumeHost};

/// The pod-info keys (`getPodInfoAttrs`), set only when the CSIDriver says `podInfoOnMount: true`.
pub fn pod_info_attributes(pod: &PodInfo, mode: LifecycleMode) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("csi.storage.k8s.io/pod.name".to_string(), pod.name.clone()),
        (
            "csi.storage.k8s.io/pod.namespace".to_string(),
            pod.namespace.clone(),
        ),
        ("csi.storage.k8s.io/pod.uid".to_string(), pod.uid.clone()),
        (
            "csi.storage.k8s.io/serviceAccount.name".to_string(),
            pod.service_account.clone(),
        ),
        (
            "csi.storage.k8s.io/ephemeral".to_string(),
            (mode == LifecycleMode::Ephemeral).to_string(),
        ),
    ])
}

/// `supportsVolumeLifecycleMode`: no CSIDriver allows Persistent only; an empty list means `["Persistent"]`.
pub fn check_lifecycle_mode(
    driver_name: &str,
    driver: Option<&CSIDriver>,
    mode: LifecycleMode,
) -> Result<(), String> {
    let Some(driver) = driver else {
        return match mode {
            LifecycleMode::Persistent => Ok(()),
            _ => Err(format!(
                "volume mode {:?} not supported by driver {driver_name} (no CSIDriver object)",
                mode.as_str()
            )),
        };
    };
    let mut modes = driver
        .spec
        .volume_lifecycle_modes
        .clone()
        .unwrap_or_default();
    if modes.is_empty() {
        modes.push("Persistent".into());
    }
    if modes.iter().any(|m| m == mode.as_str()) {
        return Ok(());
    }
    // Go's %q of a []string: ["Persistent" "Ephemeral"].
    let listed: Vec<String> = modes.iter().map(|m| format!("{m:?}")).collect();
    Err(format!(
        "volume mode {:?} not supported by driver {driver_name} (only supports [{}])",
        mode.as_str(),
        listed.join(" ")
    ))
}

/// `getFSGroupPolicy`: no CSIDriver means `ReadWriteOnceWithFSType`.
pub fn fs_group_policy(driver: Option<&CSIDriver>) -> Result<String, String> {
    match driver {
        None => Ok("ReadWriteOnceWithFSType".into()),
        Some(d) => match d.spec.fs_group_policy.as_deref() {
            None | Some("") => {
                Err("expected valid fsGroupPolicy, received nil value or empty string".into())
            }
            Some(policy) => Ok(policy.to_string()),
        },
    }
}

/// `supportsFSGroup` (csi_mounter.go): never for read-only volumes or policy None; always for File;
/// otherwise only with an fsType, and for a PV only when its access modes include ReadWriteOnce
/// (`pv_access_modes` is None for inline volumes, which are always mounted ReadWriteOnce).
pub fn supports_fs_group(
    fs_type: Option<&str>,
    fs_group: Option<i64>,
    policy: &str,
    read_only: bool,
    pv_access_modes: Option<&[String]>,
) -> bool {
    if fs_group.is_none() || policy == "None" || read_only {
        return false;
    }
    if policy == "File" {
        return true;
    }
    if fs_type.is_none_or(str::is_empty) {
        return false;
    }
    pv_access_modes.is_none_or(|modes| modes.iter().any(|m| m == "ReadWriteOnce"))
}

/// `csi.storage.k8s.io/serviceAccount.tokens` for the CSIDriver's `tokenRequests`: JSON
/// `{"<audience>": {"token": "...", "expirationTimestamp": "..."}}`. None when the driver asks for none.
pub async fn service_account_tokens(
    host: &dyn VolumeHost,
    driver: Option<&CSIDriver>,
    pod: &PodInfo,
) -> Result<Option<String>, String> {
    let Some(requests) = driver
        .and_then(|d| d.spec.token_requests.as_ref())
        .filter(|r| !r.is_empty())
    else {
        return Ok(None);
    };
    /// `authenticationv1.TokenRequestStatus`, its fields in Go's order.
    #[derive(serde::Serialize)]
    struct TokenStatus {
        token: String,
        #[serde(rename = "expirationTimestamp")]
        expiration_timestamp: String,
    }
    // Audiences sorted, as Go marshals a map.
    let mut tokens = BTreeMap::new();
    for request in requests {
        let (token, expiration) = host
            .service_account_token(TokenRequestArgs {
                namespace: pod.namespace.clone(),
                service_account: pod.service_account.clone(),
                audience: request.audience.clone(),
                expiration_seconds: request.expiration_seconds,
                pod: (pod.name.clone(), pod.uid.clone()),
            })
            .await?;
        tokens.insert(
            request.audience.clone(),
            TokenStatus {
                token,
                expiration_timestamp: expiration,
            },
        );
    }
    serde_json::to_string(&tokens)
        .map(Some)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::CSIDriverSpec;

    fn driver(modes: &[&str]) -> CSIDriver {
        CSIDriver {
            spec: CSIDriverSpec {
                volume_lifecycle_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn lifecycle_mode_errors_read_as_upstream() {
        assert!(check_lifecycle_mode("d", None, LifecycleMode::Persistent).is_ok());
        assert_eq!(
            check_lifecycle_mode("foo.example.com", None, LifecycleMode::Ephemeral).unwrap_err(),
            "volume mode \"Ephemeral\" not supported by driver foo.example.com (no CSIDriver object)"
        );
        assert_eq!(
            check_lifecycle_mode(
                "foo.example.com",
                Some(&driver(&[])),
                LifecycleMode::Ephemeral
            )
            .unwrap_err(),
            "volume mode \"Ephemeral\" not supported by driver foo.example.com (only supports [\"Persistent\"])"
        );
        assert!(
            check_lifecycle_mode(
                "d",
                Some(&driver(&["Persistent", "Ephemeral"])),
                LifecycleMode::Ephemeral
            )
            .is_ok()
        );
        assert_eq!(
            check_lifecycle_mode(
                "d",
                Some(&driver(&["Ephemeral"])),
                LifecycleMode::Persistent
            )
            .unwrap_err(),
            "volume mode \"Persistent\" not supported by driver d (only supports [\"Ephemeral\"])"
        );
    }

    #[test]
    fn fs_group_follows_the_policy() {
        assert!(
            !supports_fs_group(None, Some(1000), "ReadWriteOnceWithFSType", false, None),
            "needs an fsType"
        );
        assert!(supports_fs_group(
            Some("ext4"),
            Some(1000),
            "ReadWriteOnceWithFSType",
            false,
            None
        ));
        let rwx = ["ReadWriteMany".to_string()];
        let rwo = ["ReadOnlyMany".to_string(), "ReadWriteOnce".to_string()];
        assert!(
            !supports_fs_group(
                Some("ext4"),
                Some(1000),
                "ReadWriteOnceWithFSType",
                false,
                Some(&rwx)
            ),
            "a PV needs ReadWriteOnce among its access modes"
        );
        assert!(supports_fs_group(
            Some("ext4"),
            Some(1000),
            "ReadWriteOnceWithFSType",
            false,
            Some(&rwo)
        ));
        assert!(supports_fs_group(
            None,
            Some(1000),
            "File",
            false,
            Some(&rwx)
        ));
        assert!(
            !supports_fs_group(None, Some(1000), "File", true, None),
            "never for read-only volumes"
        );
        assert!(!supports_fs_group(
            Some("ext4"),
            Some(1000),
            "None",
            false,
            None
        ));
        assert!(!supports_fs_group(Some("ext4"), None, "File", false, None));
        assert_eq!(fs_group_policy(None).unwrap(), "ReadWriteOnceWithFSType");
    }
}
