//! The benchmark: microseconds per call and per row for each path, each against the read floor
//! of the same logits measured in the same run (these machines are shared and noisy, so only
//! ratios measured together mean anything).
//!
//! [TOKENRACE_SIMD=avx2] cargo run --release -p tokenrace-bench -- [--quick] [--json FILE]
//!     [--threads 1,2] [--rows 1,8,32] [--vocab 163840] [--dtype f32,bf16] [--profile peaked,flat]
//!     [--path greedy,race-inline,...] [--placement hot,cold] [--reps N]
//!     [--threads-table] [--verify] [--row-tail]
//!
//! (`--help` lists every option with its defaults; `src/args.rs` parses them. The crate turns on
//! the library's feature `internals`, for the read floors `kernels::read_floor*`.)
//!
//! `--quick` (what CI runs) uses tiny sizes and two repetitions: it checks that every case runs,
//! nothing about time.
//!
//! `--threads-table` prints, per path, vocab and rows, the median (p10-p90) us per call of hot
//! calls for each thread count, one sampler at a time (a thread count must never make a call
//! slower than 1 thread). Its defaults, for the options not given: `--threads 1,2,4,8,16 --rows
//! 1,4,32 --vocab 32000,151936,262144 --dtype f32 --profile peaked --path race-inline --reps
//! 400`.
//!
//! `--verify` times speculative-decoding verification: 32 requests of 4 drafts (`--quick`: 3 of
//! 2) against a plain draw of the same 160 target rows, without and with the draft model's q,
//! per vocab (default 151936), profile, dtype (default f32) and thread count. The drafts are
//! drawn from a q close to the target (`verify`, `verify+q`), or are each row's argmax without q
//! (`verify argmax`: the most accepted, so the most target rows read); the mean emitted count of
//! each is printed.
//!
//! `--row-tail` times rows one at a time (no slow rows): `--rows` (default 1000) random rows per
//! profile (`flat3` N(0, 3), `flat1` N(0, 1), `peaked`, `zipf` (logits of a Zipf law, shuffled),
//! `ties` (N(0, 2) rounded to halves)) and vocabulary (default 32000, 151936, 262144), each drawn
//! alone with top-p 0.9 (`--path top-p0.9`, the default) or another path, the fastest of 3 hot
//! calls per row; prints p50, p99, the max and max / p50 of the per-row times, the slowest row's
//! index, and how many rows' top-p thresholds needed the general path's second cut or every token
//! gathered.

mod args;
mod records;

use args::{Args, Table};
use records::{round, JsonLines, MainRecord, Provenance, RowTailRecord, ThreadsRecord, VerifyRecord};
use std::time::Instant;
use tokenrace::internals::{read_floor, read_floor_two};
use tokenrace::*;

/// xorshift64*, enough for benchmark data.
struct Gen(u64);
impl Gen {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        (-2.0 * (1.0 - self.uniform()).ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
}

/// N(0, 3), plus (peaked) a few logits near 20, like real next-token logits.
fn make_row(g: &mut Gen, vocab: usize, peaked: bool) -> Vec<f32> {
    let mut x: Vec<f32> = (0..vocab).map(|_| (g.normal() * 3.0) as f32).collect();
    if peaked {
        for k in 0..4 {
            let i = (g.uniform() * vocab as f64) as usize;
            x[i] = 20.0 - k as f32 * 0.7;
        }
    }
    x
}

/// The sampling step of the step paths, per row: 4096 prompt and 1024 output tokens,
/// r = 1.1, f = 0.2, p = 0.1, 16 biased ids, and a grammar bitmask allowing 10% of the
/// vocabulary.
struct Pipeline {
    prompt: (Vec<i32>, Vec<u64>),
    output: (Vec<i32>, Vec<u64>),
    bias: (Vec<i32>, Vec<f32>, Vec<u64>),
    bitmask: Vec<i32>,
    penalties: [Vec<f32>; 3],
}

impl Pipeline {
    fn new(g: &mut Gen, rows: usize, vocab: usize) -> Pipeline {
        let mut ids = |per_row: usize| {
            let ids: Vec<i32> = (0..rows * per_row).map(|_| (g.uniform() * vocab as f64) as i32).collect();
            (ids, (0..=rows).map(|r| (r * per_row) as u64).collect::<Vec<u64>>())
        };
        let prompt = ids(4096);
        let output = ids(1024);
        let (bias_ids, offsets) = ids(16);
        let bias_values = (0..bias_ids.len()).map(|j| if j % 2 == 0 { 1.5 } else { -2.0 }).collect();
        let words = vocab.div_ceil(32);
        let mut bitmask = vec![0i32; rows * words];
        for r in 0..rows {
            for i in 0..vocab {
                if g.uniform() < 0.1 {
                    bitmask[r * words + i / 32] |= 1 << (i % 32);
                }
            }
        }
        let penalties = [vec![1.1; rows], vec![0.2; rows], vec![0.1; rows]];
        Pipeline { prompt, output, bias: (bias_ids, bias_values, offsets), bitmask, penalties }
    }

