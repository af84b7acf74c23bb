//! The main job on realistic logits: draw next tokens for a batch, check the sampled
//! frequencies against the exact probabilities, and measure throughput.
//!
//! cargo run --release --bin tokenrace-demo
use std::time::Instant;
use tokenrace::{Batch, Config, Logits, Output, Sampler};

fn main() {
    let (rows, vocab) = (32usize, 163_840usize);
    // Logits shaped like a model's next-token logits: N(0, 3) plus a handful near the top.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut row: Vec<f32> = (0..vocab)
        .map(|_| ((-2.0 * (1.0 - uniform()).ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos() * 3.0) as f32)
        .collect();
    for (i, v) in [(11usize, 19.0f32), (4242, 18.5), (90_000, 18.0), (163_000, 17.0)] {
        row[i] = v;
    }
    let logits: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let temps = vec![0.8f32; rows];

    let sampler = Sampler::new(Config { max_rows: rows, seed: Some(1), ..Config::default() }).expect("a sampler");
    println!("tokenrace {} | SIMD level: {}", tokenrace::VERSION, sampler.simd_level().name());
    println!("batch: {rows} rows x vocab {vocab}, f32, temperature 0.8");

    let batch = Batch { temperature: Some(&temps), ..Batch::new(Logits::F32(&logits), rows, vocab) };
    let mut tokens = vec![0i32; rows];
    let draws = 200;
    let mut counts = std::collections::HashMap::<i32, u64>::new();
    let start = Instant::now();
    for _ in 0..draws {
        sampler.draw(&batch, &mut Output::new(&mut tokens)).expect("draw");
        for &t in &tokens {
            *counts.entry(t).or_default() += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();

    // Exact probabilities of softmax(x / T) in float64.
    let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let weights: Vec<f64> = row.iter().map(|&x| ((x as f64 - m) / 0.8).exp()).collect();
    let total: f64 = weights.iter().sum();
    let n = (draws * rows) as f64;
    println!("\n{:>8} {:>12} {:>12} {:>10}", "token", "exact p", "sampled", "z-score");
    let mut top: Vec<usize> = (0..vocab).collect();
    top.sort_by(|&a, &b| weights[b].partial_cmp(&weights[a]).unwrap());
    for &t in top.iter().take(5) {
        let p = weights[t] / total;
        let f = *counts.get(&(t as i32)).unwrap_or(&0) as f64 / n;
        let z = (f - p) / (p * (1.0 - p) / n).sqrt();
        println!("{t:>8} {p:>12.5} {f:>12.5} {z:>10.2}");
    }
    let tail_p: f64 = top[5..].iter().map(|&t| weights[t]).sum::<f64>() / total;
    let tail_f =
        counts.iter().filter(|(t, _)| !top[..5].contains(&(**t as usize))).map(|(_, c)| *c).sum::<u64>() as f64 / n;
    println!("{:>8} {tail_p:>12.5} {tail_f:>12.5}", "rest");
    println!(
        "\nthroughput: {:.0} rows/s, {:.1} us per row, {:.2} G logits/s (1 thread)",
        n / secs,
        secs * 1e6 / n,
        n * vocab as f64 / secs / 1e9
    );
}
