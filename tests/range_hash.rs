//! Seeded draws of rows whose filters keep a range (XTC, locally typical sampling, the dynamic
//! temperature), in both fixed orders and in caller's orders, with and without a step, with raw
//! logprobs, ranks and a top-5: their tokens, flags and logprobs hashed, at every SIMD level and
//! on 1 and 3 threads, against the hash recorded before the range paths were made faster. A
//! change of the draw path that moves one token, flag or logprob bit fails here.
mod common;

use common::*;
use tokenrace::*;

/// The hash of [`draws`] as the range path drew it when every row was written out and its
/// range computed over every candidate (recorded before that path was made faster).
const RECORDED: u64 = 13_656_739_694_797_163_136;

/// FNV-1a over 64-bit words.
fn fnv(h: &mut u64, word: u64) {
    for b in word.to_le_bytes() {
        *h = (*h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
}

/// One family of rows: its filters (per row, cycled over the rows of a call) and its order.
struct Family {
    t: &'static [f32],
    top_k: &'static [i32],
    top_p: &'static [f32],
    min_p: &'static [f32],
    min_keep: &'static [i32],
    typical_p: &'static [f32],
    xtc_probability: &'static [f32],
    xtc_threshold: &'static [f32],
    dynatemp_range: &'static [f32],
    order: Option<&'static [Stage]>,
    banned: bool,
}

const XTC_P: &[f32] = &[0.5, 1.0, 0.3, 0.0];
const XTC_T: &[f32] = &[0.1, 0.02, 0.001, 0.3];

fn families() -> Vec<Family> {
    let off = Family {
        t: &[1.0, 0.8, 1.3],
        top_k: &[0],
        top_p: &[1.0],
        min_p: &[0.0],
        min_keep: &[0, 1, 3],
        typical_p: &[1.0],
        xtc_probability: &[0.0],
        xtc_threshold: &[1.0],
        dynatemp_range: &[0.0],
        order: None,
        banned: false,
    };
    use Stage::*;
    vec![
        // XTC alone, XTC after llama.cpp's defaults, with a step.
        Family { xtc_probability: XTC_P, xtc_threshold: XTC_T, ..off },
        Family {
            top_k: &[40, 0, 400],
            top_p: &[0.95, 0.9],
            min_p: &[0.05, 0.0, 0.01],
            xtc_probability: XTC_P,
            xtc_threshold: XTC_T,
            ..off
        },
        Family { xtc_probability: XTC_P, xtc_threshold: XTC_T, banned: true, ..off },
        // Typical alone, with XTC, with top-k and top-p, with a step.
        Family { typical_p: &[0.95, 0.5, 0.2], ..off },
        Family { typical_p: &[0.9, 0.7], xtc_probability: XTC_P, xtc_threshold: XTC_T, ..off },
        Family { top_k: &[40, 1000], top_p: &[0.95], typical_p: &[0.9, 0.3], ..off },
        Family { typical_p: &[0.8], banned: true, ..off },
        // The dynamic temperature, alone and with XTC and typical.
        Family { dynatemp_range: &[0.5, 1.5], ..off },
        Family { dynatemp_range: &[0.5], xtc_probability: XTC_P, xtc_threshold: XTC_T, typical_p: &[1.0, 0.9], ..off },
        // The caller's orders.
        Family {
            top_k: &[40, 0],
            min_p: &[0.05],
            xtc_probability: XTC_P,
            xtc_threshold: XTC_T,
            order: Some(&[Xtc, TopK, MinP, Temperature]),
            ..off
        },
        Family {
            top_p: &[0.95],
            typical_p: &[0.9],
            xtc_probability: XTC_P,
            xtc_threshold: XTC_T,
            order: Some(&[Temperature, Xtc, Typical, TopP]),
            ..off
        },
        Family {
            top_k: &[100],
            xtc_probability: XTC_P,
            xtc_threshold: XTC_T,
            order: Some(&[TopK, Temperature, Xtc]),
            ..off
        },
        Family { typical_p: &[0.9], min_p: &[0.02], order: Some(&[Typical, MinP, Temperature]), ..off },
    ]
}

fn cycle<T: Copy>(v: &[T], rows: usize) -> Vec<T> {
    (0..rows).map(|r| v[r % v.len()]).collect()
}

/// Every family's rows drawn `calls` times (fresh seeds each call) at `level` on `threads`:
/// the hash of their tokens, flags, logprobs, ranks and top-5s, and how many rows were drawn.
fn draws(level: SimdLevel, threads: usize, calls: usize) -> (u64, usize) {
    let (rows, vocab) = (48usize, 4096usize);
    let mut rng = TestRng::new(0x7261_6e67);
    // Peaked rows (XTC at 0.1 cuts them), flat ones, rows of few distinct values (ties).
    let mut x = Vec::with_capacity(rows * vocab);
    for r in 0..rows {
        let row: Vec<f32> = match r % 4 {
            0 => peaked_logits(&mut rng, vocab, 2.0, 12.0),
            1 => peaked_logits(&mut rng, vocab, 1.0, 4.0),
            2 => (0..vocab).map(|_| (rng.normal() * 3.0) as f32).collect(),
            _ => (0..vocab).map(|_| (rng.below(12) as f32) * 0.75).collect(),
        };
        x.extend(row);
    }
    let banned: Vec<i32> = (0..rows).flat_map(|r| (r as i32 % 5..vocab as i32).step_by(5)).collect();
    let mut ban_offsets = vec![0u64];
    for r in 0..rows {
        ban_offsets.push(ban_offsets[r] + (r % 5..vocab).step_by(5).count() as u64);
    }
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut drawn = 0;
    for (fi, f) in families().iter().enumerate() {
        let t = cycle(f.t, rows);
        let top_k = cycle(f.top_k, rows);
        let top_p = cycle(f.top_p, rows);
        let min_p = cycle(f.min_p, rows);
        let min_keep = cycle(f.min_keep, rows);
        let typical_p = cycle(f.typical_p, rows);
        let xtc_probability = cycle(f.xtc_probability, rows);
        let xtc_threshold = cycle(f.xtc_threshold, rows);
        let dynatemp_range = cycle(f.dynatemp_range, rows);
        let dynatemp_exponent = cycle(&[1.0f32, 0.5, 2.0], rows);
        for order in [FilterOrder::FiltersFirst, FilterOrder::TemperatureFirst] {
            let s =
                Sampler::new(Config { threads, filter_order: order, ..sampler(level, 5).config().clone() }).unwrap();
            for call in 0..calls {
                let seeds: Vec<u64> = (0..rows as u64).map(|r| (fi * 1_000_000 + call * 1000) as u64 + r).collect();
                let b = Batch {
                    temperature: Some(&t),
                    seeds: Some(&seeds),
                    top_k: Some(&top_k),
                    top_p: Some(&top_p),
                    min_p: Some(&min_p),
                    min_keep: Some(&min_keep),
                    typical_p: Some(&typical_p),
                    xtc_probability: Some(&xtc_probability),
                    xtc_threshold: Some(&xtc_threshold),
                    dynatemp_range: Some(&dynatemp_range),
                    dynatemp_exponent: Some(&dynatemp_exponent),
                    order: f.order,
                    banned_tokens: f.banned.then_some(TokenLists { ids: &banned, offsets: &ban_offsets }),
                    ..Batch::new(Logits::F32(&x), rows, vocab)
                };
                let (mut tokens, mut fl) = (vec![-1; rows], vec![0u32; rows]);
                let (mut lps, mut ranks) = (vec![0f32; rows], vec![0i32; rows]);
                let (mut ids, mut tlps) = (vec![0i32; rows * 5], vec![0f32; rows * 5]);
                let mut out = Output {
                    flags: Some(&mut fl),
                    logprobs: Some(&mut lps),
                    ranks: Some(&mut ranks),
                    top_n: 5,
                    topn_ids: Some(&mut ids),
                    topn_logprobs: Some(&mut tlps),
                    ..Output::new(&mut tokens)
                };
                s.draw(&b, &mut out).unwrap();
                for r in 0..rows {
                    fnv(&mut h, tokens[r] as u64);
                    fnv(&mut h, fl[r] as u64);
                    fnv(&mut h, lps[r].to_bits() as u64);
                    fnv(&mut h, ranks[r] as u64);
                    for j in 0..5 {
                        fnv(&mut h, ids[r * 5 + j] as u64 ^ ((tlps[r * 5 + j].to_bits() as u64) << 32));
                    }
                }
                drawn += rows;
            }
        }
    }
    (h, drawn)
}

/// The recorded hash at every level and on 1 and 3 threads, over more than 20,000 seeded rows.
#[test]
fn range_rows_draw_what_they_drew() {
    each_level(|level| {
        for threads in [1usize, 3] {
            let (h, drawn) = draws(level, threads, 18);
            assert!(drawn > 20_000, "{drawn} rows");
            assert_eq!(h, RECORDED, "{level:?} threads {threads}: the hash of {drawn} seeded range rows moved");
        }
    });
}
