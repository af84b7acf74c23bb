//! min_tokens: a row's stop tokens are banned while its output list (passed in the same call)
//! holds fewer than `min_tokens` tokens, exactly as the banned list bans (-inf; processed
//! logprobs report -inf). Hand-made rows at the boundary, seeded rows equal to the plain draw of
//! their processed row at every SIMD level on 1 and 4 threads, and refusals naming the row and
//! position with nothing written.
mod common;

use common::reference as rf;
use common::step::*;
use common::TestRng;
use tokenrace::*;

/// The greedy token of one row with `output` generated so far, `stop` tokens and `min_tokens`;
/// and the processed logprob of every token.
fn greedy(x: &[f32], output: Option<&[i32]>, stop: &[i32], min_tokens: i32) -> (i32, Vec<f32>) {
    let vocab = x.len();
    let oo = [0, output.map_or(0, |o| o.len() as u64)];
    let so = [0, stop.len() as u64];
    let b = Batch {
        temperature: Some(&[0.0]),
        output_tokens: output.map(|ids| TokenLists { ids, offsets: &oo }),
        stop_tokens: Some(TokenLists { ids: stop, offsets: &so }),
        min_tokens: Some(std::slice::from_ref(&min_tokens)),
        ..Batch::new(Logits::F32(x), 1, vocab)
    };
    let (token, full) = greedy_with_processed_row(&b);
    let p = rf::RowInputs { output: output.unwrap_or(&[]), stop, min_tokens, ..rf::RowInputs::NONE };
    let y = rf::effective_row(x, &p);
    let best = (0..vocab).fold(0, |b, i| if y[i] > y[b] { i } else { b });
    assert_eq!(token as usize, best, "the reference's greedy token: {y:?}");
    (token, full)
}

#[test]
fn stop_tokens_are_banned_until_the_output_reaches_min_tokens() {
    let x = [1.0f32, 5.0, 4.0, 3.0];
    // Stop token 1 leads: banned while the output holds fewer than 3 tokens.
    for (output, want) in [(&[][..], 2), (&[0][..], 2), (&[0, 0][..], 2), (&[0, 0, 0][..], 1), (&[0, 0, 0, 0][..], 1)] {
        let (token, full) = greedy(&x, Some(output), &[1], 3);
        assert_eq!(token, want, "output of {} tokens", output.len());
        assert_eq!(full[1] == f32::NEG_INFINITY, want == 2, "the processed logprob of the stop token: {full:?}");
    }
    // No output list: its length is 0. min_tokens 0 bans nothing.
    assert_eq!(greedy(&x, None, &[1, 2], 1).0, 3);
    assert_eq!(greedy(&x, None, &[1, 2], 0).0, 1);
    // A stop token listed twice, and every token a stop token: the row is EMPTY (token 0).
    assert_eq!(greedy(&x, Some(&[]), &[1, 1], 5).0, 2);
    let s = Sampler::new(Config::default()).unwrap();
    let b = Batch {
        output_tokens: Some(TokenLists { ids: &[], offsets: &[0, 0] }),
        stop_tokens: Some(TokenLists { ids: &[0, 1, 2, 3], offsets: &[0, 4] }),
        min_tokens: Some(&[1]),
        ..Batch::new(Logits::F32(&x), 1, 4)
    };
    let (mut tokens, mut flags) = ([-1], [0u32]);
    s.draw(&b, &mut Output { flags: Some(&mut flags), ..Output::new(&mut tokens) }).unwrap();
    assert_eq!((tokens[0], flags[0] & 4), (0, 4), "every token banned: EMPTY");
}

