//! The CRI client the pod workers use: RuntimeService and ImageService over one unix socket (cri-fake or
//! a real runtime such as containerd).

use std::path::Path;
use std::time::Duration;

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
    /// Connects to the runtime on `socket`. A RuntimeService call that takes longer than
    /// `runtime_timeout` fails with DEADLINE_EXCEEDED (`remote_runtime.go` gives each its
    /// `runtimeRequestTimeout`); ImageService calls have no deadline, since a pull may take long.
    pub async fn connect(
        socket: &Path,
        runtime_timeout: Duration,
    ) -> Result<Self, inlet_proto::uds::EndpointError> {
        let runtime = inlet_proto::uds::connect_with_timeout(socket, Some(runtime_timeout)).await?;
        let image = inlet_proto::uds::connect(socket).await?;
        Ok(Self {
            runtime: RuntimeServiceClient::new(runtime),
            image: ImageServiceClient::new(image),
        })
    }
}
