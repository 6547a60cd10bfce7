//! What a [`Puller`] keeps in the node's pull records (KEP-2535): the intent before a pull, the record
//! after, the check that a cached image may be handed to a caller, the import of inlet's earlier
//! record, and their upkeep (intents settled at start, records pruned after image GC). The record
//! itself is [`PullRecords`].

use std::collections::HashSet;
use std::path::Path;
use std::time::SystemTime;

use inlet_proto::runtime::v1 as cri;

use super::{PullError, Puller, VerificationPolicy};
use crate::allowlist::image_name;
use crate::auth::Credentials;

impl Puller {
    /// Announces a pull of `image` before it starts (upstream's pull intent): until its record is
    /// written, the image counts as pulled by this node with credentials unknown. An error means the
    /// pull must not start: its record could not be kept.
    pub(super) fn intend_pull(&self, image: &str) -> Result<(), PullError> {
        let Some(records) = &self.records else {
            return Ok(());
        };
        records.intend(image).map_err(|e| PullError::Failed {
            image: image.to_string(),
            code: None,
            message: format!("recording the pull: {e}"),
        })
    }

    /// True when the caller may use the cached `image` (the runtime's `id` for it) without pulling it, as
    /// the kubelet's `MustAttemptImagePull` answers: always under NeverVerify, and for an allowlisted
    /// image under NeverVerifyAllowlistedImages; an image this node never pulled (no record, no intent)
    /// under NeverVerifyPreloadedImages; else only when its record, for the image's name, says the node's
    /// pods may, or one of `credentials` pulled it. A record that cannot be read means no.
    pub(super) fn may_use(&self, image: &str, id: &str, credentials: &[Credentials]) -> bool {
        let allowlisted = self.verification == VerificationPolicy::NeverVerifyAllowlistedImages
            && self.allowlist.matches(image);
        if self.verification == VerificationPolicy::NeverVerify || allowlisted {
            return true;
        }
        let Some(records) = &self.records else {
            return false;
        };
        let record = match records.record(id) {
            Ok(record) => record,
            Err(e) => {
                tracing::warn!(error = %e, "Unable to access cache records about image pulls");
                return false;
            }
        };
        let Some(record) = record else {
            return self.verification == VerificationPolicy::NeverVerifyPreloadedImages
                && !records.intended(image);
        };
        let name = image_name(image).unwrap_or_else(|| image.to_string());
        record
            .credential_mapping
            .get(&name)
            .is_some_and(|pulled| pulled.grants(credentials))
    }

    /// Records who pulled `image` (the runtime's `id`): the one of `credentials` whose hash is
    /// `credential_hash`, or nobody (an anonymous pull); and clears its intent. A failure is logged: the
    /// intent stays, so the image keeps needing proof.
    pub(super) fn remember(
        &self,
        image: &str,
        id: &str,
        credentials: &[Credentials],
        credential_hash: Option<String>,
    ) {
        let Some(records) = &self.records else {
            return;
        };
        let pulled_with = credential_hash
            .and_then(|hash| credentials.iter().find(|c| c.credential_hash() == hash));
        match records.remember(image, id, pulled_with) {
            Ok(()) => self.withdraw_intent(image),
            Err(e) => tracing::warn!(error = %e, "could not save the pull record"),
        }
    }

    /// Withdraws the intent of a pull of `image` that ended, unless another pull of it still runs here
    /// (its intent is the same file). A failure is logged: the image keeps needing proof.
    pub(super) fn withdraw_intent(&self, image: &str) {
        let Some(records) = &self.records else {
            return;
        };
        let prefix = format!("{image}\n");
        let others = self
            .running
            .lock()
            .iter()
            .any(|(key, r)| key.starts_with(&prefix) && r.done.borrow().is_none());
        if others {
            return;
        }
        if let Err(e) = records.withdraw(image) {
            tracing::warn!(error = %e, "could not withdraw the pull intent");
        }
    }

    /// At start (upstream's `initialize`): the intents of pulls that ended while no one recorded them,
    /// for images the runtime has, become records naming no one ([`PullRecords::settle_intents`]).
    /// Returns how many; a runtime that cannot list its images leaves them for the next start.
    pub async fn settle_intents(&self) -> inlet_host::Result<usize> {
        let Some(records) = &self.records else {
            return Ok(0);
        };
        let request = cri::ListImagesRequest { filter: None };
        let images = match self.cri.clone().list_images(request).await {
            Ok(reply) => reply.into_inner().images,
            Err(s) => {
                tracing::warn!(error = s.message(), "listing images to settle pull intents");
                return Ok(0);
            }
        };
        let present: Vec<(String, Vec<String>)> = images
            .into_iter()
            .map(|i| (i.id, [i.repo_tags, i.repo_digests].concat()))
            .collect();
        let records = records.clone();
        let settled = tokio::task::spawn_blocking(move || records.settle_intents(&present)).await;
        joined(settled, "settling pull intents")
    }

    /// After image GC (its post hook, upstream's `PruneUnknownRecords`): the records of images not in
    /// `images` (the runtime's ids, listed after `until`) go ([`PullRecords::prune_unknown`]).
    pub async fn prune_unknown_records(
        &self,
        images: HashSet<String>,
        until: SystemTime,
    ) -> inlet_host::Result<usize> {
        let Some(records) = self.records.clone() else {
            return Ok(0);
        };
        let pruned =
            tokio::task::spawn_blocking(move || records.prune_unknown(&images, until)).await;
        joined(pruned, "pruning pull records")
    }

    /// Imports the node's record of inlet's earlier format from `dir` (see
    /// [`PullRecords::import_legacy`]).
    pub fn import_legacy(&self, dir: &Path) -> inlet_host::Result<()> {
        match &self.records {
            Some(records) => records.import_legacy(dir),
            None => Ok(()),
        }
    }
}

/// The result of work on the blocking pool; a task that panicked is an error naming `what`.
fn joined<T>(
    result: Result<inlet_host::Result<T>, tokio::task::JoinError>,
    what: &str,
) -> inlet_host::Result<T> {
    use inlet_host::error::IoContext;
    result
        .map_err(std::io::Error::other)
        .context(|| what.to_string())?
}
