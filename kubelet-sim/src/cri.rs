//! The CRI client the pod workers use: RuntimeService and ImageService over one unix socket (cri-fake or
//! a real runtime such as containerd).

use std::path::Path;

use inlet_proto::runtime::v1::{
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use tonic::transport::Channel;

/// Both CRI services. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Cri {
    /// RuntimeService.
    pub runtime: RuntimeServiceClient<Channel>,
    /// ImageService.
    pub image: ImageServiceClient<Channel>,
}

impl Cri {
    /// Connects to the runtime on `socket`.
    pub async fn connect(socket: &Path) -> Result<Self, inlet_proto::uds::EndpointError> {
        let channel = inlet_proto::uds::connect(socket).await?;
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel.clone()),
            image: ImageServiceClient::new(channel),
        })
    }
}
