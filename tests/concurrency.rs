//! Concurrency through the C entry points: 8 threads draw on one sampler (1 and 4 worker
//! threads) while two threads borrow from and release to two noise pools (one INLINE, one
//! BLOCK), one thread attaches them to the sampler in turn (and tries a pool that is shut down and
//! one of another vocab), and one thread frees, or shuts down then frees, pools that have
//! borrowers blocked under the BLOCK policy.
//!
//! Asserted: seeded and greedy rows always give the tokens (and every row the flags) of a
//! single-threaded draw of the same rows; every call answers OK or the status documented for
//! that situation, and writes nothing when it fails; no sequence number of a pool is handed out
//! twice (the direct borrows' `first_seq` ranges are disjoint) or lost (after the run, the next
//! sequence number equals `rows_borrowed + rows_skipped`, and `rows_borrowed` equals the rows the
//! borrowers received plus the rows the sampler drew on pool noise); the sampler's counters add
//! up; every blocked borrower returns CLOSED when its pool is freed, none is left waiting.
//!
//! Bounded: each phase draws for about 1.5 s; joins have deadlines, and a watchdog aborts the
//! binary with a message if anything hangs for 60 s, so a deadlock fails the suite instead of
//! hanging it. `cargo test --test concurrency -- --nocapture` prints what was exercised.
mod common;

use common::{last_error, peaked_logits, TestRng};
use std::mem::size_of;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};
use tokenrace::internals::api::*;
use tokenrace::internals::types::*;
use tokenrace::Bf16;

/// More than two 32K-logit tiles: a 4-thread sampler splits a row of a call with fewer rows than
/// threads into tiles, and spreads larger calls by rows.
const VOCAB: usize = 66_000;
const DRAWERS: usize = 8;
const BORROWERS: usize = 2;
/// How long each phase draws, and the fewest calls each drawing thread makes whatever the load.
const PHASE: Duration = Duration::from_millis(1500);
const MIN_CALLS: usize = 10;
/// Capacities of the two pools: a batch with more unseeded sampling rows than the BLOCK pool's
/// fails while that pool is attached.
const INLINE_ROWS: u32 = 16;
const BLOCK_ROWS: u32 = 8;
/// Long enough never to run out on a loaded machine: a TIMEOUT would be a starved borrower.
const BLOCK_TIMEOUT_MS: u64 = 20_000;
const WATCHDOG: Duration = Duration::from_secs(60);

const TOKEN_SENTINEL: i32 = -0x05a5_a5a5;
const FLAG_SENTINEL: u32 = 0xdead_beef;

/// A sampler or pool handle shared by threads (both are documented safe to use from several
/// threads at once). Used through `get()`, so that closures capture the wrapper, not the pointer.
struct Handle<T>(*mut T);
impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Handle<T> {}
// SAFETY: the C API makes samplers and pools usable from any thread, concurrently.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Handle<T> {}
impl<T> Handle<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

/// Aborts the process if not dropped within `limit`: a hang ends the test binary with a message
/// instead of hanging the suite.
struct Watchdog {
    /// Dropped with the watchdog, which ends its thread.
    _alive: mpsc::Sender<()>,
}

impl Watchdog {
    fn start(what: &'static str, limit: Duration) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!("watchdog: {what} has not finished after {limit:?}: a call hangs; aborting");
                std::process::abort();
            }
        });
        Watchdog { _alive: tx }
    }
}

