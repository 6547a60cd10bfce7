//! A container's environment as the kubelet makes it (`kubelet_pods.go` makeEnvironmentVariables): every
//! `envFrom` source (a ConfigMap's or Secret's keys, with the source's prefix), then each `env` entry in
//! order, a literal value expanded against the variables before it, a `valueFrom` read from a Secret or
//! ConfigMap of the pod's namespace, a field of the pod, or a resource of the container. Command, args and
//! `subPathExpr` are expanded against the result (`ExpandContainerCommandAndArgs`,
//! `ExpandContainerVolumeMounts`) with `$(VAR)` syntax (`third_party/forked/golang/expansion`): `$$` is a
//! `$`, an unknown variable stays as written, and nothing expands twice, so references cannot loop.
//!
//! A missing object or key fails the container's creation with upstream's text (CreateContainerConfigError),
//! unless the reference is `optional`. Service links are not made: the simulated cluster has no Services.

use std::collections::BTreeMap;

use inlet_volume::container_resources;
use inlet_volume::fieldpath::{
    NodeAllocatable, container_resource_value, extract_field_path_as_string,
};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVarSource, ObjectFieldSelector, Pod, ResourceFieldSelector, Secret,
};

use super::Kubelet;

/// A container's environment variables, in the order they are given to the runtime.
pub type Env = Vec<(String, String)>;

impl Kubelet {
    /// `makeEnvironmentVariables` for `container` of `pod`.
    pub(super) fn environment(&self, pod: &Pod, container: &Container) -> Result<Env, String> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let mut env: Env = Vec::new();
        for source in container.env_from.iter().flatten() {
            let prefix = source.prefix.clone().unwrap_or_default();
            let data: BTreeMap<String, String> = if let Some(r) = &source.config_map_ref {
                match self.config_map(&namespace, &r.name) {
                    Some(cm) => cm.data.clone().unwrap_or_default(),
                    None if r.optional == Some(true) => continue,
                    None => return Err(format!("configmap {:?} not found", r.name)),
                }
            } else if let Some(r) = &source.secret_ref {
                match self.secret(&namespace, &r.name) {
                    Some(s) => secret_strings(&s),
                    None if r.optional == Some(true) => continue,
                    None => return Err(format!("secret {:?} not found", r.name)),
                }
            } else {
                continue;
            };
            for (key, value) in data {
                set(&mut env, format!("{prefix}{key}"), value);
            }
        }
        for var in container.env.iter().flatten() {
            let value = match &var.value_from {
                None => {
                    let known: BTreeMap<&str, &str> =
                        env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    expand(var.value.as_deref().unwrap_or_default(), |name| {
                        known.get(name).map(|v| v.to_string())
                    })
                }
                Some(from) => match self.value_from(pod, container, from)? {
                    Some(value) => value,
                    // An optional reference to what is not there sets nothing.
                    None => continue,
                },
            };
            set(&mut env, var.name.clone(), value);
        }
        Ok(env)
    }

    /// One `valueFrom`: a Secret's or ConfigMap's key, a pod field, or a container resource; None when an
    /// optional reference finds nothing.
    fn value_from(
        &self,
        pod: &Pod,
        container: &Container,
        from: &EnvVarSource,
    ) -> Result<Option<String>, String> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let (kind, name, key, optional, data) = if let Some(r) = &from.secret_key_ref {
            let data = self.secret(&namespace, &r.name).map(|s| secret_strings(&s));
            ("Secret", &r.name, &r.key, r.optional, data)
        } else if let Some(r) = &from.config_map_key_ref {
            let data = self.config_map(&namespace, &r.name);
            let data = data.map(|c| c.data.clone().unwrap_or_default());
            ("ConfigMap", &r.name, &r.key, r.optional, data)
        } else if let Some(field) = &from.field_ref {
            // The sandbox's IP, known before the status that reports it is written.
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            let sandbox_ip = self.pods.lock().get(uid).and_then(|rt| rt.pod_ip.clone());
            let pod_ip = sandbox_ip.or_else(|| pod.status.as_ref()?.pod_ip.clone());
            return pod_field(pod, field, pod_ip).map(Some);
        } else if let Some(resource) = &from.resource_field_ref {
            return container_resource(pod, container, resource, &super::host::allocatable())
                .map(Some);
        } else {
            return Ok(None);
        };
        let optional = optional == Some(true);
        match data.map(|mut d| d.remove(key)) {
            Some(Some(value)) => Ok(Some(value)),
            None | Some(None) if optional => Ok(None),
            None => Err(format!("{} {name:?} not found", kind.to_lowercase())),
            Some(None) => Err(format!(
                "couldn't find key {key} in {kind} {namespace}/{name}"
            )),
        }
    }

    /// A Secret of the pod's namespace (read for the report, as the kubelet's secret manager reads it).
    fn secret(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Secret>> {
        self.api.get_recorded::<Secret>(namespace, name)
    }

    fn config_map(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<ConfigMap>> {
        self.api.get_recorded::<ConfigMap>(namespace, name)
    }
}

/// Sets `key`, where it was if it was already set (a later source or entry wins).
fn set(env: &mut Env, key: String, value: String) {
    match env.iter_mut().find(|(k, _)| *k == key) {
        Some(entry) => entry.1 = value,
        None => env.push((key, value)),
    }
}

/// A Secret's data as strings (`string(bytes)`, as the kubelet converts it).
fn secret_strings(secret: &Secret) -> BTreeMap<String, String> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect()
}

