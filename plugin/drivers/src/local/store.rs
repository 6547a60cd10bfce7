//! Durable state of the local driver: one JSON record per volume and per snapshot.
//!
//! Layout under the state dir:
//! ```text
//! records/volumes/<id>.json     VolumeRecord     volumes/<id>/       a mount volume's files
//! records/snapshots/<id>.json   SnapshotRecord   volumes/<id>.img    a block volume's backing file
//!                                                snapshots/<id>[.img] a snapshot's copy
//! ```
//! A record is written to a temporary file, flushed, then renamed over the old one, so a crash leaves either
//! the old or the new record, never half of one; one operation rewrites only the objects it changed. Records
//! are loaded into memory at start, so a restarted driver answers as if it never stopped.
//!
//! The store is shared by the calls the driver serves side by side (one per volume), so it keeps its maps
//! behind a lock held only while a record is written and its map updated; a volume's mounts and content
//! are made outside it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use litemap::LiteMap;
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use serde::{Deserialize, Serialize};

use inlet_host::error::{Error, IoContext, Result};
use inlet_host::mount::MountFlags;
use inlet_host::quantity::format_bytes;
use inlet_host::records::{Durability, load_records, remove_record, write_record};

/// How a volume is consumed: a directory tree, or a raw block device (a loop device over a file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessType {
    /// A directory, bind-mounted into place.
    Mount,
    /// A block device file, bind-mounted onto a file.
    Block,
}

/// Where a volume's initial content came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContentSource {
    /// Restored from a snapshot.
    Snapshot(String),
    /// Cloned from another volume.
    Volume(String),
}

/// One target path a volume is published at on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    /// Mount flags the target was mounted with (`read_only` included).
    pub flags: MountFlags,
    /// The access mode asked for, as the CSI enum number, to enforce SINGLE_NODE_SINGLE_WRITER.
    pub access_mode: i32,
}

/// A volume the driver owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// The CSI volume id: the CreateVolume name, or the kubelet's handle for an ephemeral volume.
    pub id: String,
    /// Allocated size, counted against the driver's capacity.
    pub capacity_bytes: u64,
    /// Mount or block.
    pub access_type: AccessType,
    /// CreateVolume parameters, echoed back and compared on a repeated CreateVolume.
    pub parameters: BTreeMap<String, String>,
    /// Where the initial content came from.
    pub content_source: Option<ContentSource>,
    /// Created by NodePublishVolume for an inline ephemeral volume, deleted by its last NodeUnpublishVolume.
    pub ephemeral: bool,
    /// Nodes the volume is ControllerPublished to, with the read-only flag it was published with.
    pub attached_to: BTreeMap<String, bool>,
    /// The staging path NodeStageVolume mounted it at.
    pub staged_at: Option<PathBuf>,
    /// Target paths NodePublishVolume mounted it at: one, nearly always (a list, where a B-tree would
    /// take a node of eleven for it; saved as a map all the same).
    pub published: LiteMap<PathBuf, Publication>,
}

/// A snapshot: a copy of a volume's content at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The CSI snapshot id.
    pub id: String,
    /// The name CreateSnapshot was called with.
    pub name: String,
    /// The volume it was taken of.
    pub source_volume_id: String,
    /// Size of the source volume when taken; a volume restored from it is at least this big.
    pub size_bytes: u64,
    /// Mount or block, as the source volume was.
    pub access_type: AccessType,
    /// Creation time, seconds since the Unix epoch.
    pub created_seconds: i64,
    /// Creation time, the nanoseconds part.
    pub created_nanos: i32,
}

/// The records, in memory and on disk. Maps are ordered by id, which makes pagination stable.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    records: Mutex<Records>,
}

#[derive(Debug)]
struct Records {
    volumes: BTreeMap<String, VolumeRecord>,
    snapshots: BTreeMap<String, SnapshotRecord>,
    /// The sum of the volumes' capacities, kept with them: a check of free capacity costs the same
    /// however many volumes the node has.
    allocated: u64,
}

