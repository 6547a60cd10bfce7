//! Cluster-side controllers the simulation needs: the attach/detach controller and the external attacher.

pub mod attach_detach;
