//! The three classes of volume errors that drive the volume manager, as in the kubelet
//! (`pkg/volume/util/types`: TransientOperationFailure, UncertainProgressError, and everything else).

use tonic::Code;

/// How the volume manager treats a failed operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ErrorClass {
    /// Nothing happened on the node; retry with backoff (a missing secret, an unregistered driver).
    Transient,
    /// The operation may have taken effect (a timeout, the driver went away mid-call): track the volume as
    /// possibly mounted, so it is torn down if no longer wanted, and retry.
    Uncertain,
    /// It failed for sure and left nothing: clean up (remove the mount dir) and retry with backoff.
    Final,
}

/// A failed volume operation: its class, and a message in upstream's words (it becomes a pod event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct VolumeError {
    /// How the volume manager should treat it.
    pub class: ErrorClass,
    /// What went wrong.
    pub message: String,
}

impl VolumeError {
    /// A transient error.
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            class: ErrorClass::Transient,
            message: message.into(),
        }
    }

    /// An uncertain error.
    pub fn uncertain(message: impl Into<String>) -> Self {
        Self {
            class: ErrorClass::Uncertain,
            message: message.into(),
        }
    }

    /// A final error.
    pub fn final_(message: impl Into<String>) -> Self {
        Self {
            class: ErrorClass::Final,
            message: message.into(),
        }
    }

    /// The class of a CSI call's failure, as `csi_client.go` `isFinalError` decides: a timeout, a cancelled
    /// call, an unavailable or exhausted driver, or an aborted operation may still be in progress on the
    /// driver, so the result is uncertain; every other code is final.
    pub fn from_csi(status: &tonic::Status, message: impl Into<String>) -> Self {
        let class = match status.code() {
            Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted => ErrorClass::Uncertain,
            _ => ErrorClass::Final,
        };
        Self {
            class,
            message: message.into(),
        }
    }

    /// The same error with a prefix, keeping its class: `prefix: message`.
    pub fn context(self, prefix: impl std::fmt::Display) -> Self {
        Self {
            class: self.class,
            message: format!("{prefix}: {}", self.message),
        }
    }
}

/// `utilerrors.NewAggregate(...).Error()`: one error as it is, more as `[a, b]`.
pub fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csi_codes_map_to_classes_like_the_kubelet() {
        for code in [
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::Aborted,
            Code::Cancelled,
            Code::ResourceExhausted,
        ] {
            assert_eq!(
                VolumeError::from_csi(&tonic::Status::new(code, ""), "x").class,
                ErrorClass::Uncertain
            );
        }
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::Internal,
            Code::FailedPrecondition,
        ] {
            assert_eq!(
                VolumeError::from_csi(&tonic::Status::new(code, ""), "x").class,
                ErrorClass::Final
            );
        }
        let e = VolumeError::transient("b").context("a");
        assert_eq!(
            (e.class, e.message.as_str()),
            (ErrorClass::Transient, "a: b")
        );
    }
}
