//! Per-row cost of the filters at vocab 163840 (f32), against two read floors of the same row
//! measured in the same run: a max pass in plain Rust (as the issue measured it) and the
//! library's SIMD max pass at the sampler's level (`kernels::read_floor`, usually faster).
//! `cargo run --release --example filter_speed`
use std::time::Instant;
use tokenrace::*;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The read floor as the issue measured it: a max pass in plain Rust, 16 accumulators (kept out
/// of line so that its code does not depend on what surrounds it).
#[inline(never)]
fn max_pass(x: &[f32]) -> [f32; 16] {
    let mut acc = [f32::NEG_INFINITY; 16];
    for c in x.chunks_exact(16) {
        for (a, &b) in acc.iter_mut().zip(c) {
            *a = if b > *a { b } else { *a };
        }
    }
    acc
}

fn rng_normal(state: &mut u64) -> f64 {
    let mut next = || {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let (u, v) = (next(), next());
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

fn main() {
    let vocab = 163_840;
    let reps = 50;
    let s = Sampler::new(Config { threads: 1, seed: Some(1), ..Config::default() }).unwrap();
    println!("simd {}, vocab {vocab}, median of {reps} reps, one row, one thread", s.simd_level().name());
    let mut st = 7u64;
    // peaked: N(0, 3) and four tokens near 20; spread: N(0, 3) and 64 tokens around 14, one per
    // block or so (the nucleus of top-p 0.9 is ~40 tokens); flat: N(0, 3) (~7000 tokens).
    for shape in ["peaked", "spread", "flat"] {
        let mut x: Vec<f32> = (0..vocab).map(|_| (rng_normal(&mut st) * 3.0) as f32).collect();
        if shape == "peaked" {
            for j in 0..4 {
                x[(j * 40_009 + 123) % vocab] = 20.0 - j as f32 * 0.4;
            }
        }
        if shape == "spread" {
            for j in 0..64 {
                x[(j * 2_557 + 11) % vocab] = 14.0 + (rng_normal(&mut st) * 1.5) as f32;
            }
        }
        let time = |f: &mut dyn FnMut()| {
            f();
            median(
                (0..reps)
                    .map(|_| {
                        let t = Instant::now();
                        f();
                        t.elapsed().as_secs_f64() * 1e6
                    })
                    .collect(),
            )
        };
        let floor = time(&mut || {
            std::hint::black_box(max_pass(&x));
        });
        let cases: [(&str, i32, f32, f32, bool); 6] = [
            ("unfiltered race", 0, 1.0, 0.0, false),
            ("top-k 50", 50, 1.0, 0.0, false),
            ("top-k 50 + top-p 0.9", 50, 0.9, 0.0, false),
            ("top-p 0.9", 0, 0.9, 0.0, false),
            ("min-p 0.05", 0, 1.0, 0.05, false),
            ("unfiltered + logprob", 0, 1.0, 0.0, true),
        ];
        let simd_floor = time(&mut || {
            std::hint::black_box(tokenrace::internals::read_floor(s.simd_level(), Logits::F32(&x), 1, vocab, vocab));
        });
        println!("{shape}: read floor (max pass) {floor:.1} us, SIMD read floor {simd_floor:.1} us");
        for (name, k, p, mp, lp) in cases {
            let (kk, pp, mm, tt) = ([k], [p], [mp], [1.0f32]);
            let b = Batch {
                temperature: Some(&tt),
                top_k: Some(&kk),
                top_p: Some(&pp),
                min_p: Some(&mm),
                ..Batch::new(Logits::F32(&x), 1, vocab)
            };
            let mut tok = [0i32];
            let mut l = [0f32];
            let tiers = tokenrace::internals::tier_counts();
            let us = time(&mut || {
                let mut out = Output::new(&mut tok);
                if lp {
                    out.logprobs = Some(&mut l);
                }
                s.draw(&b, &mut out).unwrap();
            });
            let after = tokenrace::internals::tier_counts();
            let decided: Vec<u64> = (0..4).map(|i| after[i] - tiers[i]).collect();
            let how = if decided.iter().sum::<u64>() > 0 {
                format!("  top-p by cheap/f32/f64/all: {decided:?}")
            } else {
                String::new()
            };
            println!("  {name:<24} {us:8.1} us  {:5.2}x floor  {:5.2}x SIMD floor{how}", us / floor, us / simd_floor);
        }
    }
}
