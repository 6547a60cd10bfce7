//! Every CSI call the simulated nodes make, for the report: those that returned, and those in flight.

use std::collections::BTreeMap;

use inlet_proto::csi_call::CsiCall;
use inlet_volume::csi::{Answer, CsiObserver};
use parking_lot::Mutex;

use crate::deflated::DeflatedLines;

/// Collects every CSI call the nodes make, for the report: those that returned, and those still in flight.
/// A returned call is kept as its report's JSON line, deflated with the others ([`DeflatedLines`]): a run
/// of 100,000 pods makes 600,000 calls, about 1 KB each as a [`CsiCall`], several times less deflated.
#[derive(Default)]
pub struct ReportedCalls {
    returned: DeflatedLines,
    /// The returned calls counted by method, then by code.
    counts: Mutex<BTreeMap<String, BTreeMap<String, usize>>>,
    in_flight: Mutex<BTreeMap<u64, (CsiCall, std::time::Instant)>>,
    next: std::sync::atomic::AtomicU64,
}

/// The `code` of a call reported while it has no answer yet.
pub const IN_FLIGHT: &str = "InFlight";

impl CsiObserver for ReportedCalls {
    fn started(&self, call: CsiCall) -> u64 {
        let token = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.in_flight
            .lock()
            .insert(token, (call, std::time::Instant::now()));
        token
    }

    fn answered(&self, token: u64, answer: Answer<'_>) {
        let Some((mut call, _)) = self.in_flight.lock().remove(&token) else {
            return;
        };
        call.answered(answer.failure, answer.publish_context);
        crate::metrics::METRICS.csi_call(&call, answer.elapsed);
        self.returned.push_json(&call);
        let mut counts = self.counts.lock();
        let by_code = counts.entry(call.method).or_default();
        *by_code.entry(call.code).or_default() += 1;
    }

    fn given_up(&self, token: u64) {
        self.in_flight.lock().remove(&token);
    }
}

impl ReportedCalls {
    /// Every call that returned so far.
    pub fn calls(&self) -> Vec<CsiCall> {
        self.returned
            .lines()
            .iter()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// How many calls returned so far.
    pub fn returned(&self) -> usize {
        self.returned.len()
    }

    /// The calls that returned so far, counted by method, then by code (`OK`, `NotFound`, ...).
    pub fn counts(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        self.counts.lock().clone()
    }

    /// The calls sent and not answered yet, in the order they were sent: code [`IN_FLIGHT`], and how long
    /// each has waited.
    pub fn in_flight(&self) -> Vec<CsiCall> {
        self.in_flight
            .lock()
            .values()
            .map(|(call, since)| CsiCall {
                code: IN_FLIGHT.into(),
                message: format!("no answer after {:.1}s", since.elapsed().as_secs_f64()),
                ..call.clone()
            })
            .collect()
    }
}
