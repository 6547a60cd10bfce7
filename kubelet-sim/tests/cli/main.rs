//! kubelet-sim's process-level tests, in one test binary (one link, not several, on 2 cores): the binary
//! run as a user runs it (`commands.rs`, and `bench.rs` for `kubelet-sim bench`), `kubelet-sim conform`
//! as a driver author runs it (`conform.rs`), kill-anywhere crash points (`crash_points.rs`), drivers
//! that lie (`hostile.rs`), metrics (`metrics.rs`), signals mid-run (`signals.rs`), and the KEPs against
//! the upstream template (`keps.rs`).

mod bench;
mod commands;
mod common;
mod conform;
mod crash_points;
mod hostile;
mod keps;
mod metrics;
mod signals;
