//! Identity service: GetPluginInfo, GetPluginCapabilities, Probe.

use csi::plugin_capability::{Type, service};
use inlet_proto::csi::v1 as csi;

use crate::fixture::Fixture;

#[tokio::test]
async fn plugin_info_names_the_driver_and_its_version() {
    let mut f = Fixture::start().await;
    let info = f
        .identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "local.inlet.dev");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn capabilities_offer_the_controller_service_and_online_expansion() {
    let mut f = Fixture::start().await;
    let caps = f
        .identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let controller = caps.capabilities.iter().any(
        |c| matches!(&c.r#type, Some(Type::Service(s)) if s.r#type == service::Type::ControllerService as i32),
    );
    assert!(controller, "{caps:?}");
    assert!(
        caps.capabilities
            .iter()
            .any(|c| matches!(c.r#type, Some(Type::VolumeExpansion(_))))
    );
}

#[tokio::test]
async fn probe_reports_ready() {
    let mut f = Fixture::start().await;
    let probe = f
        .identity
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
}
