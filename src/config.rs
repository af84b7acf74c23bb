//! Every setting of tokenrace, in one table.
//!
//! Each row of [`SETTINGS`] names the `TOKENRACE_*` environment variable, its default, the values
//! it accepts, what it does, and how it is applied. Defaults are built by applying the table's own
//! default strings, so the table, `Config::default()`, the C `tokenrace_config_default()` and
//! `docs/configuration.md` (checked by a test) cannot drift apart.
//!
//! Environment variables are read once per process, on first use, and validated: a bad value is
//! an error that names the variable and the values it accepts, never silently ignored.

use crate::error::{Error, Result};
use std::sync::OnceLock;

/// Which instruction set the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdChoice {
    /// The best level this CPU supports.
    Auto,
    /// One lane at a time: the generic kernels with a lane count of 1 (the float64 reference
    /// of the tests, `tests/common/reference.rs`, is separate from every level).
    Scalar,
    /// Fixed-width arrays that the compiler vectorises for the target's baseline (SSE2 on x86-64,
    /// NEON on aarch64; scalar code on the default s390x target, which has no vector facility).
    Portable,
    /// x86-64 AVX2 and F16C (FMA is not used, by design: every level rounds alike).
    Avx2,
    /// x86-64 AVX-512F.
    Avx512,
    /// aarch64 NEON (the portable arrays with a NEON first pass).
    Neon,
    /// s390x vector-enhancements 2 (z15 and later; builds with Rust 1.93 or later).
    Vxe2,
}

/// Where a sampler takes the noise of its unseeded sampling rows from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoiseSource {
    /// The pool attached with `Sampler::attach_pool` when there is one, else inline noise.
    Auto,
    /// Counter-based noise generated inside the draw.
    Inline,
    /// A noise pool filled by background threads.
    Pool,
}

/// What a noise value holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoiseKind {
    /// E ~ Exp(1), as vLLM's `q` and aiter's `exponentials`.
    Exp,
    /// ln E, as the Spyre ring buffer holds (used as `logits - log_noise`).
    LogExp,
}

/// What a pool does when the rows asked for are not ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainPolicy {
    /// Generate fresh noise on the calling thread (counted in the stats).
    Inline,
    /// Wait up to the timeout, then fail with `TOKENRACE_STATUS_TIMEOUT`.
    Block,
}

/// How much tokenrace logs (to the host's log function, Python's `logging`, or stderr).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// No messages.
    Off,
    /// Errors only.
    Error,
    /// Warnings (an unknown `TOKENRACE_*` variable, ...) and errors; the default.
    Warn,
    /// The SIMD level draws run on and each pool as it starts, and the above.
    Info,
    /// Each sampler as it is made, and the above.
    Debug,
    /// Every message.
    Trace,
}

/// The settings of a sampler.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Vocabulary size every batch must have; 0 accepts any.
    pub vocab_size: usize,
    /// Most rows in one call.
    pub max_rows: usize,
    /// Worker threads for large calls; 1 runs everything on the calling thread.
    pub threads: usize,
    /// Seed of the stream that keys unseeded rows; `None` seeds it from OS entropy.
    pub seed: Option<u64>,
    /// The instruction set of the kernels; `Auto` picks the best this CPU has.
    pub simd: SimdChoice,
    /// Rows whose temperature is below this are greedy.
    pub greedy_below: f32,
    /// How much the library logs once its logger is installed (the C entry points install it;
    /// a Rust host keeps its own `log` logger, which receives the messages instead).
    pub log_level: LogLevel,
    /// Where unseeded sampling rows take their noise from.
    pub noise: NoiseSource,
    /// Capacity, in rows, of the sampler's own pool when `noise` is `Pool`; 0 means 4 x max_rows.
    pub pool_rows: usize,
    /// Whether temperature applies before the filters (vLLM) or after them (llama.cpp).
    pub filter_order: FilterOrder,
}

/// The order of temperature and the filters (`docs/semantics.md`, Filter order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FilterOrder {
    /// vLLM's: the filters judge the tempered distribution.
    #[default]
    TemperatureFirst,
    /// llama.cpp's chain: the filters judge the untempered distribution, then temperature
    /// applies to the tokens they keep.
    FiltersFirst,
}

