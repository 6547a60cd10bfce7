//! The pod sandbox's config as kuberuntime builds it (`kuberuntime_sandbox.go` generatePodSandboxConfig,
//! `kuberuntime_sandbox_linux.go`, `helpers.go` namespacesForPod, `network/dns/dns.go`): metadata, the
//! pod's labels and annotations, hostname, DNS, port mappings, the log directory, and the Linux security
//! context with the namespaces the pod asks for. The container config reuses the namespaces.

use std::collections::HashMap;
use std::path::Path;

use inlet_proto::runtime::v1 as cri;
use k8s_openapi::api::core::v1::{Pod, PodSpec};

use super::Kubelet;

/// The node's `clusterDNS` and `clusterDomain` (kubeadm's defaults): a simulated node stands for one
/// whose cluster has a DNS service.
const CLUSTER_DNS: &str = "10.96.0.10";
const CLUSTER_DOMAIN: &str = "cluster.local";
/// `ndots:5`, the option ClusterFirst pods get.
const CLUSTER_DNS_OPTIONS: &str = "ndots:5";
/// `validation.DNS1123LabelMaxLength`: a hostname longer than this is truncated.
const HOSTNAME_MAX: usize = 63;

impl Kubelet {
    /// `generatePodSandboxConfig`.
    pub(super) fn sandbox_config(&self, pod: &Pod) -> cri::PodSandboxConfig {
        let meta = &pod.metadata;
        let (name, namespace, uid) = (
            meta.name.clone().unwrap_or_default(),
            meta.namespace.clone().unwrap_or_default(),
            meta.uid.clone().unwrap_or_default(),
        );
        let log_directory = self.pod_log_dir(pod);
        let _ = std::fs::create_dir_all(&log_directory);
        let no_spec = PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&no_spec);
        let host_network = spec.host_network.unwrap_or(false);
        // `newPodLabels`: the pod's labels and the three the kubelet finds its sandboxes by.
        let mut labels: HashMap<String, String> = meta
            .labels
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        labels.extend([
            ("io.kubernetes.pod.name".to_string(), name.clone()),
            ("io.kubernetes.pod.namespace".to_string(), namespace.clone()),
            ("io.kubernetes.pod.uid".to_string(), uid.clone()),
        ]);
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.clone(),
                uid,
                namespace: namespace.clone(),
                attempt: 0,
            }),
            // Host-network pods keep the node's hostname: runc refuses one without a private UTS
            // namespace.
            hostname: if host_network {
                String::new()
            } else {
                hostname(&name, &namespace, spec)
            },
            log_directory: log_directory.display().to_string(),
            dns_config: dns_config(spec, &namespace),
            port_mappings: port_mappings(spec),
            labels,
            annotations: meta
                .annotations
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            linux: Some(cri::LinuxPodSandboxConfig {
                security_context: Some(sandbox_security_context(spec, &self.config.root)),
                sysctls: spec
                    .security_context
                    .iter()
                    .flat_map(|s| s.sysctls.iter().flatten())
                    .map(|s| (s.name.clone(), s.value.clone()))
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// `namespacesForPod`: the node's network, PID or IPC namespace for `hostNetwork`, `hostPID`, `hostIPC`;
/// else the pod's network and IPC, and each container its own PID namespace unless the pod shares one
/// (`shareProcessNamespace`). A pod-wide PID namespace makes some runtimes (CRI-O) keep an infra process.
pub(super) fn namespaces_for_pod(spec: &PodSpec) -> cri::NamespaceOption {
    let node_or = |host: Option<bool>, otherwise: cri::NamespaceMode| match host.unwrap_or(false) {
        true => cri::NamespaceMode::Node as i32,
        false => otherwise as i32,
    };
    let pid = match spec.share_process_namespace.unwrap_or(false) {
        true => cri::NamespaceMode::Pod,
        false => cri::NamespaceMode::Container,
    };
    cri::NamespaceOption {
        network: node_or(spec.host_network, cri::NamespaceMode::Pod),
        pid: node_or(spec.host_pid, pid),
        ipc: node_or(spec.host_ipc, cri::NamespaceMode::Pod),
        ..Default::default()
    }
}

/// `GeneratePodHostNameAndDomain`: `spec.hostname`, else the pod's name, at most 63 characters without a
/// trailing `-` or `.`; with `setHostnameAsFQDN` and a subdomain, the fully qualified name.
fn hostname(name: &str, namespace: &str, spec: &PodSpec) -> String {
    let mut host = spec
        .hostname
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| name.to_string());
    if host.len() > HOSTNAME_MAX {
        host.truncate(HOSTNAME_MAX);
        host = host.trim_end_matches(['-', '.']).to_string();
    }
    match spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
        Some(subdomain) if spec.set_hostname_as_fqdn == Some(true) => {
            format!("{host}.{subdomain}.{namespace}.svc.{CLUSTER_DOMAIN}")
        }
        _ => host,
    }
}