impl Records {
    fn insert_volume(&mut self, volume: VolumeRecord) {
        self.allocated = self.allocated.saturating_add(volume.capacity_bytes);
        if let Some(old) = self.volumes.insert(volume.id.clone(), volume) {
            self.allocated = self.allocated.saturating_sub(old.capacity_bytes);
        }
    }
}

impl Store {
    /// Opens (creating if needed) the state dir and loads every record.
    pub fn open(root: &Path) -> Result<Self> {
        for dir in [
            "records/volumes",
            "records/snapshots",
            "volumes",
            "snapshots",
        ] {
            let dir = root.join(dir);
            fs::create_dir_all(&dir).context(|| format!("creating state dir {}", dir.display()))?;
        }
        let volumes: BTreeMap<String, VolumeRecord> = load_records(&root.join("records/volumes"))?;
        let records = Records {
            allocated: volumes.values().map(|v| v.capacity_bytes).sum(),
            volumes,
            snapshots: load_records(&root.join("records/snapshots"))?,
        };
        Ok(Self {
            records: Mutex::new(records),
            root: root.to_path_buf(),
        })
    }

    /// The state dir.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// All volumes, ordered by id, locked while the guard lives (call nothing else of the store meanwhile).
    pub fn volumes(&self) -> MappedMutexGuard<'_, BTreeMap<String, VolumeRecord>> {
        MutexGuard::map(self.records.lock(), |r| &mut r.volumes)
    }

    /// The sum of every volume's capacity.
    pub fn allocated_bytes(&self) -> u64 {
        self.records.lock().allocated
    }

    /// One volume, as recorded now.
    pub fn volume(&self, id: &str) -> Option<VolumeRecord> {
        self.records.lock().volumes.get(id).cloned()
    }

    /// Writes a volume record, then updates memory: flushed, unless the volume is ephemeral (it ends with
    /// the node's boot, see [`Durability::UntilReboot`]).
    pub fn put_volume(&self, volume: VolumeRecord) -> Result<()> {
        let mut records = self.records.lock();
        self.write_volume(&volume)?;
        records.insert_volume(volume);
        Ok(())
    }

    /// Writes the record of a new volume unless its size would take the volumes past `capacity`
    /// (RESOURCE_EXHAUSTED): the check and the write are one step, so two volumes created side by side
    /// cannot both take the last free bytes.
    pub fn put_new_volume(&self, volume: VolumeRecord, capacity: u64) -> Result<()> {
        let mut records = self.records.lock();
        let free = capacity.saturating_sub(records.allocated);
        if volume.capacity_bytes > free {
            return Err(exhausted(volume.capacity_bytes, free, capacity));
        }
        self.write_volume(&volume)?;
        records.insert_volume(volume);
        Ok(())
    }

    /// Writes a volume's record: flushed, unless the volume is ephemeral (it ends with the node's boot).
    fn write_volume(&self, volume: &VolumeRecord) -> Result<()> {
        let durability = match volume.ephemeral {
            true => Durability::UntilReboot,
            false => Durability::PowerLoss,
        };
        write_record(
            &self.root.join("records/volumes"),
            &volume.id,
            volume,
            durability,
        )
    }

    /// Removes a volume record (its content is the caller's to delete first).
    pub fn remove_volume(&self, id: &str) -> Result<()> {
        let mut records = self.records.lock();
        remove_record(&self.root.join("records/volumes"), id)?;
        if let Some(old) = records.volumes.remove(id) {
            records.allocated = records.allocated.saturating_sub(old.capacity_bytes);
        }
        Ok(())
    }

    /// All snapshots, ordered by id, locked while the guard lives (call nothing else of the store meanwhile).
    pub fn snapshots(&self) -> MappedMutexGuard<'_, BTreeMap<String, SnapshotRecord>> {
        MutexGuard::map(self.records.lock(), |r| &mut r.snapshots)
    }

    /// Writes a snapshot record durably, then updates memory.
    pub fn put_snapshot(&self, snapshot: SnapshotRecord) -> Result<()> {
        let mut records = self.records.lock();
        write_record(
            &self.root.join("records/snapshots"),
            &snapshot.id,
            &snapshot,
            Durability::PowerLoss,
        )?;
        records.snapshots.insert(snapshot.id.clone(), snapshot);
        Ok(())
    }

    /// Removes a snapshot record.
    pub fn remove_snapshot(&self, id: &str) -> Result<()> {
        let mut records = self.records.lock();
        remove_record(&self.root.join("records/snapshots"), id)?;
        records.snapshots.remove(id);
        Ok(())
    }

    /// Where a volume's content lives: a directory for mount volumes, a file for block volumes.
    pub fn volume_data(&self, id: &str, access: AccessType) -> PathBuf {
        data_path(&self.root.join("volumes"), id, access)
    }

    /// Where a snapshot's copy lives.
    pub fn snapshot_data(&self, id: &str, access: AccessType) -> PathBuf {
        data_path(&self.root.join("snapshots"), id, access)
    }
}

