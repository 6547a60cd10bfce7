//! A recording fake of the mount layer, for tests and for running without root.
//!
//! It changes nothing on the host: calls are appended to a typed log and a table of "mounted" targets is kept,
//! so `is_mount_point` and `unmount` answer consistently with what was mounted before. The log keeps the
//! last [`CALLS_KEPT`] calls: a simulation or a driver may run on it for days, and the table, not the log,
//! is what it answers from.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::{MountFlags, MountLayer, Overlay};

/// One call made to the mount layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountCall {
    /// `bind(source, target, flags)`.
    Bind {
        /// What was bound.
        source: PathBuf,
        /// Where.
        target: PathBuf,
        /// With which flags.
        flags: MountFlags,
    },
    /// `tmpfs(target, size_bytes)`.
    Tmpfs {
        /// Where.
        target: PathBuf,
        /// The size limit.
        size_bytes: u64,
    },
    /// `overlay(overlay, target)`.
    Overlay {
        /// The layers.
        overlay: Overlay,
        /// Where.
        target: PathBuf,
    },
    /// `remount_read_only(target)`.
    RemountReadOnly(PathBuf),
    /// `unmount(target)`.
    Unmount(PathBuf),
    /// `set_group(path, gid, mode_bits)`.
    SetGroup {
        /// What was given to the group.
        path: PathBuf,
        /// The group.
        gid: u32,
        /// The mode bits added.
        mode_bits: u32,
    },
    /// `attach_loop(file)`.
    AttachLoop(PathBuf),
    /// `refresh_loop(device)`.
    RefreshLoop(PathBuf),
    /// `detach_loop(device)`.
    DetachLoop(PathBuf),
}

/// How many of the latest calls the log keeps.
pub const CALLS_KEPT: usize = 10_000;

#[derive(Debug, Default)]
struct State {
    calls: VecDeque<MountCall>,
    /// target -> what is mounted there (a path, or "tmpfs"/"overlay").
    mounts: BTreeMap<PathBuf, PathBuf>,
    /// backing file -> loop device.
    loops: BTreeMap<PathBuf, PathBuf>,
    next_loop: u32,
}

impl State {
    fn record(&mut self, call: MountCall) {
        if self.calls.len() == CALLS_KEPT {
            self.calls.pop_front();
        }
        self.calls.push_back(call);
    }
}

/// The recording fake. Cheap to clone the log out of; safe to share between threads.
#[derive(Debug, Default)]
pub struct RecordingMounter {
    state: Mutex<State>,
}

impl RecordingMounter {
    /// A fake with nothing mounted.
    pub fn new() -> Self {
        Self::default()
    }

    /// The calls so far, in order: the last [`CALLS_KEPT`].
    pub fn calls(&self) -> Vec<MountCall> {
        self.state.lock().calls.iter().cloned().collect()
    }

    /// The targets currently "mounted", with their sources.
    pub fn mounts(&self) -> BTreeMap<PathBuf, PathBuf> {
        self.state.lock().mounts.clone()
    }

    /// The backing files currently attached to a fake loop device.
    pub fn loops(&self) -> BTreeMap<PathBuf, PathBuf> {
        self.state.lock().loops.clone()
    }

    fn mount(&self, call: MountCall, target: &Path, source: PathBuf) -> io::Result<()> {
        let mut state = self.state.lock();
        state.record(call);
        if !target.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "mount target does not exist",
            ));
        }
        state.mounts.insert(target.to_path_buf(), source);
        Ok(())
    }
}

impl MountLayer for RecordingMounter {
    fn bind(&self, source: &Path, target: &Path, flags: MountFlags) -> io::Result<()> {
        let call = MountCall::Bind {
            source: source.into(),
            target: target.into(),
            flags,
        };
        self.mount(call, target, source.into())
    }

    fn tmpfs(&self, target: &Path, size_bytes: u64) -> io::Result<()> {
        self.mount(
            MountCall::Tmpfs {
                target: target.into(),
                size_bytes,
            },
            target,
            "tmpfs".into(),
        )
    }

    fn overlay(&self, overlay: &Overlay, target: &Path) -> io::Result<()> {
        let call = MountCall::Overlay {
            overlay: overlay.clone(),
            target: target.into(),
        };
        self.mount(call, target, "overlay".into())
    }

    fn remount_read_only(&self, target: &Path) -> io::Result<()> {
        let mut state = self.state.lock();
        state.record(MountCall::RemountReadOnly(target.into()));
        if !state.mounts.contains_key(target) {
            return Err(io::Error::from_raw_os_error(nix::libc::EINVAL));
        }
        Ok(())
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        let mut state = self.state.lock();
        state.record(MountCall::Unmount(target.into()));
        match state.mounts.remove(target) {
            Some(_) => Ok(()),
            None => Err(io::Error::from_raw_os_error(nix::libc::EINVAL)),
        }
    }

