//! Pulling volume images through the runtime's CRI ImageService, so its registry configuration (mirrors,
//! proxies, certificates, credentials) applies to volumes exactly as to containers.
//!
//! - Pull policies are the container ones (`Always`, `IfNotPresent`, `Never`; the default is `Always` for
//!   `:latest` and untagged images, else `IfNotPresent`, as `pkg/apis/core/v1/defaults.go` sets them).
//! - Credentials are tried in keyring order, and anonymously when none apply (`kuberuntime_image.go`).
//! - A pull runs in the background, owned by the [`Puller`], not by the caller: a caller waits at most its
//!   budget and gets [`PullError::InProgress`] meanwhile; a later call for the same image and credentials
//!   joins the same pull or takes its result. The kubelet gives a CSI call two minutes; large images take
//!   longer (warm-metal PR #71).
//! - A cached image pulled with credentials is handed only to callers that prove access (KEP-2535, "ensure
//!   secret pulled images"): by a credential that pulled it before, or by pulling it again with their own.
//!   Which credentials pulled which image is kept on disk as the kubelet keeps it ([`PullRecords`]), so
//!   restarts keep the rule and a real kubelet on the node shares it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_proto::runtime::v1::{self as cri, image_service_client::ImageServiceClient};
use parking_lot::Mutex;
use tokio::sync::watch;
use tonic::Code;
use tonic::transport::Channel;

use super::allowlist::Allowlist;
use super::auth::Credentials;
use super::metrics::ImageMetrics;
use super::pull_records::PullRecords;
use super::store::ImageStore;
use inlet_host::Error;

mod access;

/// When to pull (the container image pull policy, reused by image volumes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull on every mount.
    Always,
    /// Pull when the image is not on the node.
    IfNotPresent,
    /// Never pull; fail when the image is not on the node.
    Never,
}

impl PullPolicy {
    /// Parses `Always` / `IfNotPresent` / `Never`; empty means the default for `image`.
    pub fn parse(value: &str, image: &oci_client::Reference) -> Result<Self, String> {
        match value {
            "" => Ok(Self::default_for(image)),
            "Always" => Ok(Self::Always),
            "IfNotPresent" => Ok(Self::IfNotPresent),
            "Never" => Ok(Self::Never),
            other => Err(format!(
                "unsupported pull policy {other:?}: use Always, IfNotPresent or Never"
            )),
        }
    }

    /// `Always` for `:latest` (and untagged, which parse as `:latest`) unless pinned by digest, else
    /// `IfNotPresent`.
    pub fn default_for(image: &oci_client::Reference) -> Self {
        if image.digest().is_none() && image.tag() == Some("latest") {
            Self::Always
        } else {
            Self::IfNotPresent
        }
    }
}

/// Which cached images a caller must prove access to (the kubelet's
/// `imagePullCredentialsVerificationPolicy`, KEP-2535).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum VerificationPolicy {
    /// Any cached image is handed to anyone.
    #[value(name = "NeverVerify")]
    NeverVerify,
    /// Images this node pulled with credentials need the caller's proof; images it found on the node
    /// (preloaded, or pulled by someone else) are trusted. The upstream default.
    #[default]
    #[value(name = "NeverVerifyPreloadedImages")]
    NeverVerifyPreloadedImages,
    /// Every cached image needs proof unless it was pulled anonymously.
    #[value(name = "AlwaysVerify")]
    AlwaysVerify,
    /// Images of the `preloadedImagesVerificationAllowlist` are handed to anyone, whoever pulled them;
    /// every other cached image needs proof unless it was pulled anonymously
    /// (`image_pull_policies.go`).
    #[value(name = "NeverVerifyAllowlistedImages")]
    NeverVerifyAllowlistedImages,
}

/// What a caller asks for.
#[derive(Debug, Clone)]
pub struct PullRequest {
    /// The normalized reference.
    pub image: String,
    /// When to pull.
    pub policy: PullPolicy,
    /// The credentials that apply to the image, in the order to try them.
    pub credentials: Vec<Credentials>,
    /// How long the caller waits for a pull before getting [`PullError::InProgress`] (`Duration::MAX`:
    /// until it ends, as a container's pull does).
    pub wait: Duration,
    /// The pod sandbox the image is for, passed to the runtime's PullImage (a container's pull has one;
    /// a volume's has none).
    pub sandbox: Option<cri::PodSandboxConfig>,
}

