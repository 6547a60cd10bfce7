//! SELinux mount labels (KEP-1710), as `pkg/volume/util/selinux.go` and the volume manager's desired state
//! compute them: which label a volume is mounted with (`-o context=`) for a pod, so the container runtime
//! need not relabel every file in it.
//!
//! In 1.35 a label is only ever given to a PV's volume: `VolumeSupportsSELinuxMount` needs a
//! PersistentVolume (so a CSI inline volume is never mounted with a context, whatever its CSIDriver says),
//! and, unless the `SELinuxMount` gate is on (beta, off by default), one whose only access mode is
//! ReadWriteOncePod.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Pod, SELinuxOptions};

use crate::Spec;

/// Gate: mount ReadWriteOncePod volumes with the pod's label (beta, on by default since 1.28).
pub const SELINUX_MOUNT_READ_WRITE_ONCE_POD: &str = "SELinuxMountReadWriteOncePod";
/// Gate: the pod's `securityContext.seLinuxChangePolicy` (beta, on by default since 1.33).
pub const SELINUX_CHANGE_POLICY: &str = "SELinuxChangePolicy";
/// Gate: mount every PV's volume with the pod's label, whatever its access modes (beta, off by default).
pub const SELINUX_MOUNT: &str = "SELinuxMount";

/// The file label a container process with `opts` gets on its files, as go-selinux's `InitLabels` makes
/// it for the kubelet's translator (`SELinuxOptionsToFileLabel`): options with nothing set give none; the
/// user is the given one (default `system_u`), the role always `object_r` and the type always the
/// container file type, `container_file_t` (a process type such as `spc_t` changes only the process's
/// label); a level left empty is a fresh random one (`s0:cN,cM`), as InitLabels allocates.
pub fn file_label(opts: &SELinuxOptions) -> String {
    let set = |v: &Option<String>| v.as_deref().filter(|v| !v.is_empty()).map(str::to_string);
    let (user, role, type_, level) = (
        set(&opts.user),
        set(&opts.role),
        set(&opts.type_),
        set(&opts.level),
    );
    if user.is_none() && role.is_none() && type_.is_none() && level.is_none() {
        return String::new();
    }
    let user = user.unwrap_or_else(|| "system_u".into());
    let level = level.unwrap_or_else(random_level);
    format!("{user}:object_r:container_file_t:{level}")
}

/// A random MCS level of two distinct categories of 1024, as go-selinux allocates one.
fn random_level() -> String {
    use std::hash::BuildHasher;
    let bits = std::collections::hash_map::RandomState::new().hash_one(0u8);
    let a = bits % 1024;
    let b = (a + 1 + (bits >> 10) % 1023) % 1024;
    format!("s0:c{},c{}", a.min(b), a.max(b))
}

/// A label that cannot go into a mount option as one quoted value (a `"`, a `\` or a control character
/// would let a pod's `seLinuxOptions.level` add mount options of its own).
fn checked(label: String) -> Result<String, String> {
    match label
        .chars()
        .any(|c| c == '"' || c == '\\' || c.is_control())
    {
        true => Err(format!(
            "failed to construct SELinux label: {label:?} is not a valid label"
        )),
        false => Ok(label),
    }
}

/// The mount option for `label` (`AddSELinuxMountOption`): quoted, since a label's level may hold a comma.
pub fn mount_option(label: &str) -> String {
    format!("context=\"{label}\"")
}

/// True when the volume may be mounted with a label at all (`VolumeSupportsSELinuxMount`).
pub fn volume_supports_selinux_mount(spec: &Spec, gate: impl Fn(&str) -> bool) -> bool {
    if !gate(SELINUX_MOUNT_READ_WRITE_ONCE_POD) {
        return false;
    }
    let Spec::Persistent { pv, .. } = spec else {
        return false;
    };
    if gate(SELINUX_MOUNT) {
        return true;
    }
    let modes = pv.spec.as_ref().and_then(|s| s.access_modes.as_deref());
    modes == Some(&["ReadWriteOncePod".to_string()][..])
}

