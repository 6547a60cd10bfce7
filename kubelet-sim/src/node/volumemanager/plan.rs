//! The reconciler's plan (`reconciler_common.go`: `unmountVolumes`, `unmountDetachDevices`, then
//! `mountOrAttachVolumes`): what a pass starts, volume by volume.
//!
//! Upstream walks every volume of the node on every pass (each 100 ms) and asks the operation executor to
//! start whatever is not done; the executor refuses what still runs or backs off (`isExpectedError`).
//! Here a thousand simulated nodes share the process's CPUs, so a pass looks only at the volumes marked
//! for review ([`Review`]): those the populator added or removed a pod of, those an operation ended on,
//! and those a pass asked to see again (a start refused by backoff, an attach not confirmed yet, an
//! unmount waiting for the populator), or to see when their republish is due. Every other volume is
//! where the last pass left it: done, or its operation running. What a pass starts is the same as
//! upstream's: debug builds check on every pass that a walk of every volume finds nothing more.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_volume::Spec;

use super::VolumeManager;
use super::actual_state::{ActualVolume, MountState, MountedPod};
use super::desired_state::{DesiredVolume, PodVolume};
use crate::operations::Operations;

/// One piece of work a pass decided on.
pub(super) enum Action {
    TearDown {
        unique: String,
        /// Boxed: the largest action by far, and the rarest.
        mount: Box<MountedPod>,
        spec: Spec,
    },
    UnmountDevice {
        unique: String,
        spec: Spec,
        path: PathBuf,
    },
    Forget {
        unique: String,
    },
    CheckAttach {
        unique: String,
        volume: Arc<PodVolume>,
    },
    MarkAttached {
        unique: String,
        volume: Arc<PodVolume>,
    },
    MountDevice {
        unique: String,
        volume: Arc<PodVolume>,
        waiting: Vec<Arc<PodVolume>>,
    },
    SetUp {
        unique: String,
        volume: Arc<PodVolume>,
        /// One mount of the volume at a time, for every pod (`operation_executor.go` MountVolume keys an
        /// attachable or device-mountable volume's mounts by the volume alone, so a ReadWriteOncePod check
        /// sees the other pod's mount); else one per pod.
        per_volume: bool,
    },
}

/// The volumes the reconciler's passes look at.
#[derive(Debug, Default)]
pub(super) struct Review {
    /// On the next pass.
    next: BTreeSet<String>,
    /// Once their time comes: volumes whose driver asks to be published again, by when it is due.
    at: BTreeSet<(Instant, String)>,
}

impl Review {
    /// The volumes to look at now, taken.
    fn take_due(&mut self, now: Instant) -> BTreeSet<String> {
        let mut due = std::mem::take(&mut self.next);
        while let Some(first) = self.at.first()
            && first.0 <= now
        {
            let (_, unique) = self.at.pop_first().expect("a first entry");
            due.insert(unique);
        }
        due
    }
}

/// The actions of one pass: every unmount before any mount, as upstream's pass.
#[derive(Default)]
struct Planned {
    unmounts: Vec<Action>,
    mounts: Vec<Action>,
}

/// What a pass is planned from: the states and operation table, locked.
struct Inputs<'a> {
    ops: &'a Operations,
    /// Whether unmounting may start (the populator has added the API's pods).
    ready_to_unmount: bool,
    republish_period: Duration,
    now: Instant,
}

impl VolumeManager {
    /// Marks a volume for the next pass to look at.
    pub(super) fn review(&self, unique: &str) {
        self.review.lock().next.insert(unique.to_string());
    }

    /// Marks volumes for the next pass to look at.
    pub(super) fn review_all(&self, volumes: impl IntoIterator<Item = String>) {
        self.review.lock().next.extend(volumes);
    }

    /// What to start on this pass, from the volumes marked for review; those it must see again are
    /// marked again.
    pub(super) fn plan(&self) -> Vec<Action> {
        let dsw = self.dsw.lock();
        let asw = self.asw.lock();
        let ops = self.ops.lock();
        let mut review = self.review.lock();
        let now = Instant::now();
        let reviewed = review.take_due(now);
        let inputs = Inputs {
            ops: &ops,
            // Not before the populator has added the API's pods: a volume reconstructed after a restart
            // may belong to a pod not loaded yet, and tearing it down would delete an ephemeral volume's
            // data (upstream's `readyToUnmount`, reconstruct.go).
            ready_to_unmount: self.populator_has_added_pods(),
            republish_period: self.republish_period,
            now,
        };
        let mut planned = Planned::default();
        for unique in reviewed {
            let (desired, actual) = (dsw.volume(&unique), asw.volume(&unique));
            match plan_volume(&unique, desired, actual, &inputs, &mut planned) {
                Some(at) if at <= now => review.next.insert(unique),
                Some(at) => review.at.insert((at, unique)),
                None => false,
            };
        }
        #[cfg(debug_assertions)]
        {
            let mut everything = Planned::default();
            let all: BTreeSet<&String> = dsw.volumes().keys().chain(asw.volumes().keys()).collect();
            for unique in all {
                let (desired, actual) = (dsw.volume(unique), asw.volume(unique));
                plan_volume(unique, desired, actual, &inputs, &mut everything);
            }
            let seen: BTreeSet<_> = planned.iter().map(Action::describe).collect();
            let missed: Vec<_> = everything
                .iter()
                .map(Action::describe)
                .filter(|a| !seen.contains(a))
                .collect();
            debug_assert!(
                missed.is_empty(),
                "a pass missed {missed:?}: a change was not marked for review"
            );
        }
        let mut actions = planned.unmounts;
        actions.append(&mut planned.mounts);
        actions
    }
}