/// `GetPodDNS`: ClusterFirst pods (and ClusterFirstWithHostNet ones on the host's network) use the
/// cluster's DNS with its search path and `ndots:5`; `Default` and ClusterFirst on the host's network
/// leave the runtime the node's resolver (an empty config); `None` only what `dnsConfig` says, which is
/// merged into the others (`appendDNSConfig`).
fn dns_config(spec: &PodSpec, namespace: &str) -> Option<cri::DnsConfig> {
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let host_network = spec.host_network.unwrap_or(false);
    let cluster = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network,
        _ => false,
    };
    let mut config = match cluster {
        true => cri::DnsConfig {
            servers: vec![CLUSTER_DNS.into()],
            searches: vec![
                format!("{namespace}.svc.{CLUSTER_DOMAIN}"),
                format!("svc.{CLUSTER_DOMAIN}"),
                CLUSTER_DOMAIN.into(),
            ],
            options: vec![CLUSTER_DNS_OPTIONS.into()],
        },
        false => cri::DnsConfig::default(),
    };
    if let Some(extra) = &spec.dns_config {
        config
            .servers
            .extend(extra.nameservers.iter().flatten().cloned());
        for search in extra.searches.iter().flatten() {
            if !config.searches.contains(search) {
                config.searches.push(search.clone());
            }
        }
        for option in extra.options.iter().flatten() {
            let name = option.name.clone().unwrap_or_default();
            let text = match &option.value {
                Some(value) => format!("{name}:{value}"),
                None => name.clone(),
            };
            // A pod's option replaces the default of the same name (`mergeDNSOptions`).
            config
                .options
                .retain(|o| o.split(':').next() != Some(name.as_str()));
            config.options.push(text);
        }
    }
    let empty =
        config.servers.is_empty() && config.searches.is_empty() && config.options.is_empty();
    (!empty || policy == "None").then_some(config)
}

/// Every container port as a port mapping (`MakePortMappings`), with its host port when it has one.
fn port_mappings(spec: &PodSpec) -> Vec<cri::PortMapping> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| cri::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => cri::Protocol::Udp as i32,
                Some("SCTP") => cri::Protocol::Sctp as i32,
                _ => cri::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// `determinePodSandboxSecurityContext` (`kuberuntime_sandbox_linux.go`): the namespaces, the pod's
/// user, group and supplemental groups (fsGroup among them), privileged when any container is, and the
/// pod's seccomp profile (Unconfined unless it names one).
fn sandbox_security_context(spec: &PodSpec, root: &Path) -> cri::LinuxSandboxSecurityContext {
    let pod = spec.security_context.as_ref();
    let mut groups: Vec<i64> = pod
        .and_then(|p| p.supplemental_groups.clone())
        .unwrap_or_default();
    groups.extend(pod.and_then(|p| p.fs_group));
    let privileged = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    cri::LinuxSandboxSecurityContext {
        namespace_options: Some(namespaces_for_pod(spec)),
        run_as_user: pod
            .and_then(|p| p.run_as_user)
            .map(|value| cri::Int64Value { value }),
        run_as_group: pod
            .and_then(|p| p.run_as_group)
            .map(|value| cri::Int64Value { value }),
        supplemental_groups: groups,
        privileged,
        seccomp: Some(seccomp_profile(
            pod.and_then(|p| p.seccomp_profile.as_ref()),
            root,
        )),
        ..Default::default()
    }
}

/// A seccomp profile as the CRI takes it (`getSeccompProfile`): RuntimeDefault, Localhost (a file below
/// the kubelet's `<root>/seccomp`, `fieldSeccompProfile`), or Unconfined (also for none: the kubelet's
/// `seccompDefault` is off by default).
pub(super) fn seccomp_profile(
    profile: Option<&k8s_openapi::api::core::v1::SeccompProfile>,
    root: &Path,
) -> cri::SecurityProfile {
    use cri::security_profile::ProfileType;
    let (profile_type, localhost_ref) = match profile.map(|p| p.type_.as_str()) {
        Some("RuntimeDefault") => (ProfileType::RuntimeDefault, String::new()),
        Some("Localhost") => (
            ProfileType::Localhost,
            profile
                .and_then(|p| p.localhost_profile.as_deref())
                .map(|name| root.join("seccomp").join(name).display().to_string())
                .unwrap_or_default(),
        ),
        _ => (ProfileType::Unconfined, String::new()),
    };
    cri::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_container_has_its_own_pid_namespace_unless_the_pod_shares_one() {
        let mut spec = PodSpec::default();
        let pid = |spec: &PodSpec| namespaces_for_pod(spec).pid;
        assert_eq!(pid(&spec), cri::NamespaceMode::Container as i32);
        spec.share_process_namespace = Some(true);
        assert_eq!(pid(&spec), cri::NamespaceMode::Pod as i32);
        spec.host_pid = Some(true);
        assert_eq!(pid(&spec), cri::NamespaceMode::Node as i32);
        let options = namespaces_for_pod(&PodSpec::default());
        assert_eq!(
            (options.network, options.ipc),
            (
                cri::NamespaceMode::Pod as i32,
                cri::NamespaceMode::Pod as i32
            )
        );
    }

    #[test]
    fn cluster_first_pods_get_the_cluster_dns_and_dns_config_merges_in() {
        let mut spec = PodSpec::default();
        let config = dns_config(&spec, "team").expect("a config");
        assert_eq!(config.servers, [CLUSTER_DNS]);
        assert_eq!(config.searches[0], "team.svc.cluster.local");
        assert_eq!(config.options, ["ndots:5"]);
        spec.host_network = Some(true);
        assert_eq!(dns_config(&spec, "team"), None, "the node's resolver");
        spec.host_network = None;
        spec.dns_config = Some(k8s_openapi::api::core::v1::PodDNSConfig {
            options: Some(vec![k8s_openapi::api::core::v1::PodDNSConfigOption {
                name: Some("ndots".into()),
                value: Some("2".into()),
            }]),
            ..Default::default()
        });
        assert_eq!(dns_config(&spec, "team").unwrap().options, ["ndots:2"]);
    }

    #[test]
    fn a_long_pod_name_is_truncated_to_a_hostname() {
        let name = format!("{}-x", "a".repeat(62));
        assert_eq!(hostname(&name, "ns", &PodSpec::default()), "a".repeat(62));
    }
}