    /// The bitmask with each row's largest logit allowed too, for the rows of `tokens` (each
    /// row's greedy token): the case of a grammar that allows the model's likeliest token, which
    /// is the common one and bench/compare.py's (`step-allowed`). The plain bitmask removes
    /// the peak of most peaked rows.
    fn allowing(&self, tokens: &[i32], vocab: usize) -> Vec<i32> {
        let words = vocab.div_ceil(32);
        let mut mask = self.bitmask.clone();
        for (r, &t) in tokens.iter().enumerate() {
            mask[r * words + t as usize / 32] |= 1 << (t % 32);
        }
        mask
    }

    /// `b` with this step's inputs: all of them (`step`), the penalties alone
    /// (`step-penalties`), the bias alone (`step-bias`), or the bitmask alone
    /// (`step-bitmask`).
    fn apply<'a>(&'a self, path: &str, b: Batch<'a>) -> Batch<'a> {
        // `step-logprob-rank-top20`: everything, and the logprob outputs of the race path;
        // `step-allowed`: everything, with the bitmask of `allowed` (the caller's);
        // `step-top-p0.9`: everything, and top-p 0.9 (`step-allowed-top-p0.9`: with the
        // bitmask of `allowed`); `step-external-logexp`: everything,
        // on the caller's ln-E noise (as a pool's rows reach the draw).
        let all = path == "step"
            || path.starts_with("step-allowed")
            || path.starts_with("step-logprob")
            || path == "step-top-p0.9"
            || path == "step-external-logexp";
        let penalties = all || path == "step-penalties";
        let bitmask = all || path == "step-bitmask";
        Batch {
            prompt_tokens: penalties.then(|| TokenLists { ids: &self.prompt.0, offsets: &self.prompt.1 }),
            output_tokens: penalties.then(|| TokenLists { ids: &self.output.0, offsets: &self.output.1 }),
            repetition_penalty: penalties.then_some(&self.penalties[0][..]),
            frequency_penalty: penalties.then_some(&self.penalties[1][..]),
            presence_penalty: penalties.then_some(&self.penalties[2][..]),
            logit_bias: (all || path == "step-bias").then(|| LogitBias {
                ids: &self.bias.0,
                values: &self.bias.1,
                offsets: &self.bias.2,
            }),
            token_bitmask: bitmask.then(|| TokenBitmask { words: &self.bitmask, row_stride: b.vocab.div_ceil(32) }),
            ..b
        }
    }
}

enum Data {
    F32(Vec<f32>),
    Bf16(Vec<Bf16>),
    F16(Vec<F16>),
}

impl Data {
    fn logits(&self, start: usize, len: usize) -> Logits<'_> {
        match self {
            Data::F32(v) => Logits::F32(&v[start..start + len]),
            Data::Bf16(v) => Logits::Bf16(&v[start..start + len]),
            Data::F16(v) => Logits::F16(&v[start..start + len]),
        }
    }
}

/// A sampler with an attached ln-E pool that holds enough ready rows for the whole timing.
/// A pool of LOG_EXP noise with room for `reps + 2` calls of `rows` rows, filled before it is
/// returned, so that every borrow finds its rows ready and reads rows no call read before (as a
/// pool hands them out: from memory, never twice).
fn filled_pool(rows: usize, vocab: usize, reps: usize) -> Option<tokenrace::NoisePool> {
    let cap = rows * (reps + 2);
    if cap * vocab * 4 > 1 << 30 {
        return None;
    }
    let pool = tokenrace::NoisePool::new(PoolConfig {
        rows: cap,
        vocab,
        kind: NoiseKind::LogExp,
        threads: 1,
        seed: Some(7),
        policy: DrainPolicy::Inline,
        ..PoolConfig::default()
    })
    .ok()?;
    let start = Instant::now();
    while pool.stats().rows_produced < cap as u64 && start.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    Some(pool)
}

