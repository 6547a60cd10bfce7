//! The node's record of which credentials pulled which image (KEP-2535), kept as the kubelet keeps it
//! (`pkg/kubelet/images/pullmanager/fs_pullrecords.go`), so kubelet-sim, the image driver and a real
//! 1.33+ kubelet on one node read and write one record:
//!
//! - `<dir>/pulling/sha256-<sha256 of the image as requested>`: an `ImagePullIntent`, written before a
//!   pull starts and removed once its record is written. An image with an intent counts as pulled by this
//!   node, credentials unknown: a crash between the two fails closed.
//! - `<dir>/pulled/sha256-<sha256 of the runtime's image id>`: an `ImagePulledRecord`, by image name (no
//!   tag or digest, normalized) the credentials that pulled it: `nodePodsAccessible` for an anonymous pull,
//!   else each pull secret's coordinates (uid, namespace, name) and `credentialHash`.
//!
//! `<dir>` is the kubelet's `<root>/image_manager`. Files are JSON, owner-only, written to a `.tmp` beside
//! and renamed (each writer its own `.tmp`, which the kubelet's listing skips); inlet's writers also take a
//! `flock` on `<dir>/inlet-pull-records.lock` around a record's read-change-write, so two of them never
//! lose each other's credentials (a kubelet, which takes no such lock, can at worst make an image need
//! proof again). Written as `kubelet.config.k8s.io/v1beta1`, read as `v1alpha1` too. A file that cannot be
//! read does not stop anyone: as upstream, the image then needs proof, and the next successful pull
//! writes it anew.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use inlet_host::error::{IoContext, Result};

use crate::auth::Credentials;

/// The version files are written in.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The versions read.
const READABLE: [&str; 2] = [API_VERSION, "kubelet.config.k8s.io/v1alpha1"];
/// Most secrets a record keeps for one image name before it stops adding (upstream's bound).
const MAX_SECRETS: usize = 100;

/// `ImagePullIntent`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Intent {
    kind: String,
    api_version: String,
    image: String,
}

/// `ImagePulledRecord`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PulledRecord {
    kind: String,
    api_version: String,
    /// RFC 3339, when the record last changed.
    pub last_updated_time: String,
    /// The runtime's image id.
    pub image_ref: String,
    /// By image name, who pulled it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub credential_mapping: BTreeMap<String, PullCredentials>,
}

/// `ImagePullCredentials`: who pulled one image name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PullCredentials {
    /// Pull secrets that pulled it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_secrets: Vec<PullSecret>,
    /// Service accounts whose credentials pulled it (kept as read; inlet pulls with none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_service_accounts: Vec<serde_json::Value>,
    /// Pulled without credentials (or with the node's own): any pod may use it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_pods_accessible: bool,
}

/// `ImagePullSecret`: a pull secret's coordinates and the hash of the credential in it that pulled.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PullSecret {
    /// The secret's uid (empty when the caller had only its data, as a CSI driver does).
    #[serde(default)]
    pub uid: String,
    /// Its namespace.
    #[serde(default)]
    pub namespace: String,
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// [`Credentials::credential_hash`].
    #[serde(default)]
    pub credential_hash: String,
}

impl PullSecret {
    fn of(credentials: &Credentials) -> Self {
        let source = credentials.source.clone().unwrap_or_default();
        Self {
            uid: source.uid,
            namespace: source.namespace,
            name: source.name,
            credential_hash: credentials.credential_hash(),
        }
    }

    fn same_secret(&self, other: &Self) -> bool {
        !self.name.is_empty()
            && (&self.uid, &self.namespace, &self.name)
                == (&other.uid, &other.namespace, &other.name)
    }
}

impl PullCredentials {
    /// True when one of `offered` proves access (`MustAttemptImagePull`): the node pulled it anonymously,
    /// or a credential's hash matches, or the same secret (uid, namespace and name) pulled it.
    pub fn grants(&self, offered: &[Credentials]) -> bool {
        self.node_pods_accessible
            || offered.iter().map(PullSecret::of).any(|offer| {
                self.kubernetes_secrets.iter().any(|kept| {
                    (!kept.credential_hash.is_empty()
                        && kept.credential_hash == offer.credential_hash)
                        || kept.same_secret(&offer)
                })
            })
    }

    /// Adds who pulled: anonymous makes it the node's pods'; a secret is kept once by its coordinates (the
    /// newest hash wins), sorted as upstream sorts them.
    fn add(&mut self, pulled_with: Option<&Credentials>) {
        let Some(credentials) = pulled_with else {
            *self = Self {
                node_pods_accessible: true,
                ..Default::default()
            };
            return;
        };
        if self.node_pods_accessible {
            return;
        }
        let secret = PullSecret::of(credentials);
        let secrets = &mut self.kubernetes_secrets;
        let kept = secrets.iter().position(|kept| {
            kept.same_secret(&secret)
                || (secret.name.is_empty() && kept.credential_hash == secret.credential_hash)
        });
        match kept {
            Some(i) => secrets[i].credential_hash = secret.credential_hash,
            None if secrets.len() < MAX_SECRETS => secrets.push(secret),
            None => {}
        }
        secrets
            .sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
    }
}