    fn is_mount_point(&self, path: &Path) -> io::Result<bool> {
        Ok(self.state.lock().mounts.contains_key(path))
    }

    fn mounts_under(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let state = self.state.lock();
        // Paths order component by component, so everything under `dir` follows it in one run: the
        // lookup costs what is under `dir`, not the whole mount table.
        let from = (std::ops::Bound::Included(dir), std::ops::Bound::Unbounded);
        let under: Vec<&PathBuf> = state
            .mounts
            .range::<Path, _>(from)
            .map(|(p, _)| p)
            .take_while(|p| p.starts_with(dir))
            .collect();
        // Sorted, so a mount inside another comes after it.
        let mut outer: Vec<PathBuf> = Vec::new();
        for path in under {
            if !outer.iter().any(|o| path.starts_with(o)) {
                outer.push(path.clone());
            }
        }
        Ok(outer)
    }

    fn set_group(&self, path: &Path, gid: u32, mode_bits: u32) -> io::Result<()> {
        self.state.lock().record(MountCall::SetGroup {
            path: path.into(),
            gid,
            mode_bits,
        });
        Ok(())
    }

    fn attach_loop(&self, file: &Path) -> io::Result<PathBuf> {
        let mut state = self.state.lock();
        state.record(MountCall::AttachLoop(file.into()));
        let device = PathBuf::from(format!("/dev/fake-loop{}", state.next_loop));
        state.next_loop += 1;
        state.loops.insert(file.into(), device.clone());
        Ok(device)
    }

    fn find_loop(&self, file: &Path) -> io::Result<Option<PathBuf>> {
        Ok(self.state.lock().loops.get(file).cloned())
    }

    fn refresh_loop(&self, device: &Path) -> io::Result<()> {
        self.state
            .lock()
            .record(MountCall::RefreshLoop(device.into()));
        Ok(())
    }

    fn detach_loop(&self, device: &Path) -> io::Result<()> {
        let mut state = self.state.lock();
        state.record(MountCall::DetachLoop(device.into()));
        let before = state.loops.len();
        state.loops.retain(|_, d| d != device);
        if state.loops.len() == before {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no such loop device",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_consistent_mount_table() {
        let dir = tempfile::tempdir().unwrap();
        let m = RecordingMounter::new();
        m.bind(Path::new("/src"), dir.path(), MountFlags::default())
            .unwrap();
        assert!(m.is_mount_point(dir.path()).unwrap());
        m.unmount(dir.path()).unwrap();
        assert!(m.unmount(dir.path()).is_err());
        assert!(
            m.bind(
                Path::new("/src"),
                Path::new("/nonexistent/target"),
                MountFlags::default()
            )
            .is_err()
        );
        assert_eq!(m.calls().len(), 4);
    }

    #[test]
    fn the_log_keeps_the_latest_calls_and_the_table_all_mounts() {
        let dir = tempfile::tempdir().unwrap();
        let m = RecordingMounter::new();
        m.bind(Path::new("/src"), dir.path(), MountFlags::default())
            .unwrap();
        for gid in 0..CALLS_KEPT as u32 {
            m.set_group(Path::new("/p"), gid, 0o070).unwrap();
        }
        let calls = m.calls();
        assert_eq!(calls.len(), CALLS_KEPT);
        assert_eq!(
            calls[0],
            MountCall::SetGroup {
                path: "/p".into(),
                gid: 0,
                mode_bits: 0o070
            },
            "the oldest call went first"
        );
        assert!(
            m.is_mount_point(dir.path()).unwrap(),
            "a mount whose call left the log is still mounted"
        );
    }

    #[test]
    fn mounts_under_a_dir_are_the_outermost_ones_below_it_and_no_neighbour() {
        let dir = tempfile::tempdir().unwrap();
        let m = RecordingMounter::new();
        for sub in ["a", "a/inner", "a/inner/deeper", "ab", "b"] {
            let target = dir.path().join(sub);
            std::fs::create_dir_all(&target).unwrap();
            m.bind(Path::new("/src"), &target, MountFlags::default())
                .unwrap();
        }
        let a = dir.path().join("a");
        assert_eq!(m.mounts_under(&a).unwrap(), std::slice::from_ref(&a));
        assert_eq!(
            m.mounts_under(&a.join("inner/x")).unwrap(),
            Vec::<PathBuf>::new()
        );
        assert_eq!(m.mounts_under(dir.path()).unwrap().len(), 3, "a, ab and b");
    }
}
