//! The kubelet's service-account token manager (`pkg/kubelet/token/token_manager.go`): tokens for
//! projected `serviceAccountToken` sources and CSI `tokenRequests`, cached by what was asked (service
//! account, namespace, audiences, lifetime, bound pod) and asked for again once 80% of their life has
//! passed or they are 24 hours old. A refresh that fails keeps the cached token while it has not expired;
//! a pod's tokens are forgotten once the pod is. Time is the simulation's clock, so lifetimes are tested
//! without waiting. Upstream adds up to 10 s of random jitter to both thresholds; none here, so that
//! tests are exact.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use inlet_volume::TokenRequestArgs;
use parking_lot::Mutex;

use crate::api::Api;
use crate::api::tokens::IssuedToken;

/// A token older than this is refreshed whatever its lifetime (`maxTTL`).
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// How often expired tokens are dropped (`gcPeriod`).
const GC_PERIOD: Duration = Duration::from_secs(60);

/// A node's token cache.
pub struct TokenManager {
    api: Arc<Api>,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    tokens: HashMap<Key, IssuedToken>,
    last_gc: Option<SystemTime>,
}

/// What a token was asked for (`keyFunc`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    service_account: String,
    namespace: String,
    audience: String,
    expiration_seconds: Option<i64>,
    pod: (String, String),
}

impl Key {
    fn of(request: &TokenRequestArgs) -> Self {
        Self {
            service_account: request.service_account.clone(),
            namespace: request.namespace.clone(),
            audience: request.audience.clone(),
            expiration_seconds: request.expiration_seconds,
            pod: request.pod.clone(),
        }
    }
}

impl TokenManager {
    /// A manager asking `api` for tokens.
    pub fn new(api: Arc<Api>) -> Self {
        Self {
            api,
            cache: Mutex::default(),
        }
    }

    /// `GetServiceAccountToken`: the cached token unless it needs a refresh; else a new one. When the
    /// refresh fails, the cached token while it has not expired, else upstream's errors.
    pub async fn get(&self, request: &TokenRequestArgs) -> Result<IssuedToken, String> {
        let key = Key::of(request);
        let now = self.api.tokens.clock.now();
        let cached = self.cached(&key, now);
        if let Some(token) = cached.as_ref().filter(|t| !requires_refresh(t, now)) {
            return Ok(token.clone());
        }
        match (self.api.create_token(request).await, cached) {
            (Ok(token), _) => {
                self.cache.lock().tokens.insert(key, token.clone());
                Ok(token)
            }
            (Err(e), None) => Err(format!("failed to fetch token: {e}")),
            (Err(e), Some(token)) if now >= token.expires => Err(format!(
                "token {} expired and refresh failed: {e}",
                key.describe()
            )),
            (Err(e), Some(token)) => {
                tracing::warn!(key = %key.describe(), error = %e, "Couldn't update token");
                Ok(token)
            }
        }
    }

    /// `DeleteServiceAccountToken`: forgets the tokens bound to the pod.
    pub fn forget_pod(&self, pod_uid: &str) {
        self.cache
            .lock()
            .tokens
            .retain(|key, _| key.pod.1 != pod_uid);
    }

    /// The cached token for `key`; then, every [`GC_PERIOD`], expired tokens are dropped (`cleanup`).
    fn cached(&self, key: &Key, now: SystemTime) -> Option<IssuedToken> {
        let mut cache = self.cache.lock();
        let token = cache.tokens.get(key).cloned();
        let gc_due = cache
            .last_gc
            .is_none_or(|at| now.duration_since(at).unwrap_or_default() >= GC_PERIOD);
        if gc_due {
            cache.tokens.retain(|_, token| now < token.expires);
            cache.last_gc = Some(now);
        }
        token
    }
}

impl Key {
    /// The key as upstream prints it in errors (`keyFunc`: `%q/%q/%#v/%#v/%#v` of the name, namespace,
    /// audiences, lifetime and bound object), without the token.
    fn describe(&self) -> String {
        let audiences = match self.audience.as_str() {
            "" => "[]string(nil)".to_string(),
            audience => format!("[]string{{{audience:?}}}"),
        };
        format!(
            "{:?}/{:?}/{audiences}/{}/v1.BoundObjectReference{{Kind:\"Pod\", APIVersion:\"v1\", Name:{:?}, UID:{:?}}}",
            self.service_account,
            self.namespace,
            self.expiration_seconds.unwrap_or(0),
            self.pod.0,
            self.pod.1
        )
    }
}

/// `requiresRefresh`: past 80% of its life, or 24 hours old.
fn requires_refresh(token: &IssuedToken, now: SystemTime) -> bool {
    let life = Duration::from_secs(token.expiration_seconds.max(0) as u64);
    let issued = token.expires - life;
    now > issued + MAX_TTL || now > token.expires - life / 5
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn a_token_is_refreshed_at_80_percent_of_its_life_or_a_day() {
        let issued = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let token = |seconds: u64| IssuedToken {
            token: String::new(),
            expires: issued + Duration::from_secs(seconds),
            expiration_seconds: seconds as i64,
        };
        let at = |seconds: u64| issued + Duration::from_secs(seconds);
        assert!(!requires_refresh(&token(3600), at(2880)));
        assert!(requires_refresh(&token(3600), at(2881)));
        let long = token(7 * 24 * 3600);
        assert!(!requires_refresh(&long, at(24 * 3600)));
        assert!(requires_refresh(&long, at(24 * 3600 + 1)));
    }
}