/// The settings of a noise pool.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    /// Capacity in rows.
    pub rows: usize,
    /// Values per row.
    pub vocab: usize,
    /// What each noise value holds: E or ln E.
    pub kind: NoiseKind,
    /// Background producer threads.
    pub threads: usize,
    /// Seed of the pool's noise; `None` seeds it from OS entropy.
    pub seed: Option<u64>,
    /// What a borrow does when the rows it asks for are not ready.
    pub policy: DrainPolicy,
    /// How long a BLOCK borrow waits before failing, in milliseconds.
    pub timeout_ms: u64,
}

/// The most rows a noise pool holds: the upper end of `pool_rows` and of a pool's `rows`, and
/// the cap of a sampler's own pool sized from `max_rows`.
pub(crate) const MAX_POOL_ROWS: usize = 1 << 20;

/// The ranges of the integer settings: the table parses `TOKENRACE_*` values with them and
/// `validate()` checks the structs with them (a test checks that each row's `accepted` text
/// states its range).
mod range {
    pub const VOCAB: (u64, u64) = (0, i32::MAX as u64);
    pub const MAX_ROWS: (u64, u64) = (1, 1 << 20);
    pub const THREADS: (u64, u64) = (0, 1024);
    pub const POOL_ROWS: (u64, u64) = (0, super::MAX_POOL_ROWS as u64);
    pub const POOL_CAPACITY: (u64, u64) = (1, super::MAX_POOL_ROWS as u64);
    pub const POOL_THREADS: (u64, u64) = (1, 64);
    pub const TIMEOUT_MS: (u64, u64) = (0, 3_600_000);
}

/// The object a setting applies to, with the function that parses a value into it (the error
/// is the reason the value was refused, without the variable's name).
pub enum Apply {
    /// A field of [`Config`].
    Sampler(fn(&mut Config, &str) -> std::result::Result<(), String>),
    /// A field of [`PoolConfig`].
    Pool(fn(&mut PoolConfig, &str) -> std::result::Result<(), String>),
}

/// One row of the settings table.
// `field` and `doc` are read by the tests (against docs/configuration.md) and the fuzz target,
// which see the table through `internals`; a library build alone never reads them.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub struct Setting {
    /// The environment variable.
    pub var: &'static str,
    /// The field of `tokenrace_config` / `tokenrace_pool_config` it sets.
    pub field: &'static str,
    /// The default, in the same syntax as the variable.
    pub default: &'static str,
    /// The values it accepts, for error messages and the docs.
    pub accepted: &'static str,
    /// What the setting does, as `docs/configuration.md` says it.
    pub doc: &'static str,
    /// How a value is parsed and stored.
    pub apply: Apply,
}

