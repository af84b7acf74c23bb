//! A row with every part of the step draws the token of its processed row, drawn plainly.

use super::Penalties;
use crate::batch::Batch;
use crate::batch::ExternalNoise;
use crate::batch::{LogitBias, Logits, Output, TokenBitmask, TokenLists};
use crate::config::{NoiseKind, SimdChoice};
use crate::{Config, Sampler};

/// The processed row in the simplest form: every step over the whole vocabulary.
fn dense(x: &[f32], prompt: &[i32], output: &[i32], bias: &[(i32, f32)], p: Penalties, mask: &[bool]) -> Vec<f32> {
    let mut y: Vec<f32> = x.iter().zip(mask).map(|(&x, &m)| if m { x } else { f32::NEG_INFINITY }).collect();
    for (i, y) in y.iter_mut().enumerate() {
        if !mask[i] {
            continue;
        }
        let b: Vec<f32> = bias.iter().filter(|b| b.0 as usize == i).map(|b| b.1).collect();
        if b.contains(&f32::NEG_INFINITY) {
            *y = f32::NEG_INFINITY;
            continue;
        }
        if let Some(first) = b.first() {
            *y += b[1..].iter().fold(*first, |a, &v| a + v);
        }
        let count = output.iter().filter(|&&t| t as usize == i).count();
        if p.repetition != 1.0 && (count > 0 || prompt.contains(&(i as i32))) {
            *y = if *y > 0.0 { *y / p.repetition } else { *y * p.repetition };
        }
        if count > 0 {
            *y -= p.frequency * count as f32;
            *y -= p.presence;
        }
    }
    y
}

#[test]
fn a_row_with_a_step_draws_as_its_processed_row() {
    let vocab: usize = 1000;
    let x: Vec<f32> = (0..vocab).map(|i| ((i * 7919 % 1000) as f32 / 100.0) - 5.0).collect();
    let prompt = [3, 5, 5, 900, 17];
    let output = [5, 17, 17, 42, 0];
    let bias = [(42, 2.5), (7, -1.0), (7, 0.5), (8, f32::NEG_INFINITY), (999, 30.0)];
    let p = Penalties { repetition: 1.3, frequency: 0.2, presence: 0.1 };
    let mut words = vec![-1i32; vocab.div_ceil(32)];
    words[3] = 0x0f0f_0f0f;
    let mask: Vec<bool> = (0..vocab).map(|i| words[i / 32] as u32 >> (i % 32) & 1 != 0).collect();
    let y = dense(&x, &prompt, &output, &bias, p, &mask);
    let (bias_ids, bias_values): (Vec<i32>, Vec<f32>) = bias.iter().copied().unzip();
    let po = [0u64, prompt.len() as u64];
    let oo = [0u64, output.len() as u64];
    let bo = [0u64, bias.len() as u64];
    let ln_e: Vec<f32> =
        (0..vocab).map(|i| (-((i * 2654435761usize % 1000) as f32 / 1000.0 + 1e-4).ln()).ln()).collect();
    let e_noise: Vec<f32> = ln_e.iter().map(|l| l.exp()).collect();
    let levels = [
        SimdChoice::Scalar,
        SimdChoice::Portable,
        SimdChoice::Avx2,
        SimdChoice::Avx512,
        SimdChoice::Neon,
        SimdChoice::Vxe2,
    ];
    for (simd, level) in levels.into_iter().zip(crate::kernels::SimdLevel::ALL) {
        if !level.is_supported() {
            continue;
        }
        let s = Sampler::new(Config { vocab_size: vocab, max_rows: 4, simd, ..Config::default() }).unwrap();
        for (t, noise) in [0.0f32, 0.7, 1.0, 2.0].into_iter().flat_map(|t| {
            [
                (t, None),
                (t, Some(ExternalNoise { values: &ln_e[..], kind: NoiseKind::LogExp, row_stride: vocab })),
                (t, Some(ExternalNoise { values: &e_noise[..], kind: NoiseKind::Exp, row_stride: vocab })),
            ]
        }) {
            let temps = [t];
            let seeds = if noise.is_none() { Some(&[11u64][..]) } else { None };
            let fused = Batch {
                temperature: Some(&temps),
                seeds,
                noise,
                prompt_tokens: Some(TokenLists { ids: &prompt, offsets: &po }),
                output_tokens: Some(TokenLists { ids: &output, offsets: &oo }),
                repetition_penalty: Some(&[1.3]),
                frequency_penalty: Some(&[0.2]),
                presence_penalty: Some(&[0.1]),
                logit_bias: Some(LogitBias { ids: &bias_ids, values: &bias_values, offsets: &bo }),
                token_bitmask: Some(TokenBitmask { words: &words, row_stride: words.len() }),
                ..Batch::new(Logits::F32(&x), 1, vocab)
            };
            let plain = Batch { temperature: Some(&temps), seeds, noise, ..Batch::new(Logits::F32(&y), 1, vocab) };
            let (mut a, mut b) = ([0i32], [0i32]);
            s.draw(&fused, &mut Output::new(&mut a)).unwrap();
            s.draw(&plain, &mut Output::new(&mut b)).unwrap();
            assert_eq!(a, b, "{level:?} T = {t} noise {:?}", noise.map(|n| n.kind));
        }
    }
}
