//! Who may use a persistent inline volume (gate `PersistentInlineCSI`): the PersistentVolume of the same
//! driver and handle grants it to namespaces, and nothing else does.
//!
//! The 2019 draft let any pod name any pre-provisioned volume by its handle: a pod in `team-b` could
//! attach and mount a volume made for `team-a` (or for nobody), since a handle is not a secret. Here the
//! volume's owner, the cluster admin who made the PV, decides: the PV lists the namespaces that may use its
//! handle inline (`inlet.dev/inline-namespaces`, comma-separated; upstream, a field of
//! `CSIPersistentVolumeSource`), and a PV bound to a claim belongs to that claim's namespace and grants
//! nothing. Admission refuses a pod the grant does not cover, and the kubelet side and the attach/detach
//! controller check again before attach, stage and publish (defence in depth: a pod admitted before a
//! grant was withdrawn, or through another API server). The attach and stage secrets are the PV's, so the
//! attacher reads only secrets a PV names, as for any PV, and a namespace deleted while its pod's volume is
//! attached cannot strand the detach. kep/596-inline-csi-volume-plugin/README.md defends the model.

use k8s_openapi::api::core::v1::PersistentVolume;

/// The PV annotation that names the namespaces a PV's handle may be used from inline.
pub const INLINE_NAMESPACES_ANNOTATION: &str = "inlet.dev/inline-namespaces";

/// The namespaces `pv` grants its handle to inline; empty when it grants none.
pub fn granted_namespaces(pv: &PersistentVolume) -> Vec<&str> {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INLINE_NAMESPACES_ANNOTATION))
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The PV among `pvs` (every PV of the cluster, or those of `driver` and `handle`) that grants volume
/// `handle` of `driver` to `namespace`, or why none does, in words a pod's event or refusal can carry.
pub fn granting_pv<'a>(
    pvs: impl IntoIterator<Item = &'a PersistentVolume>,
    driver: &str,
    handle: &str,
    namespace: &str,
) -> Result<&'a PersistentVolume, String> {
    let matching: Vec<&PersistentVolume> = pvs
        .into_iter()
        .filter(|pv| {
            let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
            csi.is_some_and(|c| c.driver == driver && c.volume_handle == handle)
        })
        .collect();
    let pv = match matching.as_slice() {
        [] => {
            return Err(format!(
                "no PersistentVolume of driver {driver:?} has volume handle {handle:?}: a persistent inline volume must be granted by one"
            ));
        }
        [pv] => *pv,
        several => {
            let names: Vec<&str> = several
                .iter()
                .filter_map(|pv| pv.metadata.name.as_deref())
                .collect();
            return Err(format!(
                "PersistentVolumes {} all have volume handle {handle:?} of driver {driver:?}: a persistent inline volume must be granted by exactly one",
                names.join(", ")
            ));
        }
    };
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    if let Some(claim) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
        return Err(format!(
            "PersistentVolume {name:?} is bound to claim {}/{}: its volume is that claim's, not granted inline",
            claim.namespace.as_deref().unwrap_or_default(),
            claim.name.as_deref().unwrap_or_default()
        ));
    }
    let granted = granted_namespaces(pv);
    if !granted.contains(&namespace) {
        let list = match granted.is_empty() {
            true => "none".to_string(),
            false => granted.join(", "),
        };
        return Err(format!(
            "PersistentVolume {name:?} does not grant volume handle {handle:?} to namespace {namespace:?} (granted: {list})"
        ));
    }
    Ok(pv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        CSIPersistentVolumeSource, ObjectReference, PersistentVolumeSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pv(name: &str, handle: &str, granted: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: granted
                    .map(|g| [(INLINE_NAMESPACES_ANNOTATION.to_string(), g.to_string())].into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: "d.example.com".into(),
                    volume_handle: handle.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_pv_of_the_handle_grants_it_and_only_to_the_namespaces_it_names() {
        let pvs = [
            pv("payroll", "h1", Some("team-a, team-c")),
            pv("open", "h2", None),
        ];
        let grant = |handle: &str, ns: &str| granting_pv(&pvs, "d.example.com", handle, ns);
        assert_eq!(
            grant("h1", "team-a").unwrap().metadata.name.as_deref(),
            Some("payroll")
        );
        assert!(grant("h1", "team-c").is_ok());
        assert_eq!(
            grant("h1", "team-b").unwrap_err(),
            "PersistentVolume \"payroll\" does not grant volume handle \"h1\" to namespace \"team-b\" (granted: team-a, team-c)"
        );
        assert!(
            grant("h2", "team-a")
                .unwrap_err()
                .contains("(granted: none)")
        );
        assert!(
            grant("h3", "team-a")
                .unwrap_err()
                .starts_with("no PersistentVolume")
        );
        assert!(granting_pv(&pvs, "other.example.com", "h1", "team-a").is_err());
    }

    #[test]
    fn a_bound_pv_or_two_pvs_of_one_handle_grant_nothing() {
        let mut bound = pv("bound", "h1", Some("team-a"));
        bound.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: Some("team-a".into()),
            name: Some("data".into()),
            ..Default::default()
        });
        assert!(
            granting_pv([&bound], "d.example.com", "h1", "team-a")
                .unwrap_err()
                .contains("is bound to claim team-a/data")
        );
        let twins = [pv("a", "h1", Some("team-a")), pv("b", "h1", Some("team-a"))];
        assert!(
            granting_pv(&twins, "d.example.com", "h1", "team-a")
                .unwrap_err()
                .contains("exactly one")
        );
    }
}