/// Every setting. `docs/configuration.md` lists exactly these (a test checks it).
// Each `apply` is `Ok(field = parse(value)?)`: one line per setting reads better than a block.
#[allow(clippy::unit_arg)]
pub static SETTINGS: &[Setting] = &[
    Setting {
        var: "TOKENRACE_VOCAB_SIZE",
        field: "vocab_size",
        default: "0",
        accepted: "an integer in [0, 2147483647]; 0 accepts any vocabulary size",
        doc: "Vocabulary size that every batch must have.",
        apply: Apply::Sampler(|c, v| Ok(c.vocab_size = parse_int(v, range::VOCAB)? as usize)),
    },
    Setting {
        var: "TOKENRACE_MAX_ROWS",
        field: "max_rows",
        default: "256",
        accepted: "an integer in [1, 1048576]",
        doc: "Most rows in one draw call; a larger batch fails with INVALID_ARGUMENT.",
        apply: Apply::Sampler(|c, v| Ok(c.max_rows = parse_int(v, range::MAX_ROWS)? as usize)),
    },
    Setting {
        var: "TOKENRACE_THREADS",
        field: "threads",
        default: "1",
        accepted: "an integer in [0, 1024]; 0 uses every core the process may run on",
        doc: "Worker threads of the sampler. 1 draws on the calling thread only.",
        apply: Apply::Sampler(|c, v| Ok(c.threads = parse_int(v, range::THREADS)? as usize)),
    },
    Setting {
        var: "TOKENRACE_SEED",
        field: "seed (with has_seed)",
        default: "",
        accepted: "empty (OS entropy) or an integer in [0, 18446744073709551615]",
        doc: "Seed of the stream that keys unseeded sampling rows.",
        apply: Apply::Sampler(|c, v| Ok(c.seed = parse_seed(v)?)),
    },
    Setting {
        var: "TOKENRACE_SIMD",
        field: "simd",
        default: "auto",
        accepted: "auto, scalar, portable, avx2, avx512, neon, vxe2",
        doc: "Instruction set of the kernels; a level the CPU lacks fails with UNSUPPORTED.",
        apply: Apply::Sampler(|c, v| {
            Ok(c.simd = parse_choice(
                v,
                &[
                    ("auto", SimdChoice::Auto),
                    ("scalar", SimdChoice::Scalar),
                    ("portable", SimdChoice::Portable),
                    ("avx2", SimdChoice::Avx2),
                    ("avx512", SimdChoice::Avx512),
                    ("neon", SimdChoice::Neon),
                    ("vxe2", SimdChoice::Vxe2),
                ],
            )?)
        }),
    },
    Setting {
        var: "TOKENRACE_GREEDY_BELOW",
        field: "greedy_below",
        default: "1e-5",
        accepted: "a finite number >= 0",
        doc: "Rows with a temperature below this are greedy (exact argmax, no noise).",
        apply: Apply::Sampler(|c, v| Ok(c.greedy_below = parse_nonneg_f32(v)?)),
    },
    Setting {
        var: "TOKENRACE_FILTER_ORDER",
        field: "filter_order",
        default: "temperature_first",
        accepted: "temperature_first, filters_first",
        doc: "Whether min-p/top-k/top-p judge the tempered distribution (vLLM) or the untempered one, \
              temperature then applying to the kept tokens (llama.cpp).",
        apply: Apply::Sampler(|c, v| {
            Ok(c.filter_order = parse_choice(
                v,
                &[("temperature_first", FilterOrder::TemperatureFirst), ("filters_first", FilterOrder::FiltersFirst)],
            )?)
        }),
    },
    Setting {
        var: "TOKENRACE_LOG_LEVEL",
        field: "log_level",
        default: "warn",
        accepted: "off, error, warn, info, debug, trace",
        doc: "How much tokenrace logs (to the host's log function, Python's `logging`, or stderr).",
        apply: Apply::Sampler(|c, v| {
            Ok(c.log_level = parse_choice(
                v,
                &[
                    ("off", LogLevel::Off),
                    ("error", LogLevel::Error),
                    ("warn", LogLevel::Warn),
                    ("info", LogLevel::Info),
                    ("debug", LogLevel::Debug),
                    ("trace", LogLevel::Trace),
                ],
            )?)
        }),
    },
    Setting {
        var: "TOKENRACE_NOISE",
        field: "noise",
        default: "auto",
        accepted: "auto, inline, pool",
        doc: "Where unseeded sampling rows take their noise: generated in the draw, or from a noise pool.",
        apply: Apply::Sampler(|c, v| {
            Ok(c.noise = parse_choice(
                v,
                &[("auto", NoiseSource::Auto), ("inline", NoiseSource::Inline), ("pool", NoiseSource::Pool)],
            )?)
        }),
    },
    Setting {
        var: "TOKENRACE_NOISE_POOL_ROWS",
        field: "pool_rows",
        default: "0",
        accepted: "an integer in [0, 1048576]; 0 means 4 x max_rows",
        doc: "Capacity in rows of the sampler's own noise pool (noise = pool).",
        apply: Apply::Sampler(|c, v| Ok(c.pool_rows = parse_int(v, range::POOL_ROWS)? as usize)),
    },
    Setting {
        var: "TOKENRACE_POOL_ROWS",
        field: "rows",
        default: "1024",
        accepted: "an integer in [1, 1048576]",
        doc: "Capacity of a standalone noise pool, in rows.",
        apply: Apply::Pool(|c, v| Ok(c.rows = parse_int(v, range::POOL_CAPACITY)? as usize)),
    },
    Setting {
        var: "TOKENRACE_POOL_VOCAB",
        field: "vocab",
        default: "0",
        accepted: "an integer in [0, 2147483647]; 0 must be replaced by the caller",
        doc: "Values per row of a standalone noise pool.",
        apply: Apply::Pool(|c, v| Ok(c.vocab = parse_int(v, range::VOCAB)? as usize)),
    },
    Setting {
        var: "TOKENRACE_POOL_KIND",
        field: "kind",
        default: "log_exp",
        accepted: "exp, log_exp",
        doc: "What the pool holds: Exp(1) values E, or ln E.",
        apply: Apply::Pool(|c, v| {
            Ok(c.kind = parse_choice(v, &[("exp", NoiseKind::Exp), ("log_exp", NoiseKind::LogExp)])?)
        }),
    },
    Setting {
        var: "TOKENRACE_POOL_THREADS",
        field: "threads",
        default: "1",
        accepted: "an integer in [1, 64]",
        doc: "Background threads that refill the pool.",
        apply: Apply::Pool(|c, v| Ok(c.threads = parse_int(v, range::POOL_THREADS)? as usize)),
    },
    Setting {
        var: "TOKENRACE_POOL_SEED",
        field: "seed (with has_seed)",
        default: "",
        accepted: "empty (OS entropy) or an integer in [0, 18446744073709551615]",
        doc: "Seed of the pool's noise; a seeded pool hands out the same values for the same borrow sizes.",
        apply: Apply::Pool(|c, v| Ok(c.seed = parse_seed(v)?)),
    },
    Setting {
        var: "TOKENRACE_POOL_POLICY",
        field: "policy",
        default: "inline",
        accepted: "inline, block",
        doc: "When rows are not ready: generate them on the calling thread, or wait up to the timeout.",
        apply: Apply::Pool(|c, v| {
            Ok(c.policy = parse_choice(v, &[("inline", DrainPolicy::Inline), ("block", DrainPolicy::Block)])?)
        }),
    },
    Setting {
        var: "TOKENRACE_POOL_TIMEOUT_MS",
        field: "timeout_ms",
        default: "1000",
        accepted: "an integer in [0, 3600000]",
        doc: "How long a borrow under the block policy waits before it fails with TIMEOUT.",
        apply: Apply::Pool(|c, v| Ok(c.timeout_ms = parse_int(v, range::TIMEOUT_MS)?)),
    },
];

