//! The downward API's values: pod fields (`pkg/fieldpath/fieldpath.go` `ExtractFieldPathAsString`,
//! `FormatMap`) and container resources (`pkg/api/v1/resource/helpers.go`
//! `ExtractResourceValueByContainerNameAndNodeAllocatable`, `ExtractContainerResourceValue`), shared by
//! `downwardAPI` and `projected` volumes and by the kubelet's environment variables.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceFieldSelector, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use inlet_host::quantity::{parse_bytes, parse_milli};

/// `ExtractFieldPathAsString`: the metadata fields a downward API volume may name, labels and annotations
/// whole (as [`format_map`]) or by key (`metadata.labels['app']`).
pub fn extract_field_path_as_string(meta: &ObjectMeta, path: &str) -> Result<String, String> {
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    if let Some((base, key)) = split_subscripted_path(path) {
        return match base {
            "metadata.annotations" => Ok(annotations.get(key).cloned().unwrap_or_default()),
            "metadata.labels" => Ok(labels.get(key).cloned().unwrap_or_default()),
            _ => Err(format!("fieldPath {path:?} does not support subscript")),
        };
    }
    match path {
        "metadata.annotations" => Ok(format_map(annotations)),
        "metadata.labels" => Ok(format_map(labels)),
        "metadata.name" => Ok(meta.name.clone().unwrap_or_default()),
        "metadata.namespace" => Ok(meta.namespace.clone().unwrap_or_default()),
        "metadata.uid" => Ok(meta.uid.clone().unwrap_or_default()),
        _ => Err(format!("unsupported fieldPath: {path}")),
    }
}

/// `SplitMaybeSubscriptedPath`: `metadata.labels['app']` is `("metadata.labels", "app")`.
fn split_subscripted_path(path: &str) -> Option<(&str, &str)> {
    let (base, key) = path.strip_suffix("']")?.split_once("['")?;
    (!base.is_empty()).then_some((base, key))
}

