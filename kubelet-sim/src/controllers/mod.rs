//! Cluster-side controllers the simulation needs (a real cluster's control plane runs them instead).
//!
//! - [`attach_detach`]: the attach/detach controller and the external attacher.
//! - [`pv_binder`]: the PV controller's binding of pre-bound claims.
//! - [`claims`]: generic ephemeral volumes' claims, dynamic provisioning and reclaim, with the binder;
//!   [`resizer`]: the external-resizer.
//! - [`provisioner`]: static PVs' volumes pre-provisioned on inlet's local driver.
//! - [`scheduler`]: round robin for pods that name no node.

pub mod attach_detach;
pub mod claims;
pub mod provisioner;
pub mod pv_binder;
pub mod resizer;
pub mod scheduler;
