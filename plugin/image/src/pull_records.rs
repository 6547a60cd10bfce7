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
//! `<dir>` is the kubelet's `<root>/image_manager`. Files are JSON, owner-only, written to a temporary file
//! beside (a fresh name each time, which the kubelet's listing skips) and renamed; inlet's writers also
//! take a `flock` on `<dir>/inlet-pull-records.lock` around a record's read-change-write, so two of them
//! never lose each other's credentials (a kubelet, which takes no such lock, can at worst make an image
//! need proof again). A new record is written as `kubelet.config.k8s.io/v1alpha1`, which every kubelet
//! with the feature reads (1.33 on; newer ones migrate it), an updated one in the version it had. A record
//! that cannot be read, or of a kind or version inlet does not know, stops nothing and is not overwritten
//! (a kubelet's names may be in it): its image needs proof, as upstream forces the pull.
//!
//! Records of inlet's earlier format (one `pulls.json` per node) are imported at start
//! ([`PullRecords::import_legacy`]): each image it knew gets a record naming no one, so it needs proof
//! rather than passing for preloaded.
//!
//! Upkeep, as upstream's pull manager does it (`image_pull_manager.go`): at start, an intent whose image the
//! runtime has (a pull that ended while no one was recording) becomes a record naming no one
//! ([`PullRecords::settle_intents`], `initialize`); after image GC, the records of images the runtime no
//! longer has are removed ([`PullRecords::prune_unknown`], `PruneUnknownRecords`).

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use inlet_host::error::{IoContext, Result};

use crate::auth::Credentials;

/// The version new files are written in: the one every kubelet with the feature reads.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1alpha1";
/// The versions read.
const READABLE: [&str; 2] = [API_VERSION, "kubelet.config.k8s.io/v1beta1"];
/// Most secrets a record keeps for one image name before it stops adding (upstream's bound).
const MAX_SECRETS: usize = 100;

/// `ImagePullIntent`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Intent {
    kind: String,
    api_version: String,
    image: String,
}

/// `ImagePulledRecord`. Fields a newer kubelet adds are kept as they are.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PulledRecord {
    kind: String,
    api_version: String,
    /// RFC 3339, when the record last changed.
    #[serde(default)]
    pub last_updated_time: String,
    /// The runtime's image id.
    #[serde(default)]
    pub image_ref: String,
    /// By image name, who pulled it.
    #[serde(default, deserialize_with = "null_as_default")]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub credential_mapping: BTreeMap<String, PullCredentials>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

/// Go writes a nil slice or map without `omitempty` as `null`.
fn null_as_default<'de, D, T>(deserializer: D) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// `ImagePullCredentials`: who pulled one image name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullCredentials {
    /// Pull secrets that pulled it.
    #[serde(default, deserialize_with = "null_as_default")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_secrets: Vec<PullSecret>,
    /// Service accounts whose credentials pulled it (kept as read; inlet pulls with none).
    #[serde(default, deserialize_with = "null_as_default")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_service_accounts: Vec<serde_json::Value>,
    /// Pulled without credentials (or with the node's own): any pod may use it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_pods_accessible: bool,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

/// `ImagePullSecret`: a pull secret's coordinates and the hash of the credential in it that pulled.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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

