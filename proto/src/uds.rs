//! Unix-domain-socket transport: every API inlet speaks (CSI, CRI, containerd, registration) runs over one.
//!
//! Endpoints are written as CSI and CRI write them, `unix:///run/csi.sock`; a bare absolute path is accepted too.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::Stream;
use tokio_stream::wrappers::UnixListenerStream;

use crate::authority::AuthorityFix;
use tonic::transport::{Channel, Endpoint};

/// Why an endpoint could not be used.
#[derive(Debug)]
pub enum EndpointError {
    /// The endpoint is neither `unix:///abs/path` nor an absolute path.
    Invalid(String),
    /// Another live server already answers on this socket.
    InUse(PathBuf),
    /// The socket could not be created or reached.
    Io(PathBuf, io::Error),
    /// No server could be reached on the socket.
    Connect(PathBuf, tonic::transport::Error),
}

impl std::fmt::Display for EndpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(ep) => {
                write!(f, "invalid endpoint {ep:?}: expected unix:///absolute/path")
            }
            Self::InUse(p) => write!(f, "socket {} is in use by a live server", p.display()),
            Self::Io(p, e) => write!(f, "socket {}: {e}", p.display()),
            Self::Connect(p, e) => {
                // tonic's own message is generic ("transport error"); the cause says what happened.
                let cause = std::error::Error::source(e)
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default();
                write!(f, "cannot connect to socket {}: {e}{cause}", p.display())
            }
        }
    }
}

impl std::error::Error for EndpointError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(_, e) => Some(e),
            Self::Connect(_, e) => Some(e),
            _ => None,
        }
    }
}

/// Why a gRPC server on a unix socket stopped with an error.
#[derive(Debug)]
pub enum ServeError {
    /// The socket could not be set up.
    Endpoint(EndpointError),
    /// The gRPC server failed.
    Transport(tonic::transport::Error),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Endpoint(e) => e.fmt(f),
            Self::Transport(e) => write!(f, "grpc server: {e}"),
        }
    }
}

impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Endpoint(e) => e.source(),
            Self::Transport(e) => Some(e),
        }
    }
}

impl From<EndpointError> for ServeError {
    fn from(e: EndpointError) -> Self {
        Self::Endpoint(e)
    }
}

impl From<tonic::transport::Error> for ServeError {
    fn from(e: tonic::transport::Error) -> Self {
        Self::Transport(e)
    }
}

/// Parses `unix:///path` (or a bare absolute path) into the socket path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, EndpointError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.is_empty() || !path.starts_with('/') {
        return Err(EndpointError::Invalid(endpoint.to_string()));
    }
    Ok(PathBuf::from(path))
}

/// The connections a tonic server accepts on a unix socket, each wrapped in [`AuthorityFix`] so that
/// clients sending the socket's path as `:authority` (kubelets before 1.26, grpcio, grpc-java) are served.
///
/// When the process is out of file descriptors (or the kernel of memory for sockets), accepting fails at
/// once, again and again: tonic would retry in a loop at 100% of a core. Instead accepting pauses for
/// [`ACCEPT_BACKOFF`] each time, with one warning when it starts and one line when it recovers.
#[derive(Debug)]
pub struct Incoming {
    listener: UnixListenerStream,
    backoff: Option<Pin<Box<tokio::time::Sleep>>>,
    exhausted: bool,
}

/// How long accepting pauses after running out of descriptors.
pub const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// Errors that no retry can fix until something is released: EMFILE, ENFILE, ENOBUFS, ENOMEM.
fn out_of_resources(e: &io::Error) -> bool {
    use nix::errno::Errno;
    e.raw_os_error().is_some_and(|code| {
        [Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM]
            .contains(&Errno::from_raw(code))
    })
}

