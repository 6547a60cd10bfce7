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
//! proof.

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
    /// The record in `dir` (created, with the node's salt, when missing). A record that cannot be read
    /// is an error: replacing it would forget who pulled what, and hand private images to anyone.
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
        let mut records = self.load()?.map(|c| c.records).unwrap_or_default();
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
    fn a_record_that_cannot_be_read_fails_closed_and_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let records = PullRecords::open(dir.path()).unwrap();
        fs::write(dir.path().join("pulls.json"), b"{not json").unwrap();
        assert!(records.read(|_| ()).is_none(), "unreadable: no answer");
        assert!(records.update(|_| {}).is_err(), "not overwritten");
        assert!(PullRecords::open(dir.path()).is_err());
        assert_eq!(
            fs::read(dir.path().join("pulls.json")).unwrap(),
            b"{not json"
        );
    }
}
