//! An allocation that fails inside a draw or a verify call is OUT_OF_MEMORY naming the row and
//! what failed, never an abort of the host process, and the call writes nothing. Each case runs
//! in a fork() child under an address-space limit just above what it uses before the call: a
//! fixed one (the gather of a whole large row fails), or every limit of a sweep from nothing
//! spare to room for the whole call, so that each allocation the call makes is the one that
//! fails at some limit.
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
        let (mut tokens, mut kept) = ([-7i32], [-7i32]);
        // Asking for the kept set makes the draw compute the whole cut before its race: the
        // race alone may settle a flat top-p row without a gather (its winner surely kept).
        let mut out = Output { kept_count: Some(&mut kept), ..Output::new(&mut tokens) };
        let e = match sampler.draw(&batch, &mut out) {
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
        if tokens != [-7] || kept != [-7] {
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

/// Limits this (child) process's address space to its current size plus `extra` bytes, with
/// its allocator's own reserve used up first. A fork() child of a test thread allocates from
/// that thread's malloc arena, whose heap glibc reserves 64 MiB at a time: an allocation that
/// cannot be mapped under the limit falls back to that reserve, already counted in the size.
/// So the reserve is filled (32 KiB blocks, under a limit of the current size, until one fails)
/// and 256 KiB of it handed back, for the small allocations of the call (an error message);
/// every allocation of a whole per-block array (512 KiB and more here) then needs room under
/// the limit.
fn limit_address_space(extra: u64) -> bool {
    let set = |extra: u64| {
        let limit = virtual_size() + extra;
        let rl = libc::rlimit { rlim_cur: limit, rlim_max: libc::RLIM_INFINITY };
        // SAFETY: a valid rlimit for this (child) process.
        unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) == 0 }
    };
    // Every allocation of 128 KiB or more is a mapping of its own: glibc otherwise raises that
    // threshold after a large free, and serves large allocations from heap it already holds.
    // SAFETY: mallopt has no preconditions.
    if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10) } != 1 || !set(0) {
        return false;
    }
    let mut filler = Vec::with_capacity(1 << 16);
    while filler.len() < filler.capacity() {
        // SAFETY: malloc has no preconditions; the blocks are left to the child's exit.
        let p = unsafe { libc::malloc(32 << 10) };
        if p.is_null() {
            break;
        }
        filler.push(p);
    }
    for p in filler.iter().rev().take(8) {
        // SAFETY: each is a block from malloc above, freed once.
        unsafe { libc::free(*p) };
    }
    filler.len() < filler.capacity() && set(extra)
}

/// A child's exit status for a call's result: 0 when it succeeded and `ok` says its outputs are
/// right, 1 when it failed with OUT_OF_MEMORY naming what could not be allocated (and the row,
/// where one row needed it: "row 0: the race's block bounds: cannot allocate 524288 bytes;
/// nothing was written"), with `untouched` outputs; anything else is a failure of the test.
fn verdict(result: Result<()>, untouched: impl FnOnce() -> bool, ok: impl FnOnce() -> bool) -> i32 {
    match result {
        Ok(()) if ok() => 0,
        Ok(()) => {
            eprintln!("succeeded with wrong outputs");
            20
        }
        Err(e) if e.kind != ErrorKind::OutOfMemory => {
            eprintln!("not out of memory: {e:?}");
            21
        }
        Err(e) if !(e.message.contains(": cannot allocate ") && e.message.ends_with("; nothing was written")) => {
            eprintln!("message: {}", e.message);
            22
        }
        Err(_) if !untouched() => 23,
        Err(_) => 1,
    }
}

/// Runs `call` in a fork() child at every limit from the child's size to `most` bytes above it,
/// `step` apart (`call` sets the limit with the function it is given, right before the call,
/// and returns [`verdict`]). Every child must end in 0 or 1 (an abort is 134), some in 1 (the
/// limits reach the call's allocations), and the last in 0 (the sweep covers the whole call).
fn sweep(what: &str, most: u64, step: u64, mut call: impl FnMut(&dyn Fn() -> bool) -> i32) {
    let mut codes = Vec::new();
    for extra in (0..=most).step_by(step as usize) {
        let code = in_child(Duration::from_secs(120), || call(&|| limit_address_space(extra)));
        codes.push((extra >> 10, code));
    }
    let bad: Vec<_> = codes.iter().filter(|(_, c)| !matches!(c, Some(0 | 1))).collect();
    assert!(bad.is_empty(), "{what}: (KiB above the size, exit status; 134 = SIGABRT, the process aborted): {bad:?}");
    assert!(codes.iter().any(|(_, c)| *c == Some(1)), "{what}: no limit made the call run out of memory: {codes:?}");
    assert_eq!(codes.last().unwrap().1, Some(0), "{what}: the largest limit must leave room for the call: {codes:?}");
}

/// 2^26 logits a row: every per-block array (one entry per 256 tokens) is 1 MiB of f32, above
/// the allocator's mmap threshold, so that each allocation changes the address space.
const BIG: usize = 1 << 26;

/// A peaked row of `n` logits: -20 everywhere but 0 at `top` and -1 at `top + 300`.
fn peaked_row(n: usize, top: usize) -> Vec<f32> {
    let mut x = vec![-20f32; n];
    (x[top], x[top + 300]) = (0.0, -1.0);
    x
}

fn big_sampler(threads: usize, vocab: usize) -> Sampler {
    Sampler::new(Config { threads, vocab_size: vocab, max_rows: 2, seed: Some(1), ..Config::default() }).unwrap()
}