/// `podFieldSelectorRuntimeValue`: the pod fields the downward API may name.
fn pod_field(
    pod: &Pod,
    field: &ObjectFieldSelector,
    pod_ip: Option<String>,
) -> Result<String, String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let path = field.field_path.as_str();
    let value = match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.hostIP" | "status.hostIPs" => Some("127.0.0.1".into()),
        "status.podIP" | "status.podIPs" => pod_ip,
        // The metadata fields, labels and annotations (`ExtractFieldPathAsString`).
        _ => return extract_field_path_as_string(meta, path),
    };
    Ok(value.unwrap_or_default())
}

/// `containerResourceRuntimeValue`: the container's request or limit, a limit it leaves unset being the
/// node's allocatable.
fn container_resource(
    pod: &Pod,
    container: &Container,
    selector: &ResourceFieldSelector,
    allocatable: &NodeAllocatable,
) -> Result<String, String> {
    // The named container's, when the selector names one.
    let name = selector
        .container_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(&container.name);
    container_resource_value(selector, &container_resources(pod), name, allocatable)
}

/// `expansion.Expand`: `$(NAME)` replaced by `mapping(NAME)` when known, else kept as written; `$$` is `$`;
/// any other `$` stays.
pub fn expand(input: &str, mapping: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match mapping(name) {
                        Some(value) => out.push_str(&value),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &body[end + 1..];
                }
                // An incomplete reference is kept as it is.
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// `ExpandContainerCommandAndArgs`: each word of command and args expanded against `env`.
pub fn expand_words(words: &[String], env: &Env) -> Vec<String> {
    words
        .iter()
        .map(|w| expand(w, |name| lookup(env, name)))
        .collect()
}

/// `ExpandContainerVolumeMounts`: a `subPathExpr` expanded against `env`; a variable that is unknown or empty
/// is an error naming every such variable.
pub fn expand_sub_path(expr: &str, env: &Env) -> Result<String, String> {
    let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let expanded = expand(expr, |name| match lookup(env, name) {
        Some(v) if !v.is_empty() => Some(v),
        _ => {
            missing.borrow_mut().insert(name.to_string());
            Some(String::new())
        }
    });
    let missing = missing.into_inner();
    if !missing.is_empty() {
        let names: Vec<String> = missing.into_iter().collect();
        return Err(format!("missing value for {}", names.join(", ")));
    }
    Ok(expanded)
}

fn lookup(env: &Env, name: &str) -> Option<String> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn expansion_follows_the_forked_go_package() {
        let e = env(&[("A", "1"), ("B", "$(A)")]);
        let x = |s: &str| expand(s, |n| lookup(&e, n));
        assert_eq!(x("$(A)-$(B)"), "1-$(A)", "a value is never expanded twice");
        assert_eq!(x("$$(A)"), "$(A)");
        assert_eq!(x("$(UNKNOWN) $A $"), "$(UNKNOWN) $A $");
        assert_eq!(x("$(A"), "$(A");
        assert_eq!(x("$()"), "$()");
    }

    #[test]
    fn a_sub_path_expr_needs_every_variable() {
        let e = env(&[("POD", "web-1"), ("EMPTY", "")]);
        assert_eq!(expand_sub_path("logs/$(POD)", &e).unwrap(), "logs/web-1");
        assert_eq!(
            expand_sub_path("$(EMPTY)/$(NOPE)", &e).unwrap_err(),
            "missing value for EMPTY, NOPE"
        );
    }
}
