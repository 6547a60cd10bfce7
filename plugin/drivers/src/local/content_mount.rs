//! The local driver's content dir (`<state>/volumes`) bound onto itself while the driver serves.
//!
//! Linux's bind mount walks every mount below the mount that holds its source (`has_locked_children` in
//! `fs/namespace.c`). Targets are mounted below the kubelet dir, usually on the same filesystem mount as
//! the state dir, so without this every publish costs more the more volumes the node has published
//! (`bench/RESULTS.md`: 2.24x at 10,000 volumes, 1.34x with it).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use inlet_host::error::{IoContext, Result};
use inlet_host::mount::{MountFlags, MountLayer};

/// Beside the content dir: says the bind is the driver's own (a mount a user put there is not).
const MARKER: &str = "volumes.self-bound";

/// The self-bind, undone when dropped (the published volumes are mounts of their own and stay).
pub struct ContentMount {
    dir: PathBuf,
    mounter: Arc<dyn MountLayer>,
    own: bool,
}

impl ContentMount {
    /// Binds `<state_dir>/volumes` onto itself, unless it is a mount point already: a user's mount is
    /// left alone, and one an earlier run left (its marker beside) is taken over.
    pub fn bind(state_dir: &Path, mounter: Arc<dyn MountLayer>) -> Result<Self> {
        let dir = state_dir.join("volumes");
        fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
        let marker = state_dir.join(MARKER);
        let mounted = mounter
            .is_mount_point(&dir)
            .context(|| format!("checking {}", dir.display()))?;
        let own = if mounted {
            marker.exists()
        } else {
            // The marker first: a crash between the two leaves a marker without a mount, harmless.
            fs::write(&marker, "").context(|| format!("writing {}", marker.display()))?;
            mounter
                .bind(&dir, &dir, MountFlags::default())
                .context(|| format!("binding {} onto itself", dir.display()))?;
            true
        };
        Ok(Self { dir, mounter, own })
    }
}

impl Drop for ContentMount {
    fn drop(&mut self) {
        if self.own && self.mounter.unmount(&self.dir).is_ok() {
            let _ = fs::remove_file(self.dir.with_file_name(MARKER));
        }
    }
}

/// True when `path` is a local driver's content dir bound onto itself: the driver's own mount while it
/// serves (or after it was killed), not a volume left behind.
pub fn is_own(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "volumes") && path.with_file_name(MARKER).exists()
}