/// The node's records, in the kubelet's `image_manager` dir. Cloning is cheap (a path).
#[derive(Debug, Clone)]
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

    /// True when a pull of `image` was announced and not recorded (or that cannot be told).
    pub fn intended(&self, image: &str) -> bool {
        self.intent_path(image).try_exists().unwrap_or(true)
    }

    /// Withdraws the announcement of a pull of `image`: recorded, or failed (upstream's
    /// `RecordImagePullFailed`).
    pub fn withdraw(&self, image: &str) -> Result<()> {
        let intent = self.intent_path(image);
        match fs::remove_file(&intent) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).context(|| format!("removing {}", intent.display()))
            }
            _ => Ok(()),
        }
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
        let what =
            || format!("failed to deserialize content of file {path:?} into ImagePulledRecord");
        let record: PulledRecord = serde_json::from_slice(&text)
            .map_err(std::io::Error::from)
            .context(what)?;
        // A kind or version inlet does not know is a record it cannot read: the image needs proof.
        if record.kind != "ImagePulledRecord" || !READABLE.contains(&record.api_version.as_str()) {
            let found = format!(
                "kind {:?}, apiVersion {:?}",
                record.kind, record.api_version
            );
            return Err(std::io::Error::other(found)).context(what);
        }
        // A record of another image (a file copied by hand) is no record of this one, as upstream.
        Ok((record.image_ref == image_ref).then_some(record))
    }

    /// Records that `image` (a normalized reference) was pulled as `image_ref` with `pulled_with` (None:
    /// anonymously). A record that cannot be read is an error and is left as it is (a kubelet's names
    /// may be in it); the caller then keeps the intent, and the image keeps needing proof.
    pub fn remember(
        &self,
        image: &str,
        image_ref: &str,
        pulled_with: Option<&Credentials>,
    ) -> Result<()> {
        let name = crate::allowlist::image_name(image).unwrap_or_else(|| image.to_string());
        self.change(image_ref, |record| {
            let pulled = record.credential_mapping.entry(name).or_default();
            pulled.add(pulled_with);
        })
    }

    /// Changes the record of `image_ref` (made, naming no one, when missing) under inlet's lock, and
    /// writes it if it changed.
    fn change(&self, image_ref: &str, change: impl FnOnce(&mut PulledRecord)) -> Result<()> {
        let _lock = self.lock()?;
        let found = self.record(image_ref)?;
        let mut record = found.clone().unwrap_or_else(|| PulledRecord {
            kind: "ImagePulledRecord".into(),
            api_version: API_VERSION.into(),
            image_ref: image_ref.to_string(),
            ..Default::default()
        });
        change(&mut record);
        if found.as_ref() == Some(&record) {
            return Ok(());
        }
        record.last_updated_time = now_rfc3339();
        write(&self.record_path(image_ref), &record)
    }

    /// `initialize`: each intent naming an image the runtime has (`present`: each image's id with its
    /// tags and digests) becomes that image's record naming no one (kubelet-pulled, credentials unknown:
    /// it needs proof), and the intent goes. Intents of images the runtime lacks stay.
    /// One that cannot be settled (its record unreadable, a full disk) is logged and stays, as upstream
    /// goes on past it.
    pub fn settle_intents(&self, present: &[(String, Vec<String>)]) -> Result<usize> {
        let mut settled = 0;
        for image in self.intents()? {
            let names = |(_, names): &&(String, Vec<String>)| names.contains(&image);
            let Some((id, _)) = present.iter().find(names) else {
                continue;
            };
            match self.change(id, |_| {}).and_then(|()| self.withdraw(&image)) {
                Ok(()) => settled += 1,
                Err(e) => tracing::warn!(image, error = %e, "a pull intent stays unsettled"),
            }
        }
        Ok(settled)
    }

    /// The images of the intents on disk (ones that cannot be read are skipped).
    fn intents(&self) -> Result<Vec<String>> {
        let dir = self.dir.join("pulling");
        let entries = fs::read_dir(&dir).context(|| format!("listing {}", dir.display()))?;
        Ok(entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("sha256-"))
            .filter_map(|e| serde_json::from_slice::<Intent>(&fs::read(e.path()).ok()?).ok())
            .filter(|i| i.kind == "ImagePullIntent")
            .map(|i| i.image)
            .collect())
    }

    /// `PruneUnknownRecords`: removes the record of each image not in `images` (the runtime's image ids,
    /// listed after `until`) that was last updated before `until`, so a record written while the list
    /// was taken stays. Records that cannot be read are left alone. Returns how many went.
    pub fn prune_unknown(
        &self,
        images: &HashSet<String>,
        until: std::time::SystemTime,
    ) -> Result<usize> {
        let _lock = self.lock()?;
        let dir = self.dir.join("pulled");
        let entries = fs::read_dir(&dir).context(|| format!("listing {}", dir.display()))?;
        // Records keep whole seconds: one of the second `until` falls in counts as written after it.
        let until = until
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let mut pruned = 0;
        for entry in entries.flatten() {
            let Some(record) = fs::read(entry.path())
                .ok()
                .and_then(|text| serde_json::from_slice::<PulledRecord>(&text).ok())
            else {
                continue;
            };
            let updated = record
                .last_updated_time
                .parse::<k8s_openapi::jiff::Timestamp>();
            if images.contains(&record.image_ref) || !updated.is_ok_and(|t| t.as_second() < until) {
                continue;
            }
            fs::remove_file(entry.path())
                .context(|| format!("removing {}", entry.path().display()))?;
            pruned += 1;
        }
        Ok(pruned)
    }

    /// Imports inlet's earlier record, `<legacy_dir>/pulls.json`, if there is one: every image it knew
    /// gets a record naming no one (so it needs proof instead of passing for preloaded), every pull it
    /// announced an intent; then it is renamed `pulls.json.imported`. One that cannot be read is an
    /// error: dropping it would make the private images it knew pass for preloaded.
    pub fn import_legacy(&self, legacy_dir: &Path) -> Result<()> {
        #[derive(Deserialize)]
        struct Legacy {
            #[serde(default)]
            images: BTreeMap<String, serde_json::Value>,
            #[serde(default)]
            intents: Vec<String>,
        }
        let path = legacy_dir.join("pulls.json");
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).context(|| format!("reading {}", path.display())),
        };
        let what = || {
            format!(
                "importing the earlier pull record {} (move it away to start afresh: the images it \
                 knew would then pass for preloaded)",
                path.display()
            )
        };
        let legacy: Legacy = serde_json::from_slice(&text)
            .map_err(std::io::Error::from)
            .context(what)?;
        // Failures here name their own file; the earlier record stays until all are written.
        for image_ref in legacy.images.keys() {
            self.change(image_ref, |_| {})?;
        }
        for image in &legacy.intents {
            self.intend(image)?;
        }
        fs::rename(&path, legacy_dir.join("pulls.json.imported")).context(what)?;
        tracing::info!(from = %path.display(), images = legacy.images.len(), "imported the earlier pull record");
        Ok(())
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

