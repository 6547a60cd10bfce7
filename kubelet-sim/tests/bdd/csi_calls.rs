//! Steps about the CSI calls a driver got: which, how often, with what capabilities, contexts and paths.

use super::*;

// ---- Then: CSI calls ----

#[then(regex = r#"^the driver got (\w+) for volume "([^"]+)" of pod "([^"]+)"$"#)]
async fn got_call(w: &mut Sim, method: String, volume: String, pod: String) {
    let dir = format!(
        "/pods/{}/volumes/kubernetes.io~csi/{volume}/mount",
        w.uid(&pod)
    );
    w.wait(&format!("{method} for {pod}/{volume}"), |r| {
        r.csi_calls
            .iter()
            .any(|c| c.method == method && c.target_path.ends_with(&dir))
    })
    .await;
}

#[then(
    regex = r#"^the driver got (\w+) for volume "([^"]+)" of pod "([^"]+)" at least (\d+) times$"#
)]
async fn got_calls(w: &mut Sim, method: String, volume: String, pod: String, times: usize) {
    let dir = format!(
        "/pods/{}/volumes/kubernetes.io~csi/{volume}/mount",
        w.uid(&pod)
    );
    w.wait(&format!("{times} {method} for {pod}/{volume}"), |r| {
        r.csi_calls
            .iter()
            .filter(|c| c.method == method && c.target_path.ends_with(&dir))
            .count()
            >= times
    })
    .await;
}

#[then(regex = r#"^pod "([^"]+)" got no Warning event$"#)]
fn no_warning(w: &mut Sim, pod: String) {
    let events = w.sim().api.events_for(&w.uid(&pod));
    let warnings: Vec<_> = events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| (&e.reason, &e.message))
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[then(regex = r#"^the driver got no (\w+) for volume "([^"]+)" of pod "([^"]+)"$"#)]
fn got_no_call(w: &mut Sim, method: String, volume: String, pod: String) {
    let calls = w.calls_for(&method, &pod, &volume);
    assert!(calls.is_empty(), "unexpected {method}: {calls:#?}");
}

#[then(regex = r#"^the driver got no (\w+) calls?$"#)]
fn no_call(w: &mut Sim, method: String) {
    let calls: Vec<CsiCall> = w
        .report()
        .csi_calls
        .into_iter()
        .filter(|c| c.method == method)
        .collect();
    assert!(calls.is_empty(), "unexpected {method}: {calls:#?}");
}

#[then(regex = r#"^the driver got (\w+) for handle "([^"]+)" (\d+) times?$"#)]
fn call_count(w: &mut Sim, method: String, handle: String, times: usize) {
    let n = w
        .report()
        .csi_calls
        .iter()
        .filter(|c| c.method == method && c.volume_id == handle && c.code == "OK")
        .count();
    assert_eq!(
        n,
        times,
        "{method} for {handle}: {:#?}",
        w.report().csi_calls
    );
}

#[then(
    regex = r#"^every (\w+) call for handle "([^"]+)" has (access mode|volume mount group) "([^"]*)"$"#
)]
fn call_capability(w: &mut Sim, method: String, handle: String, field: String, value: String) {
    let calls: Vec<CsiCall> = w
        .report()
        .csi_calls
        .into_iter()
        .filter(|c| c.method == method && c.volume_id == handle)
        .collect();
    assert!(!calls.is_empty(), "no {method} for {handle}");
    for call in &calls {
        let got = match field.as_str() {
            "access mode" => &call.access_mode,
            _ => &call.volume_mount_group,
        };
        assert_eq!(got, &value, "{field} of {call:#?}");
    }
}

#[then(regex = r#"^the driver published "([^"]+)" of pod "([^"]+)" at least (\d+) times$"#)]
async fn published_times(w: &mut Sim, volume: String, pod: String, times: usize) {
    let dir = format!(
        "/pods/{}/volumes/kubernetes.io~csi/{volume}/mount",
        w.uid(&pod)
    );
    w.wait(&format!("{pod}/{volume} published {times} times"), |r| {
        r.csi_calls
            .iter()
            .filter(|c| {
                c.method == "NodePublishVolume" && c.code == "OK" && c.target_path.ends_with(&dir)
            })
            .count()
            >= times
    })
    .await;
}

