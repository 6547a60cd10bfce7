//! Registry credentials: read from Kubernetes pull secrets (`kubernetes.io/dockerconfigjson`,
//! `kubernetes.io/dockercfg`) or a CSI `secrets` map, matched to an image's registry as the kubelet's
//! keyring matches them (`pkg/credentialprovider/keyring.go`: the most specific key first), and handed to the
//! runtime as a CRI `AuthConfig`.
//!
//! [`Credentials`] never prints its secrets: `Debug` shows only the server and user. A credential is
//! remembered on disk only as its [`Credentials::credential_hash`], the one the kubelet's pulled-image
//! records keep (KEP-2535), with the coordinates of the pull secret it came from.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use inlet_proto::runtime::v1 as cri;
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The secret key of a `kubernetes.io/dockerconfigjson` secret.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// The secret key of a legacy `kubernetes.io/dockercfg` secret.
pub const DOCKER_CFG_KEY: &str = ".dockercfg";

/// One registry credential.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Credentials {
    /// The registry key it was filed under (`registry.example:5000`, `https://index.docker.io/v1/`).
    pub server: String,
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// A token the registry exchanges for an access token.
    pub identity_token: String,
    /// A bearer token sent as it is.
    pub registry_token: String,
    /// The entry's `email` (kept only for the hash, as the kubelet's keyring keeps it).
    pub email: String,
    /// The pull secret it came from; None when only its data is known (a CSI `secrets` map).
    pub source: Option<SecretSource>,
}

/// A pull secret's coordinates.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SecretSource {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("server", &self.server)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// The CRI form. `server_address` stays empty, as the kubelet leaves it for pull-secret credentials
    /// (`kuberuntime_image.go`): the credential was matched to the image already, and containerd reads a
    /// non-empty one as a URL and drops credentials whose host differs from the one it resolves.
    pub fn to_cri(&self) -> cri::AuthConfig {
        cri::AuthConfig {
            username: self.username.clone(),
            password: self.password.clone(),
            auth: String::new(),
            server_address: String::new(),
            identity_token: self.identity_token.clone(),
            registry_token: self.registry_token.clone(),
        }
    }

    /// The hash the kubelet keeps of a credential in its pulled-image records (`hashAuthConfig` in
    /// `pkg/credentialprovider`): SHA-256, in hex, of Go's `json.Marshal` of its `AuthConfig` (fields in
    /// the struct's order, empty ones left out, `<`, `>` and `&` escaped as Go escapes them), so a record
    /// a real kubelet wrote matches inlet's credential and the other way round. The kubelet's keyring
    /// keeps only a pull secret's user, password and email (`BasicDockerKeyring.Add`): so does the hash.
    pub fn credential_hash(&self) -> String {
        let fields = [
            ("username", &self.username),
            ("password", &self.password),
            ("email", &self.email),
        ];
        let members: Vec<String> = fields
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("\"{k}\":{}", serde_json::Value::String(v.to_string())))
            .collect();
        let text = format!("{{{}}}", members.join(","))
            .replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026")
            .replace('\u{2028}', "\\u2028")
            .replace('\u{2029}', "\\u2029");
        hex::encode(Sha256::digest(text.as_bytes()))
    }
}

/// Why a pull secret could not be read. Names the secret key, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct CredentialError {
    /// The secret key at fault.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize, Default)]
struct DockerAuth {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
    #[serde(default, rename = "identitytoken")]
    identity_token: String,
    #[serde(default, rename = "registrytoken")]
    registry_token: String,
    #[serde(default)]
    email: String,
}