/// What a request needs, given whether the image is present (`image_manager.go` EnsureImageExists:
/// the pull policy, then the pull manager's `MustAttemptImagePull` for a cached image).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The image is present and the caller may use it: no pull.
    UseCached(String),
    /// The image must be pulled: it is absent, the policy is Always, or it is cached and the caller must
    /// prove access by pulling it with its own credentials.
    Pull,
    /// No pull may happen: the policy is Never and the image is absent ([`PullError::NeverPull`]) or
    /// cached but not the caller's to use ([`PullError::Denied`]).
    Refused(PullError),
}

/// Why an image is not ready. Messages name the image, never a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// A pull is running; retry later.
    #[error(
        "pulling image {image:?} in the background ({progress}); the volume is mounted on a later retry"
    )]
    InProgress {
        /// The image.
        image: String,
        /// Elapsed time and, where the runtime tells, bytes and layers.
        progress: String,
    },
    /// `Never` and the image is absent (the kubelet's ErrImageNeverPull text).
    #[error("image {0:?} is not present with pull policy of Never")]
    NeverPull(String),
    /// The caller could not prove access to a cached image pulled with credentials.
    #[error(
        "image {image:?} is on this node but was pulled with credentials this volume does not have: {reason}"
    )]
    Denied {
        /// The image.
        image: String,
        /// Why proof failed.
        reason: String,
    },
    /// The registry has no such image.
    #[error("image {image:?} not found: {message}")]
    NotFound {
        /// The image.
        image: String,
        /// The runtime's code.
        code: Code,
        /// The runtime's words.
        message: String,
    },
    /// The registry refused the credentials (or their absence).
    #[error("failed to pull image {image:?}: unauthorized: {message}")]
    Unauthorized {
        /// The image.
        image: String,
        /// The runtime's code.
        code: Code,
        /// The runtime's words.
        message: String,
    },
    /// The runtime could not be reached.
    #[error("container runtime is unavailable: {0}")]
    Unavailable(String),
    /// Any other pull failure.
    #[error("failed to pull image {image:?}: {message}")]
    Failed {
        /// The image.
        image: String,
        /// The runtime's code, when the runtime answered so (None: the pull failed here).
        code: Option<Code>,
        /// The runtime's words.
        message: String,
    },
}

impl PullError {
    /// The runtime's answer, when the error is one: its code and message, which the kubelet's events
    /// show as grpc-go prints them.
    pub fn runtime_status(&self) -> Option<(Code, &str)> {
        match self {
            PullError::NotFound { code, message, .. }
            | PullError::Unauthorized { code, message, .. } => Some((*code, message)),
            PullError::Failed {
                code: Some(code),
                message,
                ..
            } => Some((*code, message)),
            PullError::Unavailable(message) => Some((Code::Unavailable, message)),
            _ => None,
        }
    }
}

impl From<PullError> for Error {
    fn from(err: PullError) -> Self {
        match &err {
            PullError::InProgress { .. } => Error::Aborted(err.to_string()),
            PullError::Denied { .. } | PullError::Unauthorized { .. } => {
                Error::PermissionDenied(err.to_string())
            }
            PullError::Unavailable(_) => Error::Unavailable(err.to_string()),
            PullError::NotFound { image, .. } => Error::not_found("image", image),
            PullError::NeverPull(_) | PullError::Failed { .. } => {
                Error::FailedPrecondition(err.to_string())
            }
        }
    }
}

/// A pulled image: the runtime's id for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// `Image.id` (`PullImageResponse.image_ref`).
    pub id: String,
    /// True when this call pulled (or took the result of a pull); false when the cached image was used.
    pub pulled: bool,
    /// How long the pull itself took (from its start, which may be another caller's, to its end).
    pub pull_duration: Duration,
    /// The image's size as the runtime reports it (`Image.size`), in bytes.
    pub size: u64,
}

type Outcome = Option<Result<(String, Option<String>), PullError>>;

struct Running {
    started: Instant,
    done: watch::Receiver<Outcome>,
}

