//! The parts of a container's CRI config that kuberuntime derives from the pod (`kuberuntime_container.go`
//! generateContainerConfig, `kuberuntime_container_linux.go` generateLinuxContainerConfig, `labels.go`,
//! `security_context.go`, `pkg/securitycontext/util.go`, `pkg/kubelet/qos`): labels, annotations, resources
//! with the QoS class's OOM score, and the security context (namespaces, user and groups, capabilities,
//! masked and read-only /proc paths, seccomp and AppArmor).

use std::collections::HashMap;
use std::path::Path;

use inlet_proto::runtime::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::sandbox_config::{namespaces_for_pod, seccomp_profile};

/// `securitycontext` defaultMaskedPaths and defaultReadonlyPaths (the runtime's own defaults since 1.31).
const MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];
/// `cm.MinShares`, `cm.SharesPerCPU`, `cm.QuotaPeriod`, `cm.MinQuotaPeriod`.
const MIN_SHARES: i64 = 2;
const SHARES_PER_CPU: i64 = 1024;
const QUOTA_PERIOD: i64 = 100_000;
const MIN_QUOTA: i64 = 1000;

/// `newContainerLabels`: what the kubelet finds a container (and its pod) by.
pub(super) fn container_labels(pod: &Pod, container: &Container) -> HashMap<String, String> {
    let meta = &pod.metadata;
    HashMap::from([
        (
            "io.kubernetes.container.name".into(),
            container.name.clone(),
        ),
        (
            "io.kubernetes.pod.name".into(),
            meta.name.clone().unwrap_or_default(),
        ),
        (
            "io.kubernetes.pod.namespace".into(),
            meta.namespace.clone().unwrap_or_default(),
        ),
        (
            "io.kubernetes.pod.uid".into(),
            meta.uid.clone().unwrap_or_default(),
        ),
    ])
}

/// `newContainerAnnotations`: what a kubelet needs to stop the container without its pod (after a
/// restart, `restoreSpecsFromContainerLabels`): the restart count, the termination message's path and
/// policy, the grace periods, the preStop hook and the ports.
pub(super) fn container_annotations(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
) -> HashMap<String, String> {
    let spec = pod.spec.as_ref();
    let mut annotations = HashMap::from([
        (
            "io.kubernetes.container.restartCount".to_string(),
            restart_count.to_string(),
        ),
        (
            "io.kubernetes.container.terminationMessagePath".to_string(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
        ),
        (
            "io.kubernetes.container.terminationMessagePolicy".to_string(),
            container
                .termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".into()),
        ),
    ]);
    if let Some(seconds) = pod.metadata.deletion_grace_period_seconds {
        annotations.insert(
            "io.kubernetes.pod.deletionGracePeriod".into(),
            seconds.to_string(),
        );
    }
    if let Some(seconds) = spec.and_then(|s| s.termination_grace_period_seconds) {
        annotations.insert(
            "io.kubernetes.pod.terminationGracePeriod".into(),
            seconds.to_string(),
        );
    }
    let pre_stop = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref());
    if let Some(json) = pre_stop.and_then(|h| serde_json::to_string(h).ok()) {
        annotations.insert("io.kubernetes.container.preStopHandler".into(), json);
    }
    if let Some(json) = container
        .ports
        .as_ref()
        .and_then(|p| serde_json::to_string(p).ok())
    {
        annotations.insert("io.kubernetes.container.ports".into(), json);
    }
    annotations
}

/// `generateLinuxContainerConfig`: resources and the security context.
pub(super) fn linux_config(
    pod: &Pod,
    container: &Container,
    root: &Path,
) -> cri::LinuxContainerConfig {
    let no_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&no_spec);
    cri::LinuxContainerConfig {
        resources: Some(resources(spec, container)),
        security_context: Some(security_context(spec, container, root)),
    }
}

/// A quantity of `resource` in the container's requests or limits: CPU in millicores, memory in bytes.
fn quantity(container: &Container, limits: bool, resource: &str) -> Option<i64> {
    let resources = container.resources.as_ref()?;
    let map = match limits {
        true => resources.limits.as_ref()?,
        false => resources.requests.as_ref()?,
    };
    let text = &map.get(resource)?.0;
    match resource {
        "cpu" => match text.strip_suffix('m') {
            Some(milli) => milli.parse().ok(),
            None => text
                .parse::<f64>()
                .ok()
                .map(|cores| (cores * 1000.0).ceil() as i64),
        },
        _ => inlet_host::quantity::parse_bytes(text)
            .ok()
            .and_then(|b| i64::try_from(b).ok()),
    }
}

/// `calculateLinuxResources` with the QoS class's `oom_score_adj` (`GetContainerOOMScoreAdjust`): CPU
/// shares from the request (the limit when no request), a CFS quota from the CPU limit, the memory limit.
fn resources(spec: &PodSpec, container: &Container) -> cri::LinuxContainerResources {
    let cpu_limit = quantity(container, true, "cpu");
    let cpu_request = quantity(container, false, "cpu").or(cpu_limit);
    let memory_limit = quantity(container, true, "memory");
    // `MilliCPUToQuota`: none for 0, at least 1 ms; saturating, whatever the pod asks.
    let cpu_quota = cpu_limit
        .filter(|milli| *milli > 0)
        .map(|milli| (milli.saturating_mul(QUOTA_PERIOD) / 1000).max(MIN_QUOTA));
    cri::LinuxContainerResources {
        cpu_shares: cpu_request
            .map(|milli| (milli.saturating_mul(SHARES_PER_CPU) / 1000).max(MIN_SHARES))
            .unwrap_or(MIN_SHARES),
        cpu_quota: cpu_quota.unwrap_or(0),
        cpu_period: if cpu_quota.is_some() { QUOTA_PERIOD } else { 0 },
        memory_limit_in_bytes: memory_limit.unwrap_or(0),
        oom_score_adj: oom_score_adj(spec, container),
        ..Default::default()
    }
}