fn parse_int(v: &str, (lo, hi): (u64, u64)) -> std::result::Result<u64, String> {
    match v.trim().parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("{v:?} is not an integer in [{lo}, {hi}]")),
    }
}

fn parse_seed(v: &str) -> std::result::Result<Option<u64>, String> {
    if v.trim().is_empty() {
        return Ok(None);
    }
    parse_int(v, (0, u64::MAX)).map(Some)
}

fn parse_nonneg_f32(v: &str) -> std::result::Result<f32, String> {
    match v.trim().parse::<f32>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("{v:?} is not a finite number >= 0")),
    }
}

fn parse_choice<T: Copy>(v: &str, choices: &[(&str, T)]) -> std::result::Result<T, String> {
    let key = v.trim().to_ascii_lowercase();
    choices.iter().find(|(name, _)| *name == key).map(|(_, t)| *t).ok_or_else(|| format!("{v:?} is not one of them"))
}

fn apply_one(setting: &Setting, value: &str, cfg: &mut Config, pool: &mut PoolConfig) -> Result<()> {
    let outcome = match &setting.apply {
        Apply::Sampler(f) => f(cfg, value),
        Apply::Pool(f) => f(pool, value),
    };
    outcome
        .map_err(|why| Error::invalid_config(format!("{}: {why}; accepted values: {}", setting.var, setting.accepted)))
}

