//! Errors: one status code per kind of failure, and a message that names what was wrong.
//!
//! An error about an argument carries *where* it is as data ([`Location`]: the struct, the
//! field, the row), so that every layer reports it the same way (`batch.top_p[3]: ...`) and no
//! layer has to guess it from the text.

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

/// The argument struct an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The draw's inputs (`Batch`, `tokenrace_batch`).
    Batch,
    /// Where a draw writes (`Output`, `tokenrace_output`).
    Output,
    /// A request's sampling parameters (`RequestParams`, `tokenrace_request_params`).
    Params,
}

impl Owner {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Owner::Batch => "batch",
            Owner::Output => "out",
            Owner::Params => "params",
        }
    }
}

/// Where in the arguments an error is: a field of a struct, and the row when it is per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// The struct the field belongs to (the config, the batch, the output).
    pub owner: Owner,
    /// The field's name, as the C struct spells it.
    pub field: &'static str,
    /// The row (or request) of a per-row field.
    pub row: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.owner.name(), self.field)?;
        if let Some(r) = self.row {
            write!(f, "[{r}]")?;
        }
        Ok(())
    }
}

/// An error with a message meant for a person: it names the argument, row or variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The status the C API returns for it.
    pub kind: ErrorKind,
    /// The argument the error is about, when it is about one; the message then starts with it
    /// (`batch.top_p[3]: 1.5 is not in (0, 1]`).
    pub location: Option<Location>,
    /// The whole message, as `tokenrace_last_error` gives it.
    pub message: String,
}

impl Error {
    /// An error of `kind` about nothing in particular.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, location: None, message: message.into() }
    }
    /// A refused argument (the call's inputs or outputs).
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    /// A refused configuration (a sampler's or a pool's settings).
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidConfig, message)
    }
    /// A broken promise inside the library (a bug): never the caller's doing.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    /// An INVALID_ARGUMENT error about field `field` of `owner` (of row `row`, if per row).
    pub(crate) fn arg(owner: Owner, field: &'static str, row: Option<usize>, what: impl fmt::Display) -> Self {
        let location = Location { owner, field, row };
        Error { kind: ErrorKind::InvalidArgument, location: Some(location), message: format!("{location}: {what}") }
    }
    /// This error as one of row `r` of a call that failed (an allocation for that row), named
    /// so: a call that fails writes nothing.
    pub(crate) fn in_row(self, r: usize) -> Self {
        let message = format!("row {r}: {}; nothing was written", self.message);
        Error { message, ..self }
    }
    /// This error as one of the whole call (an allocation for every row): it writes nothing.
    pub(crate) fn nothing_written(self) -> Self {
        let message = format!("{}; nothing was written", self.message);
        Error { message, ..self }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The library's results: a value, or an [`Error`] that says what was wrong and where.
pub type Result<T> = std::result::Result<T, Error>;

/// Returns an INVALID_ARGUMENT error about a field of the batch: `bail_batch!(field, row, fmt...)`
/// (`row` is an `Option<usize>`).
macro_rules! bail_batch {
    ($field:expr, $row:expr, $($fmt:tt)*) => {
        return Err($crate::error::Error::arg($crate::error::Owner::Batch, $field, $row, format!($($fmt)*)))
    };
}
/// As [`bail_batch!`], about a field of the output.
macro_rules! bail_out {
    ($field:expr, $row:expr, $($fmt:tt)*) => {
        return Err($crate::error::Error::arg($crate::error::Owner::Output, $field, $row, format!($($fmt)*)))
    };
}
pub(crate) use {bail_batch, bail_out};
