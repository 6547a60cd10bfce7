//! republish/tokens: requiresRepublish, with service account tokens.

use super::*;

/// The republish/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![Check {
        id: "republish/tokens",
        expects: "with requiresRepublish the driver is published again every period and answers OK each \
                  time, with the service account tokens of tokenRequests, without mounting again",
        source: "storage/v1 CSIDriverSpec requiresRepublish, tokenRequests, \
                 serviceAccountTokenInSecrets; csi_mounter.go SetUpAt \
                 (csi.storage.k8s.io/serviceAccount.tokens)",
        applies: |c| {
            ephemeral(c)?;
            service_account_tokens(c)?;
            if c.info.csi_driver.spec.requires_republish == Some(true) {
                Ok(())
            } else {
                Err("the CSIDriver does not set requiresRepublish".into())
            }
        },
        run: |env| Box::pin(republish::republish(env)),
    }]
}

pub(super) async fn republish(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "republish", InlineVolume::named("data")).await?;
    let again = |env: &CheckEnv| env.calls_at("NodePublishVolume", "republish", "data").len() >= 3;
    if !env.until(again).await {
        return Err("NodePublishVolume was not called again (requiresRepublish)".into());
    }
    all_ok(env, "NodePublishVolume", "republish", "data")?;
    let spec = &env.conf.info.csi_driver.spec;
    let in_secrets = spec.service_account_token_in_secrets == Some(true);
    if spec.token_requests.as_ref().is_some_and(|t| !t.is_empty()) {
        for call in env.calls_at("NodePublishVolume", "republish", "data") {
            let carried = if in_secrets {
                call.secret_keys.iter().any(|k| k == TOKENS_KEY)
            } else {
                call.volume_context.contains_key(TOKENS_KEY)
            };
            if !carried {
                return Err(format!("a republish carried no {TOKENS_KEY}"));
            }
        }
    }
    let target = env.target("republish", "data");
    if env.conf.mounter.1 && mounts_at(&target) > 1 {
        return Err(format!(
            "republishing mounted again: {} mounts",
            mounts_at(&target)
        ));
    }
    env.running("republish").await?;
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(String::new())
}
