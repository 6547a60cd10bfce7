//! How a [`CsiClient`](super::CsiClient) reaches its driver.
//!
//! Upstream dials the driver for every call and closes the connection when the call returns
//! (`pkg/volume/csi/csi_client.go`: each method gets its client from `newV1NodeClient`, which dials with
//! `newGrpcConn`, and `defer closer.Close()`). Here the calls made while others are in flight share one
//! connection, and it is closed when the last of them returns; the next call dials again. So a driver sees
//! connections come and go as under a real kubelet, without one connection per call: a node publishing
//! 200 volumes at once would hold 200 connections, 400 descriptors when the driver runs in the same
//! process (bench/RESULTS.md, issue #28's eighth pass). Nor is a connection kept for good: HTTP/2's
//! stream and frame tables grow to the largest burst a connection carries and keep that size while it
//! lives.

use std::sync::{Arc, Mutex, PoisonError};

use tonic::transport::Channel;

/// A channel to the driver: one kept for the client's life, or one dialed for each burst of calls.
#[derive(Clone)]
pub(super) enum Connection {
    /// The same channel for every call (conform's clients and tests, which hold their own).
    Kept(Channel),
    /// Dialed when a call finds none open, closed when its last call returns.
    PerBurst(Arc<Dialed>),
}

/// The connection of [`Connection::PerBurst`] and how to dial it.
pub(super) struct Dialed {
    dial: Box<dyn Fn() -> Channel + Send + Sync>,
    open: Mutex<Option<Open>>,
}

/// A connection open for calls in flight.
struct Open {
    channel: Channel,
    calls: usize,
}

/// A call's hold on a connection: the connection closes when the last hold on it is dropped.
pub(super) struct Lease {
    /// The channel to send the call on.
    pub channel: Channel,
    dialed: Option<Arc<Dialed>>,
}

impl Connection {
    /// A connection dialed by `dial` at each burst; the first burst uses `open`, already dialed.
    pub fn per_burst(open: Channel, dial: impl Fn() -> Channel + Send + Sync + 'static) -> Self {
        Self::PerBurst(Arc::new(Dialed {
            dial: Box::new(dial),
            open: Mutex::new(Some(Open {
                channel: open,
                calls: 0,
            })),
        }))
    }

    /// The channel for one call, dialed if no other call holds one open.
    pub fn lease(&self) -> Lease {
        match self {
            Self::Kept(channel) => Lease {
                channel: channel.clone(),
                dialed: None,
            },
            Self::PerBurst(dialed) => {
                let mut open = dialed.open.lock().unwrap_or_else(PoisonError::into_inner);
                let open = open.get_or_insert_with(|| Open {
                    channel: (dialed.dial)(),
                    calls: 0,
                });
                open.calls += 1;
                Lease {
                    channel: open.channel.clone(),
                    dialed: Some(Arc::clone(dialed)),
                }
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(dialed) = &self.dialed else { return };
        let closed = {
            let mut open = dialed.open.lock().unwrap_or_else(PoisonError::into_inner);
            match open.as_mut() {
                Some(o) if o.calls > 1 => {
                    o.calls -= 1;
                    None
                }
                _ => open.take(),
            }
        };
        // The connection ends when its channel's last clone (this lease's, then the taken one) is gone.
        drop(closed);
    }
}