fn filled_pool_sampler(base: &Config, rows: usize, vocab: usize, threads: usize, reps: usize) -> Option<Sampler> {
    let pool = filled_pool(rows, vocab, reps)?;
    let s = Sampler::new(Config { max_rows: rows.max(1), threads, seed: Some(1), vocab_size: vocab, ..base.clone() })
        .ok()?;
    s.attach_pool(std::sync::Arc::new(pool)).ok()?;
    Some(s)
}

fn median_and_spread(mut t: Vec<f64>) -> (f64, f64, f64) {
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| t[((t.len() - 1) as f64 * p).round() as usize];
    (q(0.5), q(0.1), q(0.9))
}

/// The logprob outputs a path asks for: `race-logprob` (or `step-logprob`) the sampled
/// token's logprob, with `-rank` its rank too, with `-top20` the row's 20 most probable tokens
/// too.
struct LogprobBuffers {
    logprobs: Vec<f32>,
    ranks: Vec<i32>,
    ids: Vec<i32>,
    lps: Vec<f32>,
}

impl LogprobBuffers {
    const TOP_N: usize = 20;

    fn new(rows: usize) -> Self {
        let n = rows * Self::TOP_N;
        LogprobBuffers { logprobs: vec![0.0; rows], ranks: vec![0; rows], ids: vec![0; n], lps: vec![0.0; n] }
    }

    /// `tokens` with the outputs `path` asks for.
    fn output<'a>(&'a mut self, path: &str, tokens: &'a mut [i32]) -> Output<'a> {
        let mut out = Output::new(tokens);
        if !path.starts_with("race-logprob") && !path.starts_with("step-logprob") {
            return out;
        }
        out.logprobs = Some(&mut self.logprobs);
        if path.contains("-rank") {
            out.ranks = Some(&mut self.ranks);
        }
        if path.contains("-top20") {
            out.top_n = Self::TOP_N;
            out.topn_ids = Some(&mut self.ids);
            out.topn_logprobs = Some(&mut self.lps);
        }
        out
    }
}

