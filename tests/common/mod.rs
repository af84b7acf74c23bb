//! Helpers shared by the integration tests: a seeded RNG, logit rows, float64 references,
//! chi-square, the C ABI's last error, fork() children.
#![allow(dead_code)]

pub mod fixtures;
pub mod reference;
pub mod step;
pub mod verify;

/// The per-level runner: a body run at every SIMD level this CPU supports, failures naming the level.
#[allow(unused_imports)] // not every test binary runs per level
pub use tokenrace::internals::{at_level, each_level};

use rand_xoshiro::rand_core::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use tokenrace::*;

pub struct TestRng(Xoshiro256PlusPlus);

impl TestRng {
    pub fn new(seed: u64) -> Self {
        TestRng(Xoshiro256PlusPlus::seed_from_u64(seed))
    }
    pub fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.f64() * n as f64) as usize
    }
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (1.0 - self.f64(), self.f64());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    /// Exp(1) with full precision, never 0.
    pub fn exp(&mut self) -> f64 {
        -(1.0 - self.f64()).ln().max(-745.0)
    }
}

/// Logits shaped like a model's: N(0, sd) plus a few near `peak`.
pub fn peaked_logits(rng: &mut TestRng, vocab: usize, sd: f64, peak: f64) -> Vec<f32> {
    let mut x: Vec<f32> = (0..vocab).map(|_| (rng.normal() * sd) as f32).collect();
    for _ in 0..4 {
        let i = rng.below(vocab);
        x[i] = (peak - rng.f64() * 2.0) as f32;
    }
    x
}

/// Kinds of logit rows, the common ones and the degenerate ones (masks, NaN, +inf, empty rows).
#[derive(Clone, Copy, Debug)]
pub enum Dist {
    Normal1,
    Normal3,
    /// N(0, 2) plus a few logits near 15.
    Peaked,
    /// A handful of values, many ties (the maximum included).
    Ties,
    /// N(0, 3) with about half the row masked to -inf.
    Masked,
    /// N(0, 3) with NaN sprinkled in.
    WithNan,
    /// N(0, 3) with one or two +inf.
    PosInf,
    AllNegInf,
    /// NaN and -inf only (an empty row with NaN).
    NanNegInf,
    /// N(0, 300): keys far apart, logprobs in the thousands.
    Huge,
}

pub const DISTS: [Dist; 10] = [
    Dist::Normal1,
    Dist::Normal3,
    Dist::Peaked,
    Dist::Ties,
    Dist::Masked,
    Dist::WithNan,
    Dist::PosInf,
    Dist::AllNegInf,
    Dist::NanNegInf,
    Dist::Huge,
];

/// Common distributions more often than the degenerate ones.
pub fn pick_dist(rng: &mut TestRng) -> Dist {
    let w = [4, 4, 6, 3, 3, 2, 1, 1, 1, 2];
    let mut u = rng.below(w.iter().sum());
    for (d, &wi) in DISTS.iter().zip(&w) {
        if u < wi {
            return *d;
        }
        u -= wi;
    }
    unreachable!()
}

pub fn gen_row(rng: &mut TestRng, dist: Dist, n: usize) -> Vec<f32> {
    let normal = |rng: &mut TestRng, sd: f64| (0..n).map(|_| (rng.normal() * sd) as f32).collect::<Vec<f32>>();
    match dist {
        Dist::Normal1 => normal(rng, 1.0),
        Dist::Normal3 => normal(rng, 3.0),
        Dist::Peaked => {
            let mut x = normal(rng, 2.0);
            for _ in 0..1 + rng.below(5) {
                let i = rng.below(n);
                x[i] = (15.0 - rng.f64() * 3.0) as f32;
            }
            x
        }
        Dist::Ties => {
            let levels = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0];
            let mut x: Vec<f32> = (0..n).map(|_| levels[rng.below(5)]).collect();
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(n);
                x[i] = 3.0; // ties at the maximum
            }
            x
        }
        Dist::Masked => {
            let mut x = normal(rng, 3.0);
            for v in x.iter_mut() {
                if rng.below(2) == 0 {
                    *v = f32::NEG_INFINITY;
                }
            }
            x
        }
        Dist::WithNan => {
            let mut x = normal(rng, 3.0);
            for v in x.iter_mut() {
                if rng.below(20) == 0 {
                    *v = f32::NAN;
                }
            }
            x
        }
        Dist::PosInf => {
            let mut x = normal(rng, 3.0);
            for _ in 0..1 + rng.below(2) {
                let i = rng.below(n);
                x[i] = f32::INFINITY;
            }
            x
        }
        Dist::AllNegInf => vec![f32::NEG_INFINITY; n],
        Dist::NanNegInf => (0..n).map(|_| if rng.below(3) == 0 { f32::NAN } else { f32::NEG_INFINITY }).collect(),
        Dist::Huge => normal(rng, 300.0),
    }
}

