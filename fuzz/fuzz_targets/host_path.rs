//! Target and staging paths as a CO sends them: any text is accepted only as a path below the kubelet dir
//! reached without a symlink, or refused with an error; never a panic. A leading `K` in the input stands for
//! the kubelet dir, so the corpus can reach below it.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use inlet_plugin::validate;
use libfuzzer_sys::fuzz_target;

fn kubelet_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("inlet-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("kubelet/pods/uid/volumes")).unwrap();
        let _ = std::os::unix::fs::symlink("/etc", dir.join("kubelet/pods/uid/link"));
        dir
    })
}

fuzz_target!(|text: &str| {
    let root = kubelet_dir();
    let kubelet = root.join("kubelet");
    let text = match text.strip_prefix('K') {
        Some(rest) => format!("{}{rest}", kubelet.display()),
        None => text.to_string(),
    };
    if let Ok(path) = validate::host_path("target_path", &text, &kubelet, &root.join("state")) {
        let canonical = kubelet.canonicalize().unwrap();
        assert!(
            path.starts_with(&canonical) && path != canonical,
            "{text:?} -> {path:?}"
        );
        assert!(
            !path.starts_with(canonical.join("pods/uid/link")),
            "{text:?} went through a symlink"
        );
    }
});
