//! A Rust program's logger stays the program's: making a sampler or a pool from Rust installs no
//! logger, the C entry points install the library's only when the process has none, and the
//! library's messages reach the program's logger. Its own test binary: a process has one logger.

use std::sync::Mutex;
use tokenrace::internals::api::{tokenrace_sampler_free, tokenrace_sampler_new};
use tokenrace::internals::types::tokenrace_status;
use tokenrace::{Config, NoisePool, PoolConfig, Sampler};

/// The program's logger: it keeps every message, as "target: message".
struct Recorder {
    messages: Mutex<Vec<String>>,
}

impl log::Log for Recorder {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        self.messages.lock().unwrap().push(format!("{}: {}", record.target(), record.args()));
    }
    fn flush(&self) {}
}

static RECORDER: Recorder = Recorder { messages: Mutex::new(Vec::new()) };

fn logger_is_the_recorder() -> bool {
    std::ptr::addr_eq(log::logger() as *const dyn log::Log, &RECORDER as *const Recorder)
}

#[test]
fn samplers_and_pools_keep_the_programs_logger() {
    log::set_logger(&RECORDER).expect("no logger is installed before the program's");
    log::set_max_level(log::LevelFilter::Trace);

    let sampler = Sampler::new(Config { threads: 1, ..Config::default() }).unwrap();
    let pool = NoisePool::new(PoolConfig { vocab: 16, threads: 1, ..PoolConfig::default() }).unwrap();
    drop((sampler, pool));
    assert!(logger_is_the_recorder(), "Sampler::new or NoisePool::new replaced the program's logger");

    // The C entry point would install the library's logger, but the process has one already.
    let mut c_sampler = std::ptr::null_mut();
    // SAFETY: NULL config (the environment's), `c_sampler` is writable; freed once below.
    unsafe {
        assert_eq!(tokenrace_sampler_new(std::ptr::null(), &mut c_sampler), tokenrace_status::Ok);
        tokenrace_sampler_free(c_sampler);
    }
    assert!(logger_is_the_recorder(), "tokenrace_sampler_new replaced the program's logger");
    assert_eq!(log::max_level(), log::LevelFilter::Trace, "the program's level filter changed");

    let messages = RECORDER.messages.lock().unwrap();
    assert!(messages.iter().any(|m| m.starts_with("tokenrace::sampler: ")), "{messages:?}");
}