/// Joins `h` if it finishes by `deadline`; fails the test naming `what` otherwise (the thread
/// is then left waiting, which is the failure).
fn join_within<T>(h: thread::JoinHandle<T>, deadline: Instant, what: &str) -> T {
    while !h.is_finished() {
        assert!(Instant::now() < deadline, "{what} did not return in time: left waiting");
        thread::sleep(Duration::from_millis(2));
    }
    h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

// ---------------------------------------------------------------------------------------------
// Pools, through the C functions.
// ---------------------------------------------------------------------------------------------

fn new_pool(
    rows: u32,
    vocab: usize,
    kind: tokenrace_noise_kind,
    policy: tokenrace_pool_policy,
    threads: u32,
    timeout_ms: u64,
    seed: u64,
) -> Handle<tokenrace_pool> {
    let mut cfg = tokenrace_pool_config_default();
    cfg.rows = rows;
    cfg.vocab = vocab as u32;
    cfg.kind = kind as u32;
    cfg.policy = policy as u32;
    cfg.threads = threads;
    cfg.timeout_ms = timeout_ms;
    cfg.has_seed = 1;
    cfg.seed = seed;
    let mut p = std::ptr::null_mut();
    // SAFETY: a valid config and a writable out pointer.
    assert_eq!(unsafe { tokenrace_pool_new(&cfg, &mut p) }, tokenrace_status::Ok, "{}", last_error());
    Handle(p)
}

fn pool_stats(p: Handle<tokenrace_pool>) -> tokenrace_pool_stats {
    let mut st = tokenrace_pool_stats { struct_size: size_of::<tokenrace_pool_stats>() as u32, ..Default::default() };
    // SAFETY: a live pool and a stats struct of its size.
    assert_eq!(unsafe { tokenrace_pool_get_stats(p.get(), &mut st) }, tokenrace_status::Ok, "{}", last_error());
    st
}

/// A lease slot with every output field set to a sentinel, to see that a failed borrow leaves
/// it untouched.
fn lease_sentinel() -> tokenrace_pool_lease {
    tokenrace_pool_lease {
        struct_size: size_of::<tokenrace_pool_lease>() as u32,
        kind: 0xdead,
        values: std::ptr::dangling(),
        rows: u32::MAX,
        vocab: u32::MAX,
        id: u64::MAX,
        first_seq: u64::MAX,
        in_ring: 0xdead,
        reserved0: 0xdead,
    }
}

fn untouched(l: &tokenrace_pool_lease) -> bool {
    let s = lease_sentinel();
    (l.kind, l.values, l.rows, l.vocab, l.id, l.first_seq, l.in_ring, l.reserved0)
        == (s.kind, s.values, s.rows, s.vocab, s.id, s.first_seq, s.in_ring, s.reserved0)
}

fn borrow(p: Handle<tokenrace_pool>, n: u32, lease: &mut tokenrace_pool_lease) -> tokenrace_status {
    // SAFETY: a live pool (or one whose borrowers the test frees it under: see `free_under_blocked_borrowers`)
    // and a writable lease.
    unsafe { tokenrace_pool_borrow(p.get(), n, lease) }
}

fn release(p: Handle<tokenrace_pool>, lease: &tokenrace_pool_lease) -> tokenrace_status {
    // SAFETY: a pool handle and a lease slot it wrote (or one it must refuse).
    unsafe { tokenrace_pool_release(p.get(), lease) }
}

// ---------------------------------------------------------------------------------------------
// The batches every drawing thread picks from.
// ---------------------------------------------------------------------------------------------

/// One fixed batch, and what a single-threaded draw gave for it.
struct Fixed {
    label: &'static str,
    rows: usize,
    f32s: Vec<f32>,
    /// The same logits in bf16 when the batch is bf16.
    bf16s: Option<Vec<Bf16>>,
    temps: Vec<f32>,
    seeds: Vec<u64>,
    offsets: Vec<u64>,
    /// Nonzero: the row uses its seed.
    seeded: Vec<u8>,
    top_k: Option<Vec<i32>>,
    top_p: Option<Vec<f32>>,
    min_p: Option<Vec<f32>>,
    /// The single-threaded draw's tokens and flags.
    want_tokens: Vec<i32>,
    want_flags: Vec<u32>,
}

/// The default greedy threshold (the tests below make every sampler with it).
fn greedy_below() -> f32 {
    tokenrace_config_default().greedy_below
}

impl Fixed {
    fn greedy(&self, r: usize) -> bool {
        self.temps[r] < greedy_below()
    }
    /// Rows whose token does not depend on where unseeded noise comes from.
    fn decided(&self, r: usize) -> bool {
        self.greedy(r) || self.seeded[r] != 0
    }
    /// Unseeded sampling rows: each takes one row of the attached pool.
    fn pool_rows(&self) -> usize {
        (0..self.rows).filter(|&r| !self.decided(r)).count()
    }
    fn seeded_rows(&self) -> usize {
        (0..self.rows).filter(|&r| !self.greedy(r) && self.seeded[r] != 0).count()
    }
    fn greedy_rows(&self) -> usize {
        (0..self.rows).filter(|&r| self.greedy(r)).count()
    }

    /// Draws the batch on `s` into `tokens` and `flags`.
    fn draw(&self, s: Handle<tokenrace_sampler>, tokens: &mut [i32], flags: &mut [u32]) -> tokenrace_status {
        // SAFETY: all-zero is a valid value of these C structs (integers and NULL pointers).
        let (mut b, mut o): (tokenrace_batch, tokenrace_output) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        b.struct_size = size_of::<tokenrace_batch>() as u32;
        (b.dtype, b.logits) = match &self.bf16s {
            Some(v) => (tokenrace_dtype::Bf16 as u32, v.as_ptr() as *const _),
            None => (tokenrace_dtype::F32 as u32, self.f32s.as_ptr() as *const _),
        };
        b.rows = self.rows as u32;
        b.vocab = VOCAB as u32;
        b.temperature = self.temps.as_ptr();
        b.seeds = self.seeds.as_ptr();
        b.offsets = self.offsets.as_ptr();
        b.seeded = self.seeded.as_ptr();
        b.top_k = self.top_k.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
        b.top_p = self.top_p.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
        b.min_p = self.min_p.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
        o.struct_size = size_of::<tokenrace_output>() as u32;
        o.tokens = tokens.as_mut_ptr();
        o.flags = flags.as_mut_ptr();
        // SAFETY: a live sampler; every pointer covers `rows` rows of VOCAB logits or `rows`
        // elements.
        unsafe { tokenrace_draw(s.get(), &b, &mut o) }
    }
}

/// (label, temperatures, which rows are seeded, dtype bf16, top_k, top_p, min_p)
type Spec = (
    &'static str,
    &'static [f32],
    &'static [u8],
    bool,
    Option<&'static [i32]>,
    Option<&'static [f32]>,
    Option<&'static [f32]>,
);

/// Batches of 1 to 10 rows: seeded, greedy and unseeded rows, filters, bf16; one with more
/// unseeded sampling rows (10) than the BLOCK pool holds (8).
const SPECS: [Spec; 8] = [
    ("1 seeded row", &[0.8], &[1], false, None, None, None),
    ("seeded + greedy", &[1.0, 0.0], &[1, 0], false, None, None, None),
    ("4 seeded, filtered", &[0.7; 4], &[1; 4], false, Some(&[50, 0, 1000, 5]), Some(&[0.9, 0.95, 1.0, 0.5]), None),
    ("3 seeded, 2 on the pool, greedy", &[1.0, 0.7, 1.2, 0.0, 1.0, 0.9], &[1, 0, 1, 0, 1, 0], false, None, None, None),
    ("3 on the pool + greedy", &[1.0, 0.0, 0.8, 1.0], &[0; 4], false, None, None, None),
    ("10 on the pool", &[1.0; 10], &[0; 10], false, None, None, None),
    ("bf16, seeded + pool", &[1.0, 1.0], &[1, 0], true, None, None, None),
    ("5 seeded, min-p", &[1.3; 5], &[1; 5], false, None, None, Some(&[0.05, 0.0, 0.2, 0.05, 1.0])),
];

fn sampler_new(threads: u32, seed: u64) -> Handle<tokenrace_sampler> {
    let mut cfg = tokenrace_config_default();
    cfg.vocab_size = VOCAB as u32;
    cfg.max_rows = 16;
    cfg.threads = threads;
    cfg.seed = seed;
    cfg.has_seed = 1;
    let mut s = std::ptr::null_mut();
    // SAFETY: a valid config and a writable out pointer.
    assert_eq!(unsafe { tokenrace_sampler_new(&cfg, &mut s) }, tokenrace_status::Ok, "{}", last_error());
    Handle(s)
}

/// The batches, with the tokens and flags one draw on a 1-thread sampler without a pool gives.
fn fixed_batches() -> Vec<Fixed> {
    let mut rng = TestRng::new(0xc0c0);
    let single = sampler_new(1, 5);
    let batches = SPECS
        .iter()
        .map(|&(label, temps, seeded, bf16, top_k, top_p, min_p)| {
            let rows = temps.len();
            let mut f32s = Vec::with_capacity(rows * VOCAB);
            for _ in 0..rows {
                let mut x = peaked_logits(&mut rng, VOCAB, 2.0, 12.0);
                for _ in 0..VOCAB / 10 {
                    x[rng.below(VOCAB)] = f32::NEG_INFINITY; // masks
                }
                f32s.extend(x);
            }
            let bf16s = bf16.then(|| f32s.iter().map(|&v| Bf16::from_f32(v)).collect());
            let mut b = Fixed {
                label,
                rows,
                f32s,
                bf16s,
                temps: temps.to_vec(),
                seeds: (0..rows).map(|_| rng.u64()).collect(),
                offsets: (0..rows).map(|r| r as u64 * 17).collect(),
                seeded: seeded.to_vec(),
                top_k: top_k.map(|v| v.to_vec()),
                top_p: top_p.map(|v| v.to_vec()),
                min_p: min_p.map(|v| v.to_vec()),
                want_tokens: vec![TOKEN_SENTINEL; rows],
                want_flags: vec![FLAG_SENTINEL; rows],
            };
            let (mut tokens, mut flags) = (vec![TOKEN_SENTINEL; rows], vec![FLAG_SENTINEL; rows]);
            assert_eq!(b.draw(single, &mut tokens, &mut flags), tokenrace_status::Ok, "{label}: {}", last_error());
            (b.want_tokens, b.want_flags) = (tokens, flags);
            b
        })
        .collect();
    // SAFETY: made above, freed once.
    unsafe { tokenrace_sampler_free(single.get()) };
    batches
}

// ---------------------------------------------------------------------------------------------
// The threads.
// ---------------------------------------------------------------------------------------------

/// What one drawing thread did.
#[derive(Default, Debug)]
struct Drawn {
    ok: u64,
    failed: u64,
    /// Calls refused because the BLOCK pool was attached and too small for the batch.
    too_small: u64,
    timeouts: u64,
    pool_rows: u64,
    seeded_rows: u64,
    greedy_rows: u64,
    decided_rows: u64,
}

fn drawer(s: Handle<tokenrace_sampler>, batches: &[Fixed], seed: u64, end: Instant) -> Drawn {
    let mut rng = TestRng::new(seed);
    let mut d = Drawn::default();
    let mut calls = 0;
    while calls < MIN_CALLS || Instant::now() < end {
        calls += 1;
        let b = &batches[rng.below(batches.len())];
        let (mut tokens, mut flags) = (vec![TOKEN_SENTINEL; b.rows], vec![FLAG_SENTINEL; b.rows]);
        let status = b.draw(s, &mut tokens, &mut flags);
        let at = format!("{} (drawing thread {seed})", b.label);
        match status {
            tokenrace_status::Ok => {
                d.ok += 1;
                for r in 0..b.rows {
                    assert!((0..VOCAB as i32).contains(&tokens[r]), "{at}: row {r}: token {} out of range", tokens[r]);
                    assert_eq!(flags[r], b.want_flags[r], "{at}: row {r}: flags");
                    if b.decided(r) {
                        assert_eq!(tokens[r], b.want_tokens[r], "{at}: row {r} (seeded or greedy): token");
                        d.decided_rows += 1;
                    }
                }
                d.pool_rows += b.pool_rows() as u64;
                d.seeded_rows += b.seeded_rows() as u64;
                d.greedy_rows += b.greedy_rows() as u64;
            }
            status => {
                let message = last_error();
                assert!(tokens.iter().all(|&t| t == TOKEN_SENTINEL), "{at}: a failed call wrote tokens");
                assert!(flags.iter().all(|&f| f == FLAG_SENTINEL), "{at}: a failed call wrote flags");
                d.failed += 1;
                match status {
                    // Documented: a draw with more unseeded sampling rows than the attached
                    // pool's capacity.
                    tokenrace_status::InvalidArgument if b.pool_rows() > BLOCK_ROWS as usize => {
                        let want = format!("n_rows: {} is not in [1, {BLOCK_ROWS}]", b.pool_rows());
                        assert!(message.contains("noise pool") && message.contains(&want), "{at}: {message}");
                        d.too_small += 1;
                    }
                    // Documented for a BLOCK pool; counted, and reported by the test.
                    tokenrace_status::Timeout => d.timeouts += 1,
                    _ => panic!("{at}: {status:?}: {message}"),
                }
            }
        }
    }
    d
}

/// What one borrowing thread received, per pool: (first_seq, rows) of every lease.
#[derive(Default)]
struct Borrowed {
    leases: [Vec<(u64, u64)>; 2],
    timeouts: u64,
    refused: u64,
}

fn borrower(pools: [(Handle<tokenrace_pool>, tokenrace_noise_kind, u32); 2], seed: u64, stop: &AtomicBool) -> Borrowed {
    let mut rng = TestRng::new(seed);
    let mut got = Borrowed::default();
    while !stop.load(SeqCst) {
        let which = rng.below(2);
        let (pool, kind, cap) = pools[which];
        let mut lease = lease_sentinel();
        if rng.below(10) == 0 {
            // Outside [1, capacity]: refused, and no sequence number is spent on it.
            let n = if rng.below(2) == 0 { 0 } else { cap + 1 };
            assert_eq!(borrow(pool, n, &mut lease), tokenrace_status::InvalidArgument, "n_rows {n}");
            assert!(last_error().contains(&format!("n_rows: {n} is not in [1, {cap}]")), "{}", last_error());
            assert!(untouched(&lease), "a refused borrow wrote its lease");
            got.refused += 1;
            continue;
        }
        let n = 1 + rng.below(4) as u32;
        match borrow(pool, n, &mut lease) {
            tokenrace_status::Ok => {
                assert_eq!((lease.rows, lease.vocab, lease.kind), (n, VOCAB as u32, kind as u32));
                assert!(lease.in_ring <= 1 && lease.first_seq != u64::MAX);
                // SAFETY: a lease's values are `rows x vocab` readable floats until its release.
                let values = unsafe { std::slice::from_raw_parts(lease.values, n as usize * VOCAB) };
                // Values a producer or an inline borrower wrote, of the pool's kind: E > 0, or
                // a finite ln E (a sample of them: a torn or reused row would show).
                let ok =
                    |v: f32| if kind == tokenrace_noise_kind::Exp { v > 0.0 && v.is_finite() } else { v.is_finite() };
                assert!(
                    values.iter().step_by(97).all(|&v| ok(v)),
                    "pool {which}: a lease holds values not of its kind"
                );
                got.leases[which].push((lease.first_seq, n as u64));
                if rng.below(3) == 0 {
                    thread::sleep(Duration::from_micros(200)); // hold it while others borrow
                }
                assert_eq!(release(pool, &lease), tokenrace_status::Ok, "{}", last_error());
                if rng.below(10) == 0 {
                    assert_eq!(release(pool, &lease), tokenrace_status::InvalidArgument, "released twice");
                    assert!(last_error().contains("not a lease of this pool"), "{}", last_error());
                }
            }
            tokenrace_status::Timeout if which == 1 => {
                assert!(untouched(&lease), "a failed borrow wrote its lease");
                got.timeouts += 1;
            }
            status => panic!("pool {which}: borrow of {n}: {status:?}: {}", last_error()),
        }
    }
    got
}

/// Attaches the two pools in turn, and tries the two that must be refused; reads the counters
/// meanwhile. Returns the number of attaches.
fn attacher(
    s: Handle<tokenrace_sampler>,
    pools: [Handle<tokenrace_pool>; 2],
    closed: Handle<tokenrace_pool>,
    other_vocab: Handle<tokenrace_pool>,
    stop: &AtomicBool,
) -> usize {
    let mut n = 0;
    while !stop.load(SeqCst) {
        // SAFETY (every call below): a live sampler and live pool handles.
        unsafe {
            assert_eq!(
                tokenrace_sampler_attach_pool(s.get(), pools[n % 2].get()),
                tokenrace_status::Ok,
                "{}",
                last_error()
            );
            if n % 8 == 3 {
                assert_eq!(tokenrace_sampler_attach_pool(s.get(), closed.get()), tokenrace_status::Closed);
                assert!(last_error().contains("pool: is shut down"), "{}", last_error());
            }
            if n % 8 == 7 {
                assert_eq!(
                    tokenrace_sampler_attach_pool(s.get(), other_vocab.get()),
                    tokenrace_status::InvalidArgument
                );
                assert!(last_error().contains("differs from the sampler's vocab_size"), "{}", last_error());
            }
            let mut st = tokenrace_sampler_stats {
                struct_size: size_of::<tokenrace_sampler_stats>() as u32,
                ..Default::default()
            };
            assert_eq!(tokenrace_sampler_get_stats(s.get(), &mut st), tokenrace_status::Ok);
        }
        n += 1;
        thread::sleep(Duration::from_micros(500));
    }
    n
}

/// One cycle: a BLOCK pool with its only rows leased, three borrowers blocked on it, then the
/// pool freed (after `tokenrace_pool_shutdown` when `shutdown_first`): every borrower returns
/// CLOSED promptly with its lease slot untouched, and the lease still out is released after
/// the free. Returns how long the borrowers took to return.
fn free_under_blocked_borrowers(seed: u64, shutdown_first: bool) -> Duration {
    const WAITERS: usize = 3;
    let pool = new_pool(2, 64, tokenrace_noise_kind::Exp, tokenrace_pool_policy::Block, 1, 60_000, seed);
    let mut held = lease_sentinel();
    assert_eq!(borrow(pool, 2, &mut held), tokenrace_status::Ok, "{}", last_error());
    let started = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let started = started.clone();
            thread::spawn(move || {
                let mut lease = lease_sentinel();
                started.fetch_add(1, SeqCst);
                let status = borrow(pool, 1, &mut lease);
                (status, untouched(&lease), last_error())
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while started.load(SeqCst) < WAITERS {
        assert!(Instant::now() < deadline, "the borrowers did not start");
        thread::sleep(Duration::from_millis(1));
    }
    // Give them time to reach the wait. (One that is late still finds the handle alive, since
    // the lease held keeps it, and the pool shut down: CLOSED all the same.)
    thread::sleep(Duration::from_millis(30));
    assert!(waiters.iter().all(|w| !w.is_finished()), "a borrower returned although no row can be ready");
    let t0 = Instant::now();
    // SAFETY: a live pool; the blocked borrows are the calls this must wake, the lease held is
    // released after the free, as documented.
    unsafe {
        if shutdown_first {
            assert_eq!(tokenrace_pool_shutdown(pool.get()), tokenrace_status::Ok);
        }
        tokenrace_pool_free(pool.get());
    }
    for (i, w) in waiters.into_iter().enumerate() {
        let (status, untouched, message) = join_within(w, t0 + Duration::from_secs(10), "a blocked borrower");
        assert_eq!(status, tokenrace_status::Closed, "borrower {i}: {message}");
        assert!(untouched, "borrower {i}: a failed borrow wrote its lease");
    }
    let woke = t0.elapsed();
    assert_eq!(
        release(pool, &held),
        tokenrace_status::Ok,
        "the lease out is released after the free: {}",
        last_error()
    );
    woke
}

/// Disjoint `(first_seq, rows)` ranges, or the first two that overlap.
fn overlap(leases: &mut [(u64, u64)]) -> Option<((u64, u64), (u64, u64))> {
    leases.sort_unstable();
    leases.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0).map(|w| (w[0], w[1]))
}

fn run_phase(threads: u32, batches: &Arc<Vec<Fixed>>) {
    let started = Instant::now();
    let s = sampler_new(threads, 0xfeed + threads as u64);
    let seed = 0x900d + threads as u64;
    let inline =
        new_pool(INLINE_ROWS, VOCAB, tokenrace_noise_kind::LogExp, tokenrace_pool_policy::Inline, 1, 1000, seed);
    let block = new_pool(
        BLOCK_ROWS,
        VOCAB,
        tokenrace_noise_kind::Exp,
        tokenrace_pool_policy::Block,
        2,
        BLOCK_TIMEOUT_MS,
        seed + 1,
    );
    let closed = new_pool(4, VOCAB, tokenrace_noise_kind::Exp, tokenrace_pool_policy::Inline, 1, 1000, seed + 2);
    // SAFETY: a live pool.
    assert_eq!(unsafe { tokenrace_pool_shutdown(closed.get()) }, tokenrace_status::Ok);
    let other_vocab = new_pool(4, 1000, tokenrace_noise_kind::Exp, tokenrace_pool_policy::Inline, 1, 1000, seed + 3);
    // A pool is attached before any draw, so every unseeded sampling row takes pool noise.
    // SAFETY: a live sampler and pool.
    assert_eq!(unsafe { tokenrace_sampler_attach_pool(s.get(), inline.get()) }, tokenrace_status::Ok);

    let stop = Arc::new(AtomicBool::new(false));
    let end = Instant::now() + PHASE;
    let drawers: Vec<_> = (0..DRAWERS as u64)
        .map(|i| {
            let batches = batches.clone();
            thread::spawn(move || drawer(s, &batches, i, end))
        })
        .collect();
    let pools = [(inline, tokenrace_noise_kind::LogExp, INLINE_ROWS), (block, tokenrace_noise_kind::Exp, BLOCK_ROWS)];
    let borrowers: Vec<_> = (0..BORROWERS as u64)
        .map(|i| {
            let stop = stop.clone();
            thread::spawn(move || borrower(pools, 100 + i, &stop))
        })
        .collect();
    let attach = {
        let stop = stop.clone();
        thread::spawn(move || attacher(s, [inline, block], closed, other_vocab, &stop))
    };
    let closer = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut woke = Vec::new();
            while woke.len() < 2 || !stop.load(SeqCst) {
                woke.push(free_under_blocked_borrowers(seed + woke.len() as u64, woke.len() % 2 == 1));
            }
            woke
        })
    };

    let deadline = end + Duration::from_secs(30);
    let drawn: Vec<Drawn> = drawers.into_iter().map(|h| join_within(h, deadline, "a drawing thread")).collect();
    stop.store(true, SeqCst);
    let borrowed: Vec<Borrowed> =
        borrowers.into_iter().map(|h| join_within(h, deadline, "a borrowing thread")).collect();
    let attaches = join_within(attach, deadline, "the attaching thread");
    let woke = join_within(closer, deadline, "the freeing thread");

    // The sampler's counters are the sum of what the drawing threads saw.
    let sum = |f: fn(&Drawn) -> u64| drawn.iter().map(f).sum::<u64>();
    let mut st =
        tokenrace_sampler_stats { struct_size: size_of::<tokenrace_sampler_stats>() as u32, ..Default::default() };
    // SAFETY: a live sampler.
    assert_eq!(unsafe { tokenrace_sampler_get_stats(s.get(), &mut st) }, tokenrace_status::Ok);
    assert_eq!(
        (
            st.calls,
            st.rejected_calls,
            st.pool_rows,
            st.seeded_rows,
            st.greedy_rows,
            st.inline_rows,
            st.external_noise_rows
        ),
        (sum(|d| d.ok), sum(|d| d.failed), sum(|d| d.pool_rows), sum(|d| d.seeded_rows), sum(|d| d.greedy_rows), 0, 0),
        "sampler counters [calls, rejected, pool, seeded, greedy, inline, external]"
    );

    // No sequence number handed out twice, none lost, and every row borrowed accounted for.
    let mut direct = [0u64; 2];
    for (which, pool) in [inline, block].into_iter().enumerate() {
        let mut leases: Vec<(u64, u64)> = borrowed.iter().flat_map(|b| b.leases[which].iter().copied()).collect();
        direct[which] = leases.iter().map(|l| l.1).sum();
        if let Some((a, b)) = overlap(&mut leases) {
            panic!("pool {which}: leases {a:?} and {b:?} (first_seq, rows) share sequence numbers");
        }
        let before = pool_stats(pool);
        let mut next = lease_sentinel();
        assert_eq!(borrow(pool, 1, &mut next), tokenrace_status::Ok, "{}", last_error());
        assert_eq!(
            next.first_seq,
            before.rows_borrowed + before.rows_skipped,
            "pool {which}: the next sequence number is not rows_borrowed + rows_skipped ({before:?})"
        );
        assert_eq!(release(pool, &next), tokenrace_status::Ok);
    }
    let (a, b) = (pool_stats(inline), pool_stats(block));
    assert_eq!(
        a.rows_borrowed + b.rows_borrowed - 2, // the two single rows just borrowed
        direct[0] + direct[1] + st.pool_rows,
        "rows borrowed from the two pools vs rows received by the borrowers ({direct:?}) and drawn on pool noise ({})",
        st.pool_rows
    );
    assert!(direct.iter().all(|&n| n > 0) && st.pool_rows > 0, "the pools were not used: {direct:?}, {}", st.pool_rows);

    // SAFETY: every thread has returned; each handle is freed once (the sampler first, which
    // keeps an attached pool running until then).
    unsafe {
        tokenrace_sampler_free(s.get());
        for p in [inline, block, closed, other_vocab] {
            tokenrace_pool_free(p.get());
        }
    }
    let slowest = woke.iter().max().unwrap();
    eprintln!(
        "concurrency, sampler of {threads} thread(s): {} draw calls by {DRAWERS} threads ({} failed: {} for a pool too \
         small, {} timeouts), {} seeded or greedy rows equal to the single-threaded draw, {} rows on pool noise; \
         {} direct leases ({:?} rows, {} refused, {} timeouts) from the INLINE and BLOCK pools; {attaches} attaches; \
         {} pools freed under 3 blocked borrowers each (every borrower CLOSED, slowest after {slowest:.1?}); \
         pool stats {a:?} / {b:?}; {:.1?}",
        st.calls + st.rejected_calls,
        st.rejected_calls,
        sum(|d| d.too_small),
        sum(|d| d.timeouts),
        sum(|d| d.decided_rows),
        st.pool_rows,
        borrowed.iter().map(|b| b.leases[0].len() + b.leases[1].len()).sum::<usize>(),
        direct,
        borrowed.iter().map(|b| b.refused).sum::<u64>(),
        borrowed.iter().map(|b| b.timeouts).sum::<u64>(),
        woke.len(),
        started.elapsed()
    );
    assert!(slowest < &Duration::from_secs(2), "a blocked borrower took {slowest:?} to be woken by the free");
}

#[test]
fn threads_drawing_borrowing_attaching_and_freeing_at_once() {
    let _watchdog = Watchdog::start("the concurrency test", WATCHDOG);
    let batches = Arc::new(fixed_batches());
    // Every call on all its sampler's threads, as the comment on VOCAB says (the cost model
    // would keep many of these calls on one thread).
    tokenrace::internals::force_participants(usize::MAX);
    for threads in [1, 4] {
        run_phase(threads, &batches);
    }
}