/// The plain draw of a sampling row: its block maxima, then the inline race's per-block scratch.
#[test]
fn a_plain_draw_of_a_huge_row_runs_out_of_memory_without_an_abort() {
    let logits = peaked_row(BIG, 70_000);
    let sampler = big_sampler(1, BIG);
    sweep("plain draw", 10 << 20, 512 << 10, |limit| {
        let batch = Batch::new(Logits::F32(&logits), 1, BIG);
        let mut tokens = [-7i32];
        if !limit() {
            return 10;
        }
        let result = sampler.draw(&batch, &mut Output::new(&mut tokens));
        verdict(result, || tokens == [-7], || (0..BIG as i32).contains(&tokens[0]))
    });
}

/// The sampling step with a grammar bitmask: the row's mask, its block bounds, the race of the
/// kept tokens block by block.
#[test]
fn a_masked_draw_of_a_huge_row_runs_out_of_memory_without_an_abort() {
    let logits = peaked_row(BIG, 70_000);
    let mut words = vec![-1i32; BIG / 32];
    words[0] = !1; // token 0 is masked
    let sampler = big_sampler(1, BIG);
    sweep("masked draw", 20 << 20, 512 << 10, |limit| {
        let batch = Batch {
            token_bitmask: Some(TokenBitmask { words: &words, row_stride: BIG / 32 }),
            ..Batch::new(Logits::F32(&logits), 1, BIG)
        };
        let mut tokens = [-7i32];
        if !limit() {
            return 10;
        }
        let result = sampler.draw(&batch, &mut Output::new(&mut tokens));
        verdict(result, || tokens == [-7], || (1..BIG as i32).contains(&tokens[0]))
    });
}

/// A draw with logprobs, the top 5 and the full raw logprobs: the normaliser's per-block
/// masses, the top-n's block maxima, the full output's block maxima.
#[test]
fn logprobs_of_a_huge_row_run_out_of_memory_without_an_abort() {
    let n = BIG / 2;
    let mut logits = peaked_row(n, 70_000);
    for j in 1..5 {
        // The top 5 in blocks of their own, so that the top-n gathers from 5 blocks.
        logits[70_000 + 512 * j] = -(j as f32);
    }
    let mut full = vec![-7f32; n];
    let sampler = big_sampler(1, n);
    sweep("logprobs", 12 << 20, 512 << 10, |limit| {
        let batch = Batch::new(Logits::F32(&logits), 1, n);
        let (mut tokens, mut lp, mut ids, mut lps) = ([-7i32], [-7f32], [-7i32; 5], [-7f32; 5]);
        let mut out = Output {
            logprobs: Some(&mut lp),
            top_n: 5,
            topn_ids: Some(&mut ids),
            topn_logprobs: Some(&mut lps),
            full_logprobs: Some(&mut full),
            full_row_stride: n,
            ..Output::new(&mut tokens)
        };
        if !limit() {
            return 10;
        }
        let result = sampler.draw(&batch, &mut out);
        let untouched =
            || tokens == [-7] && lp == [-7.0] && ids == [-7; 5] && lps == [-7.0; 5] && full[..4] == [-7.0; 4];
        verdict(result, untouched, || ids[0] == 70_000 && lp[0] <= 0.0 && full[70_000] == lps[0])
    });
}

/// Verify: one request whose draft (the row's maximum) is rejected by its uniform, so that the
/// row's mass is bounded and the race runs without the draft; with top-p, the threshold too;
/// with draft probabilities (all on the draft), the race over the residual `max(p - q, 0)`.
fn verify_under_limits(what: &str, top_p: Option<f32>, with_q: bool, most: u64) {
    let n = BIG / 2;
    let mut logits = peaked_row(2 * n, 70_000);
    logits[n + 70_000] = 0.0; // the bonus row's maximum
    let mut q = vec![0f32; if with_q { n } else { 0 }];
    if with_q {
        q[70_000] = 1.0;
    }
    let sampler = big_sampler(1, n);
    sweep(what, most, 512 << 10, |limit| {
        let (counts, drafts, top_p) = ([1], [70_000], top_p.map(|p| [p]));
        let batch = VerifyBatch {
            uniforms: Some(&[0.999_999]),
            top_p: top_p.as_ref().map(|p| &p[..]),
            draft_probs: with_q.then_some(DraftProbs { values: &q, row_stride: n }),
            ..VerifyBatch::new(Logits::F32(&logits), n, &counts, &drafts)
        };
        let (mut tokens, mut emitted) = ([-7i32; 2], [-7i32]);
        if !limit() {
            return 10;
        }
        let result = sampler.verify(&batch, &mut VerifyOutput::new(&mut tokens, &mut emitted));
        let ok = || match top_p {
            // top-p keeps the maximum and the token at -1 (0.70 and 0.26 of the mass): the
            // draft is rejected, and the other kept token drawn.
            Some(_) => emitted == [1] && tokens == [70_300, -1],
            None => emitted == [1] && tokens[0] != 70_000 && (0..n as i32).contains(&tokens[0]) && tokens[1] == -1,
        };
        verdict(result, || tokens == [-7; 2] && emitted == [-7], ok)
    });
}

#[test]
fn verify_of_huge_rows_runs_out_of_memory_without_an_abort() {
    verify_under_limits("verify", None, false, 12 << 20);
}

#[test]
fn verify_with_top_p_of_huge_rows_runs_out_of_memory_without_an_abort() {
    verify_under_limits("verify with top-p", Some(0.9), false, 16 << 20);
}

#[test]
fn verify_with_draft_probabilities_of_huge_rows_runs_out_of_memory_without_an_abort() {
    verify_under_limits("verify with draft probabilities", None, true, 12 << 20);
}
