//! The kubelet's `preloadedImagesVerificationAllowlist` (KEP-2535): the images `NeverVerifyAllowlistedImages`
//! hands to any pod without proof, as `pkg/kubelet/images/pullmanager/image_pull_policies.go` reads it. An
//! entry is a full image name without tag or digest (`registry.example/team/tool`, matched exactly once the
//! image is normalized), or a prefix ending in `/*` (`registry.example/base/*`). The errors are upstream's
//! where it has one for the case.

/// A parsed allowlist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    names: Vec<String>,
    prefixes: Vec<String>,
}

impl Allowlist {
    /// Parses the entries, refusing the first that is not a full name or a `/*` prefix.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut list = Self::default();
        for entry in entries {
            if entry.trim() != entry {
                return Err(format!("leading/trailing spaces are not allowed: {entry}"));
            }
            let wildcard = || {
                format!(
                    "not a valid wildcard pattern, only patterns ending with '/*' are allowed: {entry}"
                )
            };
            if let Some(prefix) = entry.strip_suffix("/*") {
                if prefix.contains('*') {
                    return Err(wildcard());
                }
                if prefix.is_empty() {
                    return Err("at least registry hostname is required".into());
                }
                list.prefixes.push(format!("{prefix}/"));
                continue;
            }
            if entry.contains('*') {
                return Err(wildcard());
            }
            let last = entry.rsplit('/').next().unwrap_or_default();
            if entry.contains('@') || last.contains(':') {
                return Err(format!(
                    "neither tag nor digest is accepted in an image reference: {entry}"
                ));
            }
            if !entry.contains('/') {
                return Err("at least registry hostname is required".into());
            }
            match image_name(entry) {
                Some(normalized) if normalized == *entry => list.names.push(normalized),
                Some(normalized) => {
                    return Err(format!(
                        "not a fully qualified image name: {entry} (it means {normalized})"
                    ));
                }
                None => return Err(format!("not a valid image name: {entry}")),
            }
        }
        Ok(list)
    }

    /// True when `image` (a reference as pods write it) is allowlisted.
    pub fn matches(&self, image: &str) -> bool {
        let Some(name) = image_name(image) else {
            return false;
        };
        self.names.contains(&name) || self.prefixes.iter().any(|p| name.starts_with(p))
    }
}

/// One entry checked alone, for a command-line parser: the entry, or upstream's error.
pub fn allowlist_entry(entry: &str) -> Result<String, String> {
    Allowlist::parse(&[entry.to_string()]).map(|_| entry.to_string())
}

/// An image's normalized name without tag or digest (`nginx:1` is `docker.io/library/nginx`), as
/// `ParseNormalizedNamed(...).Name()`.
pub(crate) fn image_name(image: &str) -> Option<String> {
    let reference = oci_client::Reference::try_from(image).ok()?;
    Some(format!(
        "{}/{}",
        reference.registry(),
        reference.repository()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Result<Allowlist, String> {
        Allowlist::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn full_names_and_prefixes_match_normalized_images() {
        let allow = list(&["registry.example:5000/team/tool", "docker.io/library/*"]).unwrap();
        assert!(allow.matches("registry.example:5000/team/tool:v1"));
        assert!(allow.matches("registry.example:5000/team/tool@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"));
        assert!(!allow.matches("registry.example:5000/team/tool2:v1"));
        assert!(!allow.matches("registry.example:5000/team:v1"));
        assert!(allow.matches("busybox:1.36"), "docker.io/library/busybox");
        assert!(!allow.matches("docker.io/other/busybox"));
        assert!(!Allowlist::default().matches("busybox"));
    }

    #[test]
    fn entries_that_are_not_full_names_are_refused_in_upstreams_words() {
        let err = |e: &str| list(&[e]).unwrap_err();
        assert_eq!(
            err(" a.io/b"),
            "leading/trailing spaces are not allowed:  a.io/b"
        );
        assert_eq!(
            err("a.io/*/b"),
            "not a valid wildcard pattern, only patterns ending with '/*' are allowed: a.io/*/b"
        );
        assert!(err("a.io/b*").starts_with("not a valid wildcard pattern"));
        assert_eq!(err("/*"), "at least registry hostname is required");
        assert_eq!(err("nginx"), "at least registry hostname is required");
        assert_eq!(
            err("a.io/b:v1"),
            "neither tag nor digest is accepted in an image reference: a.io/b:v1"
        );
        assert!(err("docker.io/nginx").contains("docker.io/library/nginx"));
        list(&["a.io:5000/b/*", "a.io:5000/b"]).unwrap();
    }
}
