//! Request validation for the local driver. Every check names the CSI field at fault, so a caller's
//! INVALID_ARGUMENT says exactly what to fix. Nothing a caller sends may make the driver touch a path outside
//! its state dir or the kubelet dir it serves.

use std::path::{Component, Path, PathBuf};

use inlet_proto::csi::v1::VolumeCapability;
use inlet_proto::csi::v1::volume_capability::{AccessType as CsiAccessType, access_mode::Mode};

use crate::local::store::AccessType;
use inlet_host::error::{Error, IoContext, Result};
use inlet_host::host_path::{self, Refused};
use inlet_host::mount::MountFlags;

/// The longest path Linux takes (`PATH_MAX`, with its NUL).
const PATH_MAX: usize = 4096;

/// The CSI spec's limit on names and ids ("SHOULD NOT exceed 128 bytes"), which the driver enforces.
pub const MAX_ID_BYTES: usize = 128;

/// A field that must be present.
pub fn required<'a>(field: &str, value: &'a str) -> Result<&'a str> {
    if value.is_empty() {
        return Err(Error::invalid(field, "required"));
    }
    Ok(value)
}

/// A volume or snapshot id or name: it becomes a file name under the state dir, so it may not contain `/` or
/// NUL, be `.` or `..`, or exceed 128 bytes.
pub fn id<'a>(field: &str, value: &'a str) -> Result<&'a str> {
    required(field, value)?;
    let reason = if value.len() > MAX_ID_BYTES {
        format!(
            "is {} bytes, more than the {MAX_ID_BYTES} allowed",
            value.len()
        )
    } else if value.contains('/') {
        "may not contain '/'".into()
    } else if value.contains('\0') {
        "may not contain NUL".into()
    } else if value == "." || value == ".." {
        format!("may not be {value:?}")
    } else {
        return Ok(value);
    };
    Err(Error::invalid(field, reason))
}

/// A target or staging path: absolute, without `.` or `..` components, below the kubelet dir the driver
/// serves, not inside the driver's own state dir, and reached without a symlink: every component below the
/// kubelet dir that exists is a real directory (the last may be a file, for block), checked with O_NOFOLLOW
/// one component at a time ([`host_path::check`]). The kubelet dir itself may be a symlink; the path is
/// returned under its canonical form, which is what the driver mounts on and records.
pub fn host_path(
    field: &str,
    value: &str,
    kubelet_dir: &Path,
    state_dir: &Path,
) -> Result<PathBuf> {
    required(field, value)?;
    if value.contains('\0') {
        return Err(Error::invalid(field, "may not contain NUL"));
    }
    // The walk below opens one component at a time, which no PATH_MAX limits: the limit is applied here, as
    // the kernel applies it to a whole path (ENAMETOOLONG).
    if value.len() >= PATH_MAX {
        return Err(Error::invalid(
            field,
            format!("{} is longer than {PATH_MAX} bytes", shown(value)),
        ));
    }
    let path = PathBuf::from(value);
    if !path.is_absolute() {
        return Err(Error::invalid(
            field,
            format!("{} is not an absolute path", shown(value)),
        ));
    }
    if path
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(Error::invalid(
            field,
            format!("{} may not contain '.' or '..'", shown(value)),
        ));
    }
    let outside = || {
        let reason = format!(
            "{} is outside the kubelet dir {} this driver serves",
            shown(value),
            kubelet_dir.display()
        );
        Error::invalid(field, reason)
    };
    let (root, relative) = host_path::below(kubelet_dir, &path)
        .context(|| format!("resolving the kubelet dir {}", kubelet_dir.display()))?
        .ok_or_else(outside)?;
    let resolved = root.join(&relative);
    let state = host_path::canonical(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    if resolved.starts_with(&state) {
        return Err(Error::invalid(
            field,
            format!("{} is inside the driver's state dir", shown(value)),
        ));
    }
    match host_path::check(&root, &relative) {
        Ok(()) => Ok(resolved),
        Err(Refused::Io(e)) if e.raw_os_error() != Some(nix::libc::ENAMETOOLONG) => {
            Err(e).context(|| format!("checking {}", shown(value)))
        }
        Err(refused) => Err(Error::invalid(
            field,
            format!("{} cannot be used: {refused}", shown(value)),
        )),
    }
}

/// A caller's path as an error shows it: cut to its first 256 bytes, so a megabyte-long input does not
/// make a megabyte-long error (which gRPC clients refuse as a header).
pub fn shown(value: &str) -> String {
    const LIMIT: usize = 256;
    if value.len() <= LIMIT {
        return format!("{value:?}");
    }
    let mut end = LIMIT;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &value[..end], value.len())
}

/// A volume capability the local driver can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capability {
    /// Mount or block.
    pub access_type: AccessType,
    /// The CSI access mode.
    pub mode: Mode,
    /// Flags from `mount.mount_flags` (always default for block).
    pub flags: MountFlags,
    /// `mount.volume_mount_group`: the group the volume is given to (the pod's fsGroup), sent by the
    /// kubelet to drivers with VOLUME_MOUNT_GROUP.
    pub mount_group: Option<u32>,
}

impl Capability {
    /// True for the modes that only allow reading.
    pub fn read_only_mode(&self) -> bool {
        self.mode == Mode::SingleNodeReaderOnly
    }
}

