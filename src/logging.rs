//! The crate's logging: `env_logger` at `TOKENRACE_LOG_LEVEL` (or a sampler config's
//! `log_level`), installed once per process by the first sampler or pool, unless the host
//! already installed a logger (then its logger and filters apply).
//!
//! What is logged: the SIMD level draws run on, once per process (info); each pool as it starts
//! (info); each sampler (debug); and a warning for every `TOKENRACE_*` variable that is not a
//! setting, once the logger exists (the first version checked them before, so nobody saw it).

use std::sync::Once;

use crate::config::{self, LogLevel, SimdChoice};
use crate::kernels::SimdLevel;

/// Installs the logger at `level` (the first call in the process decides), then warns about
/// unknown `TOKENRACE_*` variables.
pub(crate) fn init(level: LogLevel) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = match level {
            LogLevel::Off => log::LevelFilter::Off,
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
        };
        let _ = env_logger::Builder::new().filter_module("tokenrace", filter).try_init();
        config::warn_unknown_vars();
    });
}

/// [`init`] at the environment's level, for objects whose config has no `log_level` (pools). A
/// bad `TOKENRACE_*` value leaves the default level here; the call that parses it reports it.
pub(crate) fn init_from_env() {
    let level = config::from_env().map(|(cfg, _)| cfg.log_level).unwrap_or(LogLevel::Warn);
    init(level);
}

/// Logs the SIMD level, once per process: later samplers may differ only when a config forces
/// a level, and they log it at debug.
pub(crate) fn announce_simd(level: SimdLevel, requested: SimdChoice) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        log::info!(
            "tokenrace {}: SIMD level {} (requested {}, best on this CPU {})",
            env!("CARGO_PKG_VERSION"),
            level.name(),
            format!("{requested:?}").to_lowercase(),
            crate::kernels::best_level().name()
        );
    });
}
