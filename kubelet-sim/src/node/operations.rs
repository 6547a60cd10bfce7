//! The operation table: at most one operation per volume at a time (a pod-less operation, such as staging,
//! excludes every other on its volume; pod operations on one volume exclude only the same pod's), and
//! exponential backoff after a failure (`nestedpendingoperations.go`, `exponentialbackoff.go`).

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

/// What an operation is about: a volume, and a pod unless it is node-wide (attach, stage).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OpKey {
    /// The unique volume name.
    pub volume: String,
    /// The pod UID, for per-pod operations.
    pub pod: Option<String>,
}

/// Pending operations and backoff.
#[derive(Debug, Default)]
pub struct Operations {
    policy: BackoffPolicy,
    /// Running operations by volume: the pods they are for (None for a node-wide one). Indexed by
    /// volume so a conflict check costs one lookup, not a scan of every running operation.
    pending: HashMap<String, HashSet<Option<String>>>,
    backoff: HashMap<OpKey, (Instant, Duration)>,
}

impl Operations {
    /// A table with a backoff policy.
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            ..Default::default()
        }
    }

    /// Starts an operation unless a conflicting one runs or its backoff has not expired.
    pub fn try_start(&mut self, key: &OpKey) -> bool {
        let conflicts = self.pending.get(&key.volume).is_some_and(|pods| {
            key.pod.is_none() || pods.contains(&None) || pods.contains(&key.pod)
        });
        let waiting = self
            .backoff
            .get(key)
            .is_some_and(|(until, _)| Instant::now() < *until);
        if conflicts || waiting {
            return false;
        }
        self.pending
            .entry(key.volume.clone())
            .or_default()
            .insert(key.pod.clone());
        true
    }

    /// Ends an operation: success clears its backoff, failure doubles it.
    pub fn finish(&mut self, key: &OpKey, ok: bool) {
        if let Some(pods) = self.pending.get_mut(&key.volume) {
            pods.remove(&key.pod);
            if pods.is_empty() {
                self.pending.remove(&key.volume);
            }
        }
        if ok {
            self.backoff.remove(key);
            return;
        }
        let next = match self.backoff.get(key) {
            Some((_, last)) => (*last * 2).min(self.policy.max),
            None => self.policy.initial,
        };
        self.backoff
            .insert(key.clone(), (Instant::now() + next, next));
    }

    /// When the earliest backoff expires (the reconciler should look again then).
    pub fn next_retry(&self) -> Option<Instant> {
        self.backoff
            .values()
            .map(|(until, _)| *until)
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
        OpKey {
            volume: volume.into(),
            pod: pod.map(String::from),
        }
    }

    #[test]
    fn one_operation_per_volume_and_backoff_doubles() {
        let mut ops = Operations::new(BackoffPolicy {
            initial: Duration::from_millis(40),
            max: Duration::from_millis(60),
        });
        assert!(ops.try_start(&key("v", Some("a"))));
        assert!(
            ops.try_start(&key("v", Some("b"))),
            "other pods on the volume may proceed"
        );
        assert!(
            !ops.try_start(&key("v", None)),
            "a node-wide operation waits for them"
        );
        assert!(
            !ops.try_start(&key("v", Some("a"))),
            "the same operation is not started twice"
        );
        ops.finish(&key("v", Some("a")), false);
        ops.finish(&key("v", Some("b")), true);
        assert!(!ops.try_start(&key("v", Some("a"))), "backing off");
        assert!(ops.next_retry().is_some());
        std::thread::sleep(Duration::from_millis(45));
        assert!(ops.try_start(&key("v", Some("a"))));
        ops.finish(&key("v", Some("a")), false);
        assert_eq!(
            ops.backoff[&key("v", Some("a"))].1,
            Duration::from_millis(60),
            "doubled, capped"
        );
    }
}