/// Pulls images through CRI and remembers who may use them. Cheap to share behind an `Arc`.
pub struct Puller {
    cri: ImageServiceClient<Channel>,
    /// The node's record of who pulled what; None only for a node whose record cannot be opened at all
    /// (see [`Puller::unrecorded`]).
    records: Option<PullRecords>,
    running: Mutex<HashMap<String, Running>>,
    verification: VerificationPolicy,
    /// What `NeverVerifyAllowlistedImages` exempts.
    allowlist: Allowlist,
    progress: Option<Arc<dyn ImageStore>>,
    metrics: ImageMetrics,
}

/// How long the result of a finished pull waits for its caller.
const FORGET_AFTER: Duration = Duration::from_secs(600);

impl Puller {
    /// A puller over `cri`, keeping which credentials pulled which image in the node's shared record in
    /// `records_dir` (see [`PullRecords`]), reading the progress of pulls from `progress` (the runtime's
    /// store) when given.
    pub fn new(
        cri: ImageServiceClient<Channel>,
        records_dir: &Path,
        verification: VerificationPolicy,
        progress: Option<Arc<dyn ImageStore>>,
    ) -> inlet_host::Result<Self> {
        Ok(Self {
            cri,
            records: Some(PullRecords::open(records_dir)?),
            running: Mutex::default(),
            verification,
            allowlist: Allowlist::default(),
            progress,
            metrics: ImageMetrics::default(),
        })
    }

    /// A puller without a record, for a node whose record cannot be opened: nothing is remembered, and
    /// a cached image is used unproven only under `NeverVerify`.
    pub fn unrecorded(cri: ImageServiceClient<Channel>, verification: VerificationPolicy) -> Self {
        Self {
            cri,
            records: None,
            running: Mutex::default(),
            verification,
            allowlist: Allowlist::default(),
            progress: None,
            metrics: ImageMetrics::default(),
        }
    }

    /// The puller with `allowlist` as the images `NeverVerifyAllowlistedImages` exempts.
    pub fn with_allowlist(mut self, allowlist: Allowlist) -> Self {
        self.allowlist = allowlist;
        self
    }

    /// The puller's metrics, to expose them.
    pub fn metrics(&self) -> &ImageMetrics {
        &self.metrics
    }

    /// Makes `request.image` present and usable by the caller, per its policy and credentials: the
    /// runtime's ImageStatus, [`Self::decide`], then [`Self::pull`] when needed. A cached image the
    /// registry refuses the caller is [`PullError::Denied`].
    pub async fn ensure(&self, request: &PullRequest) -> Result<Pulled, PullError> {
        let present = self.status(&request.image).await?;
        match self.decide(request, present.as_deref()) {
            Decision::UseCached(id) => Ok(Pulled {
                id,
                pulled: false,
                pull_duration: Duration::ZERO,
                size: 0,
            }),
            Decision::Refused(e) => Err(e),
            Decision::Pull => match self.pull(request).await {
                Err(PullError::Unauthorized { message, .. }) if present.is_some() => {
                    Err(PullError::Denied {
                        image: request.image.clone(),
                        reason: message,
                    })
                }
                pulled => pulled,
            },
        }
    }

    /// Whether `request` may use the image as it is (the runtime's id for it in `present`, None when
    /// absent), must pull it, or may not have it: the one place a cached image is judged, for container
    /// images and image volumes alike.
    pub fn decide(&self, request: &PullRequest, present: Option<&str>) -> Decision {
        let decision = self.judge(request, present);
        let always = request.policy == PullPolicy::Always;
        self.metrics.decided(&decision, present.is_some(), always);
        decision
    }

    fn judge(&self, request: &PullRequest, present: Option<&str>) -> Decision {
        match (request.policy, present) {
            (PullPolicy::Always, _) => Decision::Pull,
            (PullPolicy::Never, None) => {
                Decision::Refused(PullError::NeverPull(request.image.clone()))
            }
            (_, None) => Decision::Pull,
            (policy, Some(id)) => {
                match (
                    self.may_use(&request.image, id, &request.credentials),
                    policy,
                ) {
                    (true, _) => Decision::UseCached(id.to_string()),
                    (false, PullPolicy::Never) => Decision::Refused(PullError::Denied {
                        image: request.image.clone(),
                        reason: "pull policy Never forbids proving access at the registry".into(),
                    }),
                    (false, _) => Decision::Pull,
                }
            }
        }
    }

