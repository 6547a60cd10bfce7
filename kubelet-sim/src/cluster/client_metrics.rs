//! `rest_client_requests_total{code, method, host}`: every request the hollow nodes make of the API
//! server, counted by answer as client-go's metric counts a kubelet's (`k8s.io/client-go/tools/metrics`,
//! registered by `component-base/metrics/prometheus/restclient`; a request that got no answer is code
//! `<error>`). An operator sees forbidden requests (`code="403"`) as they would see a kubelet's.

use std::sync::LazyLock;
use std::task::{Context, Poll};

use futures::FutureExt;
use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    code: String,
    method: String,
    host: String,
}

static REQUESTS: LazyLock<Family<RequestLabels, Counter>> = LazyLock::new(Family::default);

/// Registers the counter.
pub fn register(registry: &mut prometheus_client::registry::Registry) {
    registry.register(
        "rest_client_requests",
        "Number of HTTP requests, partitioned by status code, method, and host.",
        REQUESTS.clone(),
    );
}

/// The tower layer that counts each request of a kube client.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestMetricsLayer;

impl<S> tower::Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestMetrics { inner }
    }
}

/// See [`RequestMetricsLayer`].
#[derive(Clone, Debug)]
pub struct RequestMetrics<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for RequestMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().as_str().to_string();
        let host = request
            .uri()
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        self.inner
            .call(request)
            .map(move |answer| {
                let code = match &answer {
                    Ok(response) => response.status().as_u16().to_string(),
                    Err(_) => "<error>".to_string(),
                };
                let labels = RequestLabels { code, method, host };
                REQUESTS.get_or_create(&labels).inc();
                answer
            })
            .boxed()
    }
}
