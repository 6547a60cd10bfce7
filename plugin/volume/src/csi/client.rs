//! A CSI client for one registered driver, as the kubelet's `csi_client.go`: each call has the kubelet's
//! two-minute timeout, and every call is reported to an observer (the simulated kubelet's report) with
//! secret names but never their values, and service-account tokens redacted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_proto::codec::unary_boxed;
use inlet_proto::csi::v1 as csi;
use inlet_proto::csi_call::{CallRequest, CsiCall};
use tonic::transport::Channel;
use tonic::{Request, Status};

use super::connection::Connection;

/// The kubelet's timeout for one CSI call (`csiTimeout`).
pub const CSI_TIMEOUT: Duration = Duration::from_secs(120);

/// Receives every CSI call made: its record when it is sent, and its answer.
pub trait CsiObserver: Send + Sync {
    /// A call was sent and has no answer yet (its record's code is `OK` until answered): the token names
    /// it to [`CsiObserver::answered`] or [`CsiObserver::given_up`]. A report can then show the call that
    /// hung, not only those that returned.
    fn started(&self, call: CsiCall) -> u64;
    /// The call of `token` was answered: its record is completed with [`CsiCall::answered`].
    fn answered(&self, token: u64, answer: Answer<'_>);
    /// The call of `token` has no answer and never will: the task that made it was dropped.
    fn given_up(&self, token: u64);
}

/// A call's answer, as its record takes it.
pub struct Answer<'a> {
    /// From the call's sending to its answer.
    pub elapsed: Duration,
    /// None when the call succeeded.
    pub failure: Option<&'a Status>,
    /// What a ControllerPublishVolume returned.
    pub publish_context: Option<&'a HashMap<String, String>>,
}

/// A call sent: when, and, with an observer, its token, given back with the answer or, if the task that
/// made the call is dropped first, when dropped.
struct InFlight {
    started: Instant,
    observer: Option<(Arc<dyn CsiObserver>, u64)>,
}

impl InFlight {
    fn answered(
        mut self,
        failure: Option<&Status>,
        publish_context: Option<&HashMap<String, String>>,
    ) {
        if let Some((observer, token)) = self.observer.take() {
            let answer = Answer {
                elapsed: self.started.elapsed(),
                failure,
                publish_context,
            };
            observer.answered(token, answer);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some((observer, token)) = self.observer.take() {
            observer.given_up(token);
        }
    }
}

/// The client for one driver. Cheap to clone.
///
/// Each call is sent with its message on the heap and kept nowhere else ([`unary_boxed`]): the record
/// is made when the call is sent, so a call in flight holds no copy of its request. A node publishes
/// all its pods' volumes at once, and a generated client's call keeps its message inline several times
/// over (3.4 KB for a NodePublishVolume; issue #28).
#[derive(Clone)]
pub struct CsiClient {
    driver: String,
    connection: Connection,
    observer: Option<Arc<dyn CsiObserver>>,
    timeout: Duration,
}

impl std::fmt::Debug for CsiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiClient")
            .field("driver", &self.driver)
            .finish()
    }
}

impl CsiClient {
    /// A client for `driver` over `channel`, kept for every call, reporting to `observer`.
    pub fn new(driver: &str, channel: Channel, observer: Option<Arc<dyn CsiObserver>>) -> Self {
        Self {
            driver: driver.to_string(),
            connection: Connection::Kept(channel),
            observer,
            timeout: CSI_TIMEOUT,
        }
    }

    /// A client for `driver` as the kubelet's: calls in flight together share a connection, closed when
    /// the last of them returns, and `dial` opens the next (`connection.rs`). The first calls use `open`.
    pub fn dialing(
        driver: &str,
        open: Channel,
        dial: impl Fn() -> Channel + Send + Sync + 'static,
        observer: Option<Arc<dyn CsiObserver>>,
    ) -> Self {
        Self {
            driver: driver.to_string(),
            connection: Connection::per_burst(open, dial),
            observer,
            timeout: CSI_TIMEOUT,
        }
    }

