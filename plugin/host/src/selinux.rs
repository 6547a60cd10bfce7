//! The host's SELinux, as far as the kubelet asks: is it enabled, and which label does a file carry.

use std::path::Path;

/// True when the host runs SELinux, as go-selinux's `GetEnabled` (what the kubelet's
/// `SELinuxLabelTranslator.SELinuxEnabled` asks): selinuxfs is mounted and this process runs with a
/// label of its own (not `kernel`). Without it the kubelet never mounts with `-o context`.
pub fn enabled() -> bool {
    if !Path::new("/sys/fs/selinux/enforce").exists() {
        return false;
    }
    std::fs::read_to_string("/proc/self/attr/current").is_ok_and(|label| {
        let label = label.trim_end_matches(['\0', '\n']);
        !label.is_empty() && label != "kernel"
    })
}

/// The SELinux label of `path` (its `security.selinux` attribute, without the trailing NUL); None when it
/// carries none.
pub fn file_label(path: &Path) -> std::io::Result<Option<String>> {
    let mut buf = vec![0u8; 256];
    loop {
        match rustix::fs::getxattr(path, "security.selinux", &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                let label = String::from_utf8_lossy(&buf);
                return Ok(Some(label.trim_end_matches('\0').to_string()));
            }
            Err(rustix::io::Errno::NODATA) | Err(rustix::io::Errno::NOTSUP) => return Ok(None),
            Err(rustix::io::Errno::RANGE) if buf.len() < 64 << 10 => buf.resize(buf.len() * 4, 0),
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_label_reads_as_none() {
        if enabled() {
            return; // Every file is labelled on an SELinux host.
        }
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(file_label(dir.path()).unwrap(), None);
        assert!(file_label(&dir.path().join("missing")).is_err());
    }
}
