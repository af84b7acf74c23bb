//! The crate's logging, through the `log` crate.
//!
//! A Rust program that uses the crate installs its own logger (or none) as usual: the library
//! never installs one on its own. The C entry points that make samplers and pools install the
//! host logger ([`install`]) unless the process already has a logger: it hands each message to
//! the callback a host registered with `tokenrace_set_log_callback` (llama.cpp's `llama_log_set`
//! convention: a C++ server routes it into its own log, Python into `logging`), and writes it to
//! stderr in `env_logger`'s format when none is registered. The level is `TOKENRACE_LOG_LEVEL`
//! (or the first sampler config's `log_level`).
//!
//! What is logged: the SIMD level draws run on, once per process (info); each pool as it starts
//! (info); each sampler (debug); and a warning for every `TOKENRACE_*` variable that is not a
//! setting, once the first sampler or pool is made.

use std::ffi::{c_char, c_void, CString};
use std::sync::Once;

use parking_lot::RwLock;

use crate::config::{self, LogLevel, SimdChoice};
use crate::kernels::SimdLevel;

/// A host's log function: (level, target, message, user data). The level is a
/// `tokenrace_log_level` (1 error .. 5 trace); target and message are valid during the call.
pub(crate) type LogFn = unsafe extern "C" fn(u32, *const c_char, *const c_char, *mut c_void);

/// The registered callback and its user data (a pointer kept as an integer: the library never
/// dereferences it, only passes it back).
#[derive(Clone, Copy)]
struct Callback {
    f: LogFn,
    user_data: usize,
}

static CALLBACK: RwLock<Option<Callback>> = RwLock::new(None);

/// Registers the host's log function (`None`: stderr again). Messages logged from any thread
/// call it, one at a time per thread, possibly from several threads at once.
pub(crate) fn set_callback(f: Option<LogFn>, user_data: *mut c_void) {
    *CALLBACK.write() = f.map(|f| Callback { f, user_data: user_data as usize });
}

fn filter_of(level: LogLevel) -> log::LevelFilter {
    match level {
        LogLevel::Off => log::LevelFilter::Off,
        LogLevel::Error => log::LevelFilter::Error,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Debug => log::LevelFilter::Debug,
        LogLevel::Trace => log::LevelFilter::Trace,
    }
}

/// The logger the C entry points install: the host's callback, else stderr.
struct HostLogger {
    stderr: env_logger::Logger,
    max: log::LevelFilter,
}

impl log::Log for HostLogger {
    fn enabled(&self, meta: &log::Metadata) -> bool {
        meta.level() <= self.max && meta.target().starts_with("tokenrace")
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let Some(cb) = *CALLBACK.read() else {
            self.stderr.log(record);
            return;
        };
        let text = |s: String| CString::new(s.replace('\0', " ")).unwrap_or_default();
        let (target, message) = (text(record.target().to_string()), text(record.args().to_string()));
        // SAFETY: the host registered `f` to be called so (the header's contract: a function
        // that may run on any thread and does not unwind), with the user data it gave.
        unsafe { (cb.f)(record.level() as u32, target.as_ptr(), message.as_ptr(), cb.user_data as *mut c_void) };
    }

    fn flush(&self) {
        self.stderr.flush();
    }
}

/// Installs the host logger at `level` unless the process has a logger already (then its
/// logger and filters apply). The first call in the process decides.
pub(crate) fn install(level: LogLevel) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let max = filter_of(level);
        let stderr = env_logger::Builder::new().filter_module("tokenrace", max).build();
        if log::set_boxed_logger(Box::new(HostLogger { stderr, max })).is_ok() {
            log::set_max_level(max);
        }
    });
}

/// [`install`] at the environment's level, for the C entry points whose config has no
/// `log_level` (pools). A bad `TOKENRACE_*` value leaves the default level here; the call that
/// parses it reports it.
pub(crate) fn install_from_env() {
    install(config::from_env().map(|(cfg, _)| cfg.log_level).unwrap_or(LogLevel::Warn));
}

/// Warns about unknown `TOKENRACE_*` variables, once per process, through whatever logger the
/// process has by the time the first sampler or pool is made.
pub(crate) fn warn_unknown_vars_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(config::warn_unknown_vars);
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
