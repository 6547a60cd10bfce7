//! `process_*`: the figures client_golang's process collector gives every Go component (the kubelet,
//! the CSI sidecars, node-driver-registrar), with its names and help texts, read from `/proc/self` at
//! each scrape. A figure `/proc` does not give is left out rather than made up.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Registers the process collector in `registry`.
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector));
}

#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, value) in figures() {
            // client_golang's only counter; prometheus_client adds `_total` to a counter's name.
            if let Some(counter) = name.strip_suffix("_total") {
                let metric = ConstCounter::new(value);
                metric.encode(encoder.encode_descriptor(
                    counter,
                    help,
                    None,
                    metric.metric_type(),
                )?)?;
            } else {
                let metric = ConstGauge::new(value);
                metric.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    metric.metric_type(),
                )?)?;
            }
        }
        Ok(())
    }
}

/// This process's user and system CPU time so far, in seconds (`process_cpu_seconds_total`).
pub fn cpu_seconds() -> Option<f64> {
    cpu_seconds_of(std::process::id() as i32)
}

/// This process's resident memory now, in bytes (`process_resident_memory_bytes`).
pub fn resident_bytes() -> Option<u64> {
    resident_bytes_of(std::process::id() as i32)
}

/// Process `pid`'s CPU time, user and system, in seconds.
pub fn cpu_seconds_of(pid: i32) -> Option<f64> {
    let stat = procfs::process::Process::new(pid).ok()?.stat().ok()?;
    Some((stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64)
}

/// Process `pid`'s resident memory now, in bytes.
pub fn resident_bytes_of(pid: i32) -> Option<u64> {
    let stat = procfs::process::Process::new(pid).ok()?.stat().ok()?;
    Some(stat.rss * procfs::page_size())
}

/// Process `pid`'s peak resident memory so far (`VmHWM`), in bytes.
pub fn peak_resident_bytes_of(pid: i32) -> Option<u64> {
    let status = procfs::process::Process::new(pid).ok()?.status().ok()?;
    Some(status.vmhwm? * 1024)
}

/// Each figure `/proc/self` gives now: name, client_golang's help text, value.
fn figures() -> Vec<(&'static str, &'static str, f64)> {
    let mut figures = Vec::new();
    let Ok(me) = procfs::process::Process::myself() else {
        return figures;
    };
    if let Ok(stat) = me.stat() {
        let ticks = procfs::ticks_per_second() as f64;
        figures.push((
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            (stat.utime + stat.stime) as f64 / ticks,
        ));
        if let Ok(boot) = procfs::boot_time_secs() {
            figures.push((
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                boot as f64 + stat.starttime as f64 / ticks,
            ));
        }
        figures.push((
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            (stat.rss * procfs::page_size()) as f64,
        ));
        figures.push((
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            stat.vsize as f64,
        ));
    }
    if let Ok(fds) = me.fd_count() {
        figures.push((
            "process_open_fds",
            "Number of open file descriptors.",
            fds as f64,
        ));
    }
    if let Ok(limits) = me.limits()
        && let procfs::process::LimitValue::Value(max) = limits.max_open_files.soft_limit
    {
        figures.push((
            "process_max_fds",
            "Maximum number of open file descriptors.",
            max as f64,
        ));
    }
    figures
}
