//! The node's record of which credentials pulled which image (KEP-2535), shared by every puller on the
//! node: the kubelet's `kubernetes.io/image` plugin, the kubelet's container image pulls, and the CSI image
//! driver. With a record each, an image one of them pulled with credentials would look preloaded to the
//! others, which would then hand it to pods without those credentials under the default
//! `NeverVerifyPreloadedImages`.
//!
//! One JSON file, `pulls.json` (owner-only: it holds salted hashes of credentials), in a dir the pullers
//! share; they may be different processes. A writer takes an exclusive `flock` on `pulls.lock`, reads the
//! file again, changes it and writes it whole (write, fsync, rename); a reader reads it again only when it
//! changed (its inode, size or mtime; the version read is held open, so its inode cannot be reused), so a
//! pull by one path is seen by the others at their next check, and a check costs one `stat`.
//!
//! It fails closed, as upstream's pull manager does: a pull is announced (an *intent*) before it starts
//! and cleared only with its record, so a crash or a failed write between the two leaves the image
//! "pulled by this node, credentials unknown"; a record that cannot be read makes every cached image need
//! proof. A record found unreadable (a torn disk, a hand edit) does not stop a puller, as one corrupt file
//! does not stop upstream's kubelet (`fs_pullrecords.go` reports it and forces the pull): it is set aside
//! beside the new one (`pulls.json.corrupt-<unix time>`), and the new record starts *distrusted*: an image
//! with no record in it needs proof from then on, since it may be one the lost record knew as private.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use inlet_host::error::{IoContext, Result};
use inlet_host::records::{Durability, write_private_record};

/// The record file's id (`pulls.json`).
const RECORDS: &str = "pulls";

/// Which credentials pulled which image, by image id.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Records {
    /// Random, per node: fingerprints from another node do not match.
    pub salt: String,
    /// By image id.
    pub images: BTreeMap<String, ImageRecord>,
    /// Images (as requested) whose pull started and has no record yet.
    #[serde(default)]
    pub intents: BTreeSet<String>,
    /// The record replaces one that could not be read: an image it has no record of is not taken for
    /// preloaded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub distrusted: bool,
}

/// Who pulled one image.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct ImageRecord {
    /// Pulled without credentials at least once: public.
    pub anonymous: bool,
    /// Fingerprints of credentials that pulled it.
    pub credentials: BTreeSet<String>,
}

