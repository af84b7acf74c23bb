//! The command line. Every list option takes comma-separated values; a value that does not
//! parse, an option the chosen table does not use, or two tables at once is refused (exit code
//! 2) rather than dropped. The defaults of the list options depend on the table, so they are
//! resolved after parsing (`Args::resolve`).

use clap::{ArgAction, CommandFactory, Parser};
use std::path::PathBuf;

/// The paths of the main table, in the order they are timed by default.
pub const MAIN_PATHS: [&str; 22] = [
    "greedy",
    "race-inline",
    "race-pool",
    "race-external-logexp",
    "race-external-exp",
    "race-logprob",
    "race-logprob-rank",
    "race-logprob-top20",
    "race-logprob-rank-top20",
    "top-k50",
    "top-k50-top-p0.9",
    "top-p0.9",
    "min-p0.05",
    "step",
    "step-penalties",
    "step-bias",
    "step-bitmask",
    "step-top-p0.9",
    "step-external-logexp",
    "step-logprob-rank-top20",
    "step-allowed",
    "step-allowed-top-p0.9",
];

/// The paths `--threads-table` times (inline noise, with the filters or logprob outputs a path
/// names): any other path would be timed as a plain race under its name.
fn timed_by_threads_table(path: &str) -> bool {
    matches!(path, "greedy" | "race-inline" | "top-k50" | "top-k50-top-p0.9" | "top-p0.9" | "min-p0.05")
        || path.starts_with("race-logprob")
}

/// The logits profiles of the main, threads and verify tables.
const ROW_PROFILES: [&str; 2] = ["peaked", "flat"];
/// The profiles of `--row-tail`.
const TAIL_PROFILES: [&str; 5] = ["flat3", "flat1", "peaked", "zipf", "ties"];

#[derive(Parser)]
#[command(
    name = "tokenrace-bench",
    about = "Microseconds per call and per row of each path of tokenrace's draw, each against the \
             read floor of the same logits measured in the same run.",
    long_about = None,
    after_help = "TOKENRACE_SIMD picks the SIMD level (as for any sampler made from the environment); \
                  BENCH_PARTICIPANTS=N makes every call use N threads; BENCH_COMMIT names the commit \
                  the records carry (default: git's HEAD).",
    // A repeated option replaces its earlier value (`--threads 1 --threads 2` is `--threads 2`).
    args_override_self = true
)]
struct Cli {
    /// Tiny sizes and two repetitions (what CI runs): checks that every case runs, nothing about
    /// time. Sets --rows 1,3 --vocab 1000,5003 --reps 2 whatever else is given
    #[arg(long)]
    quick: bool,

    /// Writes one JSON record per line into FILE
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,

    /// Sampler thread counts [default: 1; --threads-table: 1,2,4,8,16]
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set, value_parser = count, conflicts_with = "row_tail")]
    threads: Option<Vec<usize>>,

    /// Rows per call [default: 1,8,32,128,256; --threads-table: 1,4,32; --row-tail: 1000, the
    /// first value only]
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set, value_parser = positive, conflicts_with = "verify")]
    rows: Option<Vec<usize>>,

    /// Vocabulary sizes [default: 32000,128256,163840,262144; --threads-table, --row-tail:
    /// 32000,151936,262144; --verify: 151936]
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set, value_parser = positive)]
    vocab: Option<Vec<usize>>,

    /// Logits types [default: f32,bf16,f16; --threads-table, --verify: f32]
    #[arg(long = "dtype", value_name = "LIST", value_delimiter = ',', action = ArgAction::Set, value_parser = ["f32", "bf16", "f16"], conflicts_with = "row_tail")]
    dtypes: Option<Vec<String>>,

    /// Logits profiles: peaked, flat [default: peaked,flat; --threads-table: peaked]; with
    /// --row-tail: flat3, flat1, peaked, zipf, ties [default: all five]
    #[arg(long = "profile", value_name = "LIST", value_delimiter = ',', action = ArgAction::Set, value_parser = trimmed)]
    profiles: Option<Vec<String>>,

    /// Paths to time [default: every path of the main table; --threads-table: race-inline;
    /// --row-tail: top-p0.9, or race-inline, top-kK, top-kK-top-pP]
    #[arg(long = "path", value_name = "LIST", value_delimiter = ',', action = ArgAction::Set, value_parser = trimmed, conflicts_with = "verify")]
    paths: Option<Vec<String>>,

    /// Where the logits are: hot (in the caches) or cold (batches that exceed them) [default:
    /// hot,cold]
    #[arg(long = "placement", value_name = "LIST", value_delimiter = ',', action = ArgAction::Set, value_parser = ["hot", "cold"], conflicts_with_all = ["threads_table", "verify", "row_tail"])]
    placements: Option<Vec<String>>,

    /// Timed calls per case [default: 30; --threads-table: 400]
    #[arg(long, value_name = "N", value_parser = positive, conflicts_with = "row_tail")]
    reps: Option<usize>,

    /// Per path, vocab and rows, the median (p10-p90) us per call of hot calls for each thread
    /// count, one sampler at a time (a thread count must never make a call slower than 1 thread)
    #[arg(long, group = "table")]
    threads_table: bool,

    /// Times speculative-decoding verification: 32 requests of 4 drafts (--quick: 3 of 2)
    /// against a plain draw of the same target rows, without and with the draft model's q
    #[arg(long, group = "table")]
    verify: bool,

    /// Times rows one at a time (no slow rows): random rows per profile and vocabulary, each
    /// drawn alone, the fastest of 3 hot calls per row; prints p50, p99, the max, max / p50
    #[arg(long, group = "table")]
    row_tail: bool,
}

