//! The `kubernetes.io/secret` plugin (`pkg/volume/secret`): a Secret's keys as files, on a tmpfs (so their
//! values never reach the node's disk), written again when the volume is set up again. What a real
//! cluster's pods carry for their service account token before projected tokens (Kubernetes 1.20 and
//! older), and what any pod may ask for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{SecretVolumeSource, Volume};

use super::empty_dir::{DirPlugin, DirVolume, set_up_dir};
use super::{Mounter, MounterArgs, PodInfo, VolumeError, VolumeHost};

/// A file's mode when neither the item nor the volume names one (`SecretVolumeSourceDefaultMode`).
const DEFAULT_MODE: i32 = 0o644;

/// `secret`.
pub struct SecretVolume;

/// The `kubernetes.io/secret` plugin.
pub type SecretPlugin = DirPlugin<SecretVolume>;

impl DirVolume for SecretVolume {
    const NAME: &'static str = "kubernetes.io/secret";
    /// Secrets change: the files are written again on every pass.
    const REQUIRES_REMOUNT: bool = true;

    fn is(volume: &Volume) -> bool {
        volume.secret.is_some()
    }

    fn reconstructed(name: &str) -> Volume {
        Volume {
            name: name.to_string(),
            secret: Some(SecretVolumeSource::default()),
            ..Default::default()
        }
    }

    fn mounter(
        host: Arc<dyn VolumeHost>,
        path: PathBuf,
        volume: &Volume,
        pod: &PodInfo,
    ) -> Box<dyn Mounter> {
        Box::new(SecretMounter {
            host,
            path,
            source: volume.secret.clone().unwrap_or_default(),
            namespace: pod.namespace.clone(),
        })
    }
}

struct SecretMounter {
    host: Arc<dyn VolumeHost>,
    path: PathBuf,
    source: SecretVolumeSource,
    namespace: String,
}

#[async_trait]
impl Mounter for SecretMounter {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    async fn set_up_at(&self, dir: &Path, _args: &MounterArgs) -> Result<(), VolumeError> {
        let name = self.source.secret_name.clone().unwrap_or_default();
        let optional = self.source.optional.unwrap_or(false);
        let secret = self
            .host
            .secret(&self.namespace, &name)
            .await
            .map_err(VolumeError::transient)?;
        let data = match secret {
            Some(secret) => secret.data.unwrap_or_default(),
            None if optional => Default::default(),
            // Upstream's text (the API server's NotFound).
            None => return Err(VolumeError::transient(format!("secret {name:?} not found"))),
        };
        set_up_dir(self.host.as_ref(), dir, Some(0))?;
        let default_mode = self.source.default_mode.unwrap_or(DEFAULT_MODE);
        let files: Vec<(String, i32, &[u8])> = match &self.source.items {
            Some(items) => {
                let mut files = Vec::new();
                for item in items {
                    match data.get(&item.key) {
                        Some(value) => files.push((
                            item.path.clone(),
                            item.mode.unwrap_or(default_mode),
                            value.0.as_slice(),
                        )),
                        None if optional => {}
                        None => {
                            return Err(VolumeError::transient(format!(
                                "references non-existent secret key: {}",
                                item.key
                            )));
                        }
                    }
                }
                files
            }
            None => data
                .iter()
                .map(|(key, value)| (key.clone(), default_mode, value.0.as_slice()))
                .collect(),
        };
        let mut written = std::collections::HashSet::new();
        for (path, mode, value) in files {
            write_file(dir, &path, mode, value)?;
            written.insert(dir.join(&path));
        }
        remove_stale_files(dir, &written);
        Ok(())
    }
}

/// Removes the files a previous set-up wrote that the Secret no longer has (its keys changed).
fn remove_stale_files(dir: &Path, written: &std::collections::HashSet<PathBuf>) {
    let stale = walkdir::WalkDir::new(dir)
        .follow_links(false)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| !e.file_type().is_dir() && !written.contains(e.path()));
    for entry in stale {
        let _ = std::fs::remove_file(entry.path());
    }
}

/// Writes one file below `dir` without following a symlink anywhere on its path (the path comes from the
/// pod's spec; the API server refuses `..`, and this refuses it again), with `mode` whatever the umask.
/// The content goes to a temporary file renamed over the old one, so a reader sees the old value or the
/// new one, never a part (upstream's AtomicWriter swaps the whole set at once through a symlink).
fn write_file(dir: &Path, path: &str, mode: i32, value: &[u8]) -> Result<(), VolumeError> {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::{Mode, fchmod};
    use std::io::Write;
    let refused = |e: String| VolumeError::final_(format!("secret file {path:?}: {e}"));
    let relative = Path::new(path);
    let name = relative
        .file_name()
        .ok_or_else(|| refused("not a file name".into()))?;
    let parent = relative.parent().unwrap_or(Path::new(""));
    if !parent.as_os_str().is_empty() {
        inlet_host::host_path::create_dirs(dir, parent, 0o755)
            .map_err(|e| refused(e.to_string()))?;
    }
    let parent = inlet_host::host_path::open_below(dir, parent)
        .map_err(|e| refused(e.to_string()))?
        .ok_or_else(|| refused("its directory is gone".into()))?;
    let mode = Mode::from_bits_truncate((mode as u32) & 0o777);
    let mut temporary = std::ffi::OsString::from("..");
    temporary.push(name);
    temporary.push(".tmp");
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd =
        openat(&parent, temporary.as_os_str(), flags, mode).map_err(|e| refused(e.to_string()))?;
    fchmod(&fd, mode).map_err(|e| refused(e.to_string()))?;
    std::fs::File::from(fd)
        .write_all(value)
        .map_err(|e| VolumeError::transient(format!("secret file {path:?}: {e}")))?;
    nix::fcntl::renameat(&parent, temporary.as_os_str(), &parent, name)
        .map_err(|e| VolumeError::transient(format!("secret file {path:?}: {e}")))
}
