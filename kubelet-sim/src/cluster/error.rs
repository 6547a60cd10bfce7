//! Why the hollow nodes' link to a real API server failed: each variant keeps the client's error.

/// A failed exchange with the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The kubeconfig could not be read, parsed or used.
    #[error("--kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The file given.
        path: std::path::PathBuf,
        /// What was wrong with it.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The pod's in-cluster config (or `KUBECONFIG`) could not be read or used.
    #[error("--in-cluster: {source}")]
    InCluster {
        /// What was wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A request failed: `what` it was for, and the client's error.
    #[error("{what}: {source}")]
    Request {
        /// What the request was for (`registering node node-1`).
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Another kubelet-sim process holds the node: its Lease was renewed `seconds` ago.
    #[error(
        "node {node} is held by another kubelet-sim (instance {holder}): its Lease was renewed {seconds}s ago; stop that process, or wait until the Lease expires ({lease_seconds}s after its last renewal)"
    )]
    NodeHeld {
        /// The node.
        node: String,
        /// The other process's instance.
        holder: String,
        /// How long ago it renewed the Lease.
        seconds: i64,
        /// The Lease's duration.
        lease_seconds: i32,
    },
    /// Leaving the cluster (`--drain-on-exit`) failed for some nodes: what happened to each.
    #[error("{}", errors.join("; "))]
    Leave {
        /// One message a failure.
        errors: Vec<String>,
    },
    /// The API server refused an object: its message, as kubectl shows it.
    #[error("{}", refusal(source))]
    Refused {
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

impl ClusterError {
    /// A failed request, with what it was for.
    pub fn request(what: impl std::fmt::Display) -> impl FnOnce(kube::Error) -> Self {
        let what = what.to_string();
        move |source| Self::Request { what, source }
    }
}

/// The API server's own message when it answered, else the client's error.
fn refusal(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}