#[then(
    regex = r#"^the volume id of "([^"]+)" in pod "([^"]+)" is csi- and the sha256 of the pod UID and the volume name$"#
)]
fn handle_formula(w: &mut Sim, volume: String, pod: String) {
    let call = w.publish_of(&pod, &volume);
    assert_eq!(
        call.volume_id,
        ephemeral_volume_handle(&w.uid(&pod), &volume)
    );
    assert_eq!(call.volume_id.len(), 68);
}

#[then(regex = r#"^pods "([^"]+)" and "([^"]+)" got different volume ids for "([^"]+)"$"#)]
fn different_handles(w: &mut Sim, a: String, b: String, volume: String) {
    assert_ne!(
        w.publish_of(&a, &volume).volume_id,
        w.publish_of(&b, &volume).volume_id
    );
}

#[then(
    regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has volume context "([^"]+)" = "([^"]*)"$"#
)]
fn context_has(w: &mut Sim, volume: String, pod: String, key: String, value: String) {
    let call = w.publish_of(&pod, &volume);
    assert_eq!(
        call.volume_context.get(&key),
        Some(&value),
        "{:#?}",
        call.volume_context
    );
}

#[then(
    regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has no volume context key starting with "([^"]+)"$"#
)]
fn context_lacks(w: &mut Sim, volume: String, pod: String, prefix: String) {
    let call = w.publish_of(&pod, &volume);
    assert!(
        !call.volume_context.keys().any(|k| k.starts_with(&prefix)),
        "{:#?}",
        call.volume_context
    );
}

#[then(regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" is (read-only|read-write)$"#)]
fn publish_readonly(w: &mut Sim, volume: String, pod: String, mode: String) {
    assert_eq!(w.publish_of(&pod, &volume).readonly, mode == "read-only");
}

#[then(regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has the staging path (empty|set)$"#)]
fn publish_staging(w: &mut Sim, volume: String, pod: String, state: String) {
    let call = w.publish_of(&pod, &volume);
    assert_eq!(call.staging_path.is_empty(), state == "empty", "{call:#?}");
    if state == "empty" {
        assert!(
            call.publish_context.is_empty(),
            "an ephemeral publish has no publish context"
        );
    }
}

#[then(regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has secret keys "([^"]*)"$"#)]
fn publish_secret_keys(w: &mut Sim, volume: String, pod: String, keys: String) {
    let expected: Vec<String> = keys
        .split(',')
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(w.publish_of(&pod, &volume).secret_keys, expected);
}

#[then(
    regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has a token for audience "([^"]*)" expiring on a whole second, RFC 3339 in UTC$"#
)]
fn token_expiry(w: &mut Sim, volume: String, pod: String, audience: String) {
    let call = w.publish_of(&pod, &volume);
    let tokens = &call.volume_context["csi.storage.k8s.io/serviceAccount.tokens"];
    let tokens: serde_json::Value = serde_json::from_str(tokens).expect("tokens are JSON");
    assert_eq!(tokens[&audience]["token"], "<redacted>", "{tokens}");
    let expiry = tokens[&audience]["expirationTimestamp"]
        .as_str()
        .expect("an expirationTimestamp");
    // `2026-12-01T16:00:00Z`: no fraction, UTC.
    let parsed = expiry.parse::<k8s_openapi::jiff::Timestamp>();
    assert!(
        parsed.is_ok() && expiry.len() == 20 && expiry.ends_with('Z'),
        "{expiry} is not metav1.Time's form"
    );
}

#[then(regex = r"^no report, log or call carries a secret value$")]
fn no_secret_values(w: &mut Sim) {
    let report = serde_json::to_string(&w.report()).expect("json");
    for value in ["s3cr3t-password", "sim-token-"] {
        assert!(!report.contains(value), "the report contains {value:?}");
    }
}

#[then(regex = r#"^the (\w+) call for handle "([^"]+)" has secret keys "([^"]*)"$"#)]
fn call_secret_keys(w: &mut Sim, method: String, handle: String, keys: String) {
    let expected: Vec<String> = keys
        .split(',')
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect();
    let report = w.report();
    let call = report
        .csi_calls
        .iter()
        .find(|c| c.method == method && c.volume_id == handle && c.code == "OK");
    assert_eq!(
        call.map(|c| c.secret_keys.clone()),
        Some(expected),
        "{:#?}",
        report.csi_calls
    );
}
