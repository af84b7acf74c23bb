//! What a thread keeps after a call is bounded (`docs/reliability.md`, Memory): a call with a
//! history of millions of ids or a vocabulary of millions of tokens gives back what exceeds
//! `KEPT_PER_THREAD` on the calling thread and on every worker, while rows of realistic
//! vocabularies keep their buffers from call to call, without growing.
mod common;

use std::sync::Mutex;
use tokenrace::internals::{force_participants, thread_kept_bytes, KEPT_PER_THREAD};
use tokenrace::*;

/// The tests measure this process's allocations: one at a time.
static ALONE: Mutex<()> = Mutex::new(());

/// Bytes this process has allocated and not freed (glibc's statistics: heap chunks in use and
/// mapped chunks).
fn allocated() -> usize {
    // SAFETY: mallinfo2 has no preconditions.
    let m = unsafe { libc::mallinfo2() };
    m.uordblks + m.hblkhd
}

/// `rows` rows of `vocab` logits, each with a frequency penalty and an output history of
/// `history` ids; drawn with `out` (tokens only when `None`).
fn draw_with_history(sampler: &Sampler, vocab: usize, rows: usize, history: usize, logprobs: bool) {
    let logits: Vec<f32> = (0..rows * vocab).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let ids: Vec<i32> = (0..rows * history).map(|i| ((i * 2_654_435_761) % vocab) as i32).collect();
    let offsets: Vec<u64> = (0..=rows).map(|r| (r * history) as u64).collect();
    let penalty = vec![0.5f32; rows];
    let batch = Batch {
        output_tokens: Some(TokenLists { ids: &ids, offsets: &offsets }),
        frequency_penalty: Some(&penalty),
        ..Batch::new(Logits::F32(&logits), rows, vocab)
    };
    let (mut tokens, mut lp, mut ranks) = (vec![-1i32; rows], vec![0f32; rows], vec![0i32; rows]);
    let mut out = Output::new(&mut tokens);
    if logprobs {
        (out.logprobs, out.ranks, out.logprob_mode) = (Some(&mut lp[..]), Some(&mut ranks[..]), LogprobMode::Processed);
    }
    sampler.draw(&batch, &mut out).unwrap();
    assert!(tokens.iter().all(|&t| (0..vocab as i32).contains(&t)));
}

/// A frequency penalty with a 10M-id output history kept about 200 MB on the calling thread
/// (the output's repeats and the touched tokens' scratch, sized by the history); a row of 2^22
/// tokens with logprobs and ranks kept its processed values (16 MiB).
#[test]
fn the_calling_thread_keeps_at_most_the_cap_after_a_huge_call() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let sampler =
        Sampler::new(Config { threads: 1, vocab_size: 0, max_rows: 4, seed: Some(1), ..Config::default() }).unwrap();
    draw_with_history(&sampler, 32_000, 1, 10_000_000, false);
    let kept = thread_kept_bytes();
    assert!(kept <= KEPT_PER_THREAD, "a 10M-id history: {kept} bytes kept, more than {KEPT_PER_THREAD}");
    draw_with_history(&sampler, 1 << 22, 1, 1000, true);
    let kept = thread_kept_bytes();
    assert!(kept <= KEPT_PER_THREAD, "a row of 2^22 tokens: {kept} bytes kept, more than {KEPT_PER_THREAD}");
}

/// Rows of a realistic vocabulary with every buffer in use (a history, processed logprobs and
/// ranks) keep their buffers, under the cap, and the same from call to call.
#[test]
fn realistic_rows_keep_their_buffers_without_growing() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let sampler =
        Sampler::new(Config { threads: 1, vocab_size: 262_144, max_rows: 4, seed: Some(1), ..Config::default() })
            .unwrap();
    draw_with_history(&sampler, 262_144, 2, 4096, true);
    let kept = thread_kept_bytes();
    assert!(kept > 1 << 20 && kept <= KEPT_PER_THREAD, "vocab 262144: {kept} bytes kept (cap {KEPT_PER_THREAD})");
    for _ in 0..3 {
        draw_with_history(&sampler, 262_144, 2, 4096, true);
        assert_eq!(thread_kept_bytes(), kept, "what a thread keeps grew from call to call");
    }
}

/// The workers give back what exceeds the cap too, before the call returns: 4 threads drawing
/// 8 rows of 2M-id histories (about 40 MB a thread before the cap), measured by the allocator.
#[test]
fn every_thread_of_a_call_keeps_at_most_the_cap() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let threads = 4;
    let sampler =
        Sampler::new(Config { threads, vocab_size: 32_000, max_rows: 8, seed: Some(1), ..Config::default() }).unwrap();
    force_participants(threads);
    // Each thread's buffers of a small call first, so that only the huge call's growth is seen.
    draw_with_history(&sampler, 32_000, 8, 100, false);
    let before = allocated();
    draw_with_history(&sampler, 32_000, 8, 2_000_000, false);
    force_participants(0);
    let grew = allocated().saturating_sub(before);
    let most = threads * KEPT_PER_THREAD + (1 << 20);
    assert!(grew <= most, "{grew} bytes still allocated after the call, more than {threads} threads' cap ({most})");
}
