//! The embedded API's service-account tokens and root CA, as a 1.21+ API server has them:
//!
//! - TokenRequest (`pkg/registry/core/serviceaccount/storage/token.go`): a JWT signed with the API's own
//!   key (ES256), with the claims `pkg/serviceaccount/claims.go` gives a token bound to a pod (`iss`,
//!   `sub`, `aud`, `iat`, `nbf`, `exp`, `jti`, and `kubernetes.io` naming the namespace, service account,
//!   pod and node), refused as the API server refuses it (no such service account or pod, a pod of another
//!   UID, a lifetime under 10 minutes). [`Api::review_token`] checks one as TokenReview would.
//! - The root CA certificate the root-ca-cert-publisher puts in every namespace's `kube-root-ca.crt`.
//! - A clock the simulation can move ([`SimClock`]), so token lifetimes are tested without waiting.
//!
//! With `--kubeconfig` the tokens come from the real API server instead ([`TokenIssuer`]).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use inlet_volume::TokenRequestArgs;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use k8s_openapi::api::core::v1::ServiceAccount;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use super::{Api, ApiPod};

/// The issuer and default audience of the embedded API's tokens, as a cluster's `--service-account-issuer`
/// and `--api-audiences` commonly are.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// A TokenRequest's lifetime when it names none (the API's default).
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// The lifetime of a `kube-api-access` token (`WarnOnlyBoundTokenExpirationSeconds`), and what it is
/// signed for (`ExpirationExtensionSeconds`, a year).
const WARN_ONLY_EXPIRATION_SECONDS: i64 = 3607;
const EXTENDED_EXPIRATION_SECONDS: u64 = 365 * 24 * 3600;
/// The shortest lifetime the API accepts (`validation.ValidateTokenRequest`).
const MIN_EXPIRATION_SECONDS: i64 = 600;

/// A token as TokenRequest's status gives it.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// The token. Never logged or reported.
    pub token: String,
    /// `status.expirationTimestamp`.
    pub expires: SystemTime,
    /// `spec.expirationSeconds` as the API server granted it.
    pub expiration_seconds: i64,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("token", &"<redacted>")
            .field("expires", &self.expires)
            .finish()
    }
}

/// Where tokens come from when not from the embedded API: the real API server's TokenRequest.
#[async_trait]
pub trait TokenIssuer: Send + Sync {
    /// Requests a token; the error is the API server's.
    async fn create_token(&self, request: &TokenRequestArgs) -> Result<IssuedToken, String>;
}

/// The wall clock, moved on by [`SimClock::advance`] (scenarios that test token lifetimes).
#[derive(Debug, Default)]
pub struct SimClock {
    skew: RwLock<Duration>,
}

impl SimClock {
    /// Now, as the simulation sees it.
    pub fn now(&self) -> SystemTime {
        SystemTime::now() + *self.skew.read()
    }

    /// Moves the clock on by `by`.
    pub fn advance(&self, by: Duration) {
        *self.skew.write() += by;
    }
}

/// The embedded API's keys, made on first use.
struct Keys {
    signing: EncodingKey,
    verifying: DecodingKey,
    key_id: String,
    root_ca_pem: String,
}

/// The API's token authority: its keys, its clock, and the issuer that replaces it for a real cluster.
#[derive(Default)]
pub struct Tokens {
    keys: OnceLock<Result<Keys, String>>,
    /// The simulation's clock.
    pub clock: SimClock,
    remote: RwLock<Option<Arc<dyn TokenIssuer>>>,
}

/// The claims of a bound service-account token (`claims.go`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Issuer.
    pub iss: String,
    /// `system:serviceaccount:<namespace>:<name>`.
    pub sub: String,
    /// Audiences.
    pub aud: Vec<String>,
    /// Issued at, not before, expires (seconds since the epoch).
    pub iat: u64,
    /// See `iat`.
    pub nbf: u64,
    /// See `iat`.
    pub exp: u64,
    /// The token's ID.
    pub jti: String,
    /// What the token is bound to.
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaims,
}