/// `sha256-<hex>` of `key`, the name of its file.
fn file_name(key: &str) -> String {
    format!("sha256-{}", hex::encode(Sha256::digest(key.as_bytes())))
}

/// The node's records, in the kubelet's `image_manager` dir.
pub struct PullRecords {
    dir: PathBuf,
}

impl PullRecords {
    /// The records in `dir` (its `pulling/` and `pulled/` made when missing). `dir` must not be a
    /// symlink: the records are the node's, in the place its pullers were given.
    pub fn open(dir: &Path) -> Result<Self> {
        if fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(std::io::Error::other(
                "it is a symlink; the pull records need a directory",
            ))
            .context(|| format!("opening the pull records dir {}", dir.display()));
        }
        let records = Self {
            dir: dir.to_path_buf(),
        };
        for sub in ["pulling", "pulled"] {
            let path = dir.join(sub);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .context(|| format!("creating {}", path.display()))?;
        }
        Ok(records)
    }

    fn intent_path(&self, image: &str) -> PathBuf {
        self.dir.join("pulling").join(file_name(image))
    }

    fn record_path(&self, image_ref: &str) -> PathBuf {
        self.dir.join("pulled").join(file_name(image_ref))
    }

    /// Announces a pull of `image` (as requested) before it starts.
    pub fn intend(&self, image: &str) -> Result<()> {
        let intent = Intent {
            kind: "ImagePullIntent".into(),
            api_version: API_VERSION.into(),
            image: image.to_string(),
        };
        write(&self.intent_path(image), &intent)
    }

    /// True when a pull of `image` was announced and not recorded.
    pub fn intended(&self, image: &str) -> bool {
        self.intent_path(image).exists()
    }

    /// The record of the runtime's image `image_ref`: None when there is none, an error when its file
    /// cannot be read (the image then needs proof, as upstream).
    pub fn record(&self, image_ref: &str) -> Result<Option<PulledRecord>> {
        let path = self.record_path(image_ref);
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).context(|| format!("reading {}", path.display())),
        };
        let record: PulledRecord = serde_json::from_slice(&text)
            .map_err(std::io::Error::from)
            .context(|| {
                format!("failed to deserialize content of file {path:?} into ImagePulledRecord")
            })?;
        let known =
            record.kind == "ImagePulledRecord" && READABLE.contains(&record.api_version.as_str());
        // A record of another image (a hash collision, a file copied by hand) is no record of this one.
        Ok((known && record.image_ref == image_ref).then_some(record))
    }

    /// Records that `image` (a normalized reference) was pulled as `image_ref` with `pulled_with` (None:
    /// anonymously), then clears its intent. A record that could not be read is written anew.
    pub fn remember(
        &self,
        image: &str,
        image_ref: &str,
        pulled_with: Option<&Credentials>,
    ) -> Result<()> {
        let _lock = self.lock()?;
        let mut record = match self.record(image_ref) {
            Ok(Some(record)) => record,
            Ok(None) => PulledRecord::default(),
            Err(e) => {
                tracing::warn!(error = %e, "failed to retrieve an ImagePulledRecord: writing it anew");
                PulledRecord::default()
            }
        };
        let before = record.clone();
        let name = crate::allowlist::image_name(image).unwrap_or_else(|| image.to_string());
        record
            .credential_mapping
            .entry(name)
            .or_default()
            .add(pulled_with);
        if record != before || before.image_ref.is_empty() {
            record.kind = "ImagePulledRecord".into();
            record.api_version = API_VERSION.into();
            record.image_ref = image_ref.to_string();
            record.last_updated_time = now_rfc3339();
            write(&self.record_path(image_ref), &record)?;
        }
        let intent = self.intent_path(image);
        match fs::remove_file(&intent) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).context(|| format!("removing {}", intent.display()))
            }
            _ => Ok(()),
        }
    }

    /// The lock inlet's writers take around a record's read-change-write.
    fn lock(&self) -> Result<Flock<fs::File>> {
        let path = self.dir.join("inlet-pull-records.lock");
        let what = || format!("locking {}", path.display());
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .context(what)?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| std::io::Error::from(errno))
            .context(what)
    }
}