/// The defaults, built from the table's default strings.
fn table_defaults() -> (Config, PoolConfig) {
    let mut cfg = Config {
        vocab_size: 0,
        max_rows: 0,
        threads: 0,
        seed: None,
        simd: SimdChoice::Auto,
        greedy_below: 0.0,
        log_level: LogLevel::Off,
        noise: NoiseSource::Auto,
        pool_rows: 0,
        filter_order: FilterOrder::TemperatureFirst,
    };
    let mut pool = PoolConfig {
        rows: 0,
        vocab: 0,
        kind: NoiseKind::LogExp,
        threads: 0,
        seed: None,
        policy: DrainPolicy::Inline,
        timeout_ms: 0,
    };
    for s in SETTINGS {
        apply_one(s, s.default, &mut cfg, &mut pool).expect("every default in the table parses");
    }
    (cfg, pool)
}

impl Default for Config {
    fn default() -> Self {
        table_defaults().0
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        table_defaults().1
    }
}

/// Applies `TOKENRACE_*` values, looked up with `lookup`, over the table defaults.
pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<(Config, PoolConfig)> {
    let (mut cfg, mut pool) = table_defaults();
    for s in SETTINGS {
        if let Some(value) = lookup(s.var) {
            apply_one(s, &value, &mut cfg, &mut pool)?;
        }
    }
    Ok((cfg, pool))
}

/// The process environment, parsed once (on first use) and cached. A value that is not UTF-8 is
/// an error naming the variable, like any other bad value.
pub fn from_env() -> Result<(Config, PoolConfig)> {
    static PARSED: OnceLock<Result<(Config, PoolConfig)>> = OnceLock::new();
    PARSED
        .get_or_init(|| {
            for s in SETTINGS {
                if std::env::var_os(s.var).is_some_and(|v| v.to_str().is_none()) {
                    return Err(Error::invalid_config(format!(
                        "{}: its value is not valid UTF-8; accepted values: {}",
                        s.var, s.accepted
                    )));
                }
            }
            from_vars(|name| std::env::var(name).ok())
        })
        .clone()
}

/// Variables that start with `TOKENRACE_` but belong to the bindings or the test tools, not to
/// the library: the Python binding's library path, the test suite's library directory, the
/// header test's rewrite switch, the C tests' memcheck switch, CI's s390x switch.
const BINDING_VARS: &[&str] =
    &["TOKENRACE_LIBRARY", "TOKENRACE_LIB_DIR", "TOKENRACE_BLESS", "TOKENRACE_VALGRIND", "TOKENRACE_CI_S390X"];

/// Logs a warning for each `TOKENRACE_*` variable that is not a setting (a misspelt name would
/// otherwise be ignored in silence). Called once the logger is installed, so the warning shows.
pub(crate) fn warn_unknown_vars() {
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if name.starts_with("TOKENRACE_") && !BINDING_VARS.contains(&name) && !SETTINGS.iter().any(|s| s.var == name) {
            log::warn!("{name} is not a tokenrace setting (see docs/configuration.md); it is ignored");
        }
    }
}

/// `value` of struct field `field` within `(lo, hi)`, or INVALID_CONFIG naming the field.
fn check_range(field: &str, value: u64, (lo, hi): (u64, u64)) -> Result<()> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid_config(format!("{field}: {value} is not in [{lo}, {hi}]")))
    }
}

impl Config {
    /// Checks the values that the type does not already restrict, with the ranges of the table.
    pub fn validate(&self) -> Result<()> {
        check_range("vocab_size", self.vocab_size as u64, range::VOCAB)?;
        check_range("max_rows", self.max_rows as u64, range::MAX_ROWS)?;
        check_range("threads", self.threads as u64, range::THREADS)?;
        if !(self.greedy_below.is_finite() && self.greedy_below >= 0.0) {
            return Err(Error::invalid_config(format!(
                "greedy_below: {} is not a finite number >= 0",
                self.greedy_below
            )));
        }
        check_range("pool_rows", self.pool_rows as u64, range::POOL_ROWS)
    }

