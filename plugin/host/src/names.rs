//! Names that become paths: a CSI driver's name is a directory under the kubelet dir
//! (`plugins/kubernetes.io/csi/<driver>/...`) and under a driver's state, so it is checked as the API
//! server checks it before anything is built from it.
//!
//! `ValidateCSIDriverName` (`pkg/apis/core/validation/validation.go`): required, at most 63 bytes, and a
//! DNS-1123 subdomain once lowercased (so `Example.com` is a valid driver name, `../x` and `/tmp/x` are
//! not). The API server applies it to a CSIDriver's name, a PV's `spec.csi.driver`, an inline
//! `csi.driver` and CSINode's drivers; the texts are apimachinery's (`util/validation`,
//! `util/validation/field/errors.go`).

/// `IsDNS1123Subdomain`'s format, as its message quotes it.
const SUBDOMAIN_FORMAT: &str = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

/// A CSI driver name's maximum length (`ValidateCSIDriverName`).
pub const CSI_DRIVER_NAME_MAX: usize = 63;

/// The field errors of `name` as a CSI driver name at `field` (for example `spec.volumes[0].csi.driver`),
/// in the API server's order and words; empty when it is valid. A value is quoted as Go's `%q` would, so
/// a control character in a name cannot reach a terminal raw.
pub fn csi_driver_name_errors(name: &str, field: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if name.is_empty() {
        errors.push(format!("{field}: Required value"));
    }
    if name.len() > CSI_DRIVER_NAME_MAX {
        errors.push(format!(
            "{field}: Too long: may not be more than {CSI_DRIVER_NAME_MAX} bytes"
        ));
    }
    for message in dns1123_subdomain_errors(&name.to_lowercase()) {
        errors.push(format!("{field}: Invalid value: {name:?}: {message}"));
    }
    errors
}

/// `IsDNS1123Subdomain` of apimachinery's `util/validation`: its messages for `value` (none when valid).
pub fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 253 {
        errors.push("must be no more than 253 characters".to_string());
    }
    if !is_dns1123_subdomain(value) {
        errors.push(format!(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{SUBDOMAIN_FORMAT}')"
        ));
    }
    errors
}

/// Whether `value` matches [`SUBDOMAIN_FORMAT`]: dot-separated labels, each of lowercase alphanumerics and
/// '-', starting and ending with an alphanumeric.
fn is_dns1123_subdomain(value: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    value.split('.').all(|label| {
        let bytes = label.as_bytes();
        match (bytes.first(), bytes.last()) {
            (Some(&first), Some(&last)) => {
                alnum(first) && alnum(last) && bytes.iter().all(|&c| alnum(c) || c == b'-')
            }
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_are_checked_as_the_api_server_does() {
        for ok in [
            "local.inlet.dev",
            "Example.COM",
            "a",
            "hostpath.csi.k8s.io",
            &"a".repeat(63),
        ] {
            assert!(csi_driver_name_errors(ok, "f").is_empty(), "{ok}");
        }
        for bad in [
            "../../../../tmp/x",
            "/tmp/x",
            "..",
            ".",
            "a..b",
            "a_b",
            "-a",
            "a-",
            "a/b",
            "a\nb",
        ] {
            let errors = csi_driver_name_errors(bad, "spec.csi.driver");
            assert_eq!(errors.len(), 1, "{bad}: {errors:?}");
            assert!(
                errors[0].starts_with(&format!(
                    "spec.csi.driver: Invalid value: {bad:?}: a lowercase RFC 1123 subdomain"
                )),
                "{}",
                errors[0]
            );
        }
        assert_eq!(
            csi_driver_name_errors("", "name"),
            [
                "name: Required value".to_string(),
                format!(
                    "name: Invalid value: \"\": {}",
                    dns1123_subdomain_errors("")[0]
                )
            ]
        );
        assert_eq!(
            csi_driver_name_errors(&"a".repeat(64), "name"),
            ["name: Too long: may not be more than 63 bytes"]
        );
    }
}