/// Checks one volume capability: access type set, a known access mode a node-local volume can honour, and
/// mount flags the driver knows.
pub fn capability(field: &str, cap: Option<&VolumeCapability>) -> Result<Capability> {
    let cap = cap.ok_or_else(|| Error::invalid(field, "required"))?;
    let (access_type, flags, mount_group) = match &cap.access_type {
        Some(CsiAccessType::Mount(mount)) => {
            let flags = MountFlags::parse(&mount.mount_flags).map_err(|flag| {
                Error::invalid(
                    format!("{field}.mount.mount_flags"),
                    format!("unsupported flag {flag:?}"),
                )
            })?;
            let group = match mount.volume_mount_group.as_str() {
                "" => None,
                text => Some(text.parse::<u32>().map_err(|_| {
                    Error::invalid(
                        format!("{field}.mount.volume_mount_group"),
                        "not a numeric group id",
                    )
                })?),
            };
            (AccessType::Mount, flags, group)
        }
        Some(CsiAccessType::Block(_)) => (AccessType::Block, MountFlags::default(), None),
        None => {
            return Err(Error::invalid(
                format!("{field}.access_type"),
                "required: mount or block",
            ));
        }
    };
    let mode_field = format!("{field}.access_mode");
    let raw = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| Error::invalid(&mode_field, "required"))?
        .mode;
    let mode = match Mode::try_from(raw) {
        Ok(Mode::Unknown) | Err(_) => {
            return Err(Error::invalid(
                mode_field,
                format!("unknown access mode {raw}"),
            ));
        }
        Ok(
            mode @ (Mode::MultiNodeReaderOnly
            | Mode::MultiNodeSingleWriter
            | Mode::MultiNodeMultiWriter),
        ) => {
            let reason = format!(
                "{} is not supported: local volumes live on one node",
                mode.as_str_name()
            );
            return Err(Error::invalid(mode_field, reason));
        }
        Ok(mode) => mode,
    };
    Ok(Capability {
        access_type,
        mode,
        flags,
        mount_group,
    })
}

/// Checks a list of capabilities that must all share one access type (CreateVolume); returns that type.
pub fn capabilities(field: &str, caps: &[VolumeCapability]) -> Result<AccessType> {
    if caps.is_empty() {
        return Err(Error::invalid(field, "required: at least one capability"));
    }
    let mut access = None;
    for (i, cap) in caps.iter().enumerate() {
        let parsed = capability(&format!("{field}[{i}]"), Some(cap))?;
        match access {
            Some(a) if a != parsed.access_type => {
                return Err(Error::invalid(
                    field,
                    "cannot have both block and mount access type",
                ));
            }
            _ => access = Some(parsed.access_type),
        }
    }
    Ok(access.expect("at least one capability was checked"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use inlet_proto::csi::v1::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn cap(mode: i32, flags: &[&str]) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode }),
            access_type: Some(CsiAccessType::Mount(MountVolume {
                mount_flags: flags.iter().map(|f| f.to_string()).collect(),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn ids_that_could_escape_the_state_dir_are_refused() {
        assert!(id("volume_id", "pvc-123").is_ok());
        for bad in ["", "a/b", "..", ".", "a\0b", &"x".repeat(129)] {
            let err = id("volume_id", bad).unwrap_err().to_string();
            assert!(err.starts_with("volume_id: "), "{err}");
        }
        assert!(id("name", &"x".repeat(128)).is_ok());
    }

    #[test]
    fn host_paths_stay_in_the_kubelet_dir() {
        let kubelet = tempfile::tempdir().unwrap();
        let state = kubelet.path().join("plugins/inlet");
        let ok = kubelet.path().join("pods/uid/volumes/v/mount");
        assert!(host_path("target_path", ok.to_str().unwrap(), kubelet.path(), &state).is_ok());
        let k = kubelet.path().display();
        for bad in [
            "relative/path".to_string(),
            "/etc/passwd".into(),
            format!("{k}/pods/../../etc"),
            format!("{k}/plugins/inlet/volumes/x"),
            k.to_string(),
        ] {
            let err = host_path("target_path", &bad, kubelet.path(), &state).unwrap_err();
            assert!(err.to_string().starts_with("target_path: "), "{bad}: {err}");
        }
        // A symlink inside the kubelet dir that points outside it is resolved and refused.
        std::os::unix::fs::symlink("/etc", kubelet.path().join("escape")).unwrap();
        let via_link = format!("{k}/escape/target");
        assert!(host_path("target_path", &via_link, kubelet.path(), &state).is_err());
    }

    #[test]
    fn capabilities_are_checked_field_by_field() {
        let ok = capability(
            "volume_capability",
            Some(&cap(Mode::SingleNodeWriter as i32, &["ro"])),
        )
        .unwrap();
        assert_eq!(ok.access_type, AccessType::Mount);
        assert!(ok.flags.read_only);

        let err = |c: Option<&VolumeCapability>| {
            capability("volume_capability", c).unwrap_err().to_string()
        };
        assert_eq!(err(None), "volume_capability: required");
        assert!(err(Some(&cap(0, &[]))).contains("access_mode: unknown access mode 0"));
        assert!(err(Some(&cap(42, &[]))).contains("unknown access mode 42"));
        assert!(
            err(Some(&cap(Mode::MultiNodeMultiWriter as i32, &[])))
                .contains("MULTI_NODE_MULTI_WRITER")
        );
        assert!(err(Some(&cap(1, &["sync"]))).contains("mount_flags: unsupported flag \"sync\""));
        let no_type = VolumeCapability {
            access_mode: Some(AccessMode { mode: 1 }),
            access_type: None,
        };
        assert!(err(Some(&no_type)).contains("access_type"));

        let block = VolumeCapability {
            access_mode: Some(AccessMode { mode: 1 }),
            access_type: Some(CsiAccessType::Block(BlockVolume {})),
        };
        let mixed = capabilities("volume_capabilities", &[cap(1, &[]), block]).unwrap_err();
        assert!(mixed.to_string().contains("both block and mount"));
        assert!(capabilities("volume_capabilities", &[]).is_err());
    }
}
