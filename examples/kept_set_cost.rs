//! Per-row cost of the kept-set outputs (threshold, count, mass; and the bitmask) against the
//! plain filtered draw of the same rows, in the same run: 32 rows of vocab 151936 (f32, peaked
//! and flat), top-k 50 + top-p 0.9, top-p 0.95 alone, min-p 0.05, greedy; one thread.
//! `cargo run --release --example kept_set_cost`
use std::time::Instant;
use tokenrace::*;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn normal(state: &mut u64) -> f64 {
    let mut next = || {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let (u, v) = (next(), next());
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

/// Microseconds per row of `draw` (median of `reps` calls).
fn time_call(reps: usize, rows: usize, mut draw: impl FnMut()) -> f64 {
    draw();
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                draw();
                t.elapsed().as_secs_f64() * 1e6 / rows as f64
            })
            .collect(),
    )
}

fn main() {
    let (rows, vocab, reps) = (32usize, 151_936usize, 15);
    let words = vocab.div_ceil(32);
    let s = Sampler::new(Config { threads: 1, seed: Some(1), max_rows: rows, ..Config::default() }).unwrap();
    println!("level {}, {rows} rows x vocab {vocab}, 1 thread: us per row", s.simd_level().name());
    println!("{:<8} {:<18} {:>9} {:>16} {:>16}", "profile", "filters", "draw", "+ thr/count/mass", "+ bitmask too");
    let mut state = 7u64;
    for (profile, sd) in [("peaked", 4.0), ("flat", 1.0)] {
        let x: Vec<f32> = (0..rows * vocab).map(|_| (normal(&mut state) * sd) as f32).collect();
        let seeds: Vec<u64> = (0..rows as u64).collect();
        let cases: [(&str, f32, i32, f32, f32); 4] = [
            ("top-k 50 + top-p .9", 1.0, 50, 0.9, 0.0),
            ("top-p .95", 1.0, 0, 0.95, 0.0),
            ("min-p .05", 1.0, 0, 1.0, 0.05),
            ("greedy", 0.0, 0, 1.0, 0.0),
        ];
        for (name, t, k, p, mp) in cases {
            let (temps, ks, ps, mps) = (vec![t; rows], vec![k; rows], vec![p; rows], vec![mp; rows]);
            let b = Batch {
                temperature: Some(&temps),
                top_k: Some(&ks),
                top_p: Some(&ps),
                min_p: Some(&mps),
                seeds: Some(&seeds),
                ..Batch::new(Logits::F32(&x), rows, vocab)
            };
            let mut tokens = vec![0i32; rows];
            let (mut thr, mut count, mut mass) = (vec![0f32; rows], vec![0i32; rows], vec![0f64; rows]);
            let mut bits = vec![0i32; rows * words];
            let plain = time_call(reps, rows, || s.draw(&b, &mut Output::new(&mut tokens)).unwrap());
            let kept = time_call(reps, rows, || {
                let mut out = Output {
                    kept_threshold: Some(&mut thr),
                    kept_count: Some(&mut count),
                    kept_mass: Some(&mut mass),
                    ..Output::new(&mut tokens)
                };
                s.draw(&b, &mut out).unwrap()
            });
            if std::env::var_os("KEPT_PARTS").is_some() {
                let count_only = time_call(reps, rows, || {
                    let mut out = Output { kept_count: Some(&mut count), ..Output::new(&mut tokens) };
                    s.draw(&b, &mut out).unwrap()
                });
                let mass_only = time_call(reps, rows, || {
                    let mut out = Output { kept_mass: Some(&mut mass), ..Output::new(&mut tokens) };
                    s.draw(&b, &mut out).unwrap()
                });
                let thr_only = time_call(reps, rows, || {
                    let mut out = Output { kept_threshold: Some(&mut thr), ..Output::new(&mut tokens) };
                    s.draw(&b, &mut out).unwrap()
                });
                println!("  parts: count {count_only:.1} mass {mass_only:.1} threshold {thr_only:.1}");
            }
            let with_bits = time_call(reps, rows, || {
                let mut out = Output {
                    kept_threshold: Some(&mut thr),
                    kept_count: Some(&mut count),
                    kept_mass: Some(&mut mass),
                    kept_bitmask: Some(&mut bits),
                    ..Output::new(&mut tokens)
                };
                s.draw(&b, &mut out).unwrap()
            });
            println!(
                "{profile:<8} {name:<18} {plain:>9.1} {kept:>9.1} ({:.2}x) {with_bits:>9.1} ({:.2}x)",
                kept / plain,
                with_bits / plain
            );
        }
    }
}
