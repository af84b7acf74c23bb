//! Noise values generated per second per producer thread, for EXP and LOG_EXP at vocab 163840.
//!
//! `cargo run --release --example pool_rate [seconds per case]`
//!
//! "producer": one background producer keeps a 64-row pool full while the main thread borrows
//! and releases one row at a time (BLOCK policy), so the rate is that of the producer thread,
//! bookkeeping included. "inline": a pool without producers (INLINE policy), so the borrowing
//! thread generates every row itself: the generator alone, on one core.
use std::time::{Duration, Instant};
use tokenrace::internals::{Pool, PoolOptions};
use tokenrace::{DrainPolicy, NoiseKind, PoolConfig};

const VOCAB: usize = 163_840;

fn run(kind: NoiseKind, producers: usize, secs: f64) -> f64 {
    let policy = if producers == 0 { DrainPolicy::Inline } else { DrainPolicy::Block };
    let cfg = PoolConfig { rows: 64, vocab: VOCAB, kind, threads: 1, seed: Some(1), policy, timeout_ms: 60_000 };
    let pool = Pool::with_options(cfg, PoolOptions { producers: Some(producers), ..PoolOptions::default() }).unwrap();
    // Warm up: let the producer fill the buffer once, touching its pages.
    for _ in 0..64 {
        drop(pool.borrow(1).unwrap());
    }
    let (s0, t0) = (pool.stats(), Instant::now());
    while t0.elapsed() < Duration::from_secs_f64(secs) {
        drop(pool.borrow(1).unwrap());
    }
    let (s1, dt) = (pool.stats(), t0.elapsed().as_secs_f64());
    let rows = if producers == 0 {
        s1.inline_rows - s0.inline_rows
    } else {
        (s1.rows_produced - s0.rows_produced) / producers as u64
    };
    rows as f64 * VOCAB as f64 / dt
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1.0);
    println!("simd {}; vocab {VOCAB}; values per second per thread", tokenrace::best_level().name());
    for kind in [NoiseKind::Exp, NoiseKind::LogExp] {
        for (name, producers) in [("producer", 1), ("inline", 0)] {
            let rate = run(kind, producers, secs);
            println!("{:<8} {name:<8} {rate:.3e}", format!("{kind:?}"));
        }
    }
}
