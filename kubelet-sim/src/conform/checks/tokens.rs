//! tokens/*: service account tokens the CSIDriver asks for (`tokenRequests`), without republish (e2e
//! `csimock/csi_service_account_token.go`; republish/tokens covers requiresRepublish).

use super::*;

/// The tokens/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![Check {
        id: "tokens/audiences",
        expects: "with tokenRequests for two audiences (one the API server's, \"\") the driver is published \
                  once with csi.storage.k8s.io/serviceAccount.tokens holding a token and its expiry for each \
                  audience, and runs the pod",
        source: "e2e csimock/csi_service_account_token.go; storage/v1 CSIDriverSpec tokenRequests; \
                 csi_mounter.go SetUpAt (podServiceAccountTokenAttrs)",
        applies: |c| ephemeral(c).and(service_account_tokens(c)),
        run: |env| Box::pin(audiences(env)),
    }]
}

/// The audience the check asks for besides the API server's.
const AUDIENCE: &str = "conform.inlet.dev";

async fn audiences(env: &mut CheckEnv) -> Outcome {
    env.edit_csi_driver(|spec| {
        spec.token_requests = Some(vec![
            k8s_openapi::api::storage::v1::TokenRequest {
                audience: AUDIENCE.into(),
                expiration_seconds: Some(3600),
            },
            k8s_openapi::api::storage::v1::TokenRequest {
                audience: String::new(),
                expiration_seconds: None,
            },
        ]);
        spec.requires_republish = Some(false);
    })
    .await?;
    let publish = one_pod(env, "tokens", InlineVolume::named("data")).await?;
    let in_secrets = env
        .conf
        .info
        .csi_driver
        .spec
        .service_account_token_in_secrets
        == Some(true);
    let note = if in_secrets {
        // Only the secrets' key names are kept: the audiences cannot be looked at.
        if !publish.secret_keys.iter().any(|k| k == TOKENS_KEY) {
            return Err(format!(
                "no {TOKENS_KEY} in the secrets (serviceAccountTokenInSecrets)"
            ));
        }
        "the tokens travel in the secrets (serviceAccountTokenInSecrets): their audiences are not looked at"
            .to_string()
    } else {
        let tokens = publish
            .volume_context
            .get(TOKENS_KEY)
            .ok_or_else(|| format!("no {TOKENS_KEY} in volume_context"))?;
        let tokens: BTreeMap<String, serde_json::Value> = serde_json::from_str(tokens)
            .map_err(|e| format!("{TOKENS_KEY} is not a JSON object of audiences: {e}"))?;
        for audience in [AUDIENCE, ""] {
            let token = tokens
                .get(audience)
                .ok_or_else(|| format!("{TOKENS_KEY} has no token for audience {audience:?}"))?;
            if token.get("token").is_none() || token.get("expirationTimestamp").is_none() {
                return Err(format!(
                    "the token for audience {audience:?} lacks token or expirationTimestamp"
                ));
            }
        }
        String::new()
    };
    let published = env.calls_at("NodePublishVolume", "tokens", "data");
    let published = published.iter().filter(|c| c.code == "OK").count();
    if published != 1 {
        return Err(format!(
            "NodePublishVolume was answered OK {published} times without requiresRepublish"
        ));
    }
    env.nothing_left(&[publish.volume_id]).await?;
    Ok(note)
}