/// Every credential in one secret's data. Understands `.dockerconfigjson`, `.dockercfg`, and a plain
/// `username` / `password` pair (warm-metal's CSI secrets), which applies to any registry (server `""`).
pub fn from_secret_data(
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<Credentials>, CredentialError> {
    let mut found = Vec::new();
    if let Some(raw) = data.get(DOCKER_CONFIG_JSON_KEY) {
        let config: DockerConfig = serde_json::from_slice(raw)
            .map_err(|e| error(DOCKER_CONFIG_JSON_KEY, format!("not a docker config: {e}")))?;
        found.extend(entries(DOCKER_CONFIG_JSON_KEY, config.auths)?);
    }
    if let Some(raw) = data.get(DOCKER_CFG_KEY) {
        let auths: BTreeMap<String, DockerAuth> = serde_json::from_slice(raw)
            .map_err(|e| error(DOCKER_CFG_KEY, format!("not a docker config: {e}")))?;
        found.extend(entries(DOCKER_CFG_KEY, auths)?);
    }
    if let (Some(user), Some(password)) = (data.get("username"), data.get("password")) {
        found.push(Credentials {
            username: String::from_utf8_lossy(user).into_owned(),
            password: String::from_utf8_lossy(password).into_owned(),
            ..Default::default()
        });
    }
    Ok(found)
}

/// Every credential in a Kubernetes pull secret (its `data`, decoded).
pub fn from_secret(
    secret: &k8s_openapi::api::core::v1::Secret,
) -> Result<Vec<Credentials>, CredentialError> {
    let data = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    let meta = &secret.metadata;
    let source = SecretSource {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
    };
    let mut found = from_secret_data(&data)?;
    for credentials in &mut found {
        credentials.source = Some(source.clone());
    }
    Ok(found)
}

fn entries(
    key: &str,
    auths: BTreeMap<String, DockerAuth>,
) -> Result<Vec<Credentials>, CredentialError> {
    auths
        .into_iter()
        .map(|(server, auth)| {
            let (mut username, mut password) = (auth.username, auth.password);
            if !auth.auth.is_empty() {
                // `auth` is base64("user:password") and wins, as in the kubelet's `readDockerConfigJSONFileFromBytes`.
                let decoded = BASE64
                    .decode(auth.auth.trim())
                    .ok()
                    .and_then(|d| String::from_utf8(d).ok())
                    .ok_or_else(|| error(key, format!("auths.{server}.auth is not base64")))?;
                let (u, p) = decoded.split_once(':').ok_or_else(|| {
                    error(key, format!("auths.{server}.auth is not user:password"))
                })?;
                (username, password) = (u.to_string(), p.to_string());
            }
            Ok(Credentials {
                server,
                username,
                password,
                identity_token: auth.identity_token,
                registry_token: auth.registry_token,
                email: auth.email,
                source: None,
            })
        })
        .collect()
}

fn error(key: &str, reason: String) -> CredentialError {
    CredentialError {
        key: key.to_string(),
        reason,
    }
}

/// The credentials that apply to `image` (a normalized reference, `registry/repo/name:tag`), most specific
/// key first, as the kubelet's keyring orders them. A key matches when its host equals the image's
/// registry and its path, if any, is a prefix of the repository; `docker.io` and `index.docker.io` are the
/// same registry; credentials without a server apply everywhere, last.
pub fn for_image(credentials: &[Credentials], image: &str) -> Vec<Credentials> {
    let image = image.split(['@']).next().unwrap_or(image);
    let (registry, repository) = image.split_once('/').unwrap_or(("docker.io", image));
    let registry = canonical_host(registry);
    let mut matched: Vec<(usize, &Credentials)> = credentials
        .iter()
        .filter_map(|c| {
            if c.server.is_empty() {
                return Some((0, c));
            }
            let key = c
                .server
                .trim_start_matches("https://")
                .trim_start_matches("http://");
            let key = key
                .trim_end_matches('/')
                .trim_end_matches("/v1")
                .trim_end_matches("/v2");
            let (host, path) = key.split_once('/').unwrap_or((key, ""));
            let path_matches = path.is_empty()
                || repository == path
                || repository.starts_with(&format!("{path}/"));
            (canonical_host(host) == registry && path_matches).then_some((1 + path.len(), c))
        })
        .collect();
    matched.sort_by_key(|m| std::cmp::Reverse(m.0));
    matched.into_iter().map(|(_, c)| c.clone()).collect()
}

/// [`for_image`] for a reference as a user wrote it (`busybox`, `reg.example:5000/app:1`), normalized first.
pub fn for_reference(credentials: &[Credentials], reference: &str) -> Vec<Credentials> {
    let normalized = oci_client::Reference::try_from(reference)
        .map(|r| r.whole())
        .unwrap_or_else(|_| reference.to_string());
    for_image(credentials, &normalized)
}

fn canonical_host(host: &str) -> &str {
    match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(key: &str, value: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([(key.to_string(), value.as_bytes().to_vec())])
    }

    #[test]
    fn reads_docker_config_json_with_auth_field_winning() {
        let auth = BASE64.encode("alice:s3cret");
        let json = format!(
            r#"{{"auths":{{"reg.example:5000":{{"username":"x","password":"y","auth":"{auth}"}}}}}}"#
        );
        let creds = from_secret_data(&data(DOCKER_CONFIG_JSON_KEY, &json)).unwrap();
        assert_eq!(creds.len(), 1);
        assert_eq!(
            (creds[0].username.as_str(), creds[0].password.as_str()),
            ("alice", "s3cret")
        );
        assert!(!format!("{creds:?}").contains("s3cret"));
    }

    #[test]
    fn a_bad_config_names_the_key_not_the_value() {
        let err = from_secret_data(&data(DOCKER_CONFIG_JSON_KEY, "hunter2")).unwrap_err();
        assert_eq!(err.key, DOCKER_CONFIG_JSON_KEY);
        assert!(!err.to_string().contains("hunter2"));
    }

    #[test]
    fn matches_the_most_specific_key_first() {
        let cred = |server: &str| Credentials {
            server: server.into(),
            username: server.into(),
            ..Default::default()
        };
        let all = [
            cred("reg.example"),
            cred("https://reg.example/team/"),
            cred("other.example"),
            cred("https://index.docker.io/v1/"),
        ];
        let users = |image| -> Vec<String> {
            for_image(&all, image)
                .into_iter()
                .map(|c| c.username)
                .collect()
        };
        assert_eq!(
            users("reg.example/team/app:1"),
            ["https://reg.example/team/", "reg.example"]
        );
        assert_eq!(users("reg.example/teammate/app:1"), ["reg.example"]);
        assert_eq!(
            users("docker.io/library/busybox:1"),
            ["https://index.docker.io/v1/"]
        );
    }

    #[test]
    fn the_credential_hash_is_the_kubelets() {
        let sha = |text: &str| hex::encode(Sha256::digest(text.as_bytes()));
        let a = Credentials {
            username: "u".into(),
            password: "p<&>".into(),
            server: "ignored.example".into(),
            ..Default::default()
        };
        // Go's json.Marshal of AuthConfig{Username, Password}: struct order, HTML characters escaped.
        assert_eq!(
            a.credential_hash(),
            sha(r#"{"username":"u","password":"p\u003c\u0026\u003e"}"#)
        );
        let b = Credentials {
            email: "e@x".into(),
            ..a.clone()
        };
        assert_eq!(
            b.credential_hash(),
            sha(r#"{"username":"u","password":"p\u003c\u0026\u003e","email":"e@x"}"#)
        );
    }
}
