//! `bench image --churn DURATION`: read-only volumes of one image published and unpublished every
//! `--churn-period` for minutes while the image is removed from the runtime every second (what the
//! kubelet's image GC, or an operator's `crictl rmi`, does to an image no container uses). A known failure
//! of other image drivers is read-only volumes going empty when pods churn faster than a few seconds: every
//! volume is looked into right after its publish and again right before its unpublish, and each one found
//! empty is counted. The runtime's own GC runs on each removal (containerd collects what no lease holds).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::runtime::remove_image;
use super::volumes::{Target, is_empty, publish_next, unpublish};
use crate::bench::error::BenchError;
use crate::bench::stats::Summary;
use crate::bench::stop_if_interrupted;
use crate::cri::Cri;

/// Volumes each driver keeps published while churning: each lives `WINDOW` periods.
const WINDOW: usize = 8;

/// How often the image is removed from the runtime.
const REMOVE_EVERY: Duration = Duration::from_secs(1);

/// What a churn run did and found.
#[derive(Debug, Serialize)]
pub struct ChurnFigures {
    /// How long it ran.
    pub seconds: f64,
    /// NodePublishVolume calls, all drivers.
    pub publishes: usize,
    /// NodeUnpublishVolume calls.
    pub unpublishes: usize,
    /// RemoveImage calls the runtime accepted while volumes of the image were published.
    pub image_removals: usize,
    /// Volumes found empty right after their publish or right before their unpublish: must be 0.
    pub empties: usize,
    /// The publishes' latencies (some pull the image again after a removal).
    pub publish: Summary,
}

/// Churns every target's read-only volumes of `image` for `duration`, a publish and an unpublish per
/// target every `period`, removing the image from the runtime every second.
pub(super) async fn churn(
    targets: &mut [Target],
    cri: &mut Cri,
    image: &str,
    duration: Duration,
    period: Duration,
    interrupts: &Option<crate::signals::Interrupts>,
) -> Result<ChurnFigures, BenchError> {
    eprintln!(
        "churn: a read-only volume published and one unpublished per driver every {period:?} for \
         {duration:?}, the image removed from the runtime every {REMOVE_EVERY:?}"
    );
    let started = Instant::now();
    let mut live: Vec<VecDeque<(String, PathBuf)>> = vec![VecDeque::new(); targets.len()];
    let (mut publishes, mut unpublishes, mut removals, mut empties) = (0, 0, 0, 0);
    let mut samples = Vec::new();
    let mut last_removal = Instant::now();
    let mut next_report = Instant::now() + Duration::from_secs(30);
    while started.elapsed() < duration {
        stop_if_interrupted(interrupts)?;
        let tick = Instant::now();
        for (target, live) in targets.iter_mut().zip(live.iter_mut()) {
            samples.push(publish_next(target, image, true).await?);
            publishes += 1;
            let volume = target.published.pop().expect("just published");
            empties += usize::from(is_empty(&volume.1));
            live.push_back(volume);
            if live.len() > WINDOW {
                let (id, path) = live.pop_front().expect("more than the window");
                empties += usize::from(is_empty(&path));
                unpublish(target, &id, &path).await?;
                unpublishes += 1;
            }
        }
        if last_removal.elapsed() >= REMOVE_EVERY {
            removals += usize::from(remove_image(cri, image).await);
            last_removal = Instant::now();
        }
        if Instant::now() >= next_report {
            eprintln!(
                "churn: {:.0} s, {publishes} publishes, {removals} image removals, {empties} empty",
                started.elapsed().as_secs_f64()
            );
            next_report += Duration::from_secs(30);
        }
        tokio::time::sleep(period.saturating_sub(tick.elapsed())).await;
    }
    for (target, live) in targets.iter_mut().zip(live) {
        for (id, path) in live {
            empties += usize::from(is_empty(&path));
            unpublish(target, &id, &path).await?;
            unpublishes += 1;
        }
    }
    Ok(ChurnFigures {
        seconds: started.elapsed().as_secs_f64(),
        publishes,
        unpublishes,
        image_removals: removals,
        empties,
        publish: Summary::of(&mut samples, started.elapsed()),
    })
}
