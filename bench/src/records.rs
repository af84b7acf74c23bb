//! The `--json` records: one JSON object per line, a line per printed case. Times are in
//! microseconds, rounded to 3 decimals (`us_per_row` to 4); every record names the commit, the
//! CPU model, the SIMD level and the command that made it, so that results copied between hosts
//! stay attributable.

use serde::Serialize;
use std::io::Write;

/// The `--json` file, or nothing when the option is not given.
pub struct JsonLines(Option<std::fs::File>);

impl JsonLines {
    pub fn create(path: Option<&std::path::Path>) -> JsonLines {
        JsonLines(path.map(|p| std::fs::File::create(p).expect("--json file")))
    }

    /// Appends `record` as one line (one write, so that an interrupted run leaves whole lines).
    pub fn write(&mut self, record: &impl Serialize) {
        if let Some(file) = self.0.as_mut() {
            let mut line = serde_json::to_vec(record).expect("a record serialises");
            line.push(b'\n');
            file.write_all(&line).expect("--json write");
        }
    }
}

/// `value` rounded to `places` decimals: the records carry no more digits than the timings
/// resolve. (serde_json writes a non-finite value, such as a missing floor's ratio, as null.)
pub fn round(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

/// The fields that end every record of the main, threads and verify tables.
#[derive(Serialize)]
pub struct Provenance {
    pub commit: String,
    pub cpu: String,
    pub command: String,
}

impl Provenance {
    /// Made once per run: `git` runs for the commit.
    pub fn get() -> &'static Provenance {
        static P: std::sync::OnceLock<Provenance> = std::sync::OnceLock::new();
        P.get_or_init(|| Provenance { commit: commit(), cpu: cpu_model(), command: command() })
    }
}

/// A case of the main table: its median, p10 and p90 us per call, and the read floor of the same
/// logits (`ratio_to_floor` = median / floor).
#[derive(Serialize)]
pub struct MainRecord<'a> {
    pub path: &'a str,
    pub dtype: &'a str,
    pub profile: &'a str,
    pub rows: usize,
    pub vocab: usize,
    pub threads: usize,
    pub placement: &'a str,
    pub simd: &'a str,
    pub us_per_call_median: f64,
    pub us_per_call_p10: f64,
    pub us_per_call_p90: f64,
    pub us_per_row: f64,
    pub floor_us_per_call: f64,
    pub ratio_to_floor: f64,
    #[serde(flatten)]
    pub provenance: &'static Provenance,
}

/// A cell of `--threads-table`.
#[derive(Serialize)]
pub struct ThreadsRecord<'a> {
    pub table: &'static str,
    pub path: &'a str,
    pub dtype: &'a str,
    pub profile: &'a str,
    pub rows: usize,
    pub vocab: usize,
    pub threads: usize,
    pub us_per_call_median: f64,
    pub us_per_call_p10: f64,
    pub us_per_call_p90: f64,
    #[serde(flatten)]
    pub provenance: &'static Provenance,
}

/// A line of `--verify`: the plain draw of the target rows, verification without q (`verify`),
/// with each row's argmax as drafts (`verify_top`) and with q (`verify_q`), and the mean
/// emitted tokens per request of each.
#[derive(Serialize)]
pub struct VerifyRecord<'a> {
    pub table: &'static str,
    pub dtype: &'a str,
    pub profile: &'a str,
    pub vocab: usize,
    pub threads: usize,
    pub requests: usize,
    pub drafts: usize,
    pub plain_us_median: f64,
    pub verify_us_median: f64,
    pub verify_q_us_median: f64,
    pub plain_us_p10: f64,
    pub plain_us_p90: f64,
    pub verify_us_p10: f64,
    pub verify_us_p90: f64,
    pub verify_q_us_p10: f64,
    pub verify_q_us_p90: f64,
    pub verify_top_us_median: f64,
    pub verify_top_us_p10: f64,
    pub verify_top_us_p90: f64,
    pub mean_emitted: f64,
    pub mean_emitted_top: f64,
    pub mean_emitted_q: f64,
    pub simd: &'a str,
    #[serde(flatten)]
    pub provenance: &'static Provenance,
}

/// A line of `--row-tail`: the distribution of the per-row times, and how many rows' top-p
/// thresholds took the general path's second cut or gathered every token. (Its provenance
/// fields sit around `simd`, as its first records had them.)
#[derive(Serialize)]
pub struct RowTailRecord<'a> {
    pub table: &'static str,
    pub path: &'a str,
    pub profile: &'a str,
    pub vocab: usize,
    pub rows: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub max_over_p50: f64,
    pub slowest_row: usize,
    pub rows_second_cut: u64,
    pub rows_every_token: u64,
    pub commit: &'a str,
    pub cpu: &'a str,
    pub simd: &'a str,
    pub command: &'a str,
}

/// The commit the records name: `BENCH_COMMIT` when set (a copy of the tree run on another host
/// may carry a stale `.git`: pass the commit the binary was built from), else the checkout's
/// `HEAD`.
fn commit() -> String {
    if let Ok(c) = std::env::var("BENCH_COMMIT") {
        return c;
    }
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(|| "unknown".into(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The command line that made a record.
fn command() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("tokenrace-bench {}", args.join(" "))
}

/// The CPU's model name (Linux).
fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let line = info.lines().find(|l| l.starts_with("model name")).unwrap_or("");
    line.split(':').nth(1).unwrap_or("unknown").trim().to_string()
}
