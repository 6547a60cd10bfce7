//! The volume stats calculator (`pkg/kubelet/server/stats/volume_stat_calculator.go`, run by the
//! fsResourceAnalyzer): every `--volume-stats-agg-period` (1 min; zero turns it off), jittered by up to as
//! long again (`wait.JitterUntil` with factor 1.0), each mounted volume is asked for its metrics
//! (NodeGetVolumeStats for a CSI volume whose driver has GET_VOLUME_STATS). The last answers are kept for
//! whoever reads the node's stats; with the `CSIVolumeHealth` gate an abnormal condition is a Warning
//! event on the pod, `VolumeConditionAbnormal`, at each pass while it lasts (the calculator does not
//! deduplicate). Upstream runs one calculator per pod; here one pass per node visits every pod's volumes,
//! a few at a time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use inlet_volume::{Metrics, PodInfo, VolumeError};

use super::Kubelet;
use super::volumemanager::VolumeInUse;
use crate::api::ApiPod;

/// How many volumes of a node are asked at once.
const CONCURRENT: usize = 16;

impl Kubelet {
    /// Calculates the node's volume stats every period until the kubelet stops (the task is aborted).
    pub(super) async fn calculate_volume_stats(self: Arc<Self>) {
        let period = self.config.volume_stats_agg_period;
        if period.is_zero() {
            return;
        }
        // A pass at once, then one per jittered period (`JitterUntil(..., sliding: true)`).
        loop {
            self.calc_and_store_stats().await;
            tokio::time::sleep(period + period.mul_f64(fastrand::f64())).await;
        }
    }

    /// One pass (`calcAndStoreStats`): the metrics of every mounted volume, by pod UID and the pod's name
    /// for the volume.
    async fn calc_and_store_stats(&self) {
        // Each ask is made when its turn comes, so a pass holds `CONCURRENT` of them, not one per mounted
        // volume.
        let mut volumes = self.volumes.mounted_volumes().into_iter();
        let mut asking = FuturesUnordered::new();
        let mut asked: Vec<Asked> = Vec::new();
        loop {
            asking.extend(volumes.by_ref().take(CONCURRENT - asking.len()).map(ask));
            match asking.next().await {
                Some(answer) => asked.push(answer),
                None => break,
            }
        }
        let mut stats: HashMap<String, PodVolumeStats> = HashMap::new();
        for (pod, outer, metrics) in asked {
            let metrics = match metrics {
                Ok(Some(metrics)) => metrics,
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(node = %self.config.name, pod = %pod.name, volume = %outer,
                        "Failed to calculate volume metrics: {e}");
                    continue;
                }
            };
            if let (Some(true), Some(message)) = (metrics.abnormal, &metrics.message)
                && let Some(object) = self.api.peek::<ApiPod>(&pod.namespace, &pod.name)
            {
                let text = format!("Volume {outer}: {message}");
                self.api
                    .record_event(&object, "Warning", "VolumeConditionAbnormal", &text);
            }
            stats
                .entry(pod.uid.clone())
                .or_default()
                .push((outer, metrics));
        }
        for volumes in stats.values_mut() {
            volumes.shrink_to_fit();
        }
        *self.volume_stats.lock() = stats;
    }

    /// The last metrics of pod `uid`'s volumes, by the pod's name for each.
    pub fn volume_stats(&self, uid: &str) -> BTreeMap<String, Metrics> {
        self.volume_stats
            .lock()
            .get(uid)
            .map(|volumes| volumes.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// A volume's metrics, asked of its plugin: the pod, its name for the volume, the answer.
type Asked = (Arc<PodInfo>, String, Result<Option<Metrics>, VolumeError>);

/// Asks one mounted volume for its metrics. Boxed: the pass's future, holding unboxed async blocks over
/// `dyn VolumePlugin`, is not provably Send.
fn ask((pod, outer, spec_name, plugin): VolumeInUse) -> BoxFuture<'static, Asked> {
    Box::pin(async move {
        let metrics = plugin.metrics(&spec_name, &pod.uid).await;
        (pod, outer, metrics)
    })
}

/// One pod's volume metrics, by the pod's name for each volume: a few per pod, kept for every pod of the
/// node between passes, so a list (a B-tree's node holds room for eleven).
pub(super) type PodVolumeStats = Vec<(String, Metrics)>;
