//! Latency figures: percentiles of a set of samples, and the rate they were taken at.

use std::time::Duration;

use serde::Serialize;

/// The figures of one set of samples.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// How many samples.
    pub samples: usize,
    /// Samples per second of wall time (at concurrency C, C run at once).
    pub per_second: f64,
    /// Percentiles and the worst, in microseconds.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// The slowest.
    pub max_us: f64,
}

impl Summary {
    /// The figures of `samples` (sorted here), taken in `wall` time.
    pub fn of(samples: &mut [Duration], wall: Duration) -> Self {
        samples.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let at = |p: f64| {
            // No samples (no pod became ready) gives zeros, never a panic.
            let index = ((samples.len() as f64 * p).ceil() as usize).max(1) - 1;
            samples.get(index).copied().map(us).unwrap_or(0.0)
        };
        Self {
            samples: samples.len(),
            per_second: samples.len() as f64 / wall.as_secs_f64().max(f64::EPSILON),
            p50_us: at(0.50),
            p90_us: at(0.90),
            p99_us: at(0.99),
            max_us: samples.last().copied().map(us).unwrap_or(0.0),
        }
    }
}

/// The process's peak resident memory (VmHWM), in MiB.
pub fn peak_rss_mib() -> u64 {
    let pid = std::process::id() as i32;
    inlet_host::metrics::process::peak_resident_bytes_of(pid).unwrap_or(0) >> 20
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_samples_taken_by_rank() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let s = Summary::of(&mut samples, Duration::from_secs(1));
        assert_eq!(
            (s.p50_us, s.p90_us, s.p99_us, s.max_us),
            (50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(s.per_second, 100.0);
        let one = Summary::of(&mut [Duration::from_micros(7)], Duration::from_secs(1));
        assert_eq!((one.p50_us, one.max_us), (7.0, 7.0));
        // No samples (no pod became ready before a signal) give zeros, never a panic.
        let none = Summary::of(&mut [], Duration::from_secs(1));
        assert_eq!((none.samples, none.p50_us, none.max_us), (0, 0.0, 0.0));
    }
}
