//! Steps of persistent inline grants (features/persistent_inline.feature): a PV's grant changed, and pods
//! that reach the API without admission (admitted before a grant was withdrawn, or by another API server).

use cucumber::gherkin::Step;
use cucumber::when;
use inlet_volume::csi::grant::INLINE_NAMESPACES_ANNOTATION;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Secret};
use kubelet_sim::api::ApiPod;
use kubelet_sim::api::manifest::{self, Object};

use super::Sim;

#[when(regex = r#"^the PersistentVolume "([^"]+)" grants its handle to "([^"]*)" only$"#)]
fn grant_changed(w: &mut Sim, pv: String, namespaces: String) {
    let changed = w.sim().api.update::<PersistentVolume>("", &pv, |pv| {
        pv.metadata
            .annotations
            .get_or_insert_default()
            .insert(INLINE_NAMESPACES_ANNOTATION.into(), namespaces);
    });
    assert!(changed, "PersistentVolume {pv} exists");
}

#[when(regex = r"^these pods are created without admission:$")]
fn created_without_admission(w: &mut Sim, step: &Step) {
    let yaml = step.docstring.clone().unwrap_or_default();
    for manifest in manifest::parse(&yaml, "scenario").expect("the scenario's YAML parses") {
        let Object::Pod(mut pod) = manifest.object else {
            panic!("only pods: {}", manifest.origin);
        };
        pod.metadata
            .namespace
            .get_or_insert_with(|| "default".into());
        pod.metadata.uid = Some(uuid::Uuid::new_v4().to_string());
        w.sim().api.put(ApiPod::from(*pod));
    }
    w.remember_uids();
}

#[when(regex = r#"^the namespace "([^"]+)" is deleted$"#)]
async fn namespace_deleted(w: &mut Sim, namespace: String) {
    // What the namespace controller does: every object in it deleted, its Secrets and ConfigMaps at once
    // (nothing orders them after the pods), its pods gracefully.
    let api = std::sync::Arc::clone(&w.sim().api);
    let in_namespace = |ns: &Option<String>| ns.as_deref() == Some(namespace.as_str());
    for secret in api.list::<Secret>() {
        if in_namespace(&secret.metadata.namespace) {
            api.remove::<Secret>(
                &namespace,
                secret.metadata.name.as_deref().unwrap_or_default(),
            );
        }
    }
    for map in api.list::<ConfigMap>() {
        if in_namespace(&map.metadata.namespace) {
            api.remove::<ConfigMap>(&namespace, map.metadata.name.as_deref().unwrap_or_default());
        }
    }
    for pod in api.list::<ApiPod>() {
        if in_namespace(&pod.metadata.namespace) {
            w.sim()
                .delete_pod(&namespace, pod.metadata.name.as_deref().unwrap_or_default());
        }
    }
    let gone = |_: &kubelet_sim::report::Report| {
        !api.list::<ApiPod>()
            .iter()
            .any(|p| in_namespace(&p.metadata.namespace))
    };
    w.wait(&format!("the pods of namespace {namespace} are gone"), gone)
        .await;
}