    /// The driver's name.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// The same client with another deadline per call than the kubelet's [`CSI_TIMEOUT`] (conform gives a
    /// call no more than a check can wait). The channel's own timeout, which enforces it, must match.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends `req` to `path` (`/csi.v1.Service/Method`) with the client's deadline; the answer, and the
    /// call to report it to. The request comes boxed: an async fn keeps its arguments inline for as long
    /// as it runs (rust-lang/rust#62958).
    async fn send<M, R>(&self, path: &'static str, req: Box<M>) -> (InFlight, Result<R, Status>)
    where
        M: CallRequest + prost::Message + Send + 'static,
        R: prost::Message + Default + Send + 'static,
    {
        let observer = self.observer.as_ref().map(|observer| {
            let token = observer.started(CsiCall::of(&self.driver, req.as_ref(), None));
            (Arc::clone(observer), token)
        });
        let in_flight = InFlight {
            started: Instant::now(),
            observer,
        };
        let mut request = Request::new(req);
        request.set_timeout(self.timeout);
        let lease = self.connection.lease();
        let result = unary_boxed(lease.channel.clone(), path, request).await;
        drop(lease);
        (in_flight, result)
    }

    /// [`CsiClient::send`], the answer reported.
    async fn call<M, R>(&self, path: &'static str, req: Box<M>) -> Result<R, Status>
    where
        M: CallRequest + prost::Message + Send + 'static,
        R: prost::Message + Default + Send + 'static,
    {
        let (in_flight, result) = self.send(path, req).await;
        in_flight.answered(result.as_ref().err(), None);
        result
    }

    /// NodePublishVolume.
    pub async fn node_publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), Status> {
        self.call::<_, csi::NodePublishVolumeResponse>(
            "/csi.v1.Node/NodePublishVolume",
            Box::new(req),
        )
        .await
        .map(drop)
    }

    /// NodeUnpublishVolume (no secrets, no context: the kubelet sends none).
    pub async fn node_unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), Status> {
        let req = csi::NodeUnpublishVolumeRequest {
            volume_id: volume_id.into(),
            target_path: target_path.into(),
        };
        self.call::<_, csi::NodeUnpublishVolumeResponse>(
            "/csi.v1.Node/NodeUnpublishVolume",
            Box::new(req),
        )
        .await
        .map(drop)
    }

    /// NodeStageVolume.
    pub async fn node_stage(&self, req: csi::NodeStageVolumeRequest) -> Result<(), Status> {
        self.call::<_, csi::NodeStageVolumeResponse>("/csi.v1.Node/NodeStageVolume", Box::new(req))
            .await
            .map(drop)
    }

    /// NodeUnstageVolume.
    pub async fn node_unstage(&self, volume_id: &str, staging_path: &str) -> Result<(), Status> {
        let req = csi::NodeUnstageVolumeRequest {
            volume_id: volume_id.into(),
            staging_target_path: staging_path.into(),
        };
        self.call::<_, csi::NodeUnstageVolumeResponse>(
            "/csi.v1.Node/NodeUnstageVolume",
            Box::new(req),
        )
        .await
        .map(drop)
    }

    /// NodeGetCapabilities, as the RPC types the driver advertises.
    pub async fn node_capabilities(
        &self,
    ) -> Result<Vec<csi::node_service_capability::rpc::Type>, Status> {
        let req = csi::NodeGetCapabilitiesRequest {};
        let response: csi::NodeGetCapabilitiesResponse = self
            .call("/csi.v1.Node/NodeGetCapabilities", Box::new(req))
            .await?;
        Ok(response
            .capabilities
            .into_iter()
            .filter_map(|c| match c.r#type {
                Some(csi::node_service_capability::Type::Rpc(rpc)) => {
                    csi::node_service_capability::rpc::Type::try_from(rpc.r#type).ok()
                }
                _ => None,
            })
            .collect())
    }

