//! The image manager (`pkg/kubelet/images/image_manager.go` EnsureImageExists): a container's image made
//! present per its pull policy before each start of the container, and an image volume's before its pod's
//! containers start when the runtime mounts it (KEP-4639), with upstream's events and errors.
//! Whether a cached image may be used (KEP-2535) and how a pull runs are the node's one [`Puller`]'s,
//! shared with image volumes and the in-process image drivers; this file turns its answers into the
//! kubelet's events, and keeps the pull back-off: after a failed pull, the pod's next pulls of that image
//! wait (10 s doubling to 5 min upstream, keyed by pod and image) with `ImagePullBackOff` and the last
//! failure's message.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_image::auth::{self, Credentials};
use inlet_image::pull::{Decision, PullError, PullPolicy, PullRequest, Puller};
use inlet_proto::runtime::v1::{self as cri, image_service_client::ImageServiceClient};
use inlet_volume::PodInfo;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use tonic::transport::Channel;

use super::BackoffPolicy;
use super::containers::go_duration;
use crate::api::Api;
use crate::operations::BackoffEntry;

/// Why a container's image is not there: the container's waiting reason, and the message beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageError {
    /// `ErrImageNeverPull`, `ErrImagePull` or `ImagePullBackOff`.
    pub reason: &'static str,
    /// Upstream's message.
    pub message: String,
}

/// One pod's back-off for one image, with the failure that started it.
struct PullBackOff {
    entry: BackoffEntry,
    last_error: String,
}

/// What an image is present for: one of the pod's containers (its events name the container), or the
/// pod's image volumes (events on the pod, as `getImageVolumes` passes the pod's reference).
#[derive(Debug, Clone, Copy)]
pub enum ImageUser<'a> {
    /// A container, by name.
    Container(&'a str),
    /// An image volume of the pod.
    Volume,
}

/// Makes containers' images present.
pub struct ImageManager {
    api: Arc<Api>,
    cri: ImageServiceClient<Channel>,
    puller: Arc<Puller>,
    backoff: BackoffPolicy,
    /// By `<pod uid>_<image>`, as upstream keys it.
    backoffs: parking_lot::Mutex<HashMap<String, PullBackOff>>,
}

impl ImageManager {
    /// An image manager over the runtime's ImageService and the node's puller, backing off failed pulls
    /// per `backoff`.
    pub fn new(
        api: Arc<Api>,
        cri: ImageServiceClient<Channel>,
        puller: Arc<Puller>,
        backoff: BackoffPolicy,
    ) -> Self {
        Self {
            api,
            cri,
            puller,
            backoff,
            backoffs: Default::default(),
        }
    }

    /// The node's puller (its pull records).
    pub fn puller(&self) -> &Puller {
        &self.puller
    }

    /// Ok once `container`'s image is present and the pod may use it; else the container waits with the
    /// error's reason, the pod has upstream's event, and the start is tried again later.
    pub async fn ensure_container_image(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox: &cri::PodSandboxConfig,
    ) -> Result<String, ImageError> {
        let image = container.image.clone().unwrap_or_default();
        let policy = pull_policy(container.image_pull_policy.as_deref(), &image);
        let user = ImageUser::Container(&container.name);
        self.ensure_image_exists(pod, user, &image, policy, sandbox)
            .await
    }

    /// EnsureImageExists: Ok with the image's id (its `imageRef`) once `image` is present and the pod may
    /// use it under `policy`; else the error's reason, with upstream's event on the pod or its container.
    pub async fn ensure_image_exists(
        &self,
        pod: &Pod,
        user: ImageUser<'_>,
        image: &str,
        policy: PullPolicy,
        sandbox: &cri::PodSandboxConfig,
    ) -> Result<String, ImageError> {
        let image = image.to_string();
        let request = PullRequest {
            image: image.clone(),
            policy,
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
        let event = |type_: &str, reason: &str, message: &str| match user {
            ImageUser::Container(name) => self
                .api
                .record_container_event(pod, name, type_, reason, message),
            ImageUser::Volume => self.api.record_event(pod, type_, reason, message),
        };
        match self.puller.decide(&request, present.as_deref()) {
            Decision::UseCached(id) => {
                let message = format!(
                    "Container image {image:?} already present on machine and can be accessed by the pod"
                );
                event("Normal", "Pulled", &message);
                Ok(id)
            }
            // Absent, or present but this pod has not shown the credentials it was pulled with, and
            // Never forbids a pull to show them: upstream answers the same for both.
            Decision::Refused(_) => {
                let message =
                    format!("Container image {image:?} is not present with pull policy of Never");
                event("Warning", "ErrImageNeverPull", &message);
                Err(ImageError {
                    reason: "ErrImageNeverPull",
                    message,
                })
            }
            Decision::Pull => self.pull(pod, &event, &request).await,
        }
    }

    /// `pullImage`: unless the pod is backing off this image, Pulling, the pull, then Pulled with its
    /// times and size, or Failed and a longer back-off.
    async fn pull(
        &self,
        pod: &Pod,
        event: &impl Fn(&str, &str, &str),
        request: &PullRequest,
    ) -> Result<String, ImageError> {
        let image = &request.image;
        let key = format!(
            "{}_{image}",
            pod.metadata.uid.as_deref().unwrap_or_default()
        );
        if let Some(last_error) = self.backing_off(&key) {
            let message = format!("Back-off pulling image {image:?}");
            event("Normal", "BackOff", &message);
            return Err(ImageError {
                reason: "ImagePullBackOff",
                message: format!("{message}: {last_error}"),
            });
        }
        event("Normal", "Pulling", &format!("Pulling image {image:?}"));
        let started = Instant::now();
        match self.puller.pull(request).await {
            Ok(pulled) => {
                self.backoffs.lock().remove(&key);
                let message = format!(
                    "Successfully pulled image {image:?} in {} ({} including waiting). Image size: {} bytes.",
                    go_duration(pulled.pull_duration),
                    go_duration(started.elapsed()),
                    pulled.size
                );
                event("Normal", "Pulled", &message);
                Ok(pulled.id)
            }
            Err(e) => {
                let shown = shown(&e);
                let message = format!("Failed to pull image {image:?}: {shown}");
                event("Warning", "Failed", &message);
                self.failed(&key, format!("ErrImagePull: {shown}"));
                Err(ImageError {
                    reason: "ErrImagePull",
                    message: shown,
                })
            }
        }
    }

    /// The last failure's text while `key` backs off (`IsInBackOffSinceUpdate`); entries the policy has
    /// forgotten are dropped.
    fn backing_off(&self, key: &str) -> Option<String> {
        let mut backoffs = self.backoffs.lock();
        backoffs.retain(|_, b| self.backoff.live(Some(b.entry)).is_some());
        let b = backoffs.get(key)?;
        (b.entry.updated.elapsed() < b.entry.delay).then(|| b.last_error.clone())
    }

    /// A failed pull lengthens the back-off (`Backoff.Next`).
    fn failed(&self, key: &str, error: String) {
        let mut backoffs = self.backoffs.lock();
        let entry = self.backoff.next(backoffs.get(key).map(|b| b.entry));
        backoffs.insert(
            key.to_string(),
            PullBackOff {
                entry,
                last_error: error,
            },
        );
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

/// A container's or image volume's pull policy; unset, the API server's default: `Always` for `:latest`
/// or no tag, else `IfNotPresent` (`pkg/apis/core/v1/defaults.go`, for both).
pub fn pull_policy(policy: Option<&str>, image: &str) -> PullPolicy {
    match policy {
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
