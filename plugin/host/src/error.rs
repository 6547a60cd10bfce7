//! The plugin's one error type, and its mapping to gRPC status codes, in one place.
//!
//! Messages name the field or object at fault, so a CSI caller (or a person reading a pod event) can act on
//! them. They never carry secret values: handlers only ever put field names and ids into them.

use std::io;

use tonic::{Code, Status};

/// An error from a driver operation. Each variant maps to one gRPC code (see `From<Error> for Status`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is missing or malformed (INVALID_ARGUMENT).
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The request field, as the CSI spec names it (`volume_capability.access_mode`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The object the request names does not exist (NOT_FOUND).
    #[error("{kind} {id:?} not found")]
    NotFound {
        /// What kind of object: "volume", "snapshot", "node".
        kind: &'static str,
        /// The id or name the caller gave.
        id: String,
    },
    /// An object of that name exists but is incompatible with the request (ALREADY_EXISTS).
    #[error("{0}")]
    AlreadyExists(String),
    /// The request is valid but the object is not in a state that allows it (FAILED_PRECONDITION).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A requested size is outside what the driver supports (OUT_OF_RANGE).
    #[error("{0}")]
    OutOfRange(String),
    /// The driver's capacity is used up (RESOURCE_EXHAUSTED).
    #[error("{0}")]
    ResourceExhausted(String),
    /// A pagination token the driver did not issue, or no longer can honour (ABORTED).
    #[error("{0}")]
    Aborted(String),
    /// The caller lacks the credentials the operation needs (PERMISSION_DENIED).
    #[error("{0}")]
    PermissionDenied(String),
    /// A service the driver depends on (the container runtime) cannot be reached (UNAVAILABLE).
    #[error("{0}")]
    Unavailable(String),
    /// The call belongs to a capability this driver does not offer as configured (UNIMPLEMENTED).
    #[error("{0}")]
    Unimplemented(String),
    /// The host refused a filesystem, mount or loop-device operation (INTERNAL).
    #[error("{context}: {source}")]
    Io {
        /// What the driver was doing, with the path involved.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// A missing or malformed request field.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// An unknown object.
    pub fn not_found(kind: &'static str, id: impl Into<String>) -> Self {
        Self::NotFound {
            kind,
            id: id.into(),
        }
    }

    /// The gRPC code this error is reported with.
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument { .. } => Code::InvalidArgument,
            Self::NotFound { .. } => Code::NotFound,
            Self::AlreadyExists(_) => Code::AlreadyExists,
            Self::FailedPrecondition(_) => Code::FailedPrecondition,
            Self::OutOfRange(_) => Code::OutOfRange,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::Aborted(_) => Code::Aborted,
            Self::PermissionDenied(_) => Code::PermissionDenied,
            Self::Unavailable(_) => Code::Unavailable,
            Self::Unimplemented(_) => Code::Unimplemented,
            // A name or path too long for the host is the caller's to fix, not the driver's failure.
            Self::Io { source, .. } if source.raw_os_error() == Some(nix::libc::ENAMETOOLONG) => {
                Code::InvalidArgument
            }
            // A full disk is a resource running out: the caller may retry once space is freed.
            Self::Io { source, .. }
                if matches!(
                    source.raw_os_error(),
                    Some(nix::libc::ENOSPC | nix::libc::EDQUOT)
                ) =>
            {
                Code::ResourceExhausted
            }
            Self::Io { .. } => Code::Internal,
        }
    }
}

/// The longest message a reply carries: it travels as an HTTP/2 header, which clients cap (8 KiB in
/// grpc-go), and it may echo what the caller sent.
const MAX_MESSAGE: usize = 4096;

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let mut message = err.to_string();
        if message.len() > MAX_MESSAGE {
            let mut end = MAX_MESSAGE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str("... (cut)");
        }
        Status::new(err.code(), message)
    }
}

/// Adds what the driver was doing to an I/O error: `dir.create_dir_all().context(|| format!(...))`.
pub trait IoContext<T> {
    /// Wraps the error in [`Error::Io`] with the given context.
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Io {
            context: what(),
            source,
        })
    }
}

/// The plugin's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_each_class_to_its_code() {
        let status: Status = Error::invalid("volume_id", "required").into();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "volume_id: required");
        let status: Status = Error::not_found("volume", "v1").into();
        assert_eq!(
            (status.code(), status.message()),
            (Code::NotFound, "volume \"v1\" not found")
        );
        let io: Result<()> = Err(io::Error::other("boom")).context(|| "mounting /x".into());
        assert_eq!(Status::from(io.unwrap_err()).code(), Code::Internal);
        let long: Result<()> = Err(io::Error::from_raw_os_error(nix::libc::ENAMETOOLONG))
            .context(|| "creating /x".into());
        assert_eq!(
            Status::from(long.unwrap_err()).code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn a_message_echoing_a_megabyte_is_cut() {
        let status: Status = Error::invalid("size", "x".repeat(1 << 20)).into();
        assert!(status.message().len() < 5000);
        assert!(status.message().ends_with("... (cut)"));
    }
}
