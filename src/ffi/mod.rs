//! The C boundary, and nothing else: `#[repr(C)]` types, `extern "C"` functions, the conversion
//! of raw pointers into the Rust types of the library, and the rules every entry point keeps:
//! a status code for every fallible call, a thread-local message that names what was wrong,
//! no panic across the boundary, and nothing written by a call that fails.
//!
//! - `types.rs`: status codes, enums, flags, versioned structs (the header's types);
//! - `convert.rs`: versioned structs, caller pointers into slices, C enums, the configurations
//!   (the entry-point files use it; it uses none of them);
//! - `disjoint.rs`: outputs that share memory with an input or another output, refused;
//! - `panic.rs`: [`guard`](panic::guard), the last error of the thread;
//! - `api.rs`: the library, configurations and samplers; `draw.rs`: `tokenrace_draw`;
//!   `greedy.rs`: `tokenrace_draw_greedy`, greedy rows without the general batch;
//!   `pool_api.rs`: noise pools; `requests.rs`: request states; `verify.rs`:
//!   `tokenrace_verify`; `shard.rs`: vocabulary-sharded sampling; `watermark.rs`: watermarks.
//!
//! `#![deny(unsafe_op_in_unsafe_fn)]`: each unsafe operation sits in its own block, with the
//! caller's contract it relies on stated next to it.

#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod api;
pub(crate) mod convert;
pub(crate) mod disjoint;
pub mod draw;
pub mod greedy;
pub(crate) mod panic;
pub mod pool_api;
pub mod requests;
pub mod score;
pub mod shard;
pub mod types;
pub mod verify;
pub mod watermark;

#[cfg(test)]
mod tests {
    /// The committed header must be what cbindgen generates from the code (build.rs writes it
    /// into OUT_DIR only, with the `header` feature, which the crate's tests turn on).
    /// `TOKENRACE_BLESS=1 cargo test --lib committed_header` rewrites
    /// `include/tokenrace.h`; `scripts/gen-header.sh` does that.
    #[test]
    #[cfg(feature = "header")]
    fn committed_header_is_current() {
        let generated = std::fs::read_to_string(concat!(env!("OUT_DIR"), "/tokenrace.h")).unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/tokenrace.h");
        if std::env::var_os("TOKENRACE_BLESS").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap();
        assert!(
            generated == committed,
            "include/tokenrace.h differs from what build.rs generates: run scripts/gen-header.sh and commit it"
        );
    }
}