    /// Pulls `request.image` (announced first, recorded after with the credential that worked), joining
    /// a running pull of the same image and credentials; waits at most `request.wait`.
    pub async fn pull(&self, request: &PullRequest) -> Result<Pulled, PullError> {
        self.intend_pull(&request.image)?;
        let (id, credential_hash, pull_duration) = match self.join_pull(request).await {
            Ok(pulled) => pulled,
            Err(e) => {
                // A pull still running keeps its intent; a failed one withdraws it (upstream's
                // RecordImagePullFailed), unless another pull of the image runs here.
                if !matches!(e, PullError::InProgress { .. }) {
                    self.withdraw_intent(&request.image);
                }
                return Err(e);
            }
        };
        // PullImage's `image_ref` is the image id on containerd but `repository@digest` on CRI-O: the id
        // the store and the credential record know comes from ImageStatus. Recording credentials under
        // the reference instead would leave a private image pulled on CRI-O unrecorded, so served to
        // pods without them as if preloaded.
        let image = self.image(&id).await?;
        let size = image.as_ref().map(|i| i.size).unwrap_or_default();
        let id = image.map(|i| i.id).unwrap_or(id);
        self.remember(&request.image, &id, &request.credentials, credential_hash);
        Ok(Pulled {
            id,
            pulled: true,
            pull_duration,
            size,
        })
    }

    /// The id of the image if the runtime has it.
    async fn status(&self, image: &str) -> Result<Option<String>, PullError> {
        Ok(self.image(image).await?.map(|i| i.id))
    }

    /// The image as the runtime has it (ImageStatus), if it has it.
    async fn image(&self, image: &str) -> Result<Option<cri::Image>, PullError> {
        let request = cri::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        match self.cri.clone().image_status(request).await {
            Ok(r) => Ok(r.into_inner().image),
            Err(s) => Err(classify(image, s)),
        }
    }

    /// Joins or starts the background pull for this image and credentials, and waits up to the budget.
    async fn join_pull(
        &self,
        request: &PullRequest,
    ) -> Result<(String, Option<String>, Duration), PullError> {
        let credential_hashes: Vec<String> = request
            .credentials
            .iter()
            .map(Credentials::credential_hash)
            .collect();
        let key = format!("{}\n{}", request.image, credential_hashes.join(","));
        let (started, mut done) = {
            let mut running = self.running.lock();
            // A finished pull whose caller never came back (its pod was deleted) is forgotten after a while.
            running.retain(|_, r| r.done.borrow().is_none() || r.started.elapsed() < FORGET_AFTER);
            let entry = running.entry(key.clone()).or_insert_with(|| {
                let (tx, rx) = watch::channel(None);
                let cri = self.cri.clone();
                let request = request.clone();
                let progress = self.progress.clone();
                let metrics = self.metrics.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let outcome =
                        pull_with(cri.clone(), &request, &credential_hashes, progress).await;
                    let took = started.elapsed().as_secs_f64();
                    // The waiters first: the size is for the metric only, and asked with a bound.
                    let pulled = outcome.clone().map(|(id, _)| id);
                    let _ = tx.send(Some(outcome));
                    match pulled {
                        Ok(id) => metrics.pulled(Ok(image_size(cri, &id).await), took),
                        Err(e) => metrics.pulled(Err(&e), took),
                    }
                });
                Running {
                    started: Instant::now(),
                    done: rx,
                }
            });
            (entry.started, entry.done.clone())
        };
        let finished = tokio::time::timeout(request.wait, async {
            done.wait_for(Option::is_some).await.map(|o| o.clone())
        })
        .await;
        match finished {
            Ok(Ok(outcome)) => {
                let outcome = outcome.unwrap_or_else(|| unreachable_outcome(&request.image));
                // The result is taken once; the next caller starts afresh (a failed pull is retried).
                self.running.lock().remove(&key);
                outcome.map(|(id, credential_hash)| (id, credential_hash, started.elapsed()))
            }
            Ok(Err(_)) => {
                self.running.lock().remove(&key);
                Err(unreachable_outcome(&request.image).unwrap_err())
            }
            Err(_) => Err(PullError::InProgress {
                image: request.image.clone(),
                progress: describe_progress(started, self.progress.as_deref()).await,
            }),
        }
    }
}

