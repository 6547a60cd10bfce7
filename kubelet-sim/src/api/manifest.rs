//! Loading ordinary Kubernetes YAML: several documents per file, `kind: List`, files or directories
//! (`.yaml`, `.yml`, `.json`, in name order).
//!
//! The early KEP-596 draft gave inline `csi` sources fields upstream's type never had (`volumeHandle`,
//! `controllerPublishSecretRef`, `nodeStageSecretRef`). They are read from the manifest and kept on the pod
//! as the annotation [`DRAFT_FIELDS_ANNOTATION`] (JSON by volume name), so they travel with the Pod object.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use serde_json::Value;

/// The pod annotation holding the draft inline fields: `{"<volume>": {"volumeHandle": ..., ...}}`.
pub const DRAFT_FIELDS_ANNOTATION: &str = "inlet.dev/csi-inline-draft-fields";
/// The pod annotation naming the state a pod is expected to reach: `Running` (default), `Pending`, `Rejected`.
pub const EXPECTED_PHASE_ANNOTATION: &str = "inlet.dev/expected-phase";

/// One object from a manifest.
#[derive(Debug, Clone)]
pub enum Object {
    /// A Pod.
    Pod(Box<Pod>),
    /// A Secret.
    Secret(Box<Secret>),
    /// A ConfigMap.
    ConfigMap(Box<ConfigMap>),
    /// A CSIDriver.
    CsiDriver(Box<CSIDriver>),
    /// A StorageClass (dynamic provisioning, generic ephemeral volumes).
    StorageClass(Box<StorageClass>),
    /// A PersistentVolume.
    PersistentVolume(Box<PersistentVolume>),
    /// A PersistentVolumeClaim.
    PersistentVolumeClaim(Box<PersistentVolumeClaim>),
    /// A ServiceAccount.
    ServiceAccount(Box<ServiceAccount>),
    /// A Namespace (accepted; namespaces need no object here).
    Namespace(Box<Namespace>),
}

/// An object and where it came from (`file.yaml#2`), for messages.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// `path#document` (1-based).
    pub origin: String,
    /// The object.
    pub object: Object,
}

/// A manifest that cannot be used; the message names the file and document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ManifestError(pub String);

/// Loads every object under `paths` (files, or directories of files).
pub fn load(paths: &[PathBuf]) -> Result<Vec<Manifest>, ManifestError> {
    let mut manifests = Vec::new();
    for path in paths {
        for file in files(path)? {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| ManifestError(format!("{}: {e}", file.display())))?;
            manifests.extend(parse(&text, &file.display().to_string())?);
        }
    }
    Ok(manifests)
}

/// The manifest files under `path` (itself, when it is a file), in name order. Symlinks are followed, but
/// each real file is read once, and a link back to a directory being walked (a loop) is skipped with a
/// warning instead of being walked forever.
fn files(path: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let failed = |e: &dyn std::fmt::Display| ManifestError(format!("{}: {e}", path.display()));
    if !std::fs::metadata(path).map_err(|e| failed(&e))?.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut seen = std::collections::HashSet::new();
    let mut found = Vec::new();
    let walk = walkdir::WalkDir::new(path)
        .follow_links(true)
        .sort_by_file_name();
    for entry in walk {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) if e.loop_ancestor().is_some() => {
                tracing::warn!("skipping a directory loop: {e}");
                continue;
            }
            Err(e) => return Err(failed(&e)),
        };
        let manifest = matches!(
            entry.path().extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        );
        if entry.file_type().is_file() && manifest {
            let real = entry.path().canonicalize().map_err(|e| failed(&e))?;
            if seen.insert(real) {
                found.push(entry.into_path());
            }
        }
    }
    Ok(found)
}

