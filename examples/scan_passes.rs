//! The first pass of every row, plain and masked, against the read floor of the same rows: the
//! cost of a grammar bitmask in the scan (`docs/performance.md`, the sampling step).
//!
//! `cargo run --release --features internals --example scan_passes [rows]` (default 32 rows of
//! vocab 151936, f32; 41 rounds, the three passes alternated in each, medians).
//!
//! "floor": the largest value of each row (`read_floor`); "scan": each block's maximum and the
//! NaN check, as a draw without edits runs it; "masked 10%" and "masked ones": the masked scan
//! through a bitmask that allows one token in ten at random, or every token.
use std::time::Instant;
use tokenrace::internals::{read_floor, scan_rows};

const VOCAB: usize = 151_936;

fn main() {
    let rows: usize = std::env::args().nth(1).map_or(32, |a| a.parse().expect("rows: a number"));
    let words = VOCAB.div_ceil(32);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let x: Vec<f32> = (0..rows * VOCAB).map(|_| (next() % 1000) as f32 / 100.0).collect();
    let tenth: Vec<u32> =
        (0..rows * words).map(|_| (0..32).filter(|_| next() % 10 == 0).fold(0u32, |w, j| w | 1 << j)).collect();
    let ones = vec![u32::MAX; rows * words];
    for level in tokenrace::supported_levels() {
        let mut times: [Vec<f64>; 4] = Default::default();
        for _ in 0..41 {
            for (pass, t) in times.iter_mut().enumerate() {
                let start = Instant::now();
                let m = match pass {
                    0 => read_floor(level, tokenrace::Logits::F32(&x), rows, VOCAB, VOCAB),
                    1 => scan_rows(level, &x, None, rows, VOCAB),
                    2 => scan_rows(level, &x, Some((&tenth, words)), rows, VOCAB),
                    _ => scan_rows(level, &x, Some((&ones, words)), rows, VOCAB),
                };
                std::hint::black_box(m);
                t.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        let [floor, scan, tenth_t, ones_t] = times.each_mut().map(median);
        println!(
            "{level:?}, {rows} rows: floor {floor:.0} us; scan {:.2}, masked 10% {:.2}, masked ones {:.2} of the floor",
            scan / floor,
            tenth_t / floor,
            ones_t / floor
        );
    }
}
