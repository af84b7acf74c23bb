//! One version everywhere: Cargo.toml's is the header's `TOKENRACE_VERSION_*`, pyproject's,
//! what the pkg-config and CMake files are made with, and the soname and `find_package` the README
//! names; and no "since X.Y" in the headers is later than it (a caller's `find_package(tokenrace
//! X.Y)` must find the release that has what the header promises).

use std::path::Path;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// (major, minor, patch) of the crate.
fn crate_version() -> (u32, u32, u32) {
    let v: Vec<u32> = env!("CARGO_PKG_VERSION").split('.').map(|p| p.parse().unwrap()).collect();
    (v[0], v[1], v[2])
}

#[test]
fn the_header_pyproject_and_packaging_carry_the_crates_version() {
    let (major, minor, patch) = crate_version();
    let header = read("include/tokenrace.h");
    for (name, want) in [("MAJOR", major), ("MINOR", minor), ("PATCH", patch)] {
        let line = format!("#define TOKENRACE_VERSION_{name} {want}\n");
        assert!(header.contains(&line), "include/tokenrace.h lacks {line:?}");
    }
    let pyproject = read("pyproject.toml");
    let line = format!("\nversion = \"{}\"\n", env!("CARGO_PKG_VERSION"));
    assert!(pyproject.contains(&line), "pyproject.toml lacks {line:?}");
    // The installed .pc and CMake files are made from these templates with the crate's version.
    assert!(read("packaging/tokenrace.pc.in").contains("Version: @VERSION@"));
    assert!(read("packaging/cmake/tokenraceConfigVersion.cmake.in").contains("set(PACKAGE_VERSION \"@VERSION@\")"));
    let readme = read("README.md");
    let soname = if major == 0 { format!("libtokenrace.so.0.{minor}") } else { format!("libtokenrace.so.{major}") };
    assert!(readme.contains(&soname), "README.md never names the soname {soname}");
    let find = format!("find_package(tokenrace {major}.{minor} REQUIRED)");
    assert!(readme.contains(&find), "README.md lacks {find:?}");
}

#[test]
fn nothing_in_the_headers_is_since_a_later_version() {
    let (major, minor, _) = crate_version();
    for path in ["include/tokenrace.h", "include/tokenrace.hpp"] {
        let text = read(path);
        let mut seen = 0;
        for (at, _) in text.match_indices("since ") {
            let rest = &text[at + 6..];
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
            let parts: Vec<u32> = digits.trim_end_matches('.').split('.').filter_map(|p| p.parse().ok()).collect();
            if parts.len() < 2 {
                continue; // prose ("since the call started")
            }
            seen += 1;
            assert!(
                (parts[0], parts[1]) <= (major, minor),
                "{path}: \"since {digits}\" is later than the crate's {major}.{minor}"
            );
        }
        if path.ends_with(".h") {
            assert!(seen > 0, "{path}: no \"since X.Y\" found: has the convention changed?");
        }
    }
}
