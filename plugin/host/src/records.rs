//! Durable JSON records, one file per object: written to a temporary file, flushed, then renamed over the
//! old one, so a crash leaves either the old or the new record, never half of one. The local driver's store
//! and the image volumes' state both keep their objects this way.
//!
//! A record of something that does not outlive the node's boot (an ephemeral volume: its mounts and its
//! pod end with the boot) is written [`Durability::UntilReboot`]: renamed whole but not flushed, which
//! survives any crash of the process (the page cache keeps it) and saves the flush, the largest cost of a
//! publish. After a power loss such a record may be gone or empty; an empty one is dropped when the
//! records are loaded, and the content nothing records is removed when the driver starts.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use serde::{Serialize, de::DeserializeOwned};

use crate::error::{IoContext, Result};

/// Every `<id>.json` record in `dir`, by id; removes temporary files a crash left behind.
pub fn load_records<T: DeserializeOwned>(dir: &Path) -> Result<BTreeMap<String, T>> {
    let mut records = BTreeMap::new();
    for entry in fs::read_dir(dir).context(|| format!("reading {}", dir.display()))? {
        let path = entry
            .context(|| format!("reading {}", dir.display()))?
            .path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => {
                let text = fs::read(&path).context(|| format!("reading {}", path.display()))?;
                // What a power loss can leave of a record written `UntilReboot`.
                if text.is_empty() {
                    tracing::warn!(record = %path.display(), "dropping an empty record");
                    fs::remove_file(&path).context(|| format!("removing {}", path.display()))?;
                    continue;
                }
                let record = serde_json::from_slice(&text).map_err(std::io::Error::from);
                let record = record.context(|| format!("parsing {}", path.display()))?;
                let id = path
                    .file_stem()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                records.insert(id, record);
            }
            // A temporary file from a write interrupted by a crash: the rename never happened, so the old
            // record (or none) is the truth.
            Some("tmp") => {
                fs::remove_file(&path).context(|| format!("removing {}", path.display()))?
            }
            _ => {}
        }
    }
    Ok(records)
}

/// How long a record must last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Across a power loss: flushed before it replaces the old one.
    PowerLoss,
    /// Across any crash of the process, not a power loss: what it records ends with the boot anyway.
    UntilReboot,
}

/// Writes `dir/<id>.json`, whole, as durable as asked.
pub fn write_record<T: Serialize>(
    dir: &Path,
    id: &str,
    record: &T,
    durability: Durability,
) -> Result<()> {
    write_record_with_mode(dir, id, record, durability, 0o666)
}

/// [`write_record`], readable by its owner only (a record others must not read, even hashed).
pub fn write_private_record<T: Serialize>(
    dir: &Path,
    id: &str,
    record: &T,
    durability: Durability,
) -> Result<()> {
    write_record_with_mode(dir, id, record, durability, 0o600)
}

/// Writes the record with `mode` (less the umask) from the moment its temporary file exists.
fn write_record_with_mode<T: Serialize>(
    dir: &Path,
    id: &str,
    record: &T,
    durability: Durability,
    mode: u32,
) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(format!("{id}.json"));
    let tmp = dir.join(format!("{id}.json.tmp"));
    let what = || format!("writing {}", path.display());
    let body = serde_json::to_vec_pretty(record)
        .map_err(std::io::Error::from)
        .context(what)?;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .context(what)?;
    let written = file.write_all(&body).and_then(|()| {
        // Flush the data before the rename makes it visible, so a power loss cannot leave an empty record.
        match durability {
            Durability::PowerLoss => file.sync_data(),
            _ => Ok(()),
        }
    });
    let renamed = written.and_then(|()| fs::rename(&tmp, &path));
    // A write that failed (a full disk) leaves the old record, and no temporary file beside it.
    if renamed.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    renamed.context(what)
}

/// Removes `dir/<id>.json`; a missing record is removed.
pub fn remove_record(dir: &Path, id: &str) -> Result<()> {
    let path = dir.join(format!("{id}.json"));
    match fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}