impl Stream for Incoming {
    type Item = io::Result<AuthorityFix<UnixStream>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(sleep) = self.backoff.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.backoff = None;
            }
            match std::task::ready!(Pin::new(&mut self.listener).poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(stream)) => {
                    if std::mem::take(&mut self.exhausted) {
                        tracing::info!("accepting connections again");
                    }
                    return Poll::Ready(Some(Ok(AuthorityFix::new(stream))));
                }
                Some(Err(e)) if out_of_resources(&e) => {
                    if !self.exhausted {
                        tracing::warn!(error = %e, backoff_ms = ACCEPT_BACKOFF.as_millis() as u64, "cannot accept connections: pausing until resources are released");
                        self.exhausted = true;
                    }
                    self.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            }
        }
    }
}

/// Listens on a unix socket for a tonic server.
///
/// A socket file left behind by a crashed server is replaced; one that a live server still answers on is
/// refused, so two drivers never silently steal each other's endpoint. The parent directory is created, and
/// the socket is made owner-only (0600).
pub async fn listen(path: &Path) -> Result<Incoming, EndpointError> {
    let io_err = |e| EndpointError::Io(path.to_path_buf(), e);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_err)?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(EndpointError::InUse(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(io_err)?;
    }
    let listener = UnixListener::bind(path).map_err(io_err)?;
    // Owner-only: whoever may connect may mount (a CSI socket) or run containers (a CRI socket).
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io_err)?;
    Ok(Incoming {
        listener: UnixListenerStream::new(listener),
        backoff: None,
        exhausted: false,
    })
}

/// Opens a gRPC channel to a server on a unix socket. The connection is made now, so a wrong path fails here.
pub async fn connect(path: &Path) -> Result<Channel, EndpointError> {
    connect_with_timeout(path, None).await
}

/// [`connect`], every call on the channel failing with DEADLINE_EXCEEDED after `timeout` (when given).
pub async fn connect_with_timeout(
    path: &Path,
    timeout: Option<std::time::Duration>,
) -> Result<Channel, EndpointError> {
    endpoint(timeout)
        .connect_with_connector(dialer(path))
        .await
        .map_err(|e| EndpointError::Connect(path.to_path_buf(), e))
}

/// [`connect_with_timeout`], dialed at the channel's first call instead of now, as grpc-go dials: a socket
/// that is not there fails that call with UNAVAILABLE.
pub fn connect_lazy(path: &Path, timeout: Option<std::time::Duration>) -> Channel {
    endpoint(timeout).connect_with_connector_lazy(dialer(path))
}

fn endpoint(timeout: Option<std::time::Duration>) -> Endpoint {
    // The URI is required by tonic but unused: the connector always dials the socket.
    let endpoint = Endpoint::from_static("http://[::1]:50051");
    match timeout {
        Some(timeout) => endpoint.timeout(timeout),
        None => endpoint,
    }
}

/// A connector that dials the socket at `path`, whatever URI it is given.
fn dialer(
    path: &Path,
) -> impl tower::Service<http::Uri, Response = TokioIo<UnixStream>, Error = io::Error, Future: Send>
+ Clone
+ Send
+ 'static {
    let target = path.to_path_buf();
    tower::service_fn(move |_: http::Uri| {
        let target = target.clone();
        async move { UnixStream::connect(target).await.map(TokioIo::new) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints() {
        assert_eq!(
            socket_path("unix:///run/a.sock").unwrap(),
            PathBuf::from("/run/a.sock")
        );
        assert_eq!(
            socket_path("/run/a.sock").unwrap(),
            PathBuf::from("/run/a.sock")
        );
        assert!(socket_path("unix://relative.sock").is_err());
        assert!(socket_path("tcp://127.0.0.1:1").is_err());
        assert!(socket_path("").is_err());
    }

    #[tokio::test]
    async fn replaces_a_stale_socket_and_refuses_a_live_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/csi.sock");
        // A stale socket: bound once, listener dropped, file left behind (as after a crash).
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let live = listen(&path).await.expect("stale socket is replaced");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "the socket is owner-only");
        assert!(matches!(listen(&path).await, Err(EndpointError::InUse(_))));
        drop(live);
    }

    #[tokio::test]
    async fn connect_to_missing_socket_names_the_path() {
        let err = connect(Path::new("/nonexistent/inlet.sock"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/inlet.sock"), "{err}");
    }
}
