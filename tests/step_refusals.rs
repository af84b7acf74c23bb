//! Bad input to the sampling step: every array of the step refused with a message naming the
//! argument, row and position, and nothing written; bad ids that the rows' tasks find are
//! reported in the batch's order.
mod common;

use common::step::*;
use tokenrace::*;

// ---------------------------------------------------------------------------------------------
// Bad input.
// ---------------------------------------------------------------------------------------------

/// Draws `b` into sentinel-filled buffers (every output, `full_logprobs` at `full_stride`) and
/// expects INVALID_ARGUMENT with a message containing `want`, and nothing written.
fn expect_error(s: &Sampler, b: &Batch, full_len: usize, full_stride: usize, want: &str) {
    let rows = b.rows;
    let mut g = sentinels(rows, 2, full_len);
    let untouched = g.clone();
    let mut out = Output {
        flags: Some(&mut g.flags),
        logprobs: Some(&mut g.lps),
        ranks: Some(&mut g.ranks),
        top_n: 2,
        topn_ids: Some(&mut g.ids),
        topn_logprobs: Some(&mut g.tlps),
        logprob_mode: LogprobMode::Processed,
        full_logprobs: Some(&mut g.full),
        full_row_stride: full_stride,
        full_mode: FullMode::Processed,
        ..Output::new(&mut g.tokens)
    };
    let err = s.draw(b, &mut out).expect_err(want);
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{want}: {err}");
    assert!(err.message.contains(want), "expected a message containing {want:?}, got {:?}", err.message);
    assert!(g == untouched, "{want}: the outputs were written by a failed call");
}

/// The lists' ids are checked by the tasks that draw their rows, on several threads; a call
/// must still report the error a check of the whole batch in order finds first (the lists in
/// order, each row by row, before the penalties), and write nothing.
#[test]
fn bad_ids_found_by_the_rows_tasks_are_reported_in_the_batchs_order() {
    fn list<'a>(ids: &'a [i32], offsets: &'a [u64]) -> Option<TokenLists<'a>> {
        Some(TokenLists { ids, offsets })
    }
    // (As `setups`: every call on every thread it may use; never reset, as other tests here
    // rely on it.)
    tokenrace::internals::force_participants(usize::MAX);
    let (rows, vocab) = (64usize, 3000usize);
    let x: Vec<f32> = (0..rows * vocab).map(|i| (i % 97) as f32 / 10.0).collect();
    let temps = vec![0.7f32; rows];
    let ids: Vec<i32> = (0..rows * 20).map(|i| (i * 31 % vocab) as i32).collect();
    let offsets: Vec<u64> = (0..=rows as u64).map(|r| r * 20).collect();
    let with_bad = |bad: &[(usize, i32)]| {
        let mut v = ids.clone();
        for &(entry, id) in bad {
            v[entry] = id;
        }
        v
    };
    let late_two = with_bad(&[(50 * 20 + 3, 3000), (7 * 20 + 5, -4)]);
    let early = with_bad(&[(20 + 1, 5000)]);
    let late = with_bad(&[(50 * 20, 3001)]);
    let penalties = vec![1.1f32; rows];
    let mut zero_first = penalties.clone();
    zero_first[0] = 0.0;
    for threads in [1usize, 2, 4] {
        let s = Sampler::new(Config { seed: Some(3), threads, ..Config::default() }).unwrap();
        let base = Batch { temperature: Some(&temps), ..Batch::new(Logits::F32(&x), rows, vocab) };
        let good = list(&ids, &offsets);
        let cases: [(Batch, &str); 3] = [
            // Two bad rows of one list: the lower.
            (
                Batch { prompt_tokens: list(&late_two, &offsets), output_tokens: good, ..base },
                "batch.prompt_ids[7]: position 5 (entry 145): -4 is not a token id in [0, 3000)",
            ),
            // A bad output id in row 1 and a bad prompt id in row 50: the prompt's, checked first.
            (
                Batch { prompt_tokens: list(&late, &offsets), output_tokens: list(&early, &offsets), ..base },
                "batch.prompt_ids[50]: position 0 (entry 1000): 3001 is not a token id in [0, 3000)",
            ),
            // A bad banned id in row 50 and a repetition penalty of 0 in row 0: the ids, checked
            // before the penalties.
            (
                Batch {
                    banned_tokens: list(&late, &offsets),
                    repetition_penalty: Some(&zero_first),
                    prompt_tokens: good,
                    ..base
                },
                "batch.banned_ids[50]: position 0 (entry 1000): 3001 is not a token id in [0, 3000)",
            ),
        ];
        for (b, want) in &cases {
            expect_error(&s, b, rows * vocab, vocab, want);
        }
        // And the good lists draw.
        let b = Batch { prompt_tokens: good, output_tokens: good, repetition_penalty: Some(&penalties), ..base };
        let mut tokens = vec![0; rows];
        s.draw(&b, &mut Output::new(&mut tokens)).unwrap();
    }
}

