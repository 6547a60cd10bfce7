//! Checks made before anything starts: each path a DaemonSet mounts from the host must be what the driver
//! expects, or the driver exits with one line naming the flag, the path and what was expected (what an
//! operator reads in `kubectl logs`), instead of serving and failing every call later.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Why the driver cannot start with these paths.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {path}: {found}; expected {expected}")]
pub struct StartupError {
    flag: &'static str,
    path: String,
    found: String,
    expected: &'static str,
}

/// What a path must be.
#[derive(Clone, Copy)]
pub enum Expect {
    /// An existing directory.
    Directory,
    /// A directory, created if missing.
    CreatedDirectory,
    /// A unix socket (whether something listens is the runtime client's to find out).
    Socket,
}

/// Checks `path` (given with `flag`) is `expect`; `expected` says, in an operator's words, what it is.
pub fn check(
    flag: &'static str,
    path: &Path,
    expect: Expect,
    expected: &'static str,
) -> Result<(), StartupError> {
    let fail = |found: String| StartupError {
        flag,
        path: path.display().to_string(),
        found,
        expected,
    };
    if let Expect::CreatedDirectory = expect {
        std::fs::create_dir_all(path).map_err(|e| fail(format!("cannot create it ({e})")))?;
    }
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    let ok = match expect {
        Expect::Directory | Expect::CreatedDirectory => meta.is_dir(),
        Expect::Socket => meta.file_type().is_socket(),
    };
    if !ok {
        let kind = if meta.is_dir() {
            "a directory"
        } else if meta.file_type().is_socket() {
            "a socket"
        } else {
            "a file"
        };
        return Err(fail(format!("is {kind}")));
    }
    Ok(())
}
