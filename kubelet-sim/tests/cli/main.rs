//! kubelet-sim's process-level tests, in one test binary (one link, not three, on 2 cores): the binary
//! run as a user runs it (`commands.rs`), `kubelet-sim conform` as a driver author runs it
//! (`conform.rs`), and kill-anywhere crash points (`crash_points.rs`).

mod commands;
mod common;
mod conform;
mod crash_points;
