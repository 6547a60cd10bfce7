//! Steps about projected and downwardAPI volumes and service-account tokens: the token on disk reviewed by
//! the embedded API (signature, audience, expiry, bound pod), the clock moved on, labels changed, a service
//! account deleted.

use std::time::Duration;

use cucumber::{then, when};
use k8s_openapi::api::core::v1::ServiceAccount;

use super::Sim;
use super::images::{host_path, split_mount};
use kubelet_sim::api::ApiPod;

fn read_token(w: &Sim, pod: &str, path: &str) -> String {
    let (mount, file) = split_mount(path);
    let host = host_path(w, pod, mount).join(file);
    std::fs::read_to_string(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()))
}

#[when(regex = r"^the clock moves on (\d+) minutes$")]
fn clock_moves(w: &mut Sim, minutes: u64) {
    w.sim()
        .api
        .tokens
        .clock
        .advance(Duration::from_secs(minutes * 60));
}

#[when(regex = r#"^the label "([^"=]+)=([^"]*)" is set on pod "([^"]+)"$"#)]
fn label_set(w: &mut Sim, key: String, value: String, pod: String) {
    let api = &w.sim().api;
    assert!(api.update::<ApiPod>("default", &pod, |p| {
        p.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(key.clone(), value.clone());
    }));
}

#[when(regex = r#"^the service account "([^"/]+)/([^"]+)" is deleted$"#)]
fn service_account_deleted(w: &mut Sim, namespace: String, name: String) {
    let removed = w.sim().api.remove::<ServiceAccount>(&namespace, &name);
    assert!(
        removed.is_some(),
        "service account {namespace}/{name} exists"
    );
}

#[then(
    regex = r#"^the token at "([^"]+)" of pod "([^"]+)" authenticates as "([^"]+)" for audience "([^"]+)", bound to the pod and its node$"#
)]
fn token_authenticates(w: &mut Sim, path: String, pod: String, user: String, audience: String) {
    let token = read_token(w, &pod, &path);
    let claims = w
        .sim()
        .api
        .review_token(&token, &audience)
        .unwrap_or_else(|e| panic!("the token of {pod} was refused: {e}"));
    assert_eq!(claims.sub, user);
    let bound = claims.kubernetes.pod.expect("bound to a pod");
    assert_eq!(bound.name, pod);
    assert_eq!(Some(&bound.uid), w.uids.get(&pod));
    assert!(claims.kubernetes.node.is_some(), "names its node");
}

/// `--service-account-extend-token-expiration`: signed for a year, `warnafter` at the lifetime asked.
#[then(
    regex = r#"^the token at "([^"]+)" of pod "([^"]+)" is signed for a year, warning after (\d+) s$"#
)]
fn token_extended(w: &mut Sim, path: String, pod: String, warn: u64) {
    let token = read_token(w, &pod, &path);
    let audience = kubelet_sim::api::tokens::ISSUER;
    let claims = w
        .sim()
        .api
        .review_token(&token, audience)
        .expect("accepted");
    assert_eq!(claims.exp - claims.iat, 365 * 24 * 3600);
    assert_eq!(
        claims.kubernetes.warnafter.map(|w| w - claims.iat),
        Some(warn)
    );
}

#[then(regex = r#"^the noted token is refused for audience "([^"]+)"$"#)]
fn noted_token_refused(w: &mut Sim, audience: String) {
    let token = w.noted_token.clone().expect("a noted token");
    let refused = w.sim().api.review_token(&token, &audience);
    assert!(refused.is_err(), "accepted: {refused:?}");
}

/// For event texts that carry a UID: a Warning event of the reason whose message starts or ends so.
#[then(regex = r#"^pod "([^"]+)" has a Warning "([^"]+)" event (starting|ending) "(.*)"$"#)]
async fn event_matching(w: &mut Sim, pod: String, reason: String, side: String, text: String) {
    let uid = w.uids.get(&pod).cloned().expect("the pod's UID");
    for _ in 0..300 {
        let found = w.sim().api.events_for(&uid).iter().any(|e| {
            let message = e.message.as_deref().unwrap_or_default();
            e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some(reason.as_str())
                && match side.as_str() {
                    "starting" => message.starts_with(&text),
                    _ => message.ends_with(&text),
                }
        });
        if found {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events: Vec<_> = w
        .sim()
        .api
        .events_for(&uid)
        .into_iter()
        .filter_map(|e| e.message)
        .collect();
    panic!("no Warning {reason} event {side} {text:?}; events: {events:#?}");
}

/// Remembers the token, to compare with what the next step finds.
#[then(regex = r#"^the token at "([^"]+)" of pod "([^"]+)" is noted$"#)]
fn token_noted(w: &mut Sim, path: String, pod: String) {
    let token = read_token(w, &pod, &path);
    w.noted_token = Some(token);
}

/// Several republish periods pass; the file must still hold the noted token.
#[then(regex = r#"^the token at "([^"]+)" of pod "([^"]+)" stays the noted one$"#)]
async fn token_stays(w: &mut Sim, path: String, pod: String) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let token = read_token(w, &pod, &path);
    assert_eq!(Some(&token), w.noted_token.as_ref(), "the token changed");
}

#[then(regex = r#"^the token at "([^"]+)" of pod "([^"]+)" comes to change$"#)]
async fn token_changes(w: &mut Sim, path: String, pod: String) {
    for _ in 0..200 {
        if Some(&read_token(w, &pod, &path)) != w.noted_token.as_ref() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the token at {path} of {pod} never changed");
}

#[then(regex = r#"^pod "([^"]+)" has a projected volume "kube-api-access-" and 5 characters$"#)]
fn has_token_volume(w: &mut Sim, pod: String) {
    let names = token_volumes(w, &pod);
    assert_eq!(names.len(), 1, "{names:?}");
    let suffix = names[0].strip_prefix("kube-api-access-").unwrap();
    assert_eq!(suffix.len(), 5, "{}", names[0]);
    assert!(
        suffix
            .chars()
            .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
    );
}

#[then(regex = r#"^pod "([^"]+)" has no service account token volume$"#)]
fn has_no_token_volume(w: &mut Sim, pod: String) {
    assert_eq!(token_volumes(w, &pod), Vec::<String>::new());
}

fn token_volumes(w: &Sim, pod: &str) -> Vec<String> {
    let pod = w.sim().api.peek::<ApiPod>("default", pod).expect("the pod");
    pod.volumes()
        .iter()
        .filter(|v| v.projected().is_some() && v.name().starts_with("kube-api-access-"))
        .map(|v| v.name().to_string())
        .collect()
}

#[then(regex = r#"^pod "([^"]+)" reads a PEM certificate at "([^"]+)"$"#)]
fn reads_pem(w: &mut Sim, pod: String, path: String) {
    let body = read_token(w, &pod, &path);
    assert!(body.starts_with("-----BEGIN CERTIFICATE-----\n"), "{body}");
}
