//! Errors: one status code per kind of failure, and a message that names what was wrong.

use std::fmt;

/// What kind of failure a call ran into. The C ABI returns these as `tokenrace_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// An argument of the call is wrong (a null pointer, a bad size, a bad per-row value).
    InvalidArgument,
    /// A configuration value is wrong (a field of the config struct or a `TOKENRACE_*` variable).
    InvalidConfig,
    /// An allocation failed.
    OutOfMemory,
    /// A bug in tokenrace (a caught panic, a broken invariant).
    Internal,
    /// The request is valid but this build or machine cannot do it (e.g. AVX-512 on a CPU without it).
    Unsupported,
    /// A wait ran out of time (a noise pool with the BLOCK policy).
    Timeout,
    /// The object was shut down or is unusable in this process (e.g. a pool after `fork()`).
    Closed,
}

/// An error with a message meant for a person: it names the argument, row or variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidConfig, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand for returning an `InvalidArgument` error built with `format!`.
macro_rules! bail_arg {
    ($($fmt:tt)*) => { return Err($crate::error::Error::invalid_argument(format!($($fmt)*))) };
}
pub(crate) use bail_arg;