/// Rows below, at and above their minimum, with stop lists holding their likely tokens, seeded:
/// each draws the token, flags and processed logprob of the plain draw of its processed row, at
/// every level, on 1 and 4 threads, with a bitmask or without (a row masked by its bitmask alone
/// reads the caller's words in place; stop tokens must not let it).
#[test]
fn seeded_rows_with_min_tokens_draw_their_processed_row() {
    tokenrace::internals::force_participants(usize::MAX);
    for (vocab, output_len) in [(300usize, 6usize), (4096, 1500)] {
        let mut rng = TestRng::new(vocab as u64 + 1);
        let rows = 12;
        let mut x = Vec::with_capacity(rows * vocab);
        let (mut output, mut stop, mut min_tokens) = (Csr::new(), Csr::new(), Vec::new());
        for r in 0..rows {
            let row: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            x.extend_from_slice(&row);
            output.push(&(0..output_len).map(|_| rng.below(vocab) as i32).collect::<Vec<_>>());
            stop.push(&order[..1 + r % 4].iter().map(|&i| i as i32).collect::<Vec<_>>());
            min_tokens.push([0, output_len as i32 - 1, output_len as i32, output_len as i32 + 1][r % 4]);
        }
        let words = vocab.div_ceil(32);
        let bitmask: Vec<i32> = (0..rows * words).map(|_| (rng.u64() | rng.u64()) as i32).collect();
        for with_bitmask in [false, true] {
            let step = StepInputs {
                output: Some(output.clone()),
                frequency: Some(vec![0.0; rows]),
                min_tokens: Some(min_tokens.clone()),
                stop: Some(stop.clone()),
                bitmask: with_bitmask.then(|| (bitmask.clone(), words)),
                ..StepInputs::default()
            };
            let processed: Vec<f32> = (0..rows)
                .flat_map(|r| rf::effective_row(&x[r * vocab..(r + 1) * vocab], &step.row(r, vocab)))
                .collect();
            let banned_rows = (0..rows).filter(|&r| min_tokens[r] > output_len as i32).count();
            assert_eq!(banned_rows, 3);
            let temps: Vec<f32> = (0..rows).map(|r| [0.0, 0.7, 1.0][r % 3]).collect();
            let seeds = vec![5u64; rows];
            let offsets: Vec<u64> = (0..rows as u64).collect();
            let top_k: Vec<i32> = (0..rows).map(|r| if r % 5 == 0 { 20 } else { 0 }).collect();
            let batch = |logits| Batch {
                temperature: Some(&temps),
                seeds: Some(&seeds),
                offsets: Some(&offsets),
                top_k: Some(&top_k),
                ..Batch::new(logits, rows, vocab)
            };
            assert_fused_draws_as_plain(
                &step.apply(batch(Logits::F32(&x))),
                &batch(Logits::F32(&processed)),
                |threads, with_logprobs, r| {
                    format!(
                        "vocab {vocab}, bitmask {with_bitmask}, {threads} threads, logprobs {with_logprobs}, row {r}"
                    )
                },
            );
        }
    }
}

#[test]
fn bad_min_tokens_and_stop_lists_are_refused_naming_row_and_position() {
    let x = vec![0.5f32; 3 * 10];
    let batch = |min: &'static [i32], ids: &'static [i32], offsets: &'static [u64]| Batch {
        min_tokens: Some(min),
        stop_tokens: Some(TokenLists { ids, offsets }),
        ..Batch::new(Logits::F32(&x), 3, 10)
    };
    expect_draw_error(&batch(&[0, 1, -1], &[1, 2], &[0, 1, 2, 2]), "batch.min_tokens[2]: -1 is negative");
    expect_draw_error(&batch(&[1, 1], &[1, 2], &[0, 1, 2, 2]), "batch.min_tokens: has 2 elements");
    expect_draw_error(
        &batch(&[1, 1, 1], &[1, 2, 10], &[0, 1, 2, 3]),
        "batch.stop_ids[2]: position 0 (entry 2): 10 is not a token id in [0, 10)",
    );
    expect_draw_error(&batch(&[1, 1, 1], &[1, -3], &[0, 0, 2, 2]), "batch.stop_ids[1]: position 1 (entry 1): -3");
    expect_draw_error(
        &batch(&[1, 1, 1], &[1, 2], &[0, 2, 1, 2]),
        "batch.stop_offsets[2]: 1 is below the previous offset 2",
    );
    expect_draw_error(&batch(&[1, 1, 1], &[1, 2], &[0, 1, 2, 3]), "batch.stop_offsets[3]: 3 is past the end");
    // A stop id out of range is refused even in a row whose output is long enough.
    expect_draw_error(&batch(&[0, 0, 0], &[11], &[0, 1, 1, 1]), "batch.stop_ids[0]: position 0 (entry 0): 11");
}
