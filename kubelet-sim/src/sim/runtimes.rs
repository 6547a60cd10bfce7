//! The nodes' CRI runtimes: one `--cri` runtime every node dials, or an in-process cri-fake per node, as
//! each real node runs its own. A runtime shared by every simulated node made each node's relist (the
//! PLEG's ListContainers, every second) visit every container of the cluster: 10⁸ visits a second at
//! 100,000 pods over 1,000 nodes. Each node's runtime keeps its own images too, so what one node's image
//! garbage collector removes is gone only there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cri_fake::FakeRuntime;

use crate::cri::{self, CriError, RuntimeServer};
use crate::images::SimImages;

/// One node's in-process runtime.
pub(super) struct Fake {
    runtime: Arc<FakeRuntime>,
    socket: PathBuf,
    /// Its server, while it serves.
    server: Option<RuntimeServer>,
}

/// Where each node's runtime answers.
pub(super) enum Runtimes {
    /// A real runtime (`--cri`) for every node.
    Shared(PathBuf),
    /// An in-process cri-fake per node, under `<root>/cri-fake/<node>/`.
    PerNode(BTreeMap<String, Fake>),
}

impl Runtimes {
    /// `--cri`'s runtime, or a cri-fake for each node (its images imported) served on its socket.
    pub(super) fn start(
        cri: Option<&Path>,
        root: &Path,
        nodes: &[String],
        images: &SimImages,
    ) -> Result<Self, CriError> {
        if let Some(socket) = cri {
            return Ok(Self::Shared(socket.to_path_buf()));
        }
        let mut fakes = BTreeMap::new();
        for node in nodes {
            let (socket, runtime) = cri::start_fake(&root.join("cri-fake").join(node), images)?;
            let server = Some(cri::serve_fake(Arc::clone(&runtime), &socket));
            let fake = Fake {
                runtime,
                socket,
                server,
            };
            fakes.insert(node.clone(), fake);
        }
        Ok(Self::PerNode(fakes))
    }

    /// The socket `node`'s kubelet and drivers dial.
    pub(super) fn socket(&self, node: &str) -> &Path {
        match self {
            Self::Shared(socket) => socket,
            Self::PerNode(fakes) => fakes.get(node).map_or(Path::new(""), |f| &f.socket),
        }
    }

    /// `node`'s in-process runtime.
    pub(super) fn fake(&self, node: &str) -> Option<&Arc<FakeRuntime>> {
        match self {
            Self::Shared(_) => None,
            Self::PerNode(fakes) => fakes.get(node).map(|f| &f.runtime),
        }
    }

    /// Every in-process runtime, by node.
    pub(super) fn fakes(&self) -> impl Iterator<Item = (&str, &Arc<FakeRuntime>)> {
        let fakes = match self {
            Self::Shared(_) => None,
            Self::PerNode(fakes) => Some(fakes),
        };
        fakes
            .into_iter()
            .flatten()
            .map(|(node, f)| (node.as_str(), &f.runtime))
    }

    /// Stops serving every in-process runtime (what they run stays).
    pub(super) async fn stop(&mut self) {
        if let Self::PerNode(fakes) = self {
            for fake in fakes.values_mut() {
                if let Some((stop, task)) = fake.server.take() {
                    let _ = stop.send(());
                    let _ = task.await;
                }
            }
        }
    }

    /// Serves every stopped in-process runtime again, on its socket.
    pub(super) fn serve(&mut self) {
        if let Self::PerNode(fakes) = self {
            for fake in fakes.values_mut().filter(|f| f.server.is_none()) {
                fake.server = Some(cri::serve_fake(Arc::clone(&fake.runtime), &fake.socket));
            }
        }
    }
}