/// What identifies one version of the file: a rewrite renames a new file over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    inode: u64,
    len: u64,
    mtime_ns: i128,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Self {
        Self {
            inode: meta.ino(),
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// The version last read: its stamp, the file held open, and what it said.
struct Cached {
    stamp: Stamp,
    _file: fs::File,
    records: Records,
}

/// The shared record, cached until the file changes.
pub struct PullRecords {
    dir: PathBuf,
    cached: Mutex<Option<Cached>>,
}

impl PullRecords {
    /// The record in `dir` (created, with the node's salt, when missing; one that cannot be read is set
    /// aside, and its successor distrusted). `dir` must not be a symlink: the record is the node's, in the
    /// place its pullers were given.
    pub fn open(dir: &Path) -> Result<Self> {
        if fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(std::io::Error::other(
                "it is a symlink; the pull records need a directory",
            ))
            .context(|| format!("opening the pull records dir {}", dir.display()));
        }
        fs::create_dir_all(dir).context(|| format!("creating {}", dir.display()))?;
        let records = Self {
            dir: dir.to_path_buf(),
            cached: Mutex::default(),
        };
        // The salt is made once, by whichever puller comes first.
        records.update(|_| {})?;
        Ok(records)
    }

    /// `look` at the records as they are now (read again if another puller changed them); None when
    /// they cannot be read, which a caller must take as "prove access".
    pub(crate) fn read<R>(&self, look: impl FnOnce(&Records) -> R) -> Option<R> {
        let mut cached = self.cached.lock();
        let current = fs::metadata(self.path()).ok().map(|m| Stamp::of(&m));
        if current.is_none() || current != cached.as_ref().map(|c| c.stamp) {
            match self.load() {
                Ok(fresh) => *cached = fresh,
                Err(e) => {
                    tracing::error!(error = %e, "the pull records cannot be read: every cached image needs proof");
                    return None;
                }
            }
        }
        cached.as_ref().map(|c| look(&c.records))
    }

    /// Changes the records under the lock every puller of the node takes, and saves them.
    pub(crate) fn update(&self, change: impl FnOnce(&mut Records)) -> Result<()> {
        let lock_path = self.dir.join(format!("{RECORDS}.lock"));
        let what = || format!("locking {}", lock_path.display());
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .context(what)?;
        let _lock = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| std::io::Error::from(errno))
            .context(what)?;
        let mut records = match self.load() {
            Ok(cached) => cached.map(|c| c.records).unwrap_or_default(),
            Err(e) => self.set_aside(&e)?,
        };
        if records.salt.is_empty() {
            records.salt = uuid::Uuid::new_v4().simple().to_string();
        }
        change(&mut records);
        write_private_record(&self.dir, RECORDS, &records, Durability::PowerLoss)?;
        *self.cached.lock() = self.load()?;
        Ok(())
    }

    fn path(&self) -> PathBuf {
        self.dir.join(format!("{RECORDS}.json"))
    }

    /// Moves an unreadable record aside (under the lock) and returns its distrusted successor.
    fn set_aside(&self, error: &inlet_host::Error) -> Result<Records> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let path = self.path();
        let aside = self.dir.join(format!("{RECORDS}.json.corrupt-{now}"));
        fs::rename(&path, &aside).context(|| format!("setting {} aside", path.display()))?;
        tracing::error!(
            %error,
            aside = %aside.display(),
            "the pull records could not be read: set aside; an image not recorded from now on needs proof"
        );
        Ok(Records {
            distrusted: true,
            ..Default::default()
        })
    }

    /// The file as it is now: None when there is none yet.
    fn load(&self) -> Result<Option<Cached>> {
        let path = self.path();
        let mut file = match fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).context(|| format!("reading {}", path.display())),
        };
        let stamp = Stamp::of(
            &file
                .metadata()
                .context(|| format!("reading {}", path.display()))?,
        );
        let mut text = Vec::new();
        file.read_to_end(&mut text)
            .context(|| format!("reading {}", path.display()))?;
        let records = serde_json::from_slice(&text)
            .map_err(std::io::Error::from)
            .context(|| format!("parsing {}", path.display()))?;
        Ok(Some(Cached {
            stamp,
            _file: file,
            records,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_pullers_share_one_record_and_one_salt() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (
            PullRecords::open(dir.path()).unwrap(),
            PullRecords::open(dir.path()).unwrap(),
        );
        let salt = |r: &PullRecords| r.read(|r| r.salt.clone()).unwrap();
        assert_eq!(salt(&a), salt(&b));
        assert!(!salt(&a).is_empty());
        a.update(|r| {
            r.images
                .entry("sha256:x".into())
                .or_default()
                .credentials
                .insert("f".into());
        })
        .unwrap();
        // b sees a's pull at its next read, without being told.
        assert_eq!(
            b.read(|r| r.images["sha256:x"].credentials.contains("f")),
            Some(true)
        );
        b.update(|r| r.images.entry("sha256:y".into()).or_default().anonymous = true)
            .unwrap();
        a.read(|seen| {
            assert!(
                seen.images["sha256:x"].credentials.contains("f"),
                "b kept a's record"
            );
            assert!(seen.images["sha256:y"].anonymous);
        });
        let mode = fs::metadata(dir.path().join("pulls.json")).unwrap().mode();
        assert_eq!(mode & 0o077, 0, "the record is its owner's only: {mode:o}");
    }

    #[test]
    fn a_record_that_cannot_be_read_fails_closed_and_is_set_aside_distrusted() {
        let dir = tempfile::tempdir().unwrap();
        let records = PullRecords::open(dir.path()).unwrap();
        fs::write(dir.path().join("pulls.json"), b"{not json").unwrap();
        assert!(records.read(|_| ()).is_none(), "unreadable: no answer");
        // The next puller to start (or to write) is not stopped by it: the file is kept aside, and the
        // new record trusts nothing it does not know.
        let next = PullRecords::open(dir.path()).unwrap();
        assert_eq!(next.read(|r| r.distrusted), Some(true));
        assert_eq!(
            records.read(|r| r.distrusted),
            Some(true),
            "the first sees it too"
        );
        let aside: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("pulls.json.corrupt-")
            })
            .collect();
        assert_eq!(aside.len(), 1);
        assert_eq!(fs::read(aside[0].path()).unwrap(), b"{not json");
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
