//! CSI conformance tests of the local driver: each test is one rule of the CSI spec (v1.9.0) for the RPCs the
//! driver implements: required fields, idempotency, error codes, pagination and capacity. Plus restart,
//! KEP-596 ephemeral inline volumes, bad input, and secrets kept out of logs. Every test talks to the real
//! server over a unix socket in a temp dir.

mod bad_input;
mod concurrency;
mod controller;
mod ephemeral;
mod fixture;
mod identity;
mod node;
mod restart;
mod secrets;
mod snapshots;
mod symlinks;
