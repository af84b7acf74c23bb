//! An allocation that fails inside a draw is OUT_OF_MEMORY naming what failed, never an abort of
//! the host process (issue 8, item 5). Each case runs in a fork() child under an address-space
//! limit just above what it uses before the draw, so the gather of a whole large row fails.
mod common;

use common::*;
use std::time::Duration;
use tokenrace::*;

/// 2^25 values: a gather of the whole row needs 128 MiB of f32 plus 256 MiB of f64 weights.
const VOCAB: usize = 1 << 25;

/// The process's virtual size in bytes (from /proc/self/statm).
fn virtual_size() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Draws one flat row of VOCAB logits (every token kept) with top-k `k` or top-p `p` under a
/// limit of the current size plus 48 MiB; exit status 0 when it failed as it should.
fn draw_under_limit(threads: usize, k: Option<i32>, p: Option<f32>) -> Option<i32> {
    let logits = vec![0f32; VOCAB];
    let sampler =
        Sampler::new(Config { threads, vocab_size: VOCAB, max_rows: 1, seed: Some(1), ..Config::default() }).unwrap();
    in_child(Duration::from_secs(60), || {
        let limit = virtual_size() + (48 << 20);
        let rl = libc::rlimit { rlim_cur: limit, rlim_max: limit };
        // SAFETY: a valid rlimit for this (child) process.
        if unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) } != 0 {
            return 10;
        }
        let (top_k, top_p) = (k.map(|k| [k]), p.map(|p| [p]));
        let batch = Batch {
            top_k: top_k.as_ref().map(|k| &k[..]),
            top_p: top_p.as_ref().map(|p| &p[..]),
            ..Batch::new(Logits::F32(&logits), 1, VOCAB)
        };
        let mut tokens = [-7i32];
        let e = match sampler.draw(&batch, &mut Output::new(&mut tokens)) {
            Ok(()) => return 11,
            Err(e) => e,
        };
        if e.kind != ErrorKind::OutOfMemory {
            return 12;
        }
        if !(e.message.starts_with("row 0: ") && e.message.contains("cannot allocate")) {
            eprintln!("message: {}", e.message);
            return 13;
        }
        if tokens != [-7] {
            return 14; // a failed call writes nothing
        }
        0
    })
}

#[test]
fn a_top_p_gather_of_a_huge_row_is_out_of_memory_not_an_abort() {
    for threads in [1, 4] {
        let code = draw_under_limit(threads, None, Some(0.999));
        assert_eq!(code, Some(0), "threads {threads}: exit status (134 = SIGABRT: the process aborted)");
    }
}

#[test]
fn a_top_k_gather_of_a_huge_row_is_out_of_memory_not_an_abort() {
    let code = draw_under_limit(1, Some(VOCAB as i32 - 1), None);
    assert_eq!(code, Some(0), "exit status (134 = SIGABRT: the process aborted)");
}

/// A row whose edits cannot be allocated (the output's counts of a huge vocabulary) is
/// OUT_OF_MEMORY, and leaves nothing behind: the storage the thread keeps for its next row's
/// edits holds no bit of the failed row. The next row (greedy; its own lists touch other
/// tokens) must take the argmax of its own processed row, not one penalised by the failed
/// row's histories.
#[test]
fn a_failed_edit_allocation_leaves_no_bits_for_the_next_row() {
    let (a, b, c) = (1000usize, 2000usize, 3000usize);
    let mut logits = vec![0f32; VOCAB];
    (logits[a], logits[b]) = (5.0, 4.0);
    let sampler =
        Sampler::new(Config { threads: 1, vocab_size: VOCAB, max_rows: 1, seed: Some(1), ..Config::default() })
            .unwrap();
    let code = in_child(Duration::from_secs(60), || {
        let (ids_a, ids_c, offsets) = ([a as i32], [c as i32], [0u64, 1]);
        let greedy = Batch {
            temperature: Some(&[0.0]),
            repetition_penalty: Some(&[2.0]),
            ..Batch::new(Logits::F32(&logits), 1, VOCAB)
        };
        let failing = Batch {
            prompt_tokens: Some(TokenLists { ids: &ids_a, offsets: &offsets }),
            output_tokens: Some(TokenLists { ids: &ids_a, offsets: &offsets }),
            frequency_penalty: Some(&[0.5]),
            ..greedy
        };
        let next = Batch { prompt_tokens: Some(TokenLists { ids: &ids_c, offsets: &offsets }), ..greedy };
        // The counts of the output (4 bytes a token: 128 MiB) do not fit under the limit; the
        // bitsets (a bit a token) do.
        let limit = virtual_size() + (48 << 20);
        let mut rl = libc::rlimit { rlim_cur: limit, rlim_max: libc::RLIM_INFINITY };
        // SAFETY: a valid rlimit for this (child) process.
        if unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) } != 0 {
            return 10;
        }
        let mut tokens = [-7i32];
        match sampler.draw(&failing, &mut Output::new(&mut tokens)) {
            Err(e) if e.kind == ErrorKind::OutOfMemory && tokens == [-7] => {}
            Err(e) => {
                eprintln!("first draw: {e:?}, tokens {tokens:?}");
                return 11;
            }
            Ok(()) => return 12,
        }
        rl.rlim_cur = libc::RLIM_INFINITY;
        // SAFETY: as above (the soft limit back to the hard one).
        if unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) } != 0 {
            return 13;
        }
        if sampler.draw(&next, &mut Output::new(&mut tokens)).is_err() {
            return 14;
        }
        // Token a is not in this row's histories: it keeps its 5, above b's 4.
        if tokens != [a as i32] {
            eprintln!("second draw: token {} (a = {a}, b = {b})", tokens[0]);
            return 15;
        }
        0
    });
    assert_eq!(code, Some(0), "exit status (134 = SIGABRT: the process aborted)");
}