    /// Worker threads after resolving 0 to the cores this process may use.
    pub fn effective_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

impl PoolConfig {
    /// Checks the values, with the ranges of the table (`vocab` 0 is refused: it must be set).
    pub fn validate(&self) -> Result<()> {
        check_range("rows", self.rows as u64, range::POOL_CAPACITY)?;
        check_range("vocab", self.vocab as u64, (1, range::VOCAB.1))?;
        check_range("threads", self.threads as u64, range::POOL_THREADS)?;
        check_range("timeout_ms", self.timeout_ms, range::TIMEOUT_MS)?;
        if self.rows.checked_mul(self.vocab).and_then(|n| n.checked_mul(4)).is_none() {
            return Err(Error::invalid_config("rows x vocab: the pool's size overflows"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each integer setting's `accepted` text states the range the code enforces.
    #[test]
    fn accepted_texts_state_the_ranges() {
        let ranges = [
            ("TOKENRACE_VOCAB_SIZE", range::VOCAB),
            ("TOKENRACE_MAX_ROWS", range::MAX_ROWS),
            ("TOKENRACE_THREADS", range::THREADS),
            ("TOKENRACE_NOISE_POOL_ROWS", range::POOL_ROWS),
            ("TOKENRACE_POOL_ROWS", range::POOL_CAPACITY),
            ("TOKENRACE_POOL_VOCAB", range::VOCAB),
            ("TOKENRACE_POOL_THREADS", range::POOL_THREADS),
            ("TOKENRACE_POOL_TIMEOUT_MS", range::TIMEOUT_MS),
        ];
        for (var, (lo, hi)) in ranges {
            let s = SETTINGS.iter().find(|s| s.var == var).unwrap();
            assert!(s.accepted.contains(&format!("[{lo}, {hi}]")), "{var}: {}", s.accepted);
        }
    }

    #[test]
    fn defaults_come_from_the_table() {
        let c = Config::default();
        assert_eq!(c.max_rows, 256);
        assert_eq!(c.threads, 1);
        assert_eq!(c.seed, None);
        assert_eq!(c.greedy_below, 1e-5);
        assert_eq!(c.simd, SimdChoice::Auto);
        assert_eq!(PoolConfig::default().kind, NoiseKind::LogExp);
        c.validate().unwrap();
    }

    #[test]
    fn bad_values_name_the_variable_and_the_accepted_values() {
        let err = from_vars(|n| (n == "TOKENRACE_SIMD").then(|| "avx9000".to_string())).unwrap_err();
        assert_eq!(err.kind, crate::error::ErrorKind::InvalidConfig);
        assert!(err.message.contains("TOKENRACE_SIMD"), "{}", err.message);
        assert!(err.message.contains("avx512"), "{}", err.message);
        let err = from_vars(|n| (n == "TOKENRACE_MAX_ROWS").then(|| "0".to_string())).unwrap_err();
        assert!(err.message.contains("TOKENRACE_MAX_ROWS") && err.message.contains("[1, 1048576]"));
        let err = from_vars(|n| (n == "TOKENRACE_GREEDY_BELOW").then(|| "nan".to_string())).unwrap_err();
        assert!(err.message.contains("TOKENRACE_GREEDY_BELOW"));
    }

    #[test]
    fn good_values_apply() {
        let (c, p) = from_vars(|n| match n {
            "TOKENRACE_SEED" => Some("42".into()),
            "TOKENRACE_SIMD" => Some("Scalar".into()),
            "TOKENRACE_POOL_POLICY" => Some("block".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.seed, Some(42));
        assert_eq!(c.simd, SimdChoice::Scalar);
        assert_eq!(p.policy, DrainPolicy::Block);
    }

    #[test]
    fn the_configuration_document_lists_exactly_the_table() {
        let doc = include_str!("../docs/configuration.md");
        let documented: Vec<(String, String)> = doc
            .lines()
            .filter(|l| l.starts_with("| `TOKENRACE_"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells[1].trim_matches('`').to_string(), cells[2].trim_matches('`').to_string())
            })
            .collect();
        let table: Vec<(String, String)> =
            SETTINGS.iter().map(|s| (s.var.to_string(), s.default.to_string())).collect();
        assert_eq!(
            documented, table,
            "docs/configuration.md must list every variable of SETTINGS with its default, in order"
        );
    }
}
