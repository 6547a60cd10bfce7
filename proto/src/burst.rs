//! [`BurstChannel`]: a gRPC channel whose connection is closed once a burst of calls is over, and dialed
//! again for the next call.
//!
//! HTTP/2 in Rust (h2) keeps a connection's stream and frame tables at the size of the most calls it ever
//! had in flight at once, for as long as the connection lives. grpc-go, which real kubelets, runtimes
//! and drivers use, frees a stream's memory with the stream. A connection that has carried `retire_after`
//! calls at once or more is closed when the last of them returns, which frees its tables on both ends
//! (both are in one process when a simulation serves its drivers). The kubelet side's CSI client closes
//! its connection after every burst, the nearest to upstream's connection per call (`csi_client.go`).
//!
//! A call holds its connection until its response body ends, so a connection never closes under a call.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::transport::Channel;
use tower::{Service, ServiceExt};

/// A channel dialed when a call finds none open, and closed after a burst (see the module's doc).
/// Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct BurstChannel {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for BurstChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurstChannel")
            .field("retire_after", &self.shared.retire_after)
            .finish()
    }
}

struct Shared {
    /// Dials a new connection (a kept channel's gives the same one again).
    dial: Box<dyn Fn() -> Channel + Send + Sync>,
    /// The calls at once that make a connection close when it falls idle.
    retire_after: usize,
    open: Mutex<Option<Open>>,
}

/// The connection open now.
struct Open {
    channel: Channel,
    /// Calls in flight on it.
    calls: usize,
    /// The most it has had in flight at once.
    most: usize,
}

/// A call's hold on the connection it was sent on.
struct Lease {
    channel: Channel,
    shared: Arc<Shared>,
}

impl BurstChannel {
    /// A channel over `open`, already dialed, that `dial` dials again after each burst of `retire_after`
    /// calls at once or more (1: after every burst, so a connection lives only while calls are in flight).
    pub fn new(
        open: Channel,
        retire_after: usize,
        dial: impl Fn() -> Channel + Send + Sync + 'static,
    ) -> Self {
        let open = Open {
            channel: open,
            calls: 0,
            most: 0,
        };
        Self {
            shared: Arc::new(Shared {
                dial: Box::new(dial),
                retire_after: retire_after.max(1),
                open: Mutex::new(Some(open)),
            }),
        }
    }

    /// A channel over `channel` for good, as it is.
    pub fn kept(channel: Channel) -> Self {
        let again = channel.clone();
        Self::new(channel, usize::MAX, move || again.clone())
    }

    /// The connection for one more call, dialed if none is open.
    fn lease(&self) -> Lease {
        let shared = &self.shared;
        let mut open = shared.open.lock().unwrap_or_else(PoisonError::into_inner);
        let open = open.get_or_insert_with(|| Open {
            channel: (shared.dial)(),
            calls: 0,
            most: 0,
        });
        open.calls += 1;
        open.most = open.most.max(open.calls);
        Lease {
            channel: open.channel.clone(),
            shared: Arc::clone(shared),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut open = self
            .shared
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let burst_over = open.as_mut().is_some_and(|o| {
            o.calls = o.calls.saturating_sub(1);
            o.calls == 0 && o.most >= self.shared.retire_after
        });
        let closed = if burst_over { open.take() } else { None };
        drop(open);
        // The connection ends with its channel's last clone: this one, then this lease's.
        drop(closed);
    }
}

impl Service<http::Request<tonic::body::Body>> for BurstChannel {
    type Response = http::Response<LeasedBody>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    /// Always ready: the connection is chosen, and made ready, when the call is made.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let lease = self.lease();
        Box::pin(async move {
            let mut channel = lease.channel.clone();
            let response = channel.ready().await?.call(request).await?;
            Ok(response.map(|body| LeasedBody {
                body,
                _lease: lease,
            }))
        })
    }
}

/// A response body that holds its call's connection open until it is dropped.
pub struct LeasedBody {
    body: tonic::body::Body,
    /// Held, never read: its drop lets the connection go.
    _lease: Lease,
}

impl Body for LeasedBody {
    type Data = <tonic::body::Body as Body>::Data;
    type Error = <tonic::body::Body as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
