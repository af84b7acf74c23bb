//! Generates the C header from the `extern "C"` items in `src/ffi/` into `OUT_DIR` (never into
//! the source tree: packaging tools and `cargo publish` refuse a build that writes there).
//!
//! The header is committed as `include/tokenrace.h`; `ffi::tests::committed_header_is_current`
//! fails when it differs from what this script generates, and `scripts/gen-header.sh` rewrites
//! it, so a change to the C ABI always ships with its header.
use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=src/ffi");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml is readable");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/ffi/types.rs"))
        .with_src(crate_dir.join("src/ffi/api.rs"))
        .with_src(crate_dir.join("src/ffi/draw.rs"))
        .with_src(crate_dir.join("src/ffi/pool_api.rs"))
        .generate()
        .expect("cbindgen generates the header");
    bindings.write_to_file(out_dir.join("tokenrace.h"));
}