impl Planned {
    #[cfg(debug_assertions)]
    fn iter(&self) -> impl Iterator<Item = &Action> {
        self.unmounts.iter().chain(&self.mounts)
    }
}

impl Action {
    /// What the action is, on which volume, for which pod ("" for none).
    #[cfg(debug_assertions)]
    fn describe(&self) -> (&'static str, &str, &str) {
        match self {
            Self::TearDown { unique, mount, .. } => ("TearDown", unique, &mount.pod.uid),
            Self::UnmountDevice { unique, .. } => ("UnmountDevice", unique, ""),
            Self::Forget { unique } => ("Forget", unique, ""),
            Self::CheckAttach { unique, .. } => ("CheckAttach", unique, ""),
            Self::MarkAttached { unique, .. } => ("MarkAttached", unique, ""),
            Self::MountDevice { unique, .. } => ("MountDevice", unique, ""),
            Self::SetUp { unique, volume, .. } => ("SetUp", unique, &volume.pod.uid),
        }
    }
}

/// What a pass starts for one volume, skipping what an operation still runs for (upstream's executor
/// would refuse it); and when a pass must look at it again whatever happens meanwhile (now: the next).
fn plan_volume(
    unique: &str,
    desired: Option<&DesiredVolume>,
    actual: Option<&ActualVolume>,
    inputs: &Inputs,
    planned: &mut Planned,
) -> Option<Instant> {
    let ops = inputs.ops;
    let mut again: Option<Instant> = None;
    // Unmount first: mounts no pod wants, then staging no pod uses, then forget what is gone.
    if let Some(actual) = actual {
        if !inputs.ready_to_unmount {
            again = Some(inputs.now);
        } else {
            for (uid, mount) in actual.pods.iter() {
                let unwanted = desired.is_none_or(|w| !w.pods.contains_key(uid));
                if unwanted && !ops.volume_op_running(unique, Some(uid)) {
                    planned.unmounts.push(Action::TearDown {
                        unique: unique.to_string(),
                        mount: mount.clone(),
                        spec: actual.spec.clone(),
                    });
                }
            }
            if actual.pods.is_empty() && desired.is_none() && !ops.volume_op_running(unique, None) {
                planned.unmounts.push(match &actual.device {
                    Some((path, _)) => Action::UnmountDevice {
                        unique: unique.to_string(),
                        spec: actual.spec.clone(),
                        path: path.clone(),
                    },
                    None => Action::Forget {
                        unique: unique.to_string(),
                    },
                });
            }
        }
    }
    // Then mount what is wanted.
    let Some((desired, first)) = desired.and_then(|d| Some((d, d.pods.values().next()?))) else {
        return again;
    };
    let Some(actual) = actual else {
        planned.mounts.push(match desired.attachable {
            true => Action::CheckAttach {
                unique: unique.to_string(),
                volume: first.clone(),
            },
            false => Action::MarkAttached {
                unique: unique.to_string(),
                volume: first.clone(),
            },
        });
        return again;
    };
    if desired.device_mountable
        && actual.device.as_ref().map(|(_, s)| *s) != Some(MountState::Mounted)
    {
        if !ops.volume_op_running(unique, None) {
            planned.mounts.push(Action::MountDevice {
                unique: unique.to_string(),
                volume: first.clone(),
                waiting: desired.pods.values().cloned().collect(),
            });
        }
        return again;
    }
    let per_volume = desired.attachable || desired.device_mountable;
    for (uid, volume) in desired.pods.iter() {
        if ops.volume_op_running(unique, (!per_volume).then_some(uid.as_str())) {
            continue;
        }
        let mounted = actual.mounted(uid);
        // A volume that asks to be published again is looked at when that is due.
        let republish_at = mounted
            .filter(|_| volume.requires_republish)
            .map(|m| m.published_at + inputs.republish_period);
        if let Some(at) = republish_at.filter(|at| *at > inputs.now) {
            again = Some(again.map_or(at, |a| a.min(at)));
        }
        let republish_due = republish_at.is_some_and(|at| at <= inputs.now);
        if mounted.is_none() || republish_due {
            planned.mounts.push(Action::SetUp {
                unique: unique.to_string(),
                volume: volume.clone(),
                per_volume,
            });
        }
    }
    again
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_gives_the_next_volumes_and_those_due_once() {
        let now = Instant::now();
        let mut review = Review::default();
        review.next.insert("a".into());
        review.at.insert((now, "due".into()));
        review
            .at
            .insert((now + Duration::from_secs(60), "later".into()));
        let due: Vec<String> = review.take_due(now).into_iter().collect();
        assert_eq!(due, ["a", "due"]);
        assert!(review.take_due(now).is_empty(), "taken");
        let later = review.take_due(now + Duration::from_secs(61));
        assert_eq!(later.into_iter().collect::<Vec<_>>(), ["later"]);
    }
}
