//! republish/tokens: requiresRepublish, with service account tokens.

use super::*;

pub(super) async fn republish(env: &mut CheckEnv) -> Outcome {
    let publish = one_pod(env, "republish", InlineVolume::named("data")).await?;
    let again = |env: &CheckEnv| env.calls_at("NodePublishVolume", "republish", "data").len() >= 3;
    if !env.sim.wait_for(env.conf.wait, |_| again(env)).await {
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