/// `GetPodQOS` and `GetContainerOOMScoreAdjust`: BestEffort 1000, Guaranteed -997, Burstable between 2
/// and 999 (1000 less the share of the node's memory the container requests; a simulated node counts
/// as 64 GiB).
fn oom_score_adj(spec: &PodSpec, container: &Container) -> i64 {
    const NODE_MEMORY: i64 = 64 << 30;
    let all: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let requests_anything = all.iter().any(|c| {
        ["cpu", "memory"].iter().any(|r| {
            quantity(c, false, r).is_some_and(|q| q > 0)
                || quantity(c, true, r).is_some_and(|q| q > 0)
        })
    });
    if !requests_anything {
        return 1000;
    }
    let guaranteed = all.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| {
            let limit = quantity(c, true, r);
            limit.is_some() && quantity(c, false, r).or(limit) == limit
        })
    });
    if guaranteed {
        return -997;
    }
    let request = quantity(container, false, "memory").unwrap_or(0);
    let adjust = 1000 - request.saturating_mul(1000) / NODE_MEMORY;
    adjust.clamp(2, 999)
}

/// `determineEffectiveSecurityContext` and `convertToRuntimeSecurityContext`: the container's settings
/// over the pod's, the pod's namespaces and supplemental groups (fsGroup among them), no_new_privs when
/// privilege escalation is refused, the default masked and read-only paths unless `procMount: Unmasked`,
/// the seccomp profile (Unconfined unless one is named) and the AppArmor profile when one is named.
fn security_context(
    spec: &PodSpec,
    container: &Container,
    root: &Path,
) -> cri::LinuxContainerSecurityContext {
    let pod = spec.security_context.as_ref();
    let own = container.security_context.as_ref();
    let run_as_user = own
        .and_then(|s| s.run_as_user)
        .or(pod.and_then(|p| p.run_as_user));
    let run_as_group = own
        .and_then(|s| s.run_as_group)
        .or(pod.and_then(|p| p.run_as_group));
    let mut groups: Vec<i64> = pod.and_then(|p| p.fs_group).into_iter().collect();
    groups.extend(
        pod.and_then(|p| p.supplemental_groups.clone())
            .unwrap_or_default(),
    );
    let unmasked = own.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked");
    let paths = |list: &[&str]| match unmasked {
        true => Vec::new(),
        false => list.iter().map(|p| p.to_string()).collect(),
    };
    let capabilities = own
        .and_then(|s| s.capabilities.as_ref())
        .map(|c| cri::Capability {
            add_capabilities: c.add.clone().unwrap_or_default(),
            drop_capabilities: c.drop.clone().unwrap_or_default(),
            ..Default::default()
        });
    let seccomp = own
        .and_then(|s| s.seccomp_profile.as_ref())
        .or(pod.and_then(|p| p.seccomp_profile.as_ref()));
    let apparmor = own
        .and_then(|s| s.app_armor_profile.as_ref())
        .or(pod.and_then(|p| p.app_armor_profile.as_ref()))
        .map(|p| {
            use cri::security_profile::ProfileType;
            let profile_type = match p.type_.as_str() {
                "RuntimeDefault" => ProfileType::RuntimeDefault,
                "Localhost" => ProfileType::Localhost,
                _ => ProfileType::Unconfined,
            };
            cri::SecurityProfile {
                profile_type: profile_type as i32,
                localhost_ref: p.localhost_profile.clone().unwrap_or_default(),
            }
        });
    cri::LinuxContainerSecurityContext {
        capabilities,
        privileged: own.and_then(|s| s.privileged).unwrap_or(false),
        namespace_options: Some(namespaces_for_pod(spec)),
        run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: own
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        supplemental_groups: groups,
        no_new_privs: own.and_then(|s| s.allow_privilege_escalation) == Some(false),
        masked_paths: paths(&MASKED_PATHS),
        readonly_paths: paths(&READONLY_PATHS),
        seccomp: Some(seccomp_profile(seccomp, root)),
        apparmor,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn with_limits(cpu: &str, memory: &str) -> Container {
        let limits = [("cpu", cpu), ("memory", memory)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.into())))
            .collect();
        Container {
            resources: Some(ResourceRequirements {
                limits: Some(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn resources_follow_the_qos_class() {
        let best_effort = PodSpec {
            containers: vec![Container::default()],
            ..Default::default()
        };
        let r = resources(&best_effort, &best_effort.containers[0]);
        assert_eq!((r.cpu_shares, r.oom_score_adj, r.cpu_quota), (2, 1000, 0));
        let guaranteed = PodSpec {
            containers: vec![with_limits("500m", "64Mi")],
            ..Default::default()
        };
        let r = resources(&guaranteed, &guaranteed.containers[0]);
        assert_eq!(r.cpu_shares, 512);
        assert_eq!((r.cpu_quota, r.cpu_period), (50_000, 100_000));
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
        assert_eq!(r.oom_score_adj, -997);
    }

    #[test]
    fn a_container_has_the_default_masked_paths_and_the_pods_namespaces() {
        let spec = PodSpec::default();
        let sc = security_context(&spec, &Container::default(), Path::new("/k"));
        assert_eq!(sc.masked_paths.len(), MASKED_PATHS.len());
        assert_eq!(sc.readonly_paths, READONLY_PATHS);
        assert_eq!(
            sc.namespace_options.map(|n| n.pid),
            Some(cri::NamespaceMode::Container as i32)
        );
        assert!(!sc.no_new_privs);
    }
}
