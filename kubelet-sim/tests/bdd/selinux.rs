//! Steps of `selinux_mount.feature`: the SELinux context a volume is mounted with (KEP-1710).

use cucumber::{given, then};

use super::Sim;

#[given(regex = r"^the node runs SELinux$")]
fn selinux(w: &mut Sim) {
    w.selinux = true;
}

/// The context flag of the calls of `method` for `handle` (there must be at least one call).
fn context_flags(w: &Sim, method: &str, handle: &str) -> Vec<String> {
    let calls: Vec<_> = w
        .report()
        .csi_calls
        .into_iter()
        .filter(|c| c.method == method && c.volume_id == handle)
        .collect();
    assert!(!calls.is_empty(), "no {method} call for handle {handle}");
    calls
        .into_iter()
        .flat_map(|c| c.mount_flags)
        .filter(|f| f.starts_with("context="))
        .collect()
}

#[then(regex = r#"^the (\w+) call for handle "([^"]+)" has the mount flag (.+)$"#)]
fn has_flag(w: &mut Sim, method: String, handle: String, flag: String) {
    let flags = context_flags(w, &method, &handle);
    assert!(flags.contains(&flag), "{method} of {handle}: {flags:?}");
}

#[then(regex = r#"^the (\w+) call for handle "([^"]+)" has no context mount flag$"#)]
fn no_flag(w: &mut Sim, method: String, handle: String) {
    let flags = context_flags(w, &method, &handle);
    assert!(flags.is_empty(), "{method} of {handle}: {flags:?}");
}

#[then(regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has no context mount flag$"#)]
fn publish_no_flag(w: &mut Sim, volume: String, pod: String) {
    let call = w.publish_of(&pod, &volume);
    assert!(
        !call.mount_flags.iter().any(|f| f.starts_with("context=")),
        "{call:#?}"
    );
}
