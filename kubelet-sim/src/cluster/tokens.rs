//! Service-account tokens from the real API server: its TokenRequest
//! (`serviceaccounts/<name>/token`), bound to the pod, as the kubelet's token manager asks for them. The
//! Node authorizer lets a node ask only for the service accounts of pods bound to it, and NodeRestriction
//! only for tokens bound to such a pod.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use inlet_volume::TokenRequestArgs;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::tokens::{IssuedToken, TokenIssuer};

/// TokenRequest on the cluster's API server.
pub struct ClusterTokens {
    /// The client.
    pub client: kube::Client,
}

#[async_trait]
impl TokenIssuer for ClusterTokens {
    async fn create_token(&self, request: &TokenRequestArgs) -> Result<IssuedToken, String> {
        let accounts =
            kube::Api::<ServiceAccount>::namespaced(self.client.clone(), &request.namespace);
        let audiences = match request.audience.as_str() {
            "" => Vec::new(),
            audience => vec![audience.to_string()],
        };
        let body = TokenRequest {
            metadata: ObjectMeta::default(),
            spec: TokenRequestSpec {
                audiences,
                expiration_seconds: request.expiration_seconds,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(request.pod.0.clone()),
                    uid: Some(request.pod.1.clone()),
                }),
            },
            status: None,
        };
        let answer = accounts
            .create_token_request(&request.service_account, &Default::default(), &body)
            .await
            .map_err(|e| match e {
                kube::Error::Api(status) => status.message,
                other => other.to_string(),
            })?;
        let status = answer
            .status
            .ok_or("the API server's TokenRequest has no status")?;
        let expires = UNIX_EPOCH
            + Duration::from_secs(status.expiration_timestamp.0.as_second().max(0) as u64);
        let granted = answer.spec.expiration_seconds.unwrap_or_else(|| {
            // What the API server granted is what is left from now.
            let left = expires
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            left.as_secs() as i64
        });
        Ok(IssuedToken {
            token: status.token,
            expires,
            expiration_seconds: granted,
        })
    }
}
