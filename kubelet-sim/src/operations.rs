//! The operation table: at most one operation per volume at a time (a pod-less operation, such as staging,
//! excludes every other on its volume; pod operations on one volume exclude only the same pod's), and
//! exponential backoff after a failure (`nestedpendingoperations.go`, `exponentialbackoff.go`). The backoff
//! holds only the operation that failed: a different operation on the same key (a TearDown after failed
//! SetUps) starts at once and resets it, as `NestedPendingOperations.Run` resets `expBackoff` when the
//! operation name differs (upstream resets it only while it runs: once it expired, a failure of the other
//! operation doubles the old wait; here that one starts at the initial wait). Each node's volume manager
//! and pod workers keep one, and so does the attach/detach controller.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// The kubelet's backoff: 500 ms, doubling, at most 2 min 2 s.
#[derive(Debug, Clone, Copy)]
pub struct BackoffPolicy {
    /// The first wait after a failure.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(122),
        }
    }
}

/// One item's entry in a `flowcontrol.Backoff` (the crash-loop back-off of a container, the pull back-off
/// of a pod's image): the wait it is in, and when it last grew.
#[derive(Debug, Clone, Copy)]
pub struct BackoffEntry {
    /// The current wait.
    pub delay: Duration,
    /// When it last grew.
    pub updated: Instant,
}

impl BackoffPolicy {
    /// `entry` while it lasts: one untouched for over twice the maximum is forgotten (`hasExpired`).
    pub fn live(&self, entry: Option<BackoffEntry>) -> Option<BackoffEntry> {
        entry.filter(|e| e.updated.elapsed() <= 2 * self.max)
    }

    /// `Backoff.Next`: `initial` for a new or forgotten entry, else its wait doubled up to the maximum.
    pub fn next(&self, entry: Option<BackoffEntry>) -> BackoffEntry {
        let delay = match self.live(entry) {
            Some(e) => (e.delay * 2).min(self.max),
            None => self.initial,
        };
        BackoffEntry {
            delay,
            updated: Instant::now(),
        }
    }
}

/// What an operation is about: what it excludes while it runs, and what its backoff is kept under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OpKey {
    /// A volume operation: on a volume (its unique name), for one pod (SetUp, TearDown), or node-wide
    /// (`pod: None`: attach checks, MountDevice, UnmountDevice), which excludes every other on the volume.
    Volume {
        /// The unique volume name.
        name: String,
        /// The pod UID, for per-pod operations.
        pod: Option<String>,
    },
    /// The attach/detach controller's attach of one pod's volume.
    Attach {
        /// The pod's UID.
        pod: String,
        /// The volume's name in the pod.
        volume: String,
    },
    /// The external attacher's ControllerPublish or ControllerUnpublish for one VolumeAttachment (its name).
    VolumeAttachment(String),
    /// A pod worker's start, stop or restart of one pod (its UID).
    Pod(String),
    /// The external-provisioner's work on one claim or PV (`<namespace>/<claim uid>`, `pv/<name>`).
    Claim(String),
}

impl OpKey {
    /// A per-pod operation on a volume.
    pub fn volume(name: &str, pod: &str) -> Self {
        Self::Volume {
            name: name.to_string(),
            pod: Some(pod.to_string()),
        }
    }

    /// A node-wide operation on a volume.
    pub fn device(name: &str) -> Self {
        Self::Volume {
            name: name.to_string(),
            pod: None,
        }
    }

    /// What the operation runs on, and for which pod: operations on one resource exclude each other
    /// unless both are for different pods.
    fn slot(&self) -> (Resource, Option<String>) {
        match self {
            Self::Volume { name, pod } => (Resource::Volume(name.clone()), pod.clone()),
            Self::Attach { pod, volume } => (Resource::Attach(pod.clone(), volume.clone()), None),
            Self::VolumeAttachment(name) => (Resource::VolumeAttachment(name.clone()), None),
            Self::Pod(uid) => (Resource::Pod(uid.clone()), None),
            Self::Claim(key) => (Resource::Claim(key.clone()), None),
        }
    }
}

/// What running operations are indexed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Resource {
    Volume(String),
    Attach(String, String),
    VolumeAttachment(String),
    Pod(String),
    Claim(String),
}

/// Pending operations and backoff.
#[derive(Debug, Default)]
pub struct Operations {
    policy: BackoffPolicy,
    /// Running operations by what they run on: the pods they are for (None for a node-wide one).
    /// Indexed so a conflict check costs one lookup, not a scan of every running operation.
    pending: HashMap<Resource, HashSet<Option<String>>>,
    backoff: HashMap<OpKey, Failed>,
}

/// The backoff of a key's last failed operation.
#[derive(Debug, Clone, Copy)]
struct Failed {
    /// Upstream's operation name (`volume_mount`, `volume_unmount`, ...).
    operation: &'static str,
    /// Not retried before.
    until: Instant,
    /// The wait that ends at `until`.
    wait: Duration,
}