    /// NodeGetVolumeStats of the volume published at `volume_path` (no staging path, as the kubelet's
    /// `csi_client.go` sends none).
    pub async fn node_volume_stats(
        &self,
        volume_id: &str,
        volume_path: &str,
    ) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
        let req = csi::NodeGetVolumeStatsRequest {
            volume_id: volume_id.into(),
            volume_path: volume_path.into(),
            staging_target_path: String::new(),
        };
        self.call("/csi.v1.Node/NodeGetVolumeStats", Box::new(req))
            .await
    }

    /// CreateVolume (what the external-provisioner asks for a claim).
    pub async fn create_volume(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::Volume, Status> {
        let response: csi::CreateVolumeResponse = self
            .call("/csi.v1.Controller/CreateVolume", Box::new(req))
            .await?;
        response
            .volume
            .ok_or_else(|| Status::internal("CreateVolume answered no volume"))
    }

    /// ControllerExpandVolume (what the external-resizer asks): the new capacity, and whether the node
    /// must expand the volume too.
    pub async fn controller_expand(
        &self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse, Status> {
        self.call("/csi.v1.Controller/ControllerExpandVolume", Box::new(req))
            .await
    }

    /// NodeExpandVolume.
    pub async fn node_expand(&self, req: csi::NodeExpandVolumeRequest) -> Result<(), Status> {
        self.call::<_, csi::NodeExpandVolumeResponse>(
            "/csi.v1.Node/NodeExpandVolume",
            Box::new(req),
        )
        .await
        .map(drop)
    }

    /// DeleteVolume.
    pub async fn delete_volume(&self, volume_id: &str) -> Result<(), Status> {
        let req = csi::DeleteVolumeRequest {
            volume_id: volume_id.into(),
            secrets: Default::default(),
        };
        self.call::<_, csi::DeleteVolumeResponse>("/csi.v1.Controller/DeleteVolume", Box::new(req))
            .await
            .map(drop)
    }

    /// NodeGetInfo.
    pub async fn node_info(&self) -> Result<csi::NodeGetInfoResponse, Status> {
        let req = csi::NodeGetInfoRequest {};
        self.call("/csi.v1.Node/NodeGetInfo", Box::new(req)).await
    }

    /// ControllerGetCapabilities, as the RPC types the driver advertises.
    pub async fn controller_capabilities(
        &self,
    ) -> Result<Vec<csi::controller_service_capability::rpc::Type>, Status> {
        let req = csi::ControllerGetCapabilitiesRequest {};
        let response: csi::ControllerGetCapabilitiesResponse = self
            .call(
                "/csi.v1.Controller/ControllerGetCapabilities",
                Box::new(req),
            )
            .await?;
        Ok(response
            .capabilities
            .into_iter()
            .filter_map(|c| match c.r#type {
                Some(csi::controller_service_capability::Type::Rpc(rpc)) => {
                    csi::controller_service_capability::rpc::Type::try_from(rpc.r#type).ok()
                }
                _ => None,
            })
            .collect())
    }

    /// ControllerPublishVolume; returns the publish context (which the record shows too).
    pub async fn controller_publish(
        &self,
        req: csi::ControllerPublishVolumeRequest,
    ) -> Result<HashMap<String, String>, Status> {
        let (in_flight, result) = self
            .send("/csi.v1.Controller/ControllerPublishVolume", Box::new(req))
            .await;
        let result = result.map(|r: csi::ControllerPublishVolumeResponse| r.publish_context);
        in_flight.answered(result.as_ref().err(), result.as_ref().ok());
        result
    }

    /// ControllerUnpublishVolume.
    pub async fn controller_unpublish(
        &self,
        req: csi::ControllerUnpublishVolumeRequest,
    ) -> Result<(), Status> {
        let path = "/csi.v1.Controller/ControllerUnpublishVolume";
        self.call::<_, csi::ControllerUnpublishVolumeResponse>(path, Box::new(req))
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inlet_proto::csi::v1::node_server::{Node, NodeServer};

    /// A driver whose NodePublishVolume never answers (a mount hung on a dead server).
    struct Hung;

    #[tonic::async_trait]
    impl Node for Hung {
        async fn node_publish_volume(
            &self,
            _: Request<csi::NodePublishVolumeRequest>,
        ) -> Result<tonic::Response<csi::NodePublishVolumeResponse>, Status> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_call_the_driver_never_answers_fails_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let incoming = inlet_proto::uds::listen(&socket).await.unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(NodeServer::new(Hung))
                .serve_with_incoming(incoming),
        );
        let timeout = Duration::from_millis(200);
        let channel = inlet_proto::uds::connect_with_timeout(&socket, Some(timeout))
            .await
            .unwrap();
        let client = CsiClient::new("hung.example.com", channel, None);
        let started = std::time::Instant::now();
        let status = client
            .node_publish(csi::NodePublishVolumeRequest::default())
            .await
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            inlet_proto::csi_call::rpc_error(&status),
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        );
    }

    /// A driver that answers NodeGetInfo.
    struct Answers;

    #[tonic::async_trait]
    impl Node for Answers {
        async fn node_get_info(
            &self,
            _: Request<csi::NodeGetInfoRequest>,
        ) -> Result<tonic::Response<csi::NodeGetInfoResponse>, Status> {
            Ok(tonic::Response::new(csi::NodeGetInfoResponse {
                node_id: "node-1".into(),
                ..Default::default()
            }))
        }
    }

    /// A server's end of a connection, counted while it is open.
    struct Counted<S> {
        io: S,
        open: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl<S> Drop for Counted<S> {
        fn drop(&mut self) {
            self.open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl<S> tonic::transport::server::Connected for Counted<S> {
        type ConnectInfo = ();
        fn connect_info(&self) {}
    }

    impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counted<S> {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
        }
    }

    impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counted<S> {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
        }
        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }

    /// Waits until the server has `want` connections open, or gives up after 10 s.
    async fn until_open(open: &std::sync::atomic::AtomicUsize, want: usize) -> usize {
        for _ in 0..1000 {
            let now = open.load(std::sync::atomic::Ordering::SeqCst);
            if now == want {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        open.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn calls_in_flight_together_share_a_connection_closed_after_the_last() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio_stream::StreamExt;

        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let (open, accepted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (counting, counted) = (Arc::clone(&open), Arc::clone(&accepted));
        let incoming = inlet_proto::uds::listen(&socket)
            .await
            .unwrap()
            .map(move |io| {
                counting.fetch_add(1, Ordering::SeqCst);
                counted.fetch_add(1, Ordering::SeqCst);
                io.map(|io| Counted {
                    io,
                    open: Arc::clone(&counting),
                })
            });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(NodeServer::new(Answers))
                .serve_with_incoming(incoming),
        );
        let first = inlet_proto::uds::connect(&socket).await.unwrap();
        let dialed = socket.clone();
        let client = CsiClient::dialing(
            "answers.example.com",
            first,
            move || inlet_proto::uds::connect_lazy(&dialed, None),
            None,
        );
        assert_eq!(until_open(&open, 1).await, 1, "the first connection, given");

        client.node_info().await.unwrap();
        assert_eq!(until_open(&open, 0).await, 0, "closed after its call");

        let (a, b, c) = tokio::join!(client.node_info(), client.node_info(), client.node_info());
        a.and(b).and(c).unwrap();
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "three calls at once, one connection"
        );
        assert_eq!(
            until_open(&open, 0).await,
            0,
            "closed after the last of them"
        );

        client.node_info().await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 3, "dialed again");
        assert_eq!(until_open(&open, 0).await, 0);
    }
}
