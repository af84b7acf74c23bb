//! CI runs the benchmark in its quick mode: every case must run; nothing about time is checked.
//! (A test of the benchmark's crate: `cargo test --workspace`, or `-p tokenrace-bench`.)

/// Runs the benchmark with `args` and `--json` into a temporary file (named after `name`);
/// returns the records it wrote.
fn run_bench(name: &str, args: &[&str]) -> String {
    let json = std::env::temp_dir().join(format!("{name}-{}.json", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokenrace-bench"))
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let records = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    records
}
#[test]
fn benchmark_runs_every_case_in_quick_mode() {
    let records = run_bench("tokenrace-bench", &["--quick", "--threads", "1,2"]);
    // 2 vocab x 2 profiles x 2 rows x 2 placements x 3 dtypes x 2 thread counts x 22 paths
    assert_eq!(records.lines().count(), 2 * 2 * 2 * 2 * 3 * 2 * 22);
    assert!(records.lines().all(|l| l.contains("\"ratio_to_floor\":")));
    assert_provenance(&records);
}

/// Every record says where it came from: the commit, the CPU model and the command, and is one
/// JSON object per line.
fn assert_provenance(records: &str) {
    for l in records.lines() {
        assert!(l.starts_with('{') && l.ends_with('}'), "not one object per line: {l}");
        for key in ["\"commit\":\"", "\"cpu\":\"", "\"command\":\"tokenrace-bench ", "\"simd\":\""] {
            assert!(l.contains(key), "{key} missing in {l}");
        }
    }
}

/// The speculative-decoding table (`--verify`) runs too, with and without q, and its records
/// carry every timing.
#[test]
fn verify_table_runs_in_quick_mode() {
    let records =
        run_bench("tokenrace-bench-verify", &["--verify", "--quick", "--vocab", "1000,5003", "--threads", "1,2"]);
    // 2 vocab x 2 profiles x 1 dtype x 2 thread counts
    assert_eq!(records.lines().count(), 2 * 2 * 2);
    for key in [
        "\"plain_us_median\":",
        "\"verify_us_median\":",
        "\"verify_q_us_median\":",
        "\"mean_emitted_q\":",
        "\"verify_top_us_median\":",
    ] {
        assert!(records.lines().all(|l| l.contains(key)), "{key} missing");
    }
    assert_provenance(&records);
}

/// The per-row tail table (`--row-tail`) runs for every profile, and its records carry the
/// distribution of the per-row times.
#[test]
fn row_tail_table_runs_in_quick_mode() {
    let records = run_bench("tokenrace-bench-tail", &["--row-tail", "--rows", "20", "--vocab", "3000"]);
    // 1 vocab x 5 profiles x 1 path
    assert_eq!(records.lines().count(), 5);
    for key in ["\"p50_us\":", "\"p99_us\":", "\"max_us\":", "\"slowest_row\":", "\"rows_every_token\":"] {
        assert!(records.lines().all(|l| l.contains(key)), "{key} missing");
    }
    assert_provenance(&records);
}

/// A value that does not parse or an option the table does not use is refused with clap's
/// message and exit code 2, before anything is measured.
#[test]
fn bad_arguments_are_refused() {
    for args in [&["--threads", "1,x"][..], &["--path", "race"], &["--row-tail", "--dtype", "f16"], &["--quik"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokenrace-bench")).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stdout.is_empty(), "{args:?} measured something");
    }
}