impl Operations {
    /// A table with a backoff policy.
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            ..Default::default()
        }
    }

    /// Starts `operation` on `key` unless a conflicting one runs or the same operation's backoff has not
    /// expired; a different operation forgets that backoff.
    pub fn try_start(&mut self, key: &OpKey, operation: &'static str) -> bool {
        let (resource, pod) = key.slot();
        let conflicts = self
            .pending
            .get(&resource)
            .is_some_and(|pods| pod.is_none() || pods.contains(&None) || pods.contains(&pod));
        if conflicts {
            return false;
        }
        match self.backoff.get(key) {
            Some(f) if f.operation != operation => drop(self.backoff.remove(key)),
            Some(f) if Instant::now() < f.until => return false,
            _ => {}
        }
        self.pending.entry(resource).or_default().insert(pod);
        true
    }

    /// Ends `operation` on `key`: success clears its backoff, failure doubles it.
    pub fn finish(&mut self, key: &OpKey, operation: &'static str, ok: bool) {
        let (resource, pod) = key.slot();
        if let Some(pods) = self.pending.get_mut(&resource) {
            pods.remove(&pod);
            if pods.is_empty() {
                self.pending.remove(&resource);
            }
        }
        if ok {
            self.backoff.remove(key);
            return;
        }
        let wait = match self.backoff.get(key) {
            Some(f) if f.operation == operation => (f.wait * 2).min(self.policy.max),
            _ => self.policy.initial,
        };
        let until = Instant::now() + wait;
        self.backoff.insert(
            key.clone(),
            Failed {
                operation,
                until,
                wait,
            },
        );
    }

    /// Whether any operation runs on the volume `name` (for any pod, or node-wide).
    pub fn volume_busy(&self, name: &str) -> bool {
        self.pending
            .contains_key(&Resource::Volume(name.to_string()))
    }

    /// When the earliest backoff expires (the reconciler should look again then).
    pub fn next_retry(&self) -> Option<Instant> {
        self.backoff
            .values()
            .map(|f| f.until)
            .filter(|u| *u > Instant::now())
            .min()
    }

    /// True while any operation runs.
    pub fn busy(&self) -> bool {
        !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(volume: &str, pod: Option<&str>) -> OpKey {
        match pod {
            Some(pod) => OpKey::volume(volume, pod),
            None => OpKey::device(volume),
        }
    }

    #[test]
    fn a_volume_is_busy_while_any_operation_runs_on_it() {
        let mut ops = Operations::new(BackoffPolicy::default());
        assert!(!ops.volume_busy("v"));
        assert!(ops.try_start(&key("v", Some("pod-a")), "volume_mount"));
        assert!(ops.volume_busy("v") && !ops.volume_busy("w"));
        ops.finish(&key("v", Some("pod-a")), "volume_mount", true);
        assert!(!ops.volume_busy("v"));
    }

    #[test]
    fn a_backoff_holds_only_the_operation_that_failed() {
        let mut ops = Operations::new(BackoffPolicy::default());
        let pod = OpKey::Pod("uid".into());
        assert!(ops.try_start(&pod, "start"));
        ops.finish(&pod, "start", false);
        assert!(!ops.try_start(&pod, "start"), "backing off");
        assert!(
            ops.try_start(&pod, "kill"),
            "a deleted pod is stopped at once"
        );
        ops.finish(&pod, "kill", false);
        assert!(!ops.try_start(&pod, "kill"), "a failed stop backs off");
        assert_eq!(ops.backoff[&pod].wait, Duration::from_millis(500), "reset");
    }

    #[test]
    fn one_operation_per_volume_and_backoff_doubles() {
        let mut ops = Operations::new(BackoffPolicy {
            initial: Duration::from_millis(40),
            max: Duration::from_millis(60),
        });
        let mount = |ops: &mut Operations, pod| ops.try_start(&key("v", pod), "volume_mount");
        assert!(mount(&mut ops, Some("a")));
        assert!(
            mount(&mut ops, Some("b")),
            "other pods on the volume may proceed"
        );
        assert!(
            !mount(&mut ops, None),
            "a node-wide operation waits for them"
        );
        assert!(
            !mount(&mut ops, Some("a")),
            "the same operation is not started twice"
        );
        ops.finish(&key("v", Some("a")), "volume_mount", false);
        ops.finish(&key("v", Some("b")), "volume_mount", true);
        assert!(!mount(&mut ops, Some("a")), "backing off");
        assert!(ops.next_retry().is_some());
        std::thread::sleep(Duration::from_millis(45));
        assert!(mount(&mut ops, Some("a")));
        ops.finish(&key("v", Some("a")), "volume_mount", false);
        assert_eq!(
            ops.backoff[&key("v", Some("a"))].wait,
            Duration::from_millis(60),
            "doubled, capped"
        );
    }
}
