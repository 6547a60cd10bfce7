//! The API server's validation of projected and downwardAPI volume sources (`pkg/apis/core/validation`
//! `validateProjectedVolumeSource`, `validateDownwardAPIVolumeFile`), with its texts: what a pod that
//! would fail only at the mount is refused for at its creation.

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, Volume};

/// The fields a downward API volume file may name (`validVolumeDownwardAPIFieldPathExpressions`).
const VOLUME_FIELD_PATHS: [&str; 5] = [
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
];

/// The errors of `volume`, the `index`th of the pod's, each as `field: message`.
pub fn errors(volume: &Volume, index: usize) -> Vec<String> {
    let mut errors = Vec::new();
    let path = format!("spec.volumes[{index}]");
    if let Some(downward) = &volume.downward_api {
        for (i, file) in downward.items.iter().flatten().enumerate() {
            file_errors(file, &format!("{path}.downwardAPI.items[{i}]"), &mut errors);
        }
    }
    let sources = volume
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten());
    for (s, source) in sources.enumerate() {
        let source_path = format!("{path}.projected.sources[{s}]");
        if let Some(token) = &source.service_account_token {
            let at = format!("{source_path}.serviceAccountToken");
            match token.expiration_seconds {
                Some(seconds) if seconds < 600 => errors.push(format!(
                    "{at}.expirationSeconds: Invalid value: {seconds}: may not specify a duration less than 10 minutes"
                )),
                Some(seconds) if seconds > 1 << 32 => errors.push(format!(
                    "{at}.expirationSeconds: Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds"
                )),
                _ => {}
            }
            if token.path.is_empty() {
                errors.push(format!("{at}.path: Required value"));
            }
        }
        if let Some(downward) = &source.downward_api {
            for (i, file) in downward.items.iter().flatten().enumerate() {
                let at = format!("{source_path}.downwardAPI.items[{i}]");
                file_errors(file, &at, &mut errors);
            }
        }
    }
    errors
}

/// `validateDownwardAPIVolumeFile`: a path, exactly one of fieldRef and resourceFieldRef, a field a volume
/// may name, and the container a resource is read from.
fn file_errors(file: &DownwardAPIVolumeFile, at: &str, errors: &mut Vec<String>) {
    if file.path.is_empty() {
        errors.push(format!("{at}.path: Required value"));
    }
    match (&file.field_ref, &file.resource_field_ref) {
        (Some(field), None) => {
            let base = field
                .field_path
                .split_once("['")
                .map_or(field.field_path.as_str(), |(base, _)| base);
            if !VOLUME_FIELD_PATHS.contains(&base) {
                let supported: Vec<String> =
                    VOLUME_FIELD_PATHS.iter().map(|p| format!("{p:?}")).collect();
                errors.push(format!(
                    "{at}.fieldRef.fieldPath: Unsupported value: {:?}: supported values: {}",
                    field.field_path,
                    supported.join(", ")
                ));
            }
        }
        (None, Some(resource)) => {
            if resource.container_name.as_deref().unwrap_or_default().is_empty() {
                errors.push(format!("{at}.resourceFieldRef.containerName: Required value"));
            }
        }
        (Some(_), Some(_)) => errors.push(format!(
            "{at}: Invalid value: \"resource\": fieldRef and resourceFieldRef can not be specified simultaneously"
        )),
        (None, None) => errors.push(format!(
            "{at}: Required value: one of fieldRef and resourceFieldRef is required"
        )),
    }
}