/// `FormatMap`: one `key="value"` line a key, sorted, the value quoted as Go's `%q` quotes it.
pub fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(key, value)| format!("{key}={}", go_quote(value)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Go's `strconv.Quote`: printable characters as they are, `"` and `\` escaped, the rest as escapes.
fn go_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What the node can give a container, for limits a container leaves unset (`MergeContainerResourceLimits`:
/// the node's allocatable stands in for them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeAllocatable {
    /// CPU, in thousandths of a core.
    pub cpu_millis: Option<u64>,
    /// Memory, in bytes.
    pub memory: Option<u64>,
}

/// `ExtractResourceValueByContainerNameAndNodeAllocatable`: `selector.resource` of the container named
/// `container` (one of `containers`: name and resources), divided by the selector's divisor (1 when unset)
/// and rounded up, as a decimal string. The node's allocatable ephemeral storage is not known here: an
/// unset `limits.ephemeral-storage` reads 0.
pub fn container_resource_value(
    selector: &ResourceFieldSelector,
    containers: &[(String, Option<ResourceRequirements>)],
    container: &str,
    allocatable: &NodeAllocatable,
) -> Result<String, String> {
    let resources = containers
        .iter()
        .find(|(n, _)| n == container)
        .map(|(_, r)| r.clone().unwrap_or_default())
        .ok_or_else(|| format!("container {container} not found"))?;
    // A zero limit counts as unset (`MergeContainerResourceLimits`).
    let from = |map: &Option<BTreeMap<String, Quantity>>, key: &str| {
        let quantity = map.as_ref().and_then(|m| m.get(key))?;
        (parse_milli(&quantity.0) != Ok(0)).then(|| quantity.0.clone())
    };
    let (kind, which) = selector
        .resource
        .split_once('.')
        .ok_or_else(|| unsupported(&selector.resource))?;
    let stated = match kind {
        "limits" => from(&resources.limits, which),
        "requests" => from(&resources.requests, which),
        _ => return Err(unsupported(&selector.resource)),
    };
    let divisor = selector.divisor.as_ref().map(|q| q.0.as_str());
    let divisor = divisor.filter(|d| !d.is_empty() && parse_milli(d) != Ok(0));
    let bad = |e: String| format!("{}: {e}", selector.resource);
    match which {
        "cpu" => {
            let value = match (stated, kind) {
                (Some(q), _) => parse_milli(&q).map_err(bad)?,
                (None, "limits") => allocatable.cpu_millis.unwrap_or(0),
                (None, _) => 0,
            };
            let divisor = divisor.map_or(Ok(1000), parse_milli).map_err(bad)?;
            Ok(value.div_ceil(divisor.max(1)).to_string())
        }
        "memory" | "ephemeral-storage" => {
            let value = match (stated, kind, which) {
                (Some(q), _, _) => parse_bytes(&q).map_err(bad)?,
                (None, "limits", "memory") => allocatable.memory.unwrap_or(0),
                _ => 0,
            };
            let divisor = divisor.map_or(Ok(1), parse_bytes).map_err(bad)?;
            Ok(value.div_ceil(divisor.max(1)).to_string())
        }
        hugepages if hugepages.starts_with("hugepages-") => {
            let value = match stated {
                Some(q) => parse_bytes(&q).map_err(bad)?,
                None => 0,
            };
            let divisor = divisor.map_or(Ok(1), parse_bytes).map_err(bad)?;
            Ok(value.div_ceil(divisor.max(1)).to_string())
        }
        _ => Err(unsupported(&selector.resource)),
    }
}

fn unsupported(resource: &str) -> String {
    format!("unsupported container resource : {resource}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ObjectMeta {
        ObjectMeta {
            name: Some("web".into()),
            namespace: Some("apps".into()),
            uid: Some("u-1".into()),
            labels: Some(BTreeMap::from([
                ("tier".into(), "front \"end\"".into()),
                ("app".into(), "web".into()),
            ])),
            ..Default::default()
        }
    }

    #[test]
    fn fields_and_maps_read_as_upstream_formats_them() {
        let meta = meta();
        let field = |path| extract_field_path_as_string(&meta, path);
        assert_eq!(
            field("metadata.labels").unwrap(),
            "app=\"web\"\ntier=\"front \\\"end\\\"\""
        );
        assert_eq!(field("metadata.labels['app']").unwrap(), "web");
        assert_eq!(field("metadata.annotations").unwrap(), "");
        assert_eq!(field("metadata.namespace").unwrap(), "apps");
        assert_eq!(
            field("spec.nodeName").unwrap_err(),
            "unsupported fieldPath: spec.nodeName"
        );
        assert_eq!(
            field("metadata.name['x']").unwrap_err(),
            "fieldPath \"metadata.name['x']\" does not support subscript"
        );
    }

    #[test]
    fn resources_divide_and_round_up_with_the_node_for_unset_limits() {
        let resources = ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity("250m".into())),
                ("memory".into(), Quantity("64Mi".into())),
            ])),
            ..Default::default()
        };
        let containers = vec![("app".to_string(), Some(resources))];
        let node = NodeAllocatable {
            cpu_millis: Some(8000),
            memory: Some(32 << 30),
        };
        let value = |resource: &str, divisor: Option<&str>| {
            let selector = ResourceFieldSelector {
                resource: resource.into(),
                divisor: divisor.map(|d| Quantity(d.into())),
                container_name: None,
            };
            container_resource_value(&selector, &containers, "app", &node)
        };
        assert_eq!(value("requests.cpu", None).unwrap(), "1");
        assert_eq!(value("requests.cpu", Some("1m")).unwrap(), "250");
        assert_eq!(value("requests.memory", Some("1Mi")).unwrap(), "64");
        assert_eq!(value("limits.cpu", None).unwrap(), "8");
        assert_eq!(value("limits.memory", Some("1Gi")).unwrap(), "32");
        assert_eq!(
            value("limits.gpu", None).unwrap_err(),
            "unsupported container resource : limits.gpu"
        );
        let selector = ResourceFieldSelector {
            resource: "limits.cpu".into(),
            ..Default::default()
        };
        assert_eq!(
            container_resource_value(&selector, &containers, "db", &node).unwrap_err(),
            "container db not found"
        );
    }
}
