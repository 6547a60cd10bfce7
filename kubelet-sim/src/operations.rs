//! The operation table: at most one operation per volume at a time (a pod-less operation, such as staging,
//! excludes every other on its volume; pod operations on one volume exclude only the same pod's), and
//! exponential backoff after a failure (`nestedpendingoperations.go`, `exponentialbackoff.go`). The backoff
//! holds only the operation that failed: a different operation on the same key (a TearDown after failed
//! SetUps) starts at once and resets it, as `NestedPendingOperations.Run` resets `expBackoff` when the
//! operation name differs (upstream resets it only while it runs: once it expired, a failure of the other
//! operation doubles the old wait; here that one starts at the initial wait). Each node's volume manager
//! and pod workers keep one, and so does the attach/detach controller.

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
}

/// Pending operations and backoff.
#[derive(Debug, Default)]
pub struct Operations {
    policy: BackoffPolicy,
    /// Running volume operations by volume name. Looked up by a borrowed name, so asking whether one
    /// runs (every pass asks it of every volume not mounted yet) builds nothing.
    volumes: foldhash::HashMap<String, Running>,
    /// Every other running operation: each excludes only itself.
    others: foldhash::HashSet<OpKey>,
    backoff: foldhash::HashMap<OpKey, Failed>,
}

/// What runs on one volume: one node-wide operation, or per-pod ones (mostly one).
#[derive(Debug)]
enum Running {
    NodeWide,
    Pods(Vec<String>),
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
        let conflicts = match key {
            OpKey::Volume { name, pod } => self.volume_op_running(name, pod.as_deref()),
            other => self.others.contains(other),
        };
        if conflicts {
            return false;
        }
        if !self.backoff.is_empty() {
            match self.backoff.get(key) {
                Some(f) if f.operation != operation => drop(self.backoff.remove(key)),
                Some(f) if Instant::now() < f.until => return false,
                _ => {}
            }
        }
        match key {
            OpKey::Volume { name, pod: None } => {
                self.volumes.insert(name.clone(), Running::NodeWide);
            }
            OpKey::Volume {
                name,
                pod: Some(pod),
            } => match self.volumes.get_mut(name.as_str()) {
                Some(Running::Pods(pods)) => pods.push(pod.clone()),
                // A node-wide one would have conflicted.
                Some(Running::NodeWide) => {}
                None => {
                    let pods = Running::Pods(vec![pod.clone()]);
                    self.volumes.insert(name.clone(), pods);
                }
            },
            other => {
                self.others.insert(other.clone());
            }
        }
        true
    }

    /// Ends `operation` on `key`: success clears its backoff, failure doubles it.
    pub fn finish(&mut self, key: &OpKey, operation: &'static str, ok: bool) {
        match key {
            OpKey::Volume { name, pod } => {
                let ended = match (self.volumes.get_mut(name.as_str()), pod) {
                    (Some(Running::Pods(pods)), Some(pod)) => {
                        pods.retain(|p| p != pod);
                        pods.is_empty()
                    }
                    (Some(Running::NodeWide), None) => true,
                    _ => false,
                };
                if ended {
                    self.volumes.remove(name.as_str());
                }
            }
            other => {
                self.others.remove(other);
            }
        }
        if ok {
            if !self.backoff.is_empty() {
                self.backoff.remove(key);
            }
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

    /// Whether an operation runs that excludes one on the volume `name` for `pod` (node-wide for `None`),
    /// as upstream's `IsOperationPending` (`nestedpendingoperations.go`): asked without building a key.
    pub fn volume_op_running(&self, name: &str, pod: Option<&str>) -> bool {
        match (self.volumes.get(name), pod) {
            (None, _) => false,
            (Some(Running::Pods(pods)), Some(pod)) => pods.iter().any(|p| p == pod),
            (Some(_), _) => true,
        }
    }

    /// Whether any operation runs on the volume `name` (for any pod, or node-wide).
    pub fn volume_busy(&self, name: &str) -> bool {
        self.volumes.contains_key(name)
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
        !self.volumes.is_empty() || !self.others.is_empty()
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
    fn an_operation_running_is_found_as_a_start_would_find_it() {
        let mut ops = Operations::new(BackoffPolicy::default());
        assert!(ops.try_start(&key("v", Some("a")), "volume_mount"));
        assert!(ops.volume_op_running("v", Some("a")));
        assert!(
            !ops.volume_op_running("v", Some("b")),
            "another pod may go on"
        );
        assert!(ops.volume_op_running("v", None), "a node-wide one may not");
        ops.finish(&key("v", Some("a")), "volume_mount", true);
        assert!(ops.try_start(&key("v", None), "volume_mount"));
        assert!(
            ops.volume_op_running("v", Some("b")),
            "nothing goes on beside it"
        );
        ops.finish(&key("v", None), "volume_mount", true);
        assert!(!ops.volume_op_running("v", None) && !ops.busy());
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