/// Which table a run prints.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Main,
    Threads,
    Verify,
    RowTail,
}

/// The options with every default resolved for the chosen table.
pub struct Args {
    pub table: Table,
    pub quick: bool,
    pub json: Option<PathBuf>,
    pub threads: Vec<usize>,
    pub rows: Vec<usize>,
    pub vocab: Vec<usize>,
    pub dtypes: Vec<String>,
    pub profiles: Vec<String>,
    pub paths: Vec<String>,
    pub placements: Vec<String>,
    pub reps: usize,
}

/// The command line, parsed and checked; exits with clap's message (code 2) when it is wrong.
pub fn parse() -> Args {
    let args = Cli::parse().resolve();
    if let Err(message) = args.check() {
        Cli::command().error(clap::error::ErrorKind::InvalidValue, message).exit();
    }
    args
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

/// A table's values for the list options not given (`--placement` is hot,cold for all).
struct Defaults {
    threads: &'static [usize],
    rows: &'static [usize],
    vocab: &'static [usize],
    dtypes: &'static [&'static str],
    profiles: &'static [&'static str],
    paths: &'static [&'static str],
    reps: usize,
}

impl Defaults {
    fn of(table: Table) -> Defaults {
        let main = Defaults {
            threads: &[1],
            rows: &[1, 8, 32, 128, 256],
            vocab: &[32000, 128256, 163840, 262144],
            dtypes: &["f32", "bf16", "f16"],
            profiles: &ROW_PROFILES,
            paths: &MAIN_PATHS,
            reps: 30,
        };
        match table {
            Table::Main => main,
            Table::Threads => Defaults {
                threads: &[1, 2, 4, 8, 16],
                rows: &[1, 4, 32],
                vocab: &[32000, 151936, 262144],
                dtypes: &["f32"],
                profiles: &["peaked"],
                paths: &["race-inline"],
                reps: 400,
            },
            // Its rows are the requests' (the command line refuses --rows) and it draws no path.
            Table::Verify => Defaults { vocab: &[151936], dtypes: &["f32"], paths: &[], ..main },
            Table::RowTail => Defaults {
                rows: &[1000],
                vocab: &[32000, 151936, 262144],
                dtypes: &["f32"],
                profiles: &TAIL_PROFILES,
                paths: &["top-p0.9"],
                ..main
            },
        }
    }
}

impl Cli {
    fn resolve(self) -> Args {
        let table = match (self.threads_table, self.verify, self.row_tail) {
            (true, _, _) => Table::Threads,
            (_, true, _) => Table::Verify,
            (_, _, true) => Table::RowTail,
            _ => Table::Main,
        };
        let d = Defaults::of(table);
        let mut args = Args {
            table,
            quick: self.quick,
            json: self.json,
            threads: self.threads.unwrap_or_else(|| d.threads.to_vec()),
            rows: self.rows.unwrap_or_else(|| d.rows.to_vec()),
            vocab: self.vocab.unwrap_or_else(|| d.vocab.to_vec()),
            dtypes: self.dtypes.unwrap_or_else(|| strings(d.dtypes)),
            profiles: self.profiles.unwrap_or_else(|| strings(d.profiles)),
            // The step's paths were named `pipeline*` before the sampling step had one name;
            // the old names still select them, so earlier commands keep working.
            paths: self
                .paths
                .map(|ps| ps.into_iter().map(|p| step_path(&p)).collect())
                .unwrap_or_else(|| strings(d.paths)),
            placements: self.placements.unwrap_or_else(|| strings(&["hot", "cold"])),
            reps: self.reps.unwrap_or(d.reps),
        };
        if args.quick {
            args.rows = vec![1, 3];
            args.vocab = vec![1000, 5003];
            args.reps = 2;
        }
        args
    }
}

/// A path by its current name (`pipeline*` is the step's former name).
fn step_path(p: &str) -> String {
    match p.strip_prefix("pipeline") {
        Some(rest) => format!("step{rest}"),
        None => p.to_string(),
    }
}