/// Writes `value` as JSON to `path`, owner-only, through a `.tmp` of this process's, renamed over it.
fn write(path: &Path, value: &impl Serialize) -> Result<()> {
    let tmp = path.with_file_name(format!(
        "{}.inlet-{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let what = || format!("writing {}", path.display());
    let text = serde_json::to_vec(value)
        .map_err(std::io::Error::from)
        .context(what)?;
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)?;
        std::io::Write::write_all(&mut file, &text)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.context(what)
}

fn now_rfc3339() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::SecretSource;
    use std::os::unix::fs::MetadataExt;

    fn secret(name: &str, uid: &str, password: &str) -> Credentials {
        Credentials {
            username: "alice".into(),
            password: password.into(),
            source: Some(SecretSource {
                namespace: "default".into(),
                name: name.into(),
                uid: uid.into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn files_are_the_kubelets_names_and_format() {
        let dir = tempfile::tempdir().unwrap();
        let records = PullRecords::open(dir.path()).unwrap();
        records.intend("repo.repo/test/test:v1").unwrap();
        // Upstream's test data: this image's intent file.
        let intent = dir.path().join(
            "pulling/sha256-ee81caca15454863449fb55a1d942904d56d5ed9f9b20a7cb3453944ea2c7e11",
        );
        let text = fs::read_to_string(&intent).unwrap();
        assert_eq!(
            text,
            r#"{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1beta1","image":"repo.repo/test/test:v1"}"#
        );
        assert_eq!(fs::metadata(&intent).unwrap().mode() & 0o077, 0);
        assert!(records.intended("repo.repo/test/test:v1"));
        let pulled_with = secret("pull-secret", "testsecretuid", "p");
        records
            .remember("repo.repo/test/test:v1", "testimageref", Some(&pulled_with))
            .unwrap();
        assert!(
            !records.intended("repo.repo/test/test:v1"),
            "the intent is cleared"
        );
        let path = dir
            .path()
            .join("pulled/sha256-b3c0cc4278800b03a308ceb2611161430df571ca733122f0a40ac8b9792a9064");
        let json: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
        assert_eq!(json["kind"], "ImagePulledRecord");
        assert_eq!(json["imageRef"], "testimageref");
        let secrets = &json["credentialMapping"]["repo.repo/test/test"]["kubernetesSecrets"];
        assert_eq!(secrets[0]["name"], "pull-secret");
        assert_eq!(secrets[0]["uid"], "testsecretuid");
        assert_eq!(secrets[0]["credentialHash"], pulled_with.credential_hash());
    }

    #[test]
    fn upstreams_v1alpha1_record_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let records = PullRecords::open(dir.path()).unwrap();
        let path = records.record_path("testimageref");
        fs::write(&path, r#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","lastUpdatedTime":"2024-10-21T12:26:40Z","imageRef":"testimageref","credentialMapping":{"docker.io/testing/test":{"kubernetesSecrets":[{"uid":"testsecretuid","namespace":"default","name":"pull-secret","credentialHash":"testsecrethash"}]}}}"#).unwrap();
        let record = records.record("testimageref").unwrap().unwrap();
        let mapping = &record.credential_mapping["docker.io/testing/test"];
        // The same secret, whatever its credential now (upstream updates the hash), proves access.
        assert!(mapping.grants(&[secret("pull-secret", "testsecretuid", "new")]));
        assert!(!mapping.grants(&[secret("pull-secret", "another-uid", "new")]));
        assert!(!mapping.grants(&[]));
        assert_eq!(records.record("other").unwrap(), None);
    }

    #[test]
    fn a_hash_proves_access_and_an_anonymous_pull_opens_it_to_all() {
        let mut mapping = PullCredentials::default();
        mapping.add(Some(&secret("a", "1", "p")));
        assert!(
            mapping.grants(&[secret("b", "2", "p")]),
            "same credential, other secret"
        );
        assert!(!mapping.grants(&[secret("b", "2", "q")]));
        let data_only = Credentials {
            source: None,
            ..secret("", "", "p")
        };
        assert!(mapping.grants(std::slice::from_ref(&data_only)));
        // Kept once: the data-only credential is the one the secret holds; the secret's new credential
        // replaces its hash.
        mapping.add(Some(&data_only));
        mapping.add(Some(&secret("a", "1", "p2")));
        assert_eq!(mapping.kubernetes_secrets.len(), 1, "{mapping:?}");
        assert!(mapping.grants(&[secret("c", "3", "p2")]));
        mapping.add(Some(&secret("b", "2", "q")));
        assert_eq!(mapping.kubernetes_secrets.len(), 2, "{mapping:?}");
        mapping.add(None);
        assert!(mapping.node_pods_accessible && mapping.kubernetes_secrets.is_empty());
        assert!(mapping.grants(&[]));
    }

    #[test]
    fn a_file_that_cannot_be_read_is_an_error_and_is_written_anew() {
        let dir = tempfile::tempdir().unwrap();
        let records = PullRecords::open(dir.path()).unwrap();
        fs::write(records.record_path("img"), b"\0garbage").unwrap();
        let err = records.record("img").unwrap_err();
        assert!(err.to_string().contains("ImagePulledRecord"), "{err}");
        // Another puller opens the dir all the same, and a pull rewrites the record.
        let other = PullRecords::open(dir.path()).unwrap();
        other.remember("a.io/b:v1", "img", None).unwrap();
        assert!(
            records.record("img").unwrap().unwrap().credential_mapping["a.io/b"]
                .node_pods_accessible
        );
    }

    #[test]
    fn a_symlinked_records_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let err = PullRecords::open(&dir.path().join("link")).err().unwrap();
        assert!(err.to_string().contains("symlink"), "{err}");
    }
}
