//! Steps about the files the kubelet writes into secret and configMap volumes (`AtomicWriter`), and the
//! size of memory-backed emptyDirs.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use cucumber::then;
use inlet_host::mount::MountCall;

use super::Sim;
use super::images::{content_visible, host_path, split_mount};

/// The timestamped directories (`..2026_12_02_...`) of a volume.
fn timestamped(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| is_timestamped(name))
        .collect()
}

/// `..YYYY_MM_DD_HH_MM_SS.<digits>`, as `newTimestampDir` names them.
fn is_timestamped(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("..") else {
        return false;
    };
    let Some((stamp, suffix)) = rest.split_once('.') else {
        return false;
    };
    let fields: Vec<&str> = stamp.split('_').collect();
    fields.len() == 6
        && fields.iter().all(|f| f.chars().all(|c| c.is_ascii_digit()))
        && !suffix.is_empty()
        && suffix.chars().all(|c| c.is_ascii_digit())
}

#[then(regex = r#"^"([^"]+)" of pod "([^"]+)" links to "([^"]+)"$"#)]
fn links_to(w: &mut Sim, path: String, pod: String, target: String) {
    let (mount, file) = split_mount(&path);
    let host = host_path(w, &pod, mount).join(file);
    let link = std::fs::read_link(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    assert_eq!(link.to_string_lossy(), target, "{}", host.display());
}

/// An update removes the old version just after the swap: the step waits for that.
#[then(regex = r#"^"([^"]+)" of pod "([^"]+)" links to its one timestamped directory$"#)]
async fn links_to_timestamped(w: &mut Sim, path: String, pod: String) {
    let (mount, file) = split_mount(&path);
    let dir = host_path(w, &pod, mount);
    let current = || {
        let link = std::fs::read_link(dir.join(file)).expect("a symlink");
        link.to_string_lossy().into_owned()
    };
    for _ in 0..100 {
        if timestamped(&dir) == [current()] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let name = current();
    assert!(is_timestamped(&name), "{name}");
    assert_eq!(timestamped(&dir), [name], "one version, the current one");
}

#[then(regex = r#"^pod "([^"]+)" comes to read "(.+)" at "([^"]+)"$"#)]
async fn comes_to_read(w: &mut Sim, pod: String, text: String, path: String) {
    let text = text.replace("\\n", "\n");
    let (mount, file) = split_mount(&path);
    let host = host_path(w, &pod, mount).join(file);
    for _ in 0..200 {
        if std::fs::read_to_string(&host).is_ok_and(|body| body == text) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = std::fs::read_to_string(&host);
    panic!("{} still reads {body:?}", host.display());
}

#[then(regex = r#"^the file "([^"]+)" of pod "([^"]+)" has group (\d+)$"#)]
fn file_group(w: &mut Sim, path: String, pod: String, gid: u32) {
    let (mount, file) = split_mount(&path);
    let host = host_path(w, &pod, mount).join(file);
    // Without root, what the mount layer was asked to do stands in for the file's group.
    if let Some(recording) = &w.recording {
        let real = std::fs::canonicalize(&host).expect("the file");
        let given = recording.calls().iter().any(|c| {
            matches!(c, MountCall::SetGroup { path, gid: g, .. }
                if std::fs::canonicalize(path).is_ok_and(|p| p == real) && *g == gid)
        });
        assert!(given, "{}: {:#?}", host.display(), recording.calls());
        return;
    }
    let group = std::fs::metadata(&host).expect("the file").gid();
    assert_eq!(group, gid, "{}", host.display());
}

#[then(regex = r#"^"([^"]+)" of pod "([^"]+)" is a tmpfs of (\d+) MiB$"#)]
fn tmpfs_size(w: &mut Sim, mount: String, pod: String, mib: u64) {
    let host = host_path(w, &pod, &mount);
    if let Some(recording) = &w.recording {
        let size = recording.calls().iter().find_map(|c| match c {
            MountCall::Tmpfs { target, size_bytes } if *target == host => Some(*size_bytes),
            _ => None,
        });
        assert_eq!(size, Some(mib << 20), "{:#?}", recording.calls());
        return;
    }
    if !content_visible(&format!("{mount} of pod {pod} is a tmpfs of {mib} MiB")) {
        return;
    }
    let fs = nix::sys::statfs::statfs(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    let bytes = fs.blocks() * fs.block_size() as u64;
    assert_eq!(bytes, mib << 20, "{}", host.display());
}

/// A path below the kubelet root with `{uid}` standing for the pod's UID.
fn under_root(w: &Sim, pod: &str, relative: &str) -> String {
    relative.replace("{uid}", &w.uid(pod))
}

#[then(regex = r#"^the driver staged handle "([^"]+)" as Block at "([^"]+)"$"#)]
fn staged_as_block(w: &mut Sim, handle: String, relative: String) {
    let calls = w.report().csi_calls;
    let stage = calls
        .iter()
        .find(|c| c.method == "NodeStageVolume" && c.volume_id == handle && c.code == "OK")
        .unwrap_or_else(|| panic!("no NodeStageVolume of {handle}: {calls:#?}"));
    assert_eq!(stage.access_type, "Block", "{stage:#?}");
    assert!(stage.staging_path.ends_with(&relative), "{stage:#?}");
}

#[then(
    regex = r#"^the driver published handle "([^"]+)" as Block for pod "([^"]+)" at "([^"]+)"$"#
)]
fn published_as_block(w: &mut Sim, handle: String, pod: String, relative: String) {
    let relative = under_root(w, &pod, &relative);
    let calls = w.report().csi_calls;
    let publish = calls
        .iter()
        .find(|c| {
            c.method == "NodePublishVolume"
                && c.volume_id == handle
                && c.target_path.ends_with(&relative)
        })
        .unwrap_or_else(|| panic!("no NodePublishVolume of {handle} at {relative}: {calls:#?}"));
    assert_eq!(
        (publish.code.as_str(), publish.access_type.as_str()),
        ("OK", "Block"),
        "{publish:#?}"
    );
}

#[then(
    regex = r#"^container "([^"]+)" of pod "([^"]+)" has the device "([^"]+)" from "([^"]+)", a link to "([^"]+)", with "(\w+)"$"#
)]
fn container_device(
    w: &mut Sim,
    container: String,
    pod: String,
    device_path: String,
    relative: String,
    target: String,
    permissions: String,
) {
    let (relative, target) = (under_root(w, &pod, &relative), under_root(w, &pod, &target));
    let uid = w.uid(&pod);
    let found: Vec<_> = w
        .sim()
        .cri_fakes()
        .flat_map(|(_, runtime)| {
            runtime.containers_where(|c| {
                c.status
                    .metadata
                    .as_ref()
                    .is_some_and(|m| m.name == container)
                    && c.status.labels.get("io.kubernetes.pod.uid") == Some(&uid)
            })
        })
        .collect();
    let device = found
        .iter()
        .flat_map(|c| &c.devices)
        .find(|d| d.container_path == device_path)
        .unwrap_or_else(|| panic!("no device {device_path}: {found:#?}"));
    assert!(device.host_path.ends_with(&relative), "{device:#?}");
    assert_eq!(device.permissions, permissions);
    let link = std::fs::read_link(&device.host_path).expect("the pod's device is a symlink");
    assert!(link.to_string_lossy().ends_with(&target), "{link:?}");
}

/// The shared directories (`staging/`, `publish/`) stay, as upstream leaves them.
#[then(regex = r#"^the kubelet dir of "([^"]+)" holds nothing of "([^"]+)" under "([^"]+)"$"#)]
fn nothing_under(w: &mut Sim, node: String, name: String, relative: String) {
    let dir = w.dir.path().join("root").join(&node).join(&relative);
    let left: Vec<_> = walkdir::WalkDir::new(&dir)
        .min_depth(1)
        .into_iter()
        .filter_map(Result::ok)
        .map(|e| e.path().display().to_string())
        .filter(|p| p.contains(&name))
        .collect();
    assert!(left.is_empty(), "left under {}: {left:#?}", dir.display());
}
