//! The image manager (`pkg/kubelet/images/image_manager.go` EnsureImageExists): a container's image made
//! present per its pull policy, with upstream's events. Whether a cached image may be used (KEP-2535) and
//! how a pull runs are the node's one [`Puller`]'s, shared with image volumes and the in-process image
//! drivers; this file turns its answers into the kubelet's events.

use std::sync::Arc;
use std::time::Duration;

use inlet_image::auth::{self, Credentials};
use inlet_image::pull::{Decision, PullError, PullPolicy, PullRequest, Puller};
use inlet_proto::runtime::v1::{self as cri, image_service_client::ImageServiceClient};
use inlet_volume::PodInfo;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use tonic::transport::Channel;

use crate::api::Api;

/// Makes containers' images present.
pub struct ImageManager {
    api: Arc<Api>,
    cri: ImageServiceClient<Channel>,
    puller: Arc<Puller>,
}

impl ImageManager {
    /// An image manager over the runtime's ImageService and the node's puller.
    pub fn new(api: Arc<Api>, cri: ImageServiceClient<Channel>, puller: Arc<Puller>) -> Self {
        Self { api, cri, puller }
    }

    /// True once `container`'s image is present and the pod may use it; else the pod has upstream's event
    /// (`ErrImageNeverPull`, or `Failed` with the runtime's answer) and its start is retried.
    pub async fn ensure_image_exists(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox: &cri::PodSandboxConfig,
    ) -> bool {
        let image = container.image.clone().unwrap_or_default();
        let request = PullRequest {
            image: image.clone(),
            policy: pull_policy(container),
            credentials: self.pull_credentials(pod, &image),
            // A container's pull has no deadline: the pod waits for it.
            wait: Duration::MAX,
            sandbox: Some(sandbox.clone()),
        };
        // An image the runtime cannot tell about is taken as absent: the pull says why.
        let present = self
            .cri
            .clone()
            .image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .ok()
            .and_then(|r| r.into_inner().image.map(|i| i.id));
        match self.puller.decide(&request, present.as_deref()) {
            Decision::UseCached(_) => {
                let message = format!(
                    "Container image {image:?} already present on machine and can be accessed by the pod"
                );
                self.api.record_event(pod, "Normal", "Pulled", &message);
                true
            }
            // Absent, or present but this pod has not shown the credentials it was pulled with, and
            // Never forbids a pull to show them: upstream answers the same for both.
            Decision::Refused(_) => {
                let message =
                    format!("Container image {image:?} is not present with pull policy of Never");
                self.api
                    .record_event(pod, "Warning", "ErrImageNeverPull", &message);
                false
            }
            Decision::Pull => {
                self.api.record_event(
                    pod,
                    "Normal",
                    "Pulling",
                    &format!("Pulling image {image:?}"),
                );
                match self.puller.pull(&request).await {
                    Ok(_) => {
                        let message = format!("Successfully pulled image {image:?}");
                        self.api.record_event(pod, "Normal", "Pulled", &message);
                        true
                    }
                    Err(e) => {
                        let message = format!("Failed to pull image {image:?}: {}", shown(&e));
                        self.api.record_event(pod, "Warning", "Failed", &message);
                        false
                    }
                }
            }
        }
    }

    /// The credentials of the pod's `imagePullSecrets` (read from its namespace) that apply to `image`;
    /// secrets that are missing or unreadable are skipped, as the kubelet skips them.
    fn pull_credentials(&self, pod: &Pod, image: &str) -> Vec<Credentials> {
        let info = PodInfo::from_pod(pod);
        let all: Vec<Credentials> = info
            .image_pull_secrets
            .iter()
            .filter_map(|name| self.api.get_recorded::<Secret>(&info.namespace, name))
            .flat_map(|secret| auth::from_secret(&secret).unwrap_or_default())
            .collect();
        auth::for_reference(&all, image)
    }
}

/// The container's pull policy; unset, the API server's default: `Always` for `:latest` or no tag,
/// else `IfNotPresent` (`pkg/apis/core/v1/defaults.go`).
fn pull_policy(container: &Container) -> PullPolicy {
    let image = container.image.as_deref().unwrap_or_default();
    match container.image_pull_policy.as_deref() {
        Some("Never") => PullPolicy::Never,
        Some("IfNotPresent") => PullPolicy::IfNotPresent,
        Some(_) => PullPolicy::Always,
        None => match oci_client::Reference::try_from(image) {
            Ok(reference) => PullPolicy::default_for(&reference),
            // Not a reference the runtime could pull either: as an untagged image, and the pull says why.
            Err(_) => PullPolicy::Always,
        },
    }
}

/// A pull's error as the kubelet's event shows it: the runtime's answer as grpc-go prints a status.
fn shown(e: &PullError) -> String {
    match e.runtime_status() {
        Some((code, message)) => format!("rpc error: code = {code:?} desc = {message}"),
        None => e.to_string(),
    }
}