/// The private `kubernetes.io` claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaims {
    /// The service account's namespace.
    pub namespace: String,
    /// The service account.
    pub serviceaccount: Ref,
    /// The pod it is bound to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<Ref>,
    /// The pod's node (ServiceAccountTokenPodNodeInfo, GA in 1.32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<Ref>,
    /// When a token signed for a year should have been replaced (`warnafter`: the extended
    /// `kube-api-access` tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warnafter: Option<u64>,
}

/// A name and UID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    /// Name.
    pub name: String,
    /// UID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

fn seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

impl Tokens {
    fn keys(&self) -> Result<&Keys, String> {
        self.keys
            .get_or_init(make_keys)
            .as_ref()
            .map_err(|e| e.clone())
    }

    /// The root CA certificate (PEM) published as `kube-root-ca.crt`'s `ca.crt`.
    pub fn root_ca_pem(&self) -> Result<String, String> {
        Ok(self.keys()?.root_ca_pem.clone())
    }

    /// Has tokens come from `issuer` from now on (the real API server of `--kubeconfig`).
    pub fn use_issuer(&self, issuer: Arc<dyn TokenIssuer>) {
        *self.remote.write() = Some(issuer);
    }

    fn remote(&self) -> Option<Arc<dyn TokenIssuer>> {
        self.remote.read().clone()
    }
}

fn make_keys() -> Result<Keys, String> {
    let bad = |e: rcgen::Error| format!("making the API's keys: {e}");
    let signing = rcgen::KeyPair::generate().map_err(bad)?;
    let key_id = {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(rcgen::PublicKeyData::subject_public_key_info(&signing));
        base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, digest)
    };
    let ca_key = rcgen::KeyPair::generate().map_err(bad)?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(bad)?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kubelet-sim-ca");
    let ca = params.self_signed(&ca_key).map_err(bad)?;
    Ok(Keys {
        signing: EncodingKey::from_ec_der(&signing.serialize_der()),
        verifying: DecodingKey::from_ec_der(signing.public_key_raw()),
        key_id,
        root_ca_pem: ca.pem(),
    })
}

impl Api {
    /// The TokenRequest API (`serviceaccounts/<name>/token`): a token for `request`'s service account,
    /// bound to its pod, from the real API server when one is in use, else signed here.
    pub async fn create_token(&self, request: &TokenRequestArgs) -> Result<IssuedToken, String> {
        match self.tokens.remote() {
            Some(remote) => remote.create_token(request).await,
            None => self.issue_token(request),
        }
    }