/// RESOURCE_EXHAUSTED: `requested` bytes, where only `free` of `capacity` are.
pub fn exhausted(requested: u64, free: u64, capacity: u64) -> Error {
    Error::ResourceExhausted(format!(
        "requested {} but only {} of {} is free",
        format_bytes(requested),
        format_bytes(free),
        format_bytes(capacity)
    ))
}

fn data_path(dir: &Path, id: &str, access: AccessType) -> PathBuf {
    match access {
        AccessType::Mount => dir.join(id),
        AccessType::Block => dir.join(format!("{id}.img")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(id: &str) -> VolumeRecord {
        VolumeRecord {
            id: id.into(),
            capacity_bytes: 1 << 20,
            access_type: AccessType::Mount,
            parameters: BTreeMap::new(),
            content_source: None,
            ephemeral: false,
            attached_to: BTreeMap::new(),
            staged_at: None,
            published: LiteMap::new(),
        }
    }

    #[test]
    fn records_survive_a_reopen_and_torn_writes_are_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.put_volume(volume("b")).unwrap();
        store.put_volume(volume("a")).unwrap();
        store.remove_volume("b").unwrap();
        store.remove_volume("never-existed").unwrap();
        // A crash between create and rename leaves a .tmp file behind.
        fs::write(dir.path().join("records/volumes/c.json.tmp"), "{ half").unwrap();

        // What a power loss may leave of a record written until reboot: an empty file, dropped.
        fs::write(dir.path().join("records/volumes/d.json"), "").unwrap();

        let reopened = Store::open(dir.path()).unwrap();
        assert_eq!(reopened.volumes().keys().collect::<Vec<_>>(), ["a"]);
        assert!(!dir.path().join("records/volumes/d.json").exists());
        assert_eq!(reopened.volume("a"), Some(volume("a")));
        assert!(!dir.path().join("records/volumes/c.json.tmp").exists());
    }

    #[test]
    fn publications_are_saved_as_a_map_of_targets_as_before() {
        let mut record = volume("a");
        let publication = Publication {
            flags: MountFlags::default(),
            access_mode: 1,
        };
        record
            .published
            .insert(PathBuf::from("/t/2"), publication.clone());
        record.published.insert(PathBuf::from("/t/1"), publication);
        let json = serde_json::to_value(&record).unwrap();
        let targets: Vec<&String> = json["published"].as_object().unwrap().keys().collect();
        assert_eq!(
            targets,
            ["/t/1", "/t/2"],
            "a map of targets, as the B-tree wrote it"
        );
        let read: VolumeRecord = serde_json::from_value(json).unwrap();
        assert_eq!(read, record);
    }
}
