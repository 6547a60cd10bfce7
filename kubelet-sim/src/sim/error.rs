//! Why a simulation, or one of its steps, could not run. Each variant keeps what it came from; the texts
//! are what `kubelet-sim run` prints.

use std::path::PathBuf;

use crate::cri::CriError;
use crate::drivers::DriverError;

/// A simulation step that failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The simulation's root could not be created.
    #[error("{}: {source}", path.display())]
    Root {
        /// The root.
        path: PathBuf,
        /// What creating it said.
        #[source]
        source: std::io::Error,
    },
    /// The runtime could not be had.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// An in-process driver did not start.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// A node refused to register a driver (the text is the kubelet's registration error).
    #[error("driver {name} on {node}: {reason}")]
    Register {
        /// The driver's name.
        name: String,
        /// The node.
        node: String,
        /// The registration handler's error, in upstream's words.
        #[source]
        reason: crate::node::registry::RegistrationError,
    },
    /// A restarted node could not register again a driver its previous kubelet had.
    #[error(transparent)]
    Reregister(crate::node::registry::RegistrationError),
    /// No node of that name.
    #[error("no node {0:?}")]
    NoNode(String),
    /// A self-registering driver needs `--plugins-registry`.
    #[error("no plugins registry to register through (--plugins-registry)")]
    NoPluginsRegistry,
    /// Only inlet's own drivers can be started (and registered through the plugins registry) here.
    #[error("driver {name}: {} is not started by kubelet-sim", socket.display())]
    NotStarted {
        /// The driver's name.
        name: String,
        /// The socket it was given on.
        socket: PathBuf,
    },
    /// The process may not open the sockets its nodes need.
    #[error(
        "{nodes} nodes need about {needed} open files, and this process may open {limit}: raise the limit (ulimit -n {needed}, or LimitNOFILE in a unit)"
    )]
    OpenFiles {
        /// The nodes asked for.
        nodes: usize,
        /// About what they need.
        needed: u64,
        /// The soft limit (raised to the hard one at start).
        limit: u64,
    },
    /// Joining the real cluster failed.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
}