/// Parses the documents of one file.
pub fn parse(text: &str, file: &str) -> Result<Vec<Manifest>, ManifestError> {
    // serde-saphyr's default budget (1,024 documents, 250,000 nodes) guards against hostile input; a load
    // test's manifest of 10,000 pods is legitimate, so the counts are raised and the other limits kept.
    let mut budget = serde_saphyr::Budget::default();
    budget.max_documents = 100_000;
    budget.max_nodes = 10_000_000;
    budget.max_events = 50_000_000;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    let documents: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options)
        .map_err(|e| ManifestError(format!("{file}: not valid YAML: {e}")))?;
    let mut manifests = Vec::new();
    for (i, document) in documents.into_iter().enumerate() {
        if document.is_null() {
            continue;
        }
        let origin = format!("{file}#{}", i + 1);
        if document.get("kind").and_then(Value::as_str) == Some("List") {
            for item in document
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                manifests.push(Manifest {
                    object: object(item, &origin)?,
                    origin: origin.clone(),
                });
            }
        } else {
            manifests.push(Manifest {
                object: object(document, &origin)?,
                origin,
            });
        }
    }
    Ok(manifests)
}

fn object(mut value: Value, origin: &str) -> Result<Object, ManifestError> {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .map(str::to_string);
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let kind =
        kind.ok_or_else(|| ManifestError(format!("{origin}: the object has no \"kind\"")))?;
    let expected = match kind.as_str() {
        "Pod"
        | "Secret"
        | "ConfigMap"
        | "PersistentVolume"
        | "PersistentVolumeClaim"
        | "ServiceAccount"
        | "Namespace" => "v1",
        "CSIDriver" | "StorageClass" => "storage.k8s.io/v1",
        other => {
            return Err(ManifestError(format!(
                "{origin}: kind {other:?} is not supported (supported: Pod, Secret, ConfigMap, CSIDriver, StorageClass, PersistentVolume, PersistentVolumeClaim, ServiceAccount, Namespace)"
            )));
        }
    };
    if api_version != expected {
        return Err(ManifestError(format!(
            "{origin}: {kind} must have apiVersion {expected:?}, not {api_version:?}"
        )));
    }
    if kind == "Pod" {
        move_draft_fields(&mut value);
    }
    let typed = |e: serde_json::Error| ManifestError(format!("{origin}: {kind}: {e}"));
    Ok(match kind.as_str() {
        "Pod" => Object::Pod(Box::new(serde_json::from_value(value).map_err(typed)?)),
        "Secret" => Object::Secret(Box::new(serde_json::from_value(value).map_err(typed)?)),
        "ConfigMap" => Object::ConfigMap(Box::new(serde_json::from_value(value).map_err(typed)?)),
        "CSIDriver" => Object::CsiDriver(Box::new(serde_json::from_value(value).map_err(typed)?)),
        "StorageClass" => {
            Object::StorageClass(Box::new(serde_json::from_value(value).map_err(typed)?))
        }
        "PersistentVolume" => {
            Object::PersistentVolume(Box::new(serde_json::from_value(value).map_err(typed)?))
        }
        "PersistentVolumeClaim" => {
            Object::PersistentVolumeClaim(serde_json::from_value(value).map_err(typed)?)
        }
        "ServiceAccount" => {
            Object::ServiceAccount(Box::new(serde_json::from_value(value).map_err(typed)?))
        }
        _ => Object::Namespace(Box::new(serde_json::from_value(value).map_err(typed)?)),
    })
}

/// Moves the draft's inline fields out of `spec.volumes[*].csi` into the pod annotation.
fn move_draft_fields(pod: &mut Value) {
    let mut fields = serde_json::Map::new();
    if let Some(volumes) = pod
        .pointer_mut("/spec/volumes")
        .and_then(Value::as_array_mut)
    {
        for volume in volumes {
            let name = volume
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let Some(csi) = volume.get_mut("csi").and_then(Value::as_object_mut) else {
                continue;
            };
            let mut draft = serde_json::Map::new();
            for key in [
                "volumeHandle",
                "controllerPublishSecretRef",
                "nodeStageSecretRef",
            ] {
                if let Some(v) = csi.remove(key) {
                    draft.insert(key.to_string(), v);
                }
            }
            if !draft.is_empty() {
                fields.insert(name, Value::Object(draft));
            }
        }
    }
    if fields.is_empty() {
        return;
    }
    let metadata = pod.as_object_mut().and_then(|p| {
        p.entry("metadata").or_insert_with(|| serde_json::json!({}));
        p.get_mut("metadata")?.as_object_mut()
    });
    if let Some(metadata) = metadata {
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(
                DRAFT_FIELDS_ANNOTATION.into(),
                Value::String(Value::Object(fields).to_string()),
            );
        }
    }
}