fn unreachable_outcome(image: &str) -> Result<(String, Option<String>), PullError> {
    Err(PullError::Failed {
        image: image.to_string(),
        code: None,
        message: "the pull task ended without a result".into(),
    })
}

/// Tries each credential in turn (anonymously when there are none), logging progress while it runs.
async fn pull_with(
    cri: ImageServiceClient<Channel>,
    request: &PullRequest,
    credential_hashes: &[String],
    progress: Option<Arc<dyn ImageStore>>,
) -> Result<(String, Option<String>), PullError> {
    let started = Instant::now();
    let attempts: Vec<(Option<&Credentials>, Option<String>)> = if request.credentials.is_empty() {
        vec![(None, None)]
    } else {
        request
            .credentials
            .iter()
            .zip(credential_hashes.iter().cloned())
            .map(|(c, f)| (Some(c), Some(f)))
            .collect()
    };
    tracing::info!(image = %request.image, "pulling image");
    let mut last = None;
    for (credentials, credential_hash) in attempts {
        let mut client = cri.clone();
        let pull = client.pull_image(cri::PullImageRequest {
            image: Some(image_spec(&request.image)),
            auth: credentials.map(Credentials::to_cri),
            sandbox_config: request.sandbox.clone(),
        });
        tokio::pin!(pull);
        let mut ticker = tokio::time::interval(Duration::from_secs(10));
        ticker.tick().await;
        let result = loop {
            tokio::select! {
                result = &mut pull => break result,
                _ = ticker.tick() => {
                    let progress = describe_progress(started, progress.as_deref()).await;
                    tracing::info!(image = %request.image, %progress, "still pulling image");
                }
            }
        };
        match result {
            Ok(reply) => {
                let id = reply.into_inner().image_ref;
                tracing::info!(image = %request.image, id, elapsed = ?started.elapsed(), "pulled image");
                return Ok((id, credential_hash));
            }
            Err(status) => {
                let err = classify(&request.image, status);
                tracing::warn!(image = %request.image, error = %err, "pull failed");
                // The next credential is tried whatever the error, as kuberuntime_image.go PullImage
                // does; the last error is the answer.
                last = Some(err);
            }
        }
    }
    Err(last.unwrap_or_else(|| unreachable_outcome(&request.image).unwrap_err()))
}

/// The runtime's size of the image `id` (0 when it cannot tell), for the pulled-bytes metric.
async fn image_size(mut cri: ImageServiceClient<Channel>, id: &str) -> u64 {
    let request = cri::ImageStatusRequest {
        image: Some(image_spec(id)),
        verbose: false,
    };
    match tokio::time::timeout(Duration::from_secs(10), cri.image_status(request)).await {
        Ok(Ok(reply)) => reply.into_inner().image.map_or(0, |i| i.size),
        _ => 0,
    }
}

async fn describe_progress(started: Instant, store: Option<&dyn ImageStore>) -> String {
    let elapsed = humantime::format_duration(Duration::from_secs(started.elapsed().as_secs()));
    let progress = match store {
        Some(store) => store.progress().await,
        None => None,
    };
    match progress {
        Some(p) => format!("{elapsed} elapsed, {p}"),
        None => format!("{elapsed} elapsed"),
    }
}

/// Sorts a runtime's pull error into the classes callers act on. Runtimes report registry refusals as
/// UNKNOWN with the registry's words (containerd: "401 Unauthorized"), so the message is read too.
fn classify(image: &str, status: tonic::Status) -> PullError {
    let message = status.message().to_string();
    let lower = message.to_ascii_lowercase();
    let image = image.to_string();
    match status.code() {
        Code::Unavailable => PullError::Unavailable(message),
        code @ (Code::Unauthenticated | Code::PermissionDenied) => PullError::Unauthorized {
            image,
            code,
            message,
        },
        code if lower.contains("unauthorized")
            || lower.contains("401")
            || lower.contains("403") =>
        {
            PullError::Unauthorized {
                image,
                code,
                message,
            }
        }
        code @ Code::NotFound => PullError::NotFound {
            image,
            code,
            message,
        },
        code if lower.contains("not found") => PullError::NotFound {
            image,
            code,
            message,
        },
        code => PullError::Failed {
            image,
            code: Some(code),
            message,
        },
    }
}

fn image_spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    }
}
