//! Why a bench could not run or finish: each variant keeps what it came from; the texts are what
//! `kubelet-sim bench` prints.

use inlet_proto::csi_call::rpc_error;

use crate::drivers::DriverError;
use crate::signals::{Interrupts, Signal};
use crate::sim::SimError;

/// A bench that failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The bench was asked for what it cannot do (flags, drivers, missing programs).
    #[error("{0}")]
    Usage(String),
    /// A file, a directory or a program the bench runs.
    #[error("{what}: {source}")]
    Io {
        /// What the bench was doing, with the path.
        what: String,
        /// What the host said.
        #[source]
        source: std::io::Error,
    },
    /// A driver or the runtime refused a call.
    #[error("{what}: {}", rpc_error(source))]
    Rpc {
        /// Who and which call (`image.inlet.dev: NodePublishVolume`).
        what: String,
        /// The answer.
        #[source]
        source: tonic::Status,
    },
    /// A socket could not be dialed.
    #[error("{what}: {source}")]
    Dial {
        /// Whose socket.
        what: String,
        /// What dialing said.
        #[source]
        source: inlet_proto::uds::EndpointError,
    },
    /// The simulation a bench runs did not start (boxed: the largest error by far).
    #[error(transparent)]
    Sim(Box<SimError>),
    /// An in-process driver did not start.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// The image could not be built, pushed, or the figures written or charted.
    #[error("{0}")]
    Output(String),
    /// SIGINT or SIGTERM stopped the bench; what it had published or mounted is undone.
    #[error("{0}: stopped; what the bench published and mounted is undone")]
    Interrupted(Signal),
}

/// Fails with [`BenchError::Interrupted`] once a signal came: a workload calls it between steps, and its
/// error path undoes what it made.
pub(crate) fn stop_if_interrupted(interrupts: &Option<Interrupts>) -> Result<(), BenchError> {
    match interrupts.as_ref().and_then(Interrupts::received) {
        Some(signal) => Err(BenchError::Interrupted(signal)),
        None => Ok(()),
    }
}

/// Runs `work` until it ends, or fails with [`BenchError::Interrupted`] when a signal comes first (`work`
/// is dropped where it waits; the caller then undoes what it made).
pub(crate) async fn or_interrupted<T>(
    interrupts: &Option<Interrupts>,
    work: impl std::future::Future<Output = Result<T, BenchError>>,
) -> Result<T, BenchError> {
    let mut interrupts = interrupts.clone();
    tokio::select! {
        done = work => done,
        signal = async {
            match interrupts.as_mut() {
                Some(interrupts) => interrupts.wait().await,
                None => std::future::pending().await,
            }
        } => Err(BenchError::Interrupted(signal)),
    }
}

impl From<SimError> for BenchError {
    fn from(e: SimError) -> Self {
        Self::Sim(Box::new(e))
    }
}

impl BenchError {
    /// An I/O error, with what was being done.
    pub fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.to_string();
        move |source| Self::Io { what, source }
    }

    /// A refused call, with who and which.
    pub fn rpc(what: impl std::fmt::Display) -> impl FnOnce(tonic::Status) -> Self {
        let what = what.to_string();
        move |source| Self::Rpc { what, source }
    }
}
