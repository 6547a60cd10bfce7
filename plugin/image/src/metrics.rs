//! The engine's metrics: image pulls (how many, how many bytes, how long, by result) and the decisions
//! the pull record makes for cached images (KEP-2535). The families are recorded into always; a binary
//! exposes them with [`ImageMetrics::register`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::pull::{Decision, PullError};

/// Pull durations, in seconds: from a cached layer's fraction of a second to a large image's minutes.
const PULL_BUCKETS: [f64; 10] = [0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabel {
    decision: &'static str,
}

/// The engine's families. Clones share them.
#[derive(Clone, Debug)]
pub struct ImageMetrics {
    pulls: Family<ResultLabel, Counter>,
    pull_bytes: Counter,
    pull_seconds: Family<ResultLabel, Histogram, fn() -> Histogram>,
    decisions: Family<DecisionLabel, Counter>,
}

impl Default for ImageMetrics {
    fn default() -> Self {
        Self {
            pulls: Family::default(),
            pull_bytes: Counter::default(),
            pull_seconds: Family::new_with_constructor(|| Histogram::new(PULL_BUCKETS)),
            decisions: Family::default(),
        }
    }
}

impl ImageMetrics {
    /// Exposes the families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "inlet_image_pulls",
            "Image pulls through the runtime's CRI that ended, by result: success, not_found, unauthorized, unavailable, failed",
            self.pulls.clone(),
        );
        registry.register(
            "inlet_image_pull_bytes",
            "Bytes of the images pulled (the runtime's size of each image pulled successfully)",
            self.pull_bytes.clone(),
        );
        registry.register(
            "inlet_image_pull_duration_seconds",
            "How long each image pull took, from its start to its end, by result",
            self.pull_seconds.clone(),
        );
        registry.register(
            "inlet_image_pull_decisions",
            "What the pull policy and the node's pull record (KEP-2535) decided for each image asked for: use_cached, pull_absent, pull_always, pull_to_verify (cached, but the caller must prove access), refused_never_pull, refused_denied",
            self.decisions.clone(),
        );
    }

    /// A pull that ended: its outcome, how long it took, and the image's size when it succeeded.
    pub(crate) fn pulled(&self, outcome: Result<u64, &PullError>, seconds: f64) {
        let result = match outcome {
            Ok(bytes) => {
                self.pull_bytes.inc_by(bytes);
                "success"
            }
            Err(PullError::NotFound { .. }) => "not_found",
            Err(PullError::Unauthorized { .. } | PullError::Denied { .. }) => "unauthorized",
            Err(PullError::Unavailable(_)) => "unavailable",
            Err(_) => "failed",
        };
        let label = ResultLabel { result };
        self.pulls.get_or_create(&label).inc();
        self.pull_seconds.get_or_create(&label).observe(seconds);
    }

    /// A decision, with whether the image was present.
    pub(crate) fn decided(&self, decision: &Decision, present: bool, always: bool) {
        let decision = match decision {
            Decision::UseCached(_) => "use_cached",
            Decision::Pull if !present => "pull_absent",
            Decision::Pull if always => "pull_always",
            Decision::Pull => "pull_to_verify",
            Decision::Refused(PullError::NeverPull(_)) => "refused_never_pull",
            Decision::Refused(_) => "refused_denied",
        };
        self.decisions
            .get_or_create(&DecisionLabel { decision })
            .inc();
    }
}
