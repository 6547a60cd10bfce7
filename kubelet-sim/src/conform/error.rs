//! Why conform could not run (exit 2), or could not start or restart the driver for a check: each
//! variant keeps what it came from.

use std::path::PathBuf;

use crate::drivers::DriverError;
use crate::sim::SimError;

/// A conform run, or a check's set-up, that could not go on.
#[derive(Debug, thiserror::Error)]
pub enum ConformError {
    /// The flags ask for what conform cannot do.
    #[error("{0}")]
    Usage(String),
    /// A file, a directory or the output.
    #[error("{what}: {source}")]
    Io {
        /// What conform was doing, with the path.
        what: String,
        /// What the host said.
        #[source]
        source: std::io::Error,
    },
    /// A socket could not be dialed or served.
    #[error("{what}: {source}")]
    Endpoint {
        /// Whose socket.
        what: String,
        /// What the transport said.
        #[source]
        source: inlet_proto::uds::EndpointError,
    },
    /// The driver refused a call conform needs to describe it.
    #[error("{what}: {}", source.message())]
    Rpc {
        /// Who and which call (`the driver x: GetPluginInfo`).
        what: String,
        /// The driver's answer.
        #[source]
        source: tonic::Status,
    },
    /// The driver reports another name than the one given.
    #[error(
        "the driver on {} says its name is {reported:?}, not {expected:?}: the CSIDriver object's name must be \
         the name GetPluginInfo returns",
        socket.display()
    )]
    Misnamed {
        /// The driver's socket.
        socket: PathBuf,
        /// The name GetPluginInfo returned.
        reported: String,
        /// The name given with `--driver`.
        expected: String,
    },
    /// The cluster of `--kubeconfig` could not be used: what the API server or the kubelet said.
    #[error("the cluster: {0}")]
    Cluster(String),
    /// The CSIDriver given is not one the API server would take, or not there.
    #[error("{0}")]
    CsiDriver(String),
    /// The simulation a check runs in did not start (boxed: the largest error by far).
    #[error(transparent)]
    Sim(Box<SimError>),
    /// An in-process driver did not start.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// `--restart-command` or `--kubelet-restart-command` could not be run, or failed.
    #[error("--{flag} {command:?}: {reason}")]
    Restart {
        /// The flag that gave it.
        flag: &'static str,
        /// The command.
        command: String,
        /// What went wrong.
        reason: String,
    },
    /// The restarted driver did not answer Probe in time.
    #[error(
        "the driver did not answer Probe on {} within {timeout:?} of its restart",
        socket.display()
    )]
    NotReady {
        /// The driver's socket.
        socket: PathBuf,
        /// How long conform waited.
        timeout: std::time::Duration,
    },
    /// The report could not be written.
    #[error("{0}")]
    Output(String),
}

impl From<SimError> for ConformError {
    fn from(e: SimError) -> Self {
        Self::Sim(Box::new(e))
    }
}

impl ConformError {
    /// An I/O error, with what was being done.
    pub fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.to_string();
        move |source| Self::Io { what, source }
    }
}
