//! Names the kubelet computes for CSI volumes (`pkg/volume/csi/csi_mounter.go`, `csi_attacher.go`).

use sha2::{Digest, Sha256};

fn sha256_hex(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// An ephemeral inline volume's handle: `csi-` + hex sha256 of the pod UID immediately followed by the
/// volume name (no separator). Stable, so it can be recomputed; unique per pod, so two pods from one
/// template get different volumes, and not guessable across users.
pub fn ephemeral_volume_handle(pod_uid: &str, volume_name: &str) -> String {
    format!("csi-{}", sha256_hex(&[pod_uid, volume_name]))
}

/// A VolumeAttachment's name: `csi-` + sha256(volume handle + driver + node). Pods on one node that use the
/// same handle share it.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", sha256_hex(&[volume_handle, driver, node]))
}

/// The directory under `plugins/kubernetes.io/csi/<driver>/` a persistent volume is staged in: the hex
/// sha256 of its handle (modern kubelets; the handle itself may not be a valid file name).
pub fn staging_dir_name(volume_handle: &str) -> String {
    sha256_hex(&[volume_handle])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_follow_the_upstream_formula() {
        let handle = ephemeral_volume_handle("f7c3f4b2-uid", "scratch");
        assert_eq!(handle.len(), 68);
        assert!(handle.starts_with("csi-"));
        // sha256("f7c3f4b2-uidscratch"): the two strings are concatenated with nothing between.
        assert_eq!(
            handle,
            format!("csi-{}", sha256_hex(&["f7c3f4b2-uidscratch"]))
        );
        assert_ne!(
            handle,
            ephemeral_volume_handle("other-uid", "scratch"),
            "each pod gets its own volume"
        );
        assert_eq!(
            sha256_hex(&["abc"]),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "plain sha256"
        );
        assert_eq!(
            attachment_name("h", "d", "n"),
            format!("csi-{}", sha256_hex(&["hdn"]))
        );
    }
}