/// Writes `value` as JSON to `path`, owner-only, through a new temporary file beside it (created
/// exclusively, so never through a link; its name, `.tmp…`, is one the kubelet's listing skips), renamed
/// over it.
fn write(path: &Path, value: &impl Serialize) -> Result<()> {
    let what = || format!("writing {}", path.display());
    let text = serde_json::to_vec(value)
        .map_err(std::io::Error::from)
        .context(what)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir).context(what)?;
    std::io::Write::write_all(&mut file, &text).context(what)?;
    file.as_file().sync_all().context(what)?;
    file.persist(path).map_err(|e| e.error).context(what)?;
    Ok(())
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
        // Upstream's test data: this image's intent file, word for word.
        let intent = dir.path().join(
            "pulling/sha256-ee81caca15454863449fb55a1d942904d56d5ed9f9b20a7cb3453944ea2c7e11",
        );
        let text = fs::read_to_string(&intent).unwrap();
        assert_eq!(
            text,
            r#"{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1alpha1","image":"repo.repo/test/test:v1"}"#
        );
        assert_eq!(fs::metadata(&intent).unwrap().mode() & 0o077, 0);
        assert!(records.intended("repo.repo/test/test:v1"));
        let pulled_with = secret("pull-secret", "testsecretuid", "p");
        records
            .remember("repo.repo/test/test:v1", "testimageref", Some(&pulled_with))
            .unwrap();
        records.withdraw("repo.repo/test/test:v1").unwrap();
        assert!(!records.intended("repo.repo/test/test:v1"));
        let path = dir
            .path()
            .join("pulled/sha256-b3c0cc4278800b03a308ceb2611161430df571ca733122f0a40ac8b9792a9064");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o077, 0);
        let json: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
        assert_eq!(json["kind"], "ImagePulledRecord");
        assert_eq!(json["imageRef"], "testimageref");
        let secrets = &json["credentialMapping"]["repo.repo/test/test"]["kubernetesSecrets"];
        assert_eq!(secrets[0]["name"], "pull-secret");
        assert_eq!(secrets[0]["uid"], "testsecretuid");
        assert_eq!(secrets[0]["credentialHash"], pulled_with.credential_hash());
        let left: Vec<_> = fs::read_dir(dir.path().join("pulled"))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(left.len(), 1, "no temporary file is left: {left:?}");
    }

    #[test]
    fn upstreams_records_are_read_with_their_nulls_and_newer_fields_kept() {
        let dir = tempfile::tempdir().unwrap();
        let records = PullRecords::open(dir.path()).unwrap();
        let path = records.record_path("testimageref");
        fs::write(&path, r#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","lastUpdatedTime":"2024-10-21T12:26:40Z","imageRef":"testimageref","credentialMapping":{"docker.io/testing/test":{"kubernetesSecrets":[{"uid":"testsecretuid","namespace":"default","name":"pull-secret","credentialHash":"testsecrethash"}]},"docker.io/testing/open":{"kubernetesSecrets":null,"nodePodsAccessible":true,"preloaded":true}}}"#).unwrap();
        let record = records.record("testimageref").unwrap().unwrap();
        let mapping = &record.credential_mapping["docker.io/testing/test"];
        // The same secret, whatever its credential now (upstream updates the hash), proves access.
        assert!(mapping.grants(&[secret("pull-secret", "testsecretuid", "new")]));
        assert!(!mapping.grants(&[secret("pull-secret", "another-uid", "new")]));
        assert!(!mapping.grants(&[]));
        assert!(record.credential_mapping["docker.io/testing/open"].grants(&[]));
        // A change keeps what this version does not know.
        records.remember("a.io/b:v1", "testimageref", None).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(r#""preloaded":true"#) && text.contains("a.io/b"),
            "{text}"
        );
        assert!(
            text.contains("v1alpha1"),
            "written in the version it had: {text}"
        );
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
    fn a_record_that_cannot_be_read_is_an_error_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let records = PullRecords::open(dir.path()).unwrap();
        for text in [
            &b"\0garbage"[..],
            br#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v9","imageRef":"img"}"#,
        ] {
            fs::write(records.record_path("img"), text).unwrap();
            let err = records.record("img").unwrap_err();
            assert!(err.to_string().contains("ImagePulledRecord"), "{err}");
            // Another puller opens the dir all the same; a pull's record is refused, the file kept.
            let other = PullRecords::open(dir.path()).unwrap();
            assert!(other.remember("a.io/b:v1", "img", None).is_err());
            assert_eq!(fs::read(records.record_path("img")).unwrap(), text);
        }
    }

    #[test]
    fn the_earlier_record_is_imported_as_images_needing_proof() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = dir.path().join("plugin");
        fs::create_dir(&legacy).unwrap();
        fs::write(
            legacy.join("pulls.json"),
            r#"{"salt":"s","images":{"sha256:aa":{"anonymous":false,"credentials":["f"]}},"intents":["a.io/b:v1"]}"#,
        )
        .unwrap();
        let records = PullRecords::open(&dir.path().join("image_manager")).unwrap();
        records.import_legacy(&legacy).unwrap();
        let record = records.record("sha256:aa").unwrap().unwrap();
        assert!(
            record.credential_mapping.is_empty(),
            "names no one: {record:?}"
        );
        assert!(records.intended("a.io/b:v1"));
        assert!(legacy.join("pulls.json.imported").exists());
        records.import_legacy(&legacy).unwrap();
        fs::write(legacy.join("pulls.json"), b"{not json").unwrap();
        let err = records.import_legacy(&legacy).unwrap_err();
        assert!(err.to_string().contains("move it away"), "{err}");
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

    #[test]
    fn intents_of_present_images_become_records_naming_no_one() {
        let dir = tempfile::tempdir().unwrap();
        let records = PullRecords::open(dir.path()).unwrap();
        records.intend("docker.io/library/present:v1").unwrap();
        records.intend("docker.io/library/absent:v1").unwrap();
        let present = [(
            "sha256:aaa".to_string(),
            vec!["docker.io/library/present:v1".to_string()],
        )];
        assert_eq!(records.settle_intents(&present).unwrap(), 1);
        assert!(!records.intended("docker.io/library/present:v1"));
        assert!(
            records.intended("docker.io/library/absent:v1"),
            "no image: kept"
        );
        let record = records.record("sha256:aaa").unwrap().expect("a record");
        assert!(
            record.credential_mapping.is_empty(),
            "naming no one: {record:?}"
        );
    }

    #[test]
    fn records_of_images_gone_before_the_listing_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let records = PullRecords::open(dir.path()).unwrap();
        for id in ["sha256:kept", "sha256:gone"] {
            records
                .remember("docker.io/library/x:v1", id, None)
                .unwrap();
        }
        let listed: HashSet<String> = ["sha256:kept".to_string()].into();
        let before = std::time::SystemTime::now() - std::time::Duration::from_secs(5);
        assert_eq!(
            records.prune_unknown(&listed, before).unwrap(),
            0,
            "written after"
        );
        let after = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        assert_eq!(records.prune_unknown(&listed, after).unwrap(), 1);
        assert!(records.record("sha256:kept").unwrap().is_some());
        assert!(records.record("sha256:gone").unwrap().is_none());
    }
}