/// The SELinux options of the containers that mount or map each volume, by volume name
/// (`GetPodVolumeNames`): a container's own options replace the pod's whole
/// (`DetermineEffectiveSecurityContext`); containers with none are left out.
pub fn container_contexts(pod: &Pod) -> HashMap<String, Vec<SELinuxOptions>> {
    let mut out: HashMap<String, Vec<SELinuxOptions>> = HashMap::new();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    let pod_options = spec
        .security_context
        .as_ref()
        .and_then(|c| c.se_linux_options.as_ref());
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    for container in containers {
        let own = container.security_context.as_ref();
        let Some(options) = own
            .and_then(|c| c.se_linux_options.as_ref())
            .or(pod_options)
        else {
            continue;
        };
        let mounts = container.volume_mounts.iter().flatten().map(|m| &m.name);
        let devices = container.volume_devices.iter().flatten().map(|d| &d.name);
        for name in mounts.chain(devices) {
            out.entry(name.clone()).or_default().push(options.clone());
        }
    }
    out
}

/// The labels a volume is tracked with in the desired state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels {
    /// The containers' one label, when the plugin supports context mounts (`originalSELinuxLabel`).
    pub original: String,
    /// What the volume is mounted with: `original`, unless the volume may not take one or the pod opted
    /// out (`effectiveSELinuxMountFileLabel`). Empty: no `-o context`.
    pub mount: String,
    /// The volume may take a label ([`volume_supports_selinux_mount`]): pods that disagree on it are an
    /// error, not just upstream's warning metric.
    pub supported: bool,
}