#[test]
fn bad_step_inputs_are_refused_with_their_argument_row_and_position() {
    let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    let (rows, vocab) = (3usize, 40usize);
    let x: Vec<f32> = (0..rows * vocab).map(|i| (i % 7) as f32).collect();
    let base = Batch { temperature: Some(&[1.0, 0.0, 0.5]), ..Batch::new(Logits::F32(&x), rows, vocab) };
    let full = rows * vocab;
    let err = |b: &Batch, want: &str| expect_error(&s, b, full, vocab, want);
    let good = TokenLists { ids: &[1, 2, 3, 4, 5], offsets: &[0, 2, 2, 5] };
    // The good batch draws (so every failure below is the one change).
    let mut tokens = vec![0; rows];
    let mut fl = vec![0.0f32; full];
    let all = Batch {
        prompt_tokens: Some(good),
        output_tokens: Some(good),
        repetition_penalty: Some(&[1.2, 1.0, 0.5]),
        frequency_penalty: Some(&[0.1, -0.5, 0.0]),
        presence_penalty: Some(&[0.0, 2.0, -1.0]),
        logit_bias: Some(LogitBias {
            ids: &[0, 39, 5],
            values: &[1.0, f32::NEG_INFINITY, -2.0],
            offsets: &[0, 1, 2, 3],
        }),
        allowed_tokens: Some(good),
        allowed_rows: Some(&[1, 0, 1]),
        banned_tokens: Some(good),
        token_bitmask: Some(TokenBitmask { words: &[-1; 6], row_stride: 2 }),
        ..base
    };
    s.draw(&all, &mut Output { full_logprobs: Some(&mut fl), full_row_stride: vocab, ..Output::new(&mut tokens) })
        .unwrap();

    // Token ids out of range, in every list: the row, the position in the row and the entry.
    for (field, set) in [("prompt_ids", 0), ("output_ids", 1), ("allowed_ids", 2), ("banned_ids", 3)] {
        for (bad, shown) in [
            (40i32, "40 is not a token id in [0, 40)"),
            (-1, "-1 is not a token id in [0, 40)"),
            (i32::MIN, "-2147483648 is not"),
        ] {
            let ids = [1, 2, 3, 4, bad, 6];
            let l = Some(TokenLists { ids: &ids, offsets: &[0, 2, 2, 6] });
            let b = match set {
                0 => Batch { prompt_tokens: l, ..all },
                1 => Batch { output_tokens: l, ..all },
                2 => Batch { allowed_tokens: l, ..all },
                _ => Batch { banned_tokens: l, ..all },
            };
            err(&b, &format!("batch.{field}[2]: position 2 (entry 4): {shown}"));
        }
    }
    // An allowed list of a row `allowed_rows` leaves out is checked too.
    let b = Batch { allowed_tokens: Some(TokenLists { ids: &[1, 2, 99, 4, 5], offsets: &[0, 2, 3, 5] }), ..all };
    err(&b, "batch.allowed_ids[1]: position 0 (entry 2): 99 is not a token id in [0, 40)");
    let b = Batch {
        logit_bias: Some(LogitBias { ids: &[0, 39, 40], values: &[1.0, 2.0, 3.0], offsets: &[0, 1, 2, 3] }),
        ..all
    };
    err(&b, "batch.bias_ids[2]: position 0 (entry 2): 40 is not a token id in [0, 40)");

    // Offsets: decreasing, past the list, too few.
    for (field, set) in [
        ("prompt_offsets", 0),
        ("output_offsets", 1),
        ("allowed_offsets", 2),
        ("banned_offsets", 3),
        ("bias_offsets", 4),
    ] {
        let with = |offsets: &'static [u64]| {
            let l = Some(TokenLists { ids: &[1, 2, 3, 4, 5], offsets });
            match set {
                0 => Batch { prompt_tokens: l, ..all },
                1 => Batch { output_tokens: l, ..all },
                2 => Batch { allowed_tokens: l, ..all },
                3 => Batch { banned_tokens: l, ..all },
                _ => Batch { logit_bias: Some(LogitBias { ids: &[1, 2, 3, 4, 5], values: &[0.5; 5], offsets }), ..all },
            }
        };
        err(
            &with(&[0, 3, 2, 5]),
            &format!("batch.{field}[2]: 2 is below the previous offset 3 (offsets must not decrease)"),
        );
        err(&with(&[1, 0, 2, 5]), &format!("batch.{field}[1]: 0 is below the previous offset 1"));
        err(&with(&[0, 2, 2, 6]), &format!("batch.{field}[3]: 6 is past the end of the list's 5 entries"));
        err(&with(&[0, 2, 2]), &format!("batch.{field}: has 3 elements, rows + 1 is 4"));
    }
    // Bias values shorter than the offsets say.
    let b =
        Batch { logit_bias: Some(LogitBias { ids: &[0, 1, 2], values: &[1.0, 2.0], offsets: &[0, 1, 2, 3] }), ..all };
    err(&b, "batch.bias_offsets[3]: 3 is past the end of the list's 2 entries");
    // Bias values: +inf and NaN (finite values and -inf are biases).
    for (v, shown) in [(f32::INFINITY, "inf"), (f32::NAN, "NaN")] {
        let values = [1.0, 2.0, 3.0, v, 5.0];
        let b = Batch {
            logit_bias: Some(LogitBias { ids: &[0, 1, 2, 3, 4], values: &values, offsets: &[0, 1, 2, 5] }),
            ..all
        };
        err(&b, &format!("batch.bias_values[2]: position 1 (entry 3): {shown} is not a bias (finite, or -inf to ban)"));
    }

    // Penalties: r <= 0 or not finite; f and p not finite; too short. Greedy rows are checked too.
    for (r, shown) in [(0.0f32, "0"), (-1.0, "-1"), (f32::NAN, "NaN"), (f32::INFINITY, "inf"), (-0.0, "-0")] {
        let v = [1.0, r, 1.0];
        err(
            &Batch { repetition_penalty: Some(&v), ..all },
            &format!("batch.repetition_penalty[1]: {shown} is not a finite number > 0"),
        );
    }
    for (v, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf"), (f32::NEG_INFINITY, "-inf")] {
        let vals = [0.0, 0.0, v];
        err(
            &Batch { frequency_penalty: Some(&vals), ..all },
            &format!("batch.frequency_penalty[2]: {shown} is not finite"),
        );
        err(
            &Batch { presence_penalty: Some(&vals), ..all },
            &format!("batch.presence_penalty[2]: {shown} is not finite"),
        );
    }
    for (field, b) in [
        ("repetition_penalty", Batch { repetition_penalty: Some(&[1.0, 1.0]), ..all }),
        ("frequency_penalty", Batch { frequency_penalty: Some(&[1.0, 1.0]), ..all }),
        ("presence_penalty", Batch { presence_penalty: Some(&[1.0]), ..all }),
        ("allowed_rows", Batch { allowed_rows: Some(&[1, 1]), ..all }),
    ] {
        err(&b, &format!("batch.{field}: has"));
    }
    err(&Batch { allowed_tokens: None, ..all }, "batch.allowed_rows: given without allowed lists");

    // The bitmask: stride below ceil(vocab / 32), too few words.
    err(
        &Batch { token_bitmask: Some(TokenBitmask { words: &[-1; 6], row_stride: 1 }), ..all },
        "batch.bitmask_row_stride: 1 is smaller than ceil(vocab / 32) = 2",
    );
    err(
        &Batch { token_bitmask: Some(TokenBitmask { words: &[-1; 5], row_stride: 2 }), ..all },
        "batch.token_bitmask: has 5 elements",
    );
    err(
        &Batch { token_bitmask: Some(TokenBitmask { words: &[-1; 7], row_stride: 3 }), ..all },
        "batch.token_bitmask: has 7 elements",
    );

    // full_logprobs: too short, stride below vocab.
    expect_error(&s, &all, full - 1, vocab, "out.full_logprobs: has 119 elements");
    expect_error(&s, &all, 2 * 41 + 39, 41, "out.full_logprobs: has 121 elements");
    expect_error(&s, &all, full, vocab - 1, "out.full_row_stride: 39 is smaller than vocab 40");
    // (Right at the span, strided: accepted.)
    let mut fl = vec![0.0f32; 2 * 41 + 40];
    s.draw(&all, &mut Output { full_logprobs: Some(&mut fl), full_row_stride: 41, ..Output::new(&mut tokens) })
        .unwrap();
}