/// Times `f(batch_index)` `reps` times, cycling over `batches`; returns per-call microseconds.
fn time(reps: usize, batches: usize, mut f: impl FnMut(usize)) -> Vec<f64> {
    f(0); // warm up
    (0..reps)
        .map(|r| {
            let t = Instant::now();
            f(r % batches);
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

/// Hot calls of one case, drawn until the sampler's cost estimates have settled, then timed.
fn time_hot_draws(s: &Sampler, path: &str, data: &Data, rows: usize, vocab: usize, reps: usize) -> Vec<f64> {
    let temps = vec![if path == "greedy" { 0.0f32 } else { 1.0 }; rows];
    let (k50, p09, mp) = (vec![50i32; rows], vec![0.9f32; rows], vec![0.05f32; rows]);
    let (top_k, top_p, min_p) = match path {
        "top-k50" => (Some(&k50[..]), None, None),
        "top-k50-top-p0.9" => (Some(&k50[..]), Some(&p09[..]), None),
        "top-p0.9" => (None, Some(&p09[..]), None),
        "min-p0.05" => (None, None, Some(&mp[..])),
        _ => (None, None, None),
    };
    let mut tokens = vec![0i32; rows];
    let mut lp = LogprobBuffers::new(rows);
    let mut draw = || {
        let batch = Batch {
            temperature: Some(&temps),
            top_k,
            top_p,
            min_p,
            ..Batch::new(data.logits(0, rows * vocab), rows, vocab)
        };
        s.draw(&batch, &mut lp.output(path, &mut tokens)).unwrap();
    };
    for _ in 0..50 {
        draw();
    }
    time(reps, 1, |_| draw())
}

/// `--threads-table`: us per call by thread count, one line per path, vocab and rows.
/// The table draws with inline noise and the filters or logprob outputs a path names (the
/// command line refuses any other path).
fn threads_table(a: &Args, base: &Config, json: &mut JsonLines) {
    let header: String = a.threads.iter().map(|t| format!(" {:>20}", format!("{t} thr"))).collect();
    println!("us per call, hot, median (p10-p90) of {} calls after 50 to warm up", a.reps);
    println!("{:<18} {:>5} {:>7} {:>5} |{header}", "path", "dtype", "vocab", "rows");
    let mut g = Gen(0x9e37_79b9_7f4a_7c15);
    for path in &a.paths {
        for dtype in &a.dtypes {
            for profile in &a.profiles {
                for &vocab in &a.vocab {
                    let row = make_row(&mut g, vocab, profile == "peaked");
                    for &rows in &a.rows {
                        let f32s: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
                        let data = match dtype.as_str() {
                            "bf16" => Data::Bf16(f32s.iter().map(|&x| Bf16::from_f32(x)).collect()),
                            "f16" => Data::F16(f32s.iter().map(|&x| F16::from_f32(x)).collect()),
                            _ => Data::F32(f32s),
                        };
                        let mut line = format!("{path:<18} {dtype:>5} {vocab:>7} {rows:>5} |");
                        for &threads in &a.threads {
                            // One sampler at a time: another's spinning workers would take cores.
                            let s = Sampler::new(Config { max_rows: rows, threads, seed: Some(1), ..base.clone() })
                                .unwrap();
                            let (med, lo, hi) = median_and_spread(time_hot_draws(&s, path, &data, rows, vocab, a.reps));
                            line += &format!(" {:>20}", format!("{med:.1} ({lo:.1}-{hi:.1})"));
                            json.write(&ThreadsRecord {
                                table: "threads",
                                path,
                                dtype,
                                profile,
                                rows,
                                vocab,
                                threads,
                                us_per_call_median: round(med, 3),
                                us_per_call_p10: round(lo, 3),
                                us_per_call_p90: round(hi, 3),
                                provenance: Provenance::get(),
                            });
                        }
                        println!("{line}");
                    }
                }
            }
        }
    }
}

/// The speculative-decoding case: `requests` requests of `drafts` draft tokens each.
/// Each draft row's q is the target row tempered by noise (`softmax(x + N(0, 1))`) and its draft
/// is drawn from q, so that some drafts are accepted and some not, as with a real draft model.
struct VerifyCase {
    counts: Vec<i32>,
    drafts: Vec<i32>,
    q: Vec<f32>,
    /// Each draft row's argmax: the drafts most often accepted (every target row is then read).
    top: Vec<i32>,
}

impl VerifyCase {
    fn new(g: &mut Gen, x: &[f32], requests: usize, drafts: usize, vocab: usize) -> VerifyCase {
        let (mut ids, mut q, mut top) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..requests {
            for j in 0..drafts {
                let row = &x[(r * (drafts + 1) + j) * vocab..][..vocab];
                top.push((0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as i32);
                let y: Vec<f64> = row.iter().map(|&v| v as f64 + g.normal()).collect();
                let m = y.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                let w: Vec<f64> = y.iter().map(|v| (v - m).exp()).collect();
                let z: f64 = w.iter().sum();
                let mut u = g.uniform() * z;
                let d = w.iter().position(|&wi| {
                    u -= wi;
                    u < 0.0
                });
                ids.push(d.unwrap_or(vocab - 1) as i32);
                q.extend(w.iter().map(|wi| (wi / z) as f32));
            }
        }
        VerifyCase { counts: vec![drafts as i32; requests], drafts: ids, q, top }
    }
}

/// `--verify`: verifying 32 requests of 4 drafts against drawing the same 160 target
/// rows plainly, without q and with q, per vocab, profile, dtype and thread count.
fn verify_table(a: &Args, base: &Config, json: &mut JsonLines) {
    let (requests, drafts) = if a.quick { (3, 2) } else { (32, 4) };
    let rows = requests * (drafts + 1);
    println!("verify: {requests} requests x {drafts} drafts ({rows} target rows), hot; us per call, median (p10-p90) of {} calls", a.reps);
    println!(
        "{:<10} {:>5} {:>7} {:>7} {:>3} | {:>22} {:>22} {:>22} {:>22} | {:>6} {:>6} {:>6} {:>14}",
        "path",
        "dtype",
        "profile",
        "vocab",
        "thr",
        "plain draw",
        "verify",
        "verify argmax",
        "verify+q",
        "ratio",
        "r-top",
        "ratio+q",
        "emitted"
    );
    let mut g = Gen(0x7e51_f1ed_0000_0010);
    for &vocab in &a.vocab {
        for profile in &a.profiles {
            let x: Vec<f32> = (0..rows).flat_map(|_| make_row(&mut g, vocab, profile == "peaked")).collect();
            let case = VerifyCase::new(&mut g, &x, requests, drafts, vocab);
            for dtype in &a.dtypes {
                let data = match dtype.as_str() {
                    "bf16" => Data::Bf16(x.iter().map(|&v| Bf16::from_f32(v)).collect()),
                    "f16" => Data::F16(x.iter().map(|&v| F16::from_f32(v)).collect()),
                    _ => Data::F32(x.clone()),
                };
                for &threads in &a.threads {
                    let s = Sampler::new(Config { max_rows: rows, threads, seed: Some(1), ..base.clone() }).unwrap();
                    let logits = data.logits(0, rows * vocab);
                    let mut tokens = vec![0i32; rows];
                    let plain = time(a.reps, 1, |_| {
                        s.draw(&Batch::new(logits, rows, vocab), &mut Output::new(&mut tokens)).unwrap()
                    });
                    let mut vt = vec![0i32; requests * (drafts + 1)];
                    let mut counts = vec![0i32; requests];
                    let mut emitted = [0u64; 3];
                    let mut run = |kind: usize, emitted: &mut u64| {
                        let ids = if kind == 1 { &case.top } else { &case.drafts };
                        let b = VerifyBatch {
                            draft_probs: (kind == 2).then(|| DraftProbs { values: &case.q, row_stride: vocab }),
                            ..VerifyBatch::new(logits, vocab, &case.counts, ids)
                        };
                        s.verify(&b, &mut VerifyOutput::new(&mut vt, &mut counts)).unwrap();
                        *emitted += counts.iter().map(|&c| c as u64).sum::<u64>();
                    };
                    let no_q = time(a.reps, 1, |_| run(0, &mut emitted[0]));
                    let top = time(a.reps, 1, |_| run(1, &mut emitted[1]));
                    let with_q = time(a.reps, 1, |_| run(2, &mut emitted[2]));
                    let calls = (a.reps + 1) as f64 * requests as f64;
                    let (p, v, vt) = (median_and_spread(plain), median_and_spread(no_q), median_and_spread(top));
                    let vq = median_and_spread(with_q);
                    let cell = |m: (f64, f64, f64)| format!("{:.0} ({:.0}-{:.0})", m.0, m.1, m.2);
                    let mean = emitted.map(|e| e as f64 / calls);
                    println!(
                        "{:<10} {dtype:>5} {profile:>7} {vocab:>7} {threads:>3} | {:>22} {:>22} {:>22} {:>22} | {:>6.2} {:>6.2} {:>6.2} {:>4.2}/{:.2}/{:.2}",
                        "verify", cell(p), cell(v), cell(vt), cell(vq), v.0 / p.0, vt.0 / p.0, vq.0 / p.0, mean[0], mean[1], mean[2]
                    );
                    json.write(&VerifyRecord {
                        table: "verify",
                        dtype,
                        profile,
                        vocab,
                        threads,
                        requests,
                        drafts,
                        plain_us_median: round(p.0, 3),
                        verify_us_median: round(v.0, 3),
                        verify_q_us_median: round(vq.0, 3),
                        plain_us_p10: round(p.1, 3),
                        plain_us_p90: round(p.2, 3),
                        verify_us_p10: round(v.1, 3),
                        verify_us_p90: round(v.2, 3),
                        verify_q_us_p10: round(vq.1, 3),
                        verify_q_us_p90: round(vq.2, 3),
                        verify_top_us_median: round(vt.0, 3),
                        verify_top_us_p10: round(vt.1, 3),
                        verify_top_us_p90: round(vt.2, 3),
                        mean_emitted: round(mean[0], 3),
                        mean_emitted_top: round(mean[1], 3),
                        mean_emitted_q: round(mean[2], 3),
                        simd: s.simd_level().name(),
                        provenance: Provenance::get(),
                    });
                }
            }
        }
    }
}

/// A row of the `--row-tail` profiles.
fn tail_row(g: &mut Gen, vocab: usize, profile: &str) -> Vec<f32> {
    match profile {
        "flat1" => (0..vocab).map(|_| g.normal() as f32).collect(),
        "peaked" => make_row(g, vocab, true),
        "zipf" => {
            // Logits of p_i ~ 1 / (1 + i)^1.1, in a random order.
            let mut x: Vec<f32> = (0..vocab).map(|i| (-1.1 * ((1 + i) as f64).ln()) as f32).collect();
            for i in (1..vocab).rev() {
                x.swap(i, (g.uniform() * (i + 1) as f64) as usize);
            }
            x
        }
        "ties" => (0..vocab).map(|_| ((g.normal() * 4.0).round() / 2.0) as f32).collect(),
        _ => make_row(g, vocab, false),
    }
}

/// `--row-tail`: the distribution of the time of single rows (see the module doc).
fn row_tail(a: &Args, base: &Config, json: &mut JsonLines) {
    let rows = a.rows.first().copied().unwrap_or(1000);
    println!(
        "{:<10} {:<8} {:>7} {:>6} | {:>9} {:>9} {:>9} {:>8} {:>6}",
        "path", "profile", "vocab", "rows", "p50 us", "p99 us", "max us", "max/p50", "slowest"
    );
    for &vocab in &a.vocab {
        let s = Sampler::new(Config { vocab_size: vocab, max_rows: 1, threads: 1, ..base.clone() }).expect("sampler");
        for profile in &a.profiles {
            for path in &a.paths {
                let mut g = Gen(0x5eed ^ vocab as u64);
                let mut times = Vec::with_capacity(rows);
                let tiers_before = tokenrace::internals::tier_counts();
                for r in 0..rows {
                    let x = tail_row(&mut g, vocab, profile);
                    let logits = Logits::F32(&x);
                    let (temps, seeds) = ([1.0f32], [r as u64]);
                    let b = Batch { temperature: Some(&temps), seeds: Some(&seeds), ..Batch::new(logits, 1, vocab) };
                    let (k, p) = args::row_tail_filters(path).expect("checked by the command line");
                    let (ks, ps) = ([k.unwrap_or(0)], [p.unwrap_or(1.0)]);
                    let b = Batch { top_k: k.map(|_| &ks[..]), top_p: p.map(|_| &ps[..]), ..b };
                    let mut tok = [0i32];
                    let mut best = f64::INFINITY;
                    for _ in 0..3 {
                        let t = Instant::now();
                        s.draw(&b, &mut Output::new(&mut tok)).expect("draw");
                        best = best.min(t.elapsed().as_secs_f64() * 1e6);
                    }
                    times.push((best, r));
                }
                let tiers = tokenrace::internals::tier_counts();
                // Rows (3 calls each) whose top-p threshold took the second cut, or every token.
                let (second, all) = ((tiers[4] - tiers_before[4]) / 3, (tiers[3] - tiers_before[3]) / 3);
                times.sort_by(|a, b| a.0.total_cmp(&b.0));
                let at = |q: f64| times[((rows - 1) as f64 * q).round() as usize].0;
                let (p50, p99, (max, slowest)) = (at(0.5), at(0.99), times[rows - 1]);
                println!(
                    "{path:<10} {profile:<8} {vocab:>7} {rows:>6} | {p50:>9.1} {p99:>9.1} {max:>9.1} {:>8.2} {slowest:>6} | second cut {second}, every token {all}",
                    max / p50
                );
                let provenance = Provenance::get();
                json.write(&RowTailRecord {
                    table: "row-tail",
                    path,
                    profile,
                    vocab,
                    rows,
                    p50_us: round(p50, 3),
                    p99_us: round(p99, 3),
                    max_us: round(max, 3),
                    max_over_p50: round(max / p50, 3),
                    slowest_row: slowest,
                    rows_second_cut: second,
                    rows_every_token: all,
                    commit: &provenance.commit,
                    cpu: &provenance.cpu,
                    simd: s.simd_level().name(),
                    command: &provenance.command,
                });
            }
        }
    }
}

fn main() {
    let a = args::parse();
    let mut json = JsonLines::create(a.json.as_deref());
    // TOKENRACE_SIMD picks the level (as for any sampler made from the environment).
    let base = tokenrace::config_from_env().expect("TOKENRACE_* variables are valid").0;
    let level = Sampler::new(Config { vocab_size: 0, ..base.clone() }).expect("the level is supported").simd_level();
    println!(
        "tokenrace-bench {} | SIMD {} | {} cores",
        VERSION,
        level.name(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    // BENCH_PARTICIPANTS=N makes every call use N threads (capped at the sampler's),
    // overriding the cost model: to tell a slow split from a slow draw. (Not a TOKENRACE_ name:
    // the configuration warns about every TOKENRACE_ variable it does not know.)
    if let Some(n) = std::env::var("BENCH_PARTICIPANTS").ok().and_then(|v| v.parse().ok()) {
        tokenrace::internals::force_participants(n);
        println!("participants forced to {n} (BENCH_PARTICIPANTS)");
    }
    match a.table {
        Table::Threads => return threads_table(&a, &base, &mut json),
        Table::Verify => return verify_table(&a, &base, &mut json),
        Table::RowTail => return row_tail(&a, &base, &mut json),
        Table::Main => {}
    }
    println!(
        "{:<22} {:>5} {:>7} {:>5} {:>7} {:>3} {:>5} {:>10} {:>9} {:>9} {:>7} {:>8}",
        "path",
        "dtype",
        "profile",
        "rows",
        "vocab",
        "thr",
        "place",
        "us/call",
        "us/row",
        "floor/row",
        "ratio",
        "spread"
    );
    let mut g = Gen(0x9e37_79b9_7f4a_7c15);
    for &vocab in &a.vocab {
        for profile in &a.profiles {
            let row = make_row(&mut g, vocab, profile == "peaked");
            for &rows in &a.rows {
                for placement in &a.placements {
                    // Cold: enough batches to exceed the caches (>= 192 MiB in all).
                    let batch_bytes = rows * vocab * 4;
                    let batches =
                        if placement == "cold" && !a.quick { (192usize << 20).div_ceil(batch_bytes).max(2) } else { 1 };
                    let total = batches * rows * vocab;
                    if total > 1 << 30 {
                        continue;
                    }
                    let f32s: Vec<f32> = (0..batches * rows).flat_map(|_| row.iter().copied()).collect();
                    let noise_ln: Vec<f32> =
                        (0..rows * vocab).map(|_| (-(1.0 - g.uniform()).ln()).ln() as f32).collect();
                    let noise_e: Vec<f32> = noise_ln.iter().map(|l| l.exp()).collect();
                    for dtype in &a.dtypes {
                        let data = match dtype.as_str() {
                            "bf16" => Data::Bf16(f32s.iter().map(|&x| Bf16::from_f32(x)).collect()),
                            "f16" => Data::F16(f32s.iter().map(|&x| F16::from_f32(x)).collect()),
                            _ => Data::F32(f32s.clone()),
                        };
                        let span = rows * vocab;
                        let floor = median_and_spread(time(a.reps, batches, |b| {
                            std::hint::black_box(read_floor(level, data.logits(b * span, span), rows, vocab, vocab));
                        }))
                        .0;
                        let floor_two = median_and_spread(time(a.reps, batches, |b| {
                            std::hint::black_box(read_floor_two(
                                level,
                                data.logits(b * span, span),
                                &noise_ln,
                                rows,
                                vocab,
                            ));
                        }))
                        .0;
                        for &threads in &a.threads {
                            let s =
                                Sampler::new(Config { max_rows: rows.max(1), threads, seed: Some(1), ..base.clone() })
                                    .unwrap();
                            // The same sampler with a pool attached, filled before timing so
                            // that every borrow finds its rows ready: this measures the draw on
                            // pool noise, not the pool's generation rate (examples/pool_rate.rs).
                            let pooled = a
                                .paths
                                .iter()
                                .any(|p| p == "race-pool")
                                .then(|| filled_pool_sampler(&base, rows, vocab, threads, a.reps))
                                .flatten();
                            // The read floor of a race on pool noise: the logits and the rows a
                            // borrow from an identical pool hands out (fresh rows each call, as the
                            // pool's own are), in one pass.
                            let floor_pool = pooled.as_ref().and_then(|_| filled_pool(rows, vocab, a.reps)).map(|fp| {
                                median_and_spread(time(a.reps, batches, |b| {
                                    let lease = fp.borrow(rows).unwrap();
                                    std::hint::black_box(read_floor_two(
                                        level,
                                        data.logits(b * span, span),
                                        lease.values(),
                                        rows,
                                        vocab,
                                    ));
                                }))
                                .0
                            });
                            let mut tokens = vec![0i32; rows];
                            let mut lp = LogprobBuffers::new(rows);
                            let (k50, p09, mp) = (vec![50i32; rows], vec![0.9f32; rows], vec![0.05f32; rows]);
                            let step_inputs = a
                                .paths
                                .iter()
                                .any(|p| p.starts_with("step"))
                                .then(|| Pipeline::new(&mut Gen(0x5eed), rows, vocab));
                            for path in &a.paths {
                                let temps = vec![if path == "greedy" { 0.0f32 } else { 1.0 }; rows];
                                let (noise, two_streams) = match path.as_str() {
                                    "race-external-logexp" | "step-external-logexp" => (
                                        Some(ExternalNoise {
                                            values: &noise_ln,
                                            kind: NoiseKind::LogExp,
                                            row_stride: vocab,
                                        }),
                                        true,
                                    ),
                                    "race-external-exp" => (
                                        Some(ExternalNoise {
                                            values: &noise_e,
                                            kind: NoiseKind::Exp,
                                            row_stride: vocab,
                                        }),
                                        true,
                                    ),
                                    _ => (None, false),
                                };
                                let (top_k, top_p, min_p) = match path.as_str() {
                                    "top-k50" => (Some(&k50[..]), None, None),
                                    "top-k50-top-p0.9" => (Some(&k50[..]), Some(&p09[..]), None),
                                    "top-p0.9" | "step-top-p0.9" | "step-allowed-top-p0.9" => {
                                        (None, Some(&p09[..]), None)
                                    }
                                    "min-p0.05" => (None, None, Some(&mp[..])),
                                    _ => (None, None, None),
                                };
                                let sampler = match (path.as_str(), &pooled) {
                                    ("race-pool", Some(p)) => p,
                                    ("race-pool", None) => continue, // too large to pre-fill
                                    _ => &s,
                                };
                                // `step-allowed`: per batch, the bitmask that allows each row's
                                // greedy token.
                                let allowed: Vec<Vec<i32>> = match (path.as_str(), step_inputs.as_ref()) {
                                    ("step-allowed" | "step-allowed-top-p0.9", Some(p)) => (0..batches)
                                        .map(|b| {
                                            let greedy = vec![0.0f32; rows];
                                            let batch = Batch {
                                                temperature: Some(&greedy),
                                                ..Batch::new(data.logits(b * span, span), rows, vocab)
                                            };
                                            sampler.draw(&batch, &mut lp.output("greedy", &mut tokens)).unwrap();
                                            p.allowing(&tokens, vocab)
                                        })
                                        .collect(),
                                    _ => Vec::new(),
                                };
                                let t = time(a.reps, batches, |b| {
                                    let mut batch = Batch {
                                        temperature: Some(&temps),
                                        noise,
                                        top_k,
                                        top_p,
                                        min_p,
                                        ..Batch::new(data.logits(b * span, span), rows, vocab)
                                    };
                                    if let Some(p) = step_inputs.as_ref().filter(|_| path.starts_with("step")) {
                                        batch = p.apply(path, batch);
                                        if let Some(mask) = allowed.get(b) {
                                            batch.token_bitmask =
                                                Some(TokenBitmask { words: mask, row_stride: vocab.div_ceil(32) });
                                        }
                                    }
                                    sampler.draw(&batch, &mut lp.output(path, &mut tokens)).unwrap();
                                });
                                let (med, lo, hi) = median_and_spread(t);
                                let fl = match path.as_str() {
                                    // The floor of the same data: the logits and fresh pool rows.
                                    "race-pool" => floor_pool.unwrap_or(f64::NAN),
                                    _ if two_streams => floor_two,
                                    _ => floor,
                                };
                                let ratio = med / fl;
                                println!(
                                    "{:<22} {:>5} {:>7} {:>5} {:>7} {:>3} {:>5} {:>10.1} {:>9.2} {:>9.2} {:>7.2} {:>8.2}",
                                    path, dtype, profile, rows, vocab, threads, placement, med, med / rows as f64, fl / rows as f64, ratio, (hi - lo) / med
                                );
                                json.write(&MainRecord {
                                    path,
                                    dtype,
                                    profile,
                                    rows,
                                    vocab,
                                    threads,
                                    placement,
                                    simd: level.name(),
                                    us_per_call_median: round(med, 3),
                                    us_per_call_p10: round(lo, 3),
                                    us_per_call_p90: round(hi, 3),
                                    us_per_row: round(med / rows as f64, 4),
                                    floor_us_per_call: round(fl, 3),
                                    ratio_to_floor: round(ratio, 3),
                                    provenance: Provenance::get(),
                                });
                            }
                        }
                    }
                }
            }
        }
    }
}
