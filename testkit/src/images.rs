//! The container images `deploy/build-images.sh` builds, for the tests that run them (podman, the kit's
//! runtimes): built once per test process, and always (cargo rebuilds only what changed, so an image is
//! never older than the code).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `target/images/<name>.tar` (`inlet-plugin` or `kubelet-sim`), built now; why not, when podman (which
/// the script needs) is missing.
pub fn archive(name: &str) -> Result<PathBuf, String> {
    if Command::new("podman").arg("--version").output().is_err() {
        return Err("podman is not installed (deploy/build-images.sh needs it)".into());
    }
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if !built.iter().any(|b| b == name) {
        let status = Command::new(repo().join("deploy/build-images.sh"))
            .arg(name)
            .status()
            .expect("build-images.sh runs");
        assert!(status.success(), "deploy/build-images.sh {name} failed");
        built.push(name.to_string());
    }
    Ok(repo().join(format!("target/images/{name}.tar")))
}
