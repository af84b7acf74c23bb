//! What every entry point runs inside: errors become a status and the thread's last error, and
//! a panic becomes `INTERNAL` without ever unwinding into C.

use super::types::tokenrace_status;
use crate::error::{Error, ErrorKind};
use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The message of the last failed call on this thread, valid until its next call.
pub(crate) fn last_error_ptr() -> *const std::ffi::c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

fn status_of(kind: ErrorKind) -> tokenrace_status {
    match kind {
        ErrorKind::InvalidArgument => tokenrace_status::InvalidArgument,
        ErrorKind::InvalidConfig => tokenrace_status::InvalidConfig,
        ErrorKind::OutOfMemory => tokenrace_status::OutOfMemory,
        ErrorKind::Internal => tokenrace_status::Internal,
        ErrorKind::Unsupported => tokenrace_status::Unsupported,
        ErrorKind::Timeout => tokenrace_status::Timeout,
        ErrorKind::Closed => tokenrace_status::Closed,
    }
}

/// Runs the body of entry point `name`: an error becomes its status and the message
/// `"{name}: {error}"` (which names the argument: `tokenrace_draw: batch.top_p[3]: ...`), a panic
/// becomes `INTERNAL`.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Result<(), Error>) -> tokenrace_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            set_last_error("");
            tokenrace_status::Ok
        }
        Ok(Err(e)) => {
            set_last_error(&format!("{name}: {e}"));
            status_of(e.kind)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("{name}: internal error (a bug in tokenrace, please report it): {what}"));
            tokenrace_status::Internal
        }
    }
}

/// Runs a function that returns nothing (a `free`): a panic is caught and dropped.
pub(crate) fn guard_void(body: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(body));
}