impl Args {
    /// The profiles and paths the chosen table knows (the other options' values are checked by
    /// their parsers).
    fn check(&self) -> Result<(), String> {
        let profiles: &[&str] = if self.table == Table::RowTail { &TAIL_PROFILES } else { &ROW_PROFILES };
        if let Some(p) = self.profiles.iter().find(|p| !profiles.contains(&p.as_str())) {
            return Err(format!("profile '{p}' is not one of this table's: {}", profiles.join(", ")));
        }
        let unknown_path = self.paths.iter().find(|p| match self.table {
            Table::Main => !MAIN_PATHS.contains(&p.as_str()),
            Table::Threads => !timed_by_threads_table(p),
            Table::RowTail => row_tail_filters(p).is_none(),
            Table::Verify => false,
        });
        if let Some(p) = unknown_path {
            let known = match self.table {
                Table::Threads => {
                    "greedy, race-inline, top-k50, top-k50-top-p0.9, top-p0.9, min-p0.05, race-logprob*".into()
                }
                Table::RowTail => "race-inline, top-kK, top-pP, top-kK-top-pP".into(),
                _ => MAIN_PATHS.join(", "),
            };
            return Err(format!("path '{p}' is not timed by this table (its paths: {known})"));
        }
        Ok(())
    }
}

/// The top-k and top-p of a `--row-tail` path: `top-kK`, `top-pP`, `top-kK-top-pP`, or
/// `race-inline` (neither: the plain race); `None` for any other name.
pub fn row_tail_filters(path: &str) -> Option<(Option<i32>, Option<f32>)> {
    if path == "race-inline" {
        return Some((None, None));
    }
    let (k, rest) = match path.strip_prefix("top-k") {
        Some(r) => {
            let (k, rest) = r.split_once('-').unwrap_or((r, ""));
            (Some(k.parse::<i32>().ok().filter(|&k| k > 0)?), rest)
        }
        None => (None, path),
    };
    let p = match rest.strip_prefix("top-p") {
        Some(p) => Some(p.parse::<f32>().ok().filter(|p| *p > 0.0 && *p <= 1.0)?),
        None if rest.is_empty() => None,
        None => return None,
    };
    Some((k, p))
}

/// A list value without the spaces around it (`--rows "1, 8"`).
fn trimmed(value: &str) -> Result<String, String> {
    Ok(value.trim().to_string())
}

/// A count of at least 0 (threads: as the sampler's configuration takes it).
fn count(value: &str) -> Result<usize, String> {
    value.trim().parse().map_err(|e| format!("'{value}' is not a count: {e}"))
}

/// A count of at least 1 (rows, vocabulary, repetitions).
fn positive(value: &str) -> Result<usize, String> {
    match count(value)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> Result<Args, String> {
        let cli = Cli::try_parse_from(std::iter::once("tokenrace-bench").chain(line.iter().copied()))
            .map_err(|e| e.to_string())?;
        let args = cli.resolve();
        args.check().map(|()| args)
    }

    #[test]
    fn the_parser_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_follow_the_table() {
        let main = args(&[]).unwrap();
        assert_eq!((main.threads, main.reps, main.paths.len()), (vec![1], 30, 22));
        let threads = args(&["--threads-table", "--vocab", "1000"]).unwrap();
        assert_eq!(
            (threads.threads, threads.rows, threads.vocab, threads.reps),
            (vec![1, 2, 4, 8, 16], vec![1, 4, 32], vec![1000], 400)
        );
        let tail = args(&["--row-tail"]).unwrap();
        assert_eq!((tail.rows, tail.paths), (vec![1000], vec!["top-p0.9".to_string()]));
        let verify = args(&["--verify", "--quick"]).unwrap();
        assert_eq!((verify.vocab, verify.dtypes, verify.reps), (vec![1000, 5003], vec!["f32".to_string()], 2));
    }

    #[test]
    fn bad_values_and_unused_options_are_refused() {
        for line in [
            &["--threads", "1,x"][..],
            &["--rows", "0"],
            &["--reps", "many"],
            &["--dtype", "f64"],
            &["--placement", "warm"],
            &["--path", "race"],
            &["--profile", "zipf"],
            &["--threads-table", "--path", "race-pool"],
            &["--row-tail", "--path", "top-p"],
            &["--row-tail", "--threads", "2"],
            &["--verify", "--rows", "32"],
            &["--verify", "--row-tail"],
            &["--frobnicate"],
            &["--json"],
        ] {
            assert!(args(line).is_err(), "{line:?} was accepted");
        }
    }

    #[test]
    fn lists_split_on_commas_and_the_last_option_wins() {
        let a = args(&["--rows", "1, 8", "--threads", "1", "--threads", "2,4"]).unwrap();
        assert_eq!((a.rows, a.threads), (vec![1, 8], vec![2, 4]));
    }

    #[test]
    fn the_step_paths_answer_to_their_former_name() {
        let a = args(&["--path", "pipeline,pipeline-allowed,race-inline"]).unwrap();
        assert_eq!(a.paths, ["step", "step-allowed", "race-inline"]);
        assert!(args(&["--path", "pipeline-frobnicate"]).is_err());
    }

    #[test]
    fn row_tail_paths_name_their_filters() {
        assert_eq!(row_tail_filters("top-p0.9"), Some((None, Some(0.9))));
        assert_eq!(row_tail_filters("top-k50"), Some((Some(50), None)));
        assert_eq!(row_tail_filters("top-k50-top-p0.9"), Some((Some(50), Some(0.9))));
        assert_eq!(row_tail_filters("race-inline"), Some((None, None)));
        assert_eq!(row_tail_filters("top-k50-min-p0.1"), None);
    }
}