    /// The embedded API's TokenRequest.
    fn issue_token(&self, request: &TokenRequestArgs) -> Result<IssuedToken, String> {
        let namespace = &request.namespace;
        // The account first, then the request's validation (its object has no name), then the pod.
        let account = self
            .get_recorded::<ServiceAccount>(namespace, &request.service_account)
            .ok_or_else(|| format!("serviceaccounts {:?} not found", request.service_account))?;
        let expiration_seconds = request
            .expiration_seconds
            .unwrap_or(DEFAULT_EXPIRATION_SECONDS);
        if expiration_seconds < MIN_EXPIRATION_SECONDS {
            return Err(format!(
                "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: {expiration_seconds}: may not specify a duration less than 10 minutes"
            ));
        }
        if expiration_seconds > 1 << 32 {
            return Err(format!(
                "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: {expiration_seconds}: may not specify a duration larger than 2^32 seconds"
            ));
        }
        let (pod_name, pod_uid) = &request.pod;
        let pod = self
            .peek::<ApiPod>(namespace, pod_name)
            .ok_or_else(|| format!("pods {pod_name:?} not found"))?;
        if pod.metadata.uid.as_deref() != Some(pod_uid) {
            return Err(format!(
                "Operation cannot be fulfilled on Pod {pod_name:?}: the UID in the bound object reference ({pod_uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ));
        }
        let spec = pod.spec.as_ref();
        if spec.and_then(|s| s.service_account_name.as_deref()) != Some(&request.service_account) {
            return Err(format!(
                "cannot bind token for serviceaccount {:?} to pod running with different serviceaccount name.",
                request.service_account
            ));
        }
        let node = spec.and_then(|s| s.node_name.clone());
        let now = self.tokens.clock.now();
        let expires = now + Duration::from_secs(expiration_seconds as u64);
        // `--service-account-extend-token-expiration` (on by default): a kube-api-access token (3607 s,
        // the API's own audiences) is signed for a year, and `warnafter` marks its 3607 s; the status
        // still says 3607 s, so kubelets rotate it on time.
        let extended =
            expiration_seconds == WARN_ONLY_EXPIRATION_SECONDS && request.audience.is_empty();
        let signed_until = match extended {
            true => now + Duration::from_secs(EXTENDED_EXPIRATION_SECONDS),
            false => expires,
        };
        let audiences = match request.audience.as_str() {
            "" => vec![ISSUER.to_string()],
            audience => vec![audience.to_string()],
        };
        let claims = Claims {
            iss: ISSUER.into(),
            sub: format!(
                "system:serviceaccount:{namespace}:{}",
                request.service_account
            ),
            aud: audiences,
            iat: seconds(now),
            nbf: seconds(now),
            exp: seconds(signed_until),
            jti: uuid::Uuid::new_v4().to_string(),
            kubernetes: KubernetesClaims {
                namespace: namespace.clone(),
                serviceaccount: Ref {
                    name: request.service_account.clone(),
                    uid: account.metadata.uid.clone().unwrap_or_default(),
                },
                pod: Some(Ref {
                    name: pod_name.clone(),
                    uid: pod_uid.clone(),
                }),
                node: node.map(|name| Ref {
                    uid: self
                        .peek::<k8s_openapi::api::core::v1::Node>("", &name)
                        .and_then(|n| n.metadata.uid.clone())
                        .unwrap_or_default(),
                    name,
                }),
                warnafter: extended.then(|| seconds(expires)),
            },
        };
        let keys = self.tokens.keys()?;
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(keys.key_id.clone());
        let token = jsonwebtoken::encode(&header, &claims, &keys.signing)
            .map_err(|e| format!("signing a token: {e}"))?;
        Ok(IssuedToken {
            token,
            // `status.expirationTimestamp`, in whole seconds as `metav1.Time` carries it.
            expires: UNIX_EPOCH + Duration::from_secs(seconds(expires)),
            expiration_seconds,
        })
    }

    /// TokenReview of an embedded API token: its claims when the signature is this API's, it has not
    /// expired by the simulation's clock, it names `audience`, and its service account and the pod it is
    /// bound to still exist with the same UIDs (`pkg/serviceaccount/claims.go` `Validate`, its texts).
    pub fn review_token(&self, token: &str, audience: &str) -> Result<Claims, String> {
        let keys = self.tokens.keys()?;
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_audience(&[audience]);
        validation.set_issuer(&[ISSUER]);
        // Expiry is checked against the simulation's clock below.
        validation.validate_exp = false;
        let claims = jsonwebtoken::decode::<Claims>(token, &keys.verifying, &validation)
            .map_err(|e| format!("invalid bearer token: {e}"))?
            .claims;
        let invalid = |why: String| format!("invalid bearer token, {why}");
        if seconds(self.tokens.clock.now()) >= claims.exp {
            return Err(invalid("service account token has expired".into()));
        }
        let namespace = &claims.kubernetes.namespace;
        let account = &claims.kubernetes.serviceaccount;
        let live = self
            .peek::<ServiceAccount>(namespace, &account.name)
            .ok_or_else(|| invalid(format!("serviceaccounts {:?} not found", account.name)))?;
        let live_uid = live.metadata.uid.clone().unwrap_or_default();
        if live_uid != account.uid {
            return Err(invalid(format!(
                "service account UID ({live_uid}) does not match claim ({})",
                account.uid
            )));
        }
        if let Some(bound) = &claims.kubernetes.pod {
            let pod = self
                .peek::<ApiPod>(namespace, &bound.name)
                .ok_or_else(|| invalid("service account token has been invalidated".into()))?;
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if uid != bound.uid {
                return Err(invalid(format!(
                    "pod UID ({uid}) does not match service account pod ref claim ({})",
                    bound.uid
                )));
            }
        }
        Ok(claims)
    }
}
