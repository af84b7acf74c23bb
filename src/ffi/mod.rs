//! The C boundary, and nothing else: `#[repr(C)]` types, `extern "C"` functions, the conversion
//! of raw pointers into the Rust types of the library, and the rules every entry point keeps:
//! a status code for every fallible call, a thread-local message that names what was wrong,
//! no panic across the boundary, and nothing written by a call that fails.

#![allow(non_camel_case_types)]

pub mod api;
pub mod pool_api;
pub mod types;

use crate::error::{Error, ErrorKind};
use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use types::tokenrace_status;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

pub(crate) fn last_error_ptr() -> *const std::ffi::c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

pub(crate) fn status_of(kind: ErrorKind) -> tokenrace_status {
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

/// Runs the body of an entry point: turns errors into a status plus the thread's last error,
/// and a panic into `INTERNAL` (the panic never unwinds into C).
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Result<(), Error>) -> tokenrace_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            set_last_error("");
            tokenrace_status::Ok
        }
        Ok(Err(e)) => {
            set_last_error(&format!("{name}: {}", e.message));
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

/// Reads a caller's versioned struct: `struct_size` first, at least `min_size` bytes; fields the
/// caller's (older) struct lacks keep their defaults, and bytes of a newer caller's struct beyond
/// what this library knows must be zero (they would be features this library cannot honour).
///
/// # Safety
/// `ptr` is null or points to at least `struct_size` readable bytes.
pub(crate) unsafe fn read_versioned<T: Copy>(
    ptr: *const T,
    default: T,
    name: &str,
    min_size: usize,
) -> Result<T, Error> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!("{name}: is NULL")));
    }
    let size = (ptr as *const u32).read_unaligned() as usize;
    let ours = std::mem::size_of::<T>();
    if size < min_size {
        return Err(Error::invalid_argument(format!(
            "{name}.struct_size: {size} is smaller than the oldest known layout ({min_size} bytes); set it to sizeof(*{name})"
        )));
    }
    if size > ours {
        let extra = std::slice::from_raw_parts((ptr as *const u8).add(ours), size - ours);
        if extra.iter().any(|&b| b != 0) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{name}: sets fields beyond the {ours} bytes this version of tokenrace knows; upgrade the library"
                ),
            ));
        }
    }
    let mut value = default;
    std::ptr::copy_nonoverlapping(ptr as *const u8, &mut value as *mut T as *mut u8, size.min(ours));
    Ok(value)
}

/// Writes `value` into a caller's versioned struct: at most `out->struct_size` bytes (which must
/// be at least `min_size`), so a caller built against an older header is never overrun; the
/// written size is stored back in `struct_size`.
///
/// # Safety
/// `out` is NULL or points to `out->struct_size` writable bytes.
pub(crate) unsafe fn write_versioned<T: Copy>(out: *mut T, value: T, name: &str, min_size: usize) -> Result<(), Error> {
    if out.is_null() {
        return Err(Error::invalid_argument(format!("{name}: is NULL")));
    }
    let size = (out as *const u32).read_unaligned() as usize;
    if size < min_size {
        return Err(Error::invalid_argument(format!(
            "{name}.struct_size: {size} is smaller than the oldest known layout ({min_size} bytes); set it to sizeof(*{name})"
        )));
    }
    let n = size.min(std::mem::size_of::<T>());
    std::ptr::copy_nonoverlapping(&value as *const T as *const u8, out as *mut u8, n);
    (out as *mut u32).write_unaligned(n as u32);
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The committed header must be what the build generates from the code.
    #[test]
    fn committed_header_is_current() {
        let generated = std::fs::read_to_string(concat!(env!("OUT_DIR"), "/tokenrace.h")).unwrap();
        let root = env!("CARGO_MANIFEST_DIR");
        let committed = std::process::Command::new("git")
            .args(["-C", root, "show", "HEAD:include/tokenrace.h"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|| std::fs::read_to_string(format!("{root}/include/tokenrace.h")).unwrap());
        assert!(
            generated == committed,
            "include/tokenrace.h in the last commit differs from what build.rs generates: commit the regenerated header"
        );
    }
}
