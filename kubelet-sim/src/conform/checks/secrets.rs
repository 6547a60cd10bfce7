//! secrets/only-when-referenced: nodePublishSecretRef, from the pod's namespace only.

use super::*;

/// The secrets/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![Check {
        id: "secrets/only-when-referenced",
        expects: "the volume that references a Secret gets its keys, from the pod's namespace only; a \
                  volume without a reference gets none; no other Secret is read; the driver publishes \
                  both",
        source: "csi_mounter.go SetUpAt (nodePublishSecretRef, namespace of the pod); KEP-596 Design 10",
        applies: ephemeral,
        run: |env| Box::pin(secrets(env)),
    }]
}

/// The values of the Secrets the secrets check creates: never shown, even if a driver echoes them.
pub const SECRET_VALUES: [&str; 2] = ["conform-secret-value-1", "conform-secret-value-2"];

pub(super) async fn secrets(env: &mut CheckEnv) -> Outcome {
    env.create(vec![
        Object::Secret(Box::new(CheckEnv::secret(
            NAMESPACE,
            "conform-secret",
            "conform-key",
            SECRET_VALUES[0],
        ))),
        Object::Secret(Box::new(CheckEnv::secret(
            OTHER_NAMESPACE,
            "conform-secret",
            "other-key",
            SECRET_VALUES[1],
        ))),
    ])
    .await?;
    let volumes = [
        InlineVolume {
            secret: Some("conform-secret".into()),
            ..InlineVolume::named("with-secret")
        },
        InlineVolume::named("without"),
    ];
    let pod = env.pod("secrets", &volumes, json!({}));
    env.run_pods(vec![pod]).await?;
    let (mut with, mut without) = (
        env.published("secrets", "with-secret")?,
        env.published("secrets", "without")?,
    );
    // With serviceAccountTokenInSecrets the tokens travel as a secret of every volume.
    for call in [&mut with, &mut without] {
        call.secret_keys.retain(|k| k != TOKENS_KEY);
    }
    if with.secret_keys != ["conform-key"] {
        return Err(format!(
            "the referencing volume got secret keys {:?}, expected [\"conform-key\"]",
            with.secret_keys
        ));
    }
    if !without.secret_keys.is_empty() {
        return Err(format!(
            "the volume without a reference got secret keys {:?}",
            without.secret_keys
        ));
    }
    // Which Secrets a real kubelet read is the API server's audit log's to say, not conform's.
    let note = match env.sim() {
        Ok(sim) => {
            let read = sim.report().secrets_read();
            if read != BTreeSet::from([format!("{NAMESPACE}/conform-secret")]) {
                return Err(format!("the kubelet read the Secrets {read:?}"));
            }
            String::new()
        }
        Err(_) => "which Secrets the kubelet read is not seen on a real node".into(),
    };
    env.nothing_left(&[with.volume_id, without.volume_id])
        .await?;
    Ok(note)
}
