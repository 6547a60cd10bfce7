//! `GET /metrics` over HTTP/1 on a TCP address: the registry in OpenMetrics text, which Prometheus
//! scrapes; and `GET /healthz` where the program gives a [`HealthCheck`] (the drivers, for their liveness
//! probe). Nothing else is served (404), and nothing is read from the request but its method and path.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// What `/healthz` answers: `Ok` is 200 `ok`, an error is 500 with its text (the livenessprobe sidecar's
/// answers, kubernetes-csi/livenessprobe `cmd/livenessprobe/main.go`).
pub type HealthCheck = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync,
>;

/// The content type of OpenMetrics text, which `prometheus_client` writes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why the endpoint could not start: the flag's value and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// Not HOST:PORT.
    #[error("--metrics-address {address:?}: not HOST:PORT ({reason})")]
    Address {
        /// The flag's value.
        address: String,
        /// Why it is not an address.
        reason: String,
    },
    /// The port is in use, or the address is not this host's.
    #[error("--metrics-address {address}: cannot listen: {source}")]
    Bind {
        /// The address.
        address: String,
        /// The bind error (`Address already in use`).
        source: std::io::Error,
    },
}

/// A running endpoint; it stops serving when dropped.
#[derive(Debug)]
pub struct MetricsEndpoint {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsEndpoint {
    /// Where it listens (the port the system chose for `:0`).
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `address` and serves `registry` at `/metrics` until the returned endpoint is dropped
/// ([`bind`], then [`MetricsListener::serve`]).
pub async fn serve(
    address: &str,
    registry: Arc<Registry>,
) -> Result<MetricsEndpoint, MetricsError> {
    Ok(bind(address).await?.serve(registry))
}

/// A bound address, not yet serving: a program binds first, so a port in use fails its start before it
/// changes anything, and serves once its metrics exist.
#[derive(Debug)]
pub struct MetricsListener(TcpListener);

/// Binds `address`: HOST:PORT, or `:PORT` for every interface, IPv6 and IPv4 (as Go's listeners read
/// it; IPv4 alone where the host has no IPv6).
pub async fn bind(address: &str) -> Result<MetricsListener, MetricsError> {
    let full = match address.strip_prefix(':') {
        Some(port) => {
            let any = format!("[::]:{port}");
            match TcpListener::bind(&any).await {
                Ok(listener) => return Ok(MetricsListener(listener)),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    return Err(MetricsError::Bind {
                        address: address.to_string(),
                        source: e,
                    });
                }
                Err(_) => format!("0.0.0.0:{port}"),
            }
        }
        None => address.to_string(),
    };
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(&full)
        .await
        .map_err(|e| MetricsError::Address {
            address: address.to_string(),
            reason: e.to_string(),
        })?
        .collect();
    TcpListener::bind(addrs.as_slice())
        .await
        .map(MetricsListener)
        .map_err(|source| MetricsError::Bind {
            address: address.to_string(),
            source,
        })
}

impl MetricsListener {
    /// Serves `registry` at `/metrics` until the returned endpoint is dropped.
    pub fn serve(self, registry: Arc<Registry>) -> MetricsEndpoint {
        self.serve_with_health(registry, None)
    }

    /// Serves `registry` at `/metrics`, and `health` at `/healthz` when given, until the returned
    /// endpoint is dropped.
    pub fn serve_with_health(
        self,
        registry: Arc<Registry>,
        health: Option<HealthCheck>,
    ) -> MetricsEndpoint {
        let listener = self.0;
        let address = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        tracing::info!(%address, healthz = health.is_some(), "serving metrics at /metrics");
        let routes = Arc::new(Routes { registry, health });
        let task = tokio::spawn(accept(listener, routes));
        MetricsEndpoint { address, task }
    }
}

/// At most this many scrapes at once; more connections are closed at once. A scrape is one short request,
/// and the driver's descriptors are for its mounts and sockets.
const MAX_CONNECTIONS: usize = 16;

/// How long a client may take to send its request's head.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Connections kept for `/healthz` when the others are all taken, so that clients holding every slot (a
/// scraper stuck, or slow clients on a node's port) do not fail the kubelet's liveness probe and get a
/// healthy driver restarted. A connection in one is answered only for `/healthz` and must send its head
/// within [`RESERVED_HEADER_TIMEOUT`]; the kubelet's probe sends it at once.
const RESERVED_FOR_HEALTH: usize = 2;

/// How long a client in a reserved slot may take to send its request's head.
const RESERVED_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// What the endpoint serves.
struct Routes {
    registry: Arc<Registry>,
    health: Option<HealthCheck>,
}

async fn accept(listener: TcpListener, routes: Arc<Routes>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let reserved = Arc::new(tokio::sync::Semaphore::new(match routes.health {
        Some(_) => RESERVED_FOR_HEALTH,
        None => 0,
    }));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin (as uds::Incoming does).
                tracing::warn!("metrics: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (slot, health_only) = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => (slot, false),
            Err(_) => match Arc::clone(&reserved).try_acquire_owned() {
                Ok(slot) => (slot, true),
                Err(_) => {
                    drop(stream);
                    continue;
                }
            },
        };
        let routes = Arc::clone(&routes);
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request| {
                respond(request, Arc::clone(&routes), health_only)
            });
            let header_timeout = match health_only {
                true => RESERVED_HEADER_TIMEOUT,
                false => HEADER_TIMEOUT,
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                tracing::debug!("metrics: connection: {e}");
            }
        });
    }
}

/// Answers a request; on a connection in a reserved slot (`health_only`), only `/healthz`.
async fn respond(
    request: Request<Incoming>,
    routes: Arc<Routes>,
    health_only: bool,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let reply = |status: StatusCode, content_type: &'static str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            HeaderValue::from_static(content_type),
        );
        Ok(response)
    };
    let path = request.uri().path();
    if health_only && path != "/healthz" {
        return reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "too many connections\n".into(),
        );
    }
    let health = match (path, &routes.health) {
        ("/metrics", _) => None,
        ("/healthz", Some(health)) => Some(health),
        _ => {
            return reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                "404 page not found\n".into(),
            );
        }
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            format!("only GET {path}\n"),
        );
    }
    if let Some(health) = health {
        return match health().await {
            Ok(()) => reply(StatusCode::OK, "text/plain", "ok".into()),
            Err(error) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", error),
        };
    }
    let registry = Arc::clone(&routes.registry);
    // Collectors read /proc and the drivers' state: off the async workers.
    let text = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).map(|()| text)
    })
    .await;
    match text {
        Ok(Ok(text)) => reply(StatusCode::OK, OPENMETRICS, text),
        _ => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            "encoding the metrics failed\n".into(),
        ),
    }
}
