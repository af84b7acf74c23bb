//! fork(): a child of a process whose sampler threads are drawing must draw correctly and free
//! the sampler without hanging. The child has only the forking thread: the
//! workers and the pool's producers are gone, and their locks may be held for ever.
mod common;

use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokenrace::*;

const VOCAB: usize = 32 * 1024;
const ROWS: usize = 8;
const FORKS: usize = 40;

/// The child's work; its exit status says what failed (0 = all fine).
fn child(sampler: *mut Sampler, logits: &[f32], expected: &[i32]) -> i32 {
    // SAFETY: the child is a copy of the parent; no thread of the child uses the sampler.
    let sampler = unsafe { &*sampler };
    let seeds: Vec<u64> = (0..ROWS as u64).collect();
    let seeded = Batch { seeds: Some(&seeds), ..Batch::new(Logits::F32(logits), ROWS, VOCAB) };
    let mut tokens = vec![-1; ROWS];
    if sampler.draw(&seeded, &mut Output::new(&mut tokens)).is_err() {
        return 2;
    }
    if tokens != expected {
        return 3;
    }
    let unseeded = Batch::new(Logits::F32(logits), ROWS, VOCAB);
    if sampler.draw(&unseeded, &mut Output::new(&mut tokens)).is_err() {
        return 4;
    }
    if tokens.iter().any(|&t| t < 0 || t as usize >= VOCAB) {
        return 5;
    }
    0
}

fn fork_while_drawing(threads: usize, with_pool: bool) {
    // Every call on all the sampler's threads, so that a child is forked while workers draw.
    tokenrace::internals::force_participants(usize::MAX);
    let mut rng = TestRng::new(threads as u64);
    let logits: Vec<f32> = (0..ROWS * VOCAB).map(|_| (rng.normal() * 2.0) as f32).collect();
    let cfg = Config { threads, max_rows: ROWS, vocab_size: VOCAB, seed: Some(9), ..Config::default() };
    let sampler = Box::into_raw(Box::new(Sampler::new(cfg).unwrap()));
    // SAFETY: freed below, after every thread that uses it was joined.
    let s = unsafe { &*sampler };
    if with_pool {
        let pool = NoisePool::new(PoolConfig { rows: 4 * ROWS, vocab: VOCAB, ..PoolConfig::default() }).unwrap();
        s.attach_pool(Arc::new(pool)).unwrap();
    }
    let seeds: Vec<u64> = (0..ROWS as u64).collect();
    let mut expected = vec![-1; ROWS];
    let seeded = Batch { seeds: Some(&seeds), ..Batch::new(Logits::F32(&logits), ROWS, VOCAB) };
    s.draw(&seeded, &mut Output::new(&mut expected)).unwrap();

    let stop = AtomicBool::new(false);
    let mut outcomes = Vec::new();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                let mut tokens = vec![-1; ROWS];
                while !stop.load(Ordering::Relaxed) {
                    s.draw(&Batch::new(Logits::F32(&logits), ROWS, VOCAB), &mut Output::new(&mut tokens)).unwrap();
                }
            });
        }
        for _ in 0..FORKS {
            std::thread::sleep(Duration::from_micros(300));
            outcomes.push(in_child(Duration::from_secs(20), || {
                let code = child(sampler, &logits, &expected);
                // SAFETY: the child's copy of the sampler; nothing else uses it here.
                drop(unsafe { Box::from_raw(sampler) });
                code
            }));
        }
        stop.store(true, Ordering::Relaxed);
    });
    // SAFETY: every thread that used it has been joined.
    drop(unsafe { Box::from_raw(sampler) });
    let hung = outcomes.iter().filter(|o| o.is_none()).count();
    let failed: Vec<_> = outcomes.iter().flatten().filter(|&&c| c != 0).collect();
    assert_eq!(hung, 0, "threads {threads}, pool {with_pool}: {hung} of {FORKS} children hung");
    assert!(failed.is_empty(), "threads {threads}, pool {with_pool}: children failed with {failed:?}");
}

#[test]
fn a_child_of_a_one_thread_sampler_draws_and_frees() {
    fork_while_drawing(1, false);
}

#[test]
fn a_child_of_a_four_thread_sampler_draws_and_frees() {
    fork_while_drawing(4, false);
}

#[test]
fn a_child_of_a_sampler_with_a_pool_draws_on_inline_noise() {
    fork_while_drawing(4, true);
}
