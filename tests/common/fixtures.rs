//! The files other suites read the float64 reference's answers from (`tests/fixtures/`): JSON
//! writers that carry every bit, and the check that a committed file is what the reference says
//! today.

use std::fmt::Display;
use std::path::Path;

/// `[a, b, c]`.
pub fn list<T: Display>(v: &[T]) -> String {
    format!("[{}]", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

/// f32 values written as the f64 of the same value: a reader parsing float64 gets them exactly
/// (an f32's shortest decimal could round twice on its way through float64).
pub fn floats(v: &[f32]) -> String {
    format!("[{}]", v.iter().map(|&x| format!("{:?}", x as f64)).collect::<Vec<_>>().join(", "))
}

/// f32 values as one string of big-endian bit patterns in hex, so that NaN payloads, infinities
/// and signed zeros arrive as they were (Python: `np.frombuffer(bytes.fromhex(s), ">f4")`).
pub fn hex(v: &[f32]) -> String {
    format!("\"{}\"", v.iter().map(|x| format!("{:08x}", x.to_bits())).collect::<String>())
}

/// `null` or the value.
pub fn or_null<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or("null".to_string(), f)
}

/// Fails unless the committed file at `path` (relative to the crate) holds `text`; with
/// `TOKENRACE_BLESS` set it writes the file instead. `how` says which test rewrites it.
pub fn check_committed(path: &str, text: &str, how: &str) {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    if std::fs::read_to_string(&full).ok().as_deref() == Some(text) {
        return;
    }
    assert!(std::env::var_os("TOKENRACE_BLESS").is_some(), "{path} is not current: TOKENRACE_BLESS=1 {how}");
    std::fs::create_dir_all(full.parent().unwrap()).unwrap();
    std::fs::write(&full, text).unwrap();
}
