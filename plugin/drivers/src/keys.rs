//! The volume-context keys every driver here reads: the kubelet's and external-provisioner's.

/// The volume-context key the kubelet sets on inline ephemeral volumes (`csi.storage.k8s.io/ephemeral`).
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";
/// Keys under this prefix are set by the kubelet or external-provisioner and are always accepted.
pub const KUBERNETES_KEY_PREFIX: &str = "csi.storage.k8s.io/";