/// The draft inline fields of one of a pod's volumes: (volumeHandle, controllerPublishSecretRef name,
/// nodeStageSecretRef name).
pub fn draft_fields(pod: &Pod, volume: &str) -> (Option<String>, Option<String>, Option<String>) {
    let parsed: Option<Value> = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DRAFT_FIELDS_ANNOTATION))
        .and_then(|text| serde_json::from_str(text).ok());
    let Some(fields) = parsed.as_ref().and_then(|v| v.get(volume)) else {
        return (None, None, None);
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    (
        text(fields.get("volumeHandle")),
        text(fields.pointer("/controllerPublishSecretRef/name")),
        text(fields.pointer("/nodeStageSecretRef/name")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_with_symlink_loops_is_walked_once() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("manifests");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n";
        std::fs::write(root.join("a.yaml"), pod).unwrap();
        std::fs::write(root.join("sub/b.yaml"), pod).unwrap();
        symlink("..", root.join("sub/up")).unwrap();
        symlink("../..", root.join("sub/up-twice")).unwrap();
        symlink(".", root.join("sub/here")).unwrap();
        symlink("sub", root.join("alias")).unwrap();
        let found = files(&root).unwrap();
        assert_eq!(found, [root.join("a.yaml"), root.join("alias/b.yaml")]);
        assert_eq!(load(&[root]).unwrap().len(), 2);
    }

    #[test]
    fn reads_documents_lists_and_draft_fields() {
        let text = r#"
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: local.inlet.dev}
spec: {volumeLifecycleModes: [Ephemeral]}
---
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Secret
    metadata: {name: creds}
    stringData: {password: x}
---
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers: [{name: app, image: busybox}]
  volumes:
    - name: data
      csi: {driver: local.inlet.dev, volumeHandle: vol-1, controllerPublishSecretRef: {name: attach-creds}}
"#;
        let manifests = parse(text, "m.yaml").unwrap();
        assert_eq!(manifests.len(), 3);
        assert!(matches!(manifests[0].object, Object::CsiDriver(_)));
        assert_eq!(manifests[1].origin, "m.yaml#2");
        let Object::Pod(pod) = &manifests[2].object else {
            panic!("a pod")
        };
        assert_eq!(
            draft_fields(pod, "data"),
            (Some("vol-1".into()), Some("attach-creds".into()), None)
        );
        assert_eq!(draft_fields(pod, "other"), (None, None, None));
    }

    #[test]
    fn names_what_is_wrong_and_where() {
        let err = parse("apiVersion: v1\nkind: Deployment\n", "d.yaml")
            .unwrap_err()
            .0;
        assert!(
            err.starts_with("d.yaml#1: kind \"Deployment\" is not supported"),
            "{err}"
        );
        let err = parse("kind: Pod\napiVersion: v2\n", "p.yaml")
            .unwrap_err()
            .0;
        assert!(err.contains("apiVersion \"v1\""), "{err}");
        let err = parse("metadata: {}\n", "x.yaml").unwrap_err().0;
        assert!(err.contains("no \"kind\""), "{err}");
        let err = parse(
            "apiVersion: v1\nkind: Pod\nspec: {containers: 3}\n",
            "t.yaml",
        )
        .unwrap_err()
        .0;
        assert!(err.starts_with("t.yaml#1: Pod: "), "{err}");
        assert!(
            parse(": : :\n  - [", "bad.yaml")
                .unwrap_err()
                .0
                .contains("not valid YAML")
        );
    }
}
