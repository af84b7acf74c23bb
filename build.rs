//! Three jobs:
//!
//! - Gives the shared object its soname, `libtokenrace.so.0.2` for version 0.2.z: cargo-c's
//!   scheme (0.y.z → `0.y`, x.y.z → `x` for x >= 1), so a library installed by
//!   `scripts/install.sh`, by `cargo cinstall` or inside the Python wheel is the same file, and a
//!   program linked with `-ltokenrace` records the ABI it was built against; and lays out a
//!   symlink of that name beside the library in the build directory, so that a program linked
//!   against `target/release` starts.
//! - With the `header` feature (the crate's own tests turn it on), generates the C header from
//!   the `extern "C"` items in `src/ffi/` into `OUT_DIR` (never into the source tree: packaging
//!   tools and `cargo publish` refuse a build that writes there). The header is committed as
//!   `include/tokenrace.h`; `ffi::tests::committed_header_is_current` fails when it differs from
//!   what this script generates, and `scripts/gen-header.sh` rewrites it, so a change to the C
//!   ABI always ships with its header. Users' builds need no cbindgen.
//! - Emits the cfg `tokenrace_s390x_vector` when the compiler is Rust 1.93 or later, the first
//!   to accept the s390x target features (`#[target_feature(enable = "vector")]`) and
//!   `is_s390x_feature_detected!` on stable: the `vxe2` level is built only then, and an older
//!   compiler still builds the crate, without it.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    set_soname();
    compiler_cfgs();
    #[cfg(feature = "header")]
    generate_header();
}

/// The soname of cargo-c's scheme, from the package version.
fn soname() -> String {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap();
    let patch = std::env::var("CARGO_PKG_VERSION_PATCH").unwrap();
    let suffix = match (major.as_str(), minor.as_str()) {
        ("0", "0") => format!("0.0.{patch}"),
        ("0", _) => format!("0.{minor}"),
        _ => major,
    };
    format!("libtokenrace.so.{suffix}")
}

fn set_soname() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    // ELF platforms; elsewhere the linker's default naming stays.
    if ["linux", "freebsd", "netbsd", "openbsd", "dragonfly", "illumos"].contains(&os.as_str()) {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{}", soname());
        link_soname_in_build_dir();
    }
    // For the tests that link C programs against the build directory's library. (Not named
    // TOKENRACE_*: cargo also sets it when it runs the tests, and the library warns about every
    // TOKENRACE_* variable that is not a setting.)
    println!("cargo:rustc-env=LIBTOKENRACE_SONAME={}", soname());
}

/// A program linked with `-ltokenrace` against the build directory asks the loader for the
/// soname: a symlink of that name beside the built `libtokenrace.so` (in the profile's
/// directory and in its `deps/`, where `cargo test` leaves it) lets such a program start, with
/// `-Wl,-rpath` to that directory, as a runtime's CI builds its C tests. It dangles until the
/// library is linked. `OUT_DIR` is `<profile dir>/build/<package>-<hash>/out` in cargo's layout;
/// where it is not (a separate build directory), no profile directory is found and nothing is
/// made.
#[cfg(unix)]
fn link_soname_in_build_dir() {
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(std::path::PathBuf::from) else { return };
    let Some(profile_dir) = out_dir.ancestors().nth(3).filter(|d| d.join("deps").is_dir()) else { return };
    for dir in [profile_dir.to_path_buf(), profile_dir.join("deps")] {
        let link = dir.join(soname());
        if std::fs::read_link(&link).is_err() {
            let _ = std::fs::remove_file(&link);
            let _ = std::os::unix::fs::symlink("libtokenrace.so", &link);
        }
    }
}

/// The minor version of the Rust compiler cargo runs (`$RUSTC --version`: "rustc 1.MINOR.z ..."),
/// or None when it cannot be read.
fn rustc_minor() -> Option<u32> {
    let rustc = std::env::var_os("RUSTC")?;
    let out = std::process::Command::new(rustc).arg("--version").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.split_whitespace().nth(1)?;
    let mut parts = version.split('.');
    if parts.next()? != "1" {
        return None;
    }
    parts.next()?.parse().ok()
}

fn compiler_cfgs() {
    println!("cargo:rustc-check-cfg=cfg(tokenrace_s390x_vector)");
    if rustc_minor().is_some_and(|minor| minor >= 93) {
        println!("cargo:rustc-cfg=tokenrace_s390x_vector");
    }
}

#[cfg(feature = "header")]
fn generate_header() {
    use std::path::PathBuf;
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=src/ffi");
    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml is readable");
    // The version a program was compiled against, for `#if` and for comparing with
    // tokenrace_version() at run time.
    let part = |p: &str| std::env::var(format!("CARGO_PKG_VERSION_{p}")).unwrap();
    config.after_includes = Some(format!(
        "\n// The version of the library this header comes with (tokenrace_version() is the loaded one's).\n\
         #define TOKENRACE_VERSION_MAJOR {}\n#define TOKENRACE_VERSION_MINOR {}\n#define TOKENRACE_VERSION_PATCH {}",
        part("MAJOR"),
        part("MINOR"),
        part("PATCH")
    ));
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/ffi/types.rs"))
        .with_src(crate_dir.join("src/ffi/api.rs"))
        .with_src(crate_dir.join("src/ffi/draw.rs"))
        .with_src(crate_dir.join("src/ffi/pool_api.rs"))
        .with_src(crate_dir.join("src/ffi/requests.rs"))
        .with_src(crate_dir.join("src/ffi/verify.rs"))
        .with_src(crate_dir.join("src/ffi/watermark.rs"))
        .with_src(crate_dir.join("src/ffi/shard.rs"))
        .with_src(crate_dir.join("src/ffi/score.rs"))
        .with_src(crate_dir.join("src/ffi/greedy.rs"))
        .generate()
        .expect("cbindgen generates the header");
    bindings.write_to_file(out_dir.join("tokenrace.h"));
}

#[cfg(not(unix))]
fn link_soname_in_build_dir() {}