/// What the desired state of world works out for one pod's use of a volume (`getSELinuxLabel` over
/// `GetMountSELinuxLabel`). `enabled`: the host runs SELinux; `plugin_supports`: the plugin mounts with
/// contexts (a CSIDriver's `seLinuxMount`). Containers with two labels on one volume that may take one
/// are an error, in upstream's words; on one that may not, only upstream's warning metric counts them.
pub fn labels(
    spec: &Spec,
    contexts: &[SELinuxOptions],
    change_policy: Option<&str>,
    plugin_supports: bool,
    enabled: bool,
    gate: impl Fn(&str) -> bool,
) -> Result<Labels, String> {
    if !gate(SELINUX_MOUNT_READ_WRITE_ONCE_POD) || !enabled || !plugin_supports {
        return Ok(Labels::default());
    }
    let supported = volume_supports_selinux_mount(spec, &gate);
    let found: BTreeSet<String> = contexts
        .iter()
        .map(file_label)
        .filter(|l| !l.is_empty())
        .map(checked)
        .collect::<Result<_, _>>()?;
    let original = match found.len() {
        0 => {
            return Ok(Labels {
                supported,
                ..Default::default()
            });
        }
        1 => found.into_iter().next().unwrap_or_default(),
        _ if supported => {
            let all: Vec<String> = found.into_iter().collect();
            return Err(format!("multiple SELinux labels found: {}", all.join(",")));
        }
        _ => return Ok(Labels::default()),
    };
    let recursive = gate(SELINUX_CHANGE_POLICY) && change_policy == Some("Recursive");
    let mount = match supported && !recursive {
        true => original.clone(),
        false => String::new(),
    };
    Ok(Labels {
        original,
        mount,
        supported,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use serde_json::json;

    fn pv(modes: &[&str]) -> Spec {
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv"},
            "spec": {"accessModes": modes, "csi": {"driver": "d", "volumeHandle": "h"}},
        }))
        .unwrap();
        Spec::Persistent {
            pv: std::sync::Arc::new(pv),
            read_only: false,
        }
    }

    fn inline() -> Spec {
        serde_json::from_value::<k8s_openapi::api::core::v1::Volume>(
            json!({"name": "v", "csi": {"driver": "d"}}),
        )
        .map(|volume| Spec::Inline {
            volume: volume.into(),
            csi: None,
        })
        .unwrap()
    }

    fn opts(level: &str) -> SELinuxOptions {
        SELinuxOptions {
            user: Some("system_u".into()),
            role: Some("system_r".into()),
            type_: Some("container_t".into()),
            level: Some(level.into()),
        }
    }

    const LABEL: &str = "system_u:object_r:container_file_t:s0:c0,c1";

    #[test]
    fn a_process_context_becomes_a_file_label() {
        assert_eq!(file_label(&opts("s0:c0,c1")), LABEL);
        // Nothing set: no label. A process type is not the file's; a missing level is a random one.
        assert_eq!(file_label(&SELinuxOptions::default()), "");
        let spc = SELinuxOptions {
            type_: Some("spc_t".into()),
            ..opts("s0:c0,c1")
        };
        assert_eq!(file_label(&spc), LABEL);
        let random = file_label(&SELinuxOptions {
            user: Some("u".into()),
            ..Default::default()
        });
        assert!(
            random.starts_with("u:object_r:container_file_t:s0:c"),
            "{random}"
        );
        assert_eq!(
            mount_option(LABEL),
            "context=\"system_u:object_r:container_file_t:s0:c0,c1\""
        );
    }

    #[test]
    fn only_a_read_write_once_pod_pv_takes_a_label_by_default() {
        let defaults = |g: &str| g != SELINUX_MOUNT;
        let all = |_: &str| true;
        assert!(volume_supports_selinux_mount(
            &pv(&["ReadWriteOncePod"]),
            defaults
        ));
        assert!(!volume_supports_selinux_mount(
            &pv(&["ReadWriteOnce"]),
            defaults
        ));
        assert!(volume_supports_selinux_mount(&pv(&["ReadWriteOnce"]), all));
        // A CSI inline volume never does, whatever the gates.
        assert!(!volume_supports_selinux_mount(&inline(), all));
        assert!(!volume_supports_selinux_mount(
            &pv(&["ReadWriteOncePod"]),
            |_| false
        ));
    }

    #[test]
    fn labels_follow_the_host_the_plugin_and_the_pods_policy() {
        let gate = |g: &str| g != SELINUX_MOUNT;
        let rwop = pv(&["ReadWriteOncePod"]);
        let one = [opts("s0:c0,c1")];
        let mounted = labels(&rwop, &one, None, true, true, gate).unwrap();
        assert_eq!(mounted.mount, LABEL);
        // No SELinux on the host, a plugin without context mounts: nothing.
        for (enabled, supports) in [(false, true), (true, false)] {
            let l = labels(&rwop, &one, None, supports, enabled, gate).unwrap();
            assert_eq!(l, Labels::default());
        }
        // The pod opts out: the label is known, not mounted with.
        let l = labels(&rwop, &one, Some("Recursive"), true, true, gate).unwrap();
        assert_eq!((l.original.as_str(), l.mount.as_str()), (LABEL, ""));
        // An inline volume: never mounted with one.
        let l = labels(&inline(), &one, None, true, true, gate).unwrap();
        assert_eq!((l.mount.as_str(), l.supported), ("", false));
        // Two labels on a volume that takes one: upstream's error; on one that does not, nothing.
        let two = [opts("s0:c0,c1"), opts("s0:c98,c99")];
        let err = labels(&rwop, &two, None, true, true, gate).unwrap_err();
        assert!(err.starts_with("multiple SELinux labels found: "), "{err}");
        // A pod without a context on a volume that takes one: no label, but the volume still does.
        let none = labels(&rwop, &[], None, true, true, gate).unwrap();
        assert_eq!((none.mount.as_str(), none.supported), ("", true));
        // A level that would close the quoted option is refused.
        let sneaky = [opts("s0:c0,c1\",dev,suid,\"")];
        let err = labels(&rwop, &sneaky, None, true, true, gate).unwrap_err();
        assert!(err.contains("not a valid label"), "{err}");
        assert_eq!(
            labels(&inline(), &two, None, true, true, gate).unwrap(),
            Labels::default()
        );
    }

    #[test]
    fn a_containers_own_options_replace_the_pods() {
        let pod: Pod = serde_json::from_value(json!({
            "spec": {
                "securityContext": {"seLinuxOptions": {"level": "s0:c1,c2"}},
                "containers": [
                    {"name": "a", "volumeMounts": [{"name": "v", "mountPath": "/a"}]},
                    {"name": "b", "securityContext": {"seLinuxOptions": {"type": "spc_t"}},
                     "volumeMounts": [{"name": "v", "mountPath": "/b"}]},
                    {"name": "c"},
                ],
            },
        }))
        .unwrap();
        let contexts = container_contexts(&pod);
        let levels: Vec<_> = contexts["v"].iter().map(|o| o.level.clone()).collect();
        assert_eq!(levels, [Some("s0:c1,c2".to_string()), None]);
        assert_eq!(contexts.len(), 1);
    }
}