/// Exact probabilities of softmax(x / T) in float64 (masked and NaN entries get 0).
pub fn softmax64(x: &[f32], t: f64) -> Vec<f64> {
    let m = x.iter().filter(|v| v.is_finite()).fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let w: Vec<f64> = x.iter().map(|&v| if v.is_finite() { ((v as f64 - m) / t).exp() } else { 0.0 }).collect();
    let s: f64 = w.iter().sum();
    w.iter().map(|v| v / s).collect()
}

/// -ln((a + 0.5) 2^-32) in float64, computed without cancellation.
pub fn exp_of_bits64(a: u32) -> f64 {
    let u = (a as f64 + 0.5) / 4294967296.0;
    if u < 0.5 {
        -u.ln()
    } else {
        -(-((4294967295 - a) as f64 + 0.5) / 4294967296.0).ln_1p()
    }
}

/// The critical value of chi-square with `dof` degrees of freedom at about z standard deviations
/// (Wilson-Hilferty); z = 5 is a false-alarm rate near 3e-7.
pub fn chi2_critical(dof: usize, z: f64) -> f64 {
    let k = dof as f64;
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Chi-square of observed counts against probabilities, pooling cells with expectation < 5.
pub fn chi2(counts: &[u64], probs: &[f64]) -> (f64, usize) {
    let n: u64 = counts.iter().sum();
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let e = p * n as f64;
        if p == 0.0 {
            assert_eq!(c, 0, "a token of probability 0 was drawn");
            continue;
        }
        if e < 5.0 {
            pool_o += c as f64;
            pool_e += e;
            continue;
        }
        stat += (c as f64 - e).powi(2) / e;
        cells += 1;
    }
    if pool_e > 0.0 {
        stat += (pool_o - pool_e).powi(2) / pool_e.max(1e-12);
        cells += 1;
    }
    (stat, cells.saturating_sub(1).max(1))
}

pub fn sampler(level: SimdLevel, seed: u64) -> Sampler {
    Sampler::new(Config { simd: step::choice_of(level), seed: Some(seed), max_rows: 4096, ..Config::default() })
        .unwrap()
}

/// The first draw of `p` (float64 probabilities summing to 1) on one uniform of `rng` (inverse
/// CDF); a uniform past the last rounding falls on the last token with mass.
pub fn draw_from(rng: &mut TestRng, p: &[f64]) -> usize {
    let mut u = rng.f64();
    for (i, &w) in p.iter().enumerate() {
        if u < w {
            return i;
        }
        u -= w;
    }
    p.iter().rposition(|&w| w > 0.0).unwrap()
}

/// Draws every row of a batch and returns (tokens, flags).
pub fn draw(s: &Sampler, batch: &Batch) -> (Vec<i32>, Vec<u32>) {
    let mut tokens = vec![-1; batch.rows];
    let mut fl = vec![0; batch.rows];
    s.draw(batch, &mut Output { flags: Some(&mut fl), ..Output::new(&mut tokens) }).unwrap();
    (tokens, fl)
}

/// The message of the last failed C call on this thread (`tokenrace_last_error()`).
pub fn last_error() -> String {
    // SAFETY: the library's last error is a valid C string until the next call on this thread.
    unsafe { std::ffi::CStr::from_ptr(tokenrace::internals::api::tokenrace_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Waits for child `pid` for at most `limit`: its exit status (128 + the signal if one killed
/// it), or None if it was still running (then it is killed).
pub fn wait_for_child(pid: libc::pid_t, limit: std::time::Duration) -> Option<i32> {
    let start = std::time::Instant::now();
    let mut status = 0;
    while start.elapsed() < limit {
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // SAFETY: as above; the child hung, so it is killed and reaped.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    None
}

/// Runs `f` in a fork() child and returns its result as the exit status (see
/// [`wait_for_child`]); a panic in `f` exits with 101.
pub fn in_child(limit: std::time::Duration, f: impl FnOnce() -> i32) -> Option<i32> {
    // SAFETY: the child runs `f` and leaves with _exit, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0, "fork failed");
    wait_for_child(pid, limit)
}
