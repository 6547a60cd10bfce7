//! The node's record of which credentials pulled which image (KEP-2535), shared by every puller on the
//! node: the kubelet's `kubernetes.io/image` plugin, the kubelet's container image pulls, and the CSI image
//! driver. With a record each, an image one of them pulled with credentials would look preloaded to the
//! others, which would then hand it to pods without those credentials under the default
//! `NeverVerifyPreloadedImages`.
//!
//! One JSON file, `pulls.json`, in a dir the pullers share (they may be different processes). A writer
//! takes an exclusive `flock` on `pulls.lock`, reads the file again, changes it and writes it whole
//! (write, fsync, rename); a reader reads it again only when it changed (its inode, size or mtime), so a
//! pull by one path is seen by the others at their next check, and a check costs one `stat`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::{IoContext, Result};
use crate::records::{Durability, write_record};

/// The record file's id (`pulls.json`).
const RECORDS: &str = "pulls";

/// Which credentials pulled which image, by image id.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Records {
    /// Random, per node: fingerprints from another node do not match.
    pub salt: String,
    /// By image id.
    pub images: BTreeMap<String, ImageRecord>,
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

/// The shared record, cached until the file changes.
pub struct PullRecords {
    dir: PathBuf,
    cached: Mutex<(Option<Stamp>, Records)>,
}

impl PullRecords {
    /// The record in `dir` (created, with the node's salt, when missing).
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).context(|| format!("creating {}", dir.display()))?;
        let records = Self {
            dir: dir.to_path_buf(),
            cached: Mutex::default(),
        };
        // The salt is made once, by whichever puller comes first.
        records.update(|_| {})?;
        Ok(records)
    }

    /// `look` at the records as they are now (read again if another puller changed them).
    pub(crate) fn read<R>(&self, look: impl FnOnce(&Records) -> R) -> R {
        let mut cached = self.cached.lock();
        let stamp = self.stamp();
        if stamp != cached.0 || stamp.is_none() {
            match self.load() {
                Ok(records) => *cached = (stamp, records),
                Err(e) => tracing::warn!(error = %e, "could not read the pull records"),
            }
        }
        look(&cached.1)
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
        let mut records = self.load()?;
        if records.salt.is_empty() {
            records.salt = uuid::Uuid::new_v4().simple().to_string();
        }
        change(&mut records);
        write_record(&self.dir, RECORDS, &records, Durability::PowerLoss)?;
        *self.cached.lock() = (self.stamp(), records);
        Ok(())
    }

    fn path(&self) -> PathBuf {
        self.dir.join(format!("{RECORDS}.json"))
    }

    fn stamp(&self) -> Option<Stamp> {
        let meta = fs::metadata(self.path()).ok()?;
        Some(Stamp {
            inode: meta.ino(),
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        })
    }

    fn load(&self) -> Result<Records> {
        let path = self.path();
        match fs::read(&path) {
            Ok(text) if !text.is_empty() => serde_json::from_slice(&text)
                .map_err(std::io::Error::from)
                .context(|| format!("parsing {}", path.display())),
            Ok(_) => Ok(Records::default()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Records::default()),
            Err(e) => Err(e).context(|| format!("reading {}", path.display())),
        }
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
        let salt = |r: &PullRecords| r.read(|r| r.salt.clone());
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
        assert!(b.read(|r| r.images["sha256:x"].credentials.contains("f")));
        b.update(|r| r.images.entry("sha256:y".into()).or_default().anonymous = true)
            .unwrap();
        a.read(|seen| {
            assert!(
                seen.images["sha256:x"].credentials.contains("f"),
                "b kept a's record"
            );
            assert!(seen.images["sha256:y"].anonymous);
        });
    }
}
