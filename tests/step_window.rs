//! The penalty window (`penalty_last_n`): only the last n tokens of a row's prompt ++ output
//! count for its penalties. Hand-made rows whose greedy token says where the window starts,
//! seeded rows of every window length equal to the plain draw of their processed row (every
//! SIMD level, 1 and 4 threads, rows that defer their histories and rows that do not), and
//! refusals naming the row with nothing written.
mod common;

use common::reference as rf;
use common::step::*;
use common::TestRng;
use tokenrace::*;

/// Greedy draws of one row whose histories and penalties are given, under window `last_n`.
fn greedy(x: &[f32], prompt: &[i32], output: &[i32], penalties: [f32; 3], last_n: i32) -> i32 {
    let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    let (po, oo) = ([0, prompt.len() as u64], [0, output.len() as u64]);
    let b = Batch {
        temperature: Some(&[0.0]),
        prompt_tokens: Some(TokenLists { ids: prompt, offsets: &po }),
        output_tokens: Some(TokenLists { ids: output, offsets: &oo }),
        repetition_penalty: Some(&penalties[0..1]),
        frequency_penalty: Some(&penalties[1..2]),
        presence_penalty: Some(&penalties[2..3]),
        penalty_last_n: Some(std::slice::from_ref(&last_n)),
        ..Batch::new(Logits::F32(x), 1, x.len())
    };
    let mut tokens = [-1];
    s.draw(&b, &mut Output::new(&mut tokens)).unwrap();
    let y = rf::effective_row(
        x,
        &rf::RowInputs {
            prompt,
            output,
            repetition: penalties[0],
            frequency: penalties[1],
            presence: penalties[2],
            last_n,
            ..rf::RowInputs::NONE
        },
    );
    let best = (0..y.len()).fold(0, |b, i| if y[i] > y[b] { i } else { b });
    assert_eq!(tokens[0] as usize, best, "the reference's greedy token under window {last_n}: {y:?}");
    tokens[0]
}

/// The window is the tail of prompt ++ output: it takes the output's last tokens first, then
/// the prompt's; 0 and a window longer than both count every token.
#[test]
fn the_window_is_the_last_tokens_of_prompt_then_output() {
    // Token 0 is in the prompt, token 1 in the output; halved by the repetition penalty, both
    // fall below token 2.
    let x = [5.0f32, 4.9, 3.0, 0.0];
    let repetition = [2.0, 0.0, 0.0];
    assert_eq!(greedy(&x, &[0], &[1], repetition, 1), 0, "window 1: only the output's token");
    assert_eq!(greedy(&x, &[0], &[1], repetition, 2), 2, "window 2: both histories");
    assert_eq!(greedy(&x, &[0], &[1], repetition, 0), 2, "window 0: every token");
    assert_eq!(greedy(&x, &[0], &[1], repetition, 1000), 2, "a window longer than the histories");
    assert_eq!(greedy(&x, &[0], &[], repetition, 1), 1, "an empty output: the prompt's last token");
    // The frequency penalty counts the output's occurrences inside the window only:
    // 5 - 0.06 c is above 4.9 for c = 1 alone.
    let frequency = [1.0, 0.06, 0.0];
    assert_eq!(greedy(&x, &[], &[0, 0, 0], frequency, 1), 0);
    assert_eq!(greedy(&x, &[], &[0, 0, 0], frequency, 2), 1, "count 2: 5 - 0.12 < 4.9");
    assert_eq!(greedy(&x, &[], &[0, 0, 0], frequency, 3), 1);
    // Prompt tokens inside the window take the repetition penalty, never frequency or presence.
    let presence = [1.0, 0.0, 10.0];
    assert_eq!(greedy(&x, &[1, 0], &[], presence, 2), 0);
    // Outside the window, an output token is neither counted nor repeated.
    let all = [3.0, 1.0, 1.0];
    assert_eq!(greedy(&x, &[], &[0, 3, 3], all, 2), 0);
    assert_eq!(greedy(&x, &[], &[0, 3, 3], all, 3), 1);
}

/// Rows of every window length around the histories' boundaries, seeded: each draws exactly the
/// token (and flags and processed logprob) that the plain draw of its processed row draws, at
/// every SIMD level, on 1 and 4 threads. At vocab 4096 with histories of thousands of tokens
/// and only-lowering penalties the row's histories are deferred to the blocks the draw visits;
/// a negative frequency penalty marks them up front.
#[test]
fn seeded_rows_with_a_window_draw_their_processed_row() {
    tokenrace::internals::force_participants(usize::MAX);
    for (vocab, prompt_len, output_len) in [(300usize, 12usize, 14usize), (4096, 2500, 1500)] {
        let windows: Vec<i32> = {
            let (p, o) = (prompt_len as i32, output_len as i32);
            vec![0, 1, 2, o - 1, o, o + 1, o + 5, p + o - 1, p + o, p + o + 1, 100_000]
        };
        let mut rng = TestRng::new(vocab as u64);
        let mut step = StepInputs::default();
        let (mut prompt, mut output) = (Csr::new(), Csr::new());
        let (mut rep, mut freq, mut pres, mut last_n) = (vec![], vec![], vec![], vec![]);
        let rows = windows.len() * 2;
        let mut x = Vec::with_capacity(rows * vocab);
        for r in 0..rows {
            let hot: Vec<i32> = (0..8).map(|_| rng.below(vocab) as i32).collect();
            let mut pick = || if rng.below(2) == 0 { hot[rng.below(8)] } else { rng.below(vocab) as i32 };
            let p: Vec<i32> = (0..prompt_len).map(|_| pick()).collect();
            let o: Vec<i32> = (0..output_len).map(|_| pick()).collect();
            prompt.push(&p);
            output.push(&o);
            x.extend((0..vocab).map(|i| if hot.contains(&(i as i32)) { 4.0 } else { rng.normal() as f32 }));
            rep.push(1.6);
            // Every other row raises values (a negative frequency penalty): never deferred.
            freq.push(if r % 2 == 0 { 0.7 } else { -0.4 });
            pres.push(0.3);
            last_n.push(windows[r / 2]);
        }
        (step.prompt, step.output) = (Some(prompt), Some(output));
        (step.repetition, step.frequency, step.presence, step.last_n) =
            (Some(rep), Some(freq), Some(pres), Some(last_n));
        let processed: Vec<f32> =
            (0..rows).flat_map(|r| rf::effective_row(&x[r * vocab..(r + 1) * vocab], &step.row(r, vocab))).collect();
        let temps = vec![0.8f32; rows];
        let seeds = vec![99u64; rows];
        let offsets: Vec<u64> = (0..rows as u64).collect();
        let top_p: Vec<f32> = (0..rows).map(|r| if r % 3 == 0 { 0.9 } else { 1.0 }).collect();
        let batch = |logits| Batch {
            temperature: Some(&temps),
            seeds: Some(&seeds),
            offsets: Some(&offsets),
            top_p: Some(&top_p),
            ..Batch::new(logits, rows, vocab)
        };
        assert_fused_draws_as_plain(
            &step.apply(batch(Logits::F32(&x))),
            &batch(Logits::F32(&processed)),
            |threads, with_logprobs, r| {
                format!(
                    "vocab {vocab}, {threads} threads, logprobs {with_logprobs}, row {r} (window {})",
                    windows[r / 2]
                )
            },
        );
    }
}

#[test]
fn a_negative_or_short_window_is_refused_naming_its_row() {
    let x = vec![0.5f32; 3 * 10];
    let output = TokenLists { ids: &[1, 2, 3], offsets: &[0, 1, 2, 3] };
    let with = |last_n| Batch {
        output_tokens: Some(output),
        presence_penalty: Some(&[0.5, 0.5, 0.5]),
        penalty_last_n: Some(last_n),
        ..Batch::new(Logits::F32(&x), 3, 10)
    };
    expect_draw_error(&with(&[0, 4, -1]), "batch.penalty_last_n[2]: -1 is negative");
    expect_draw_error(&with(&[i32::MIN, 0, 0]), "batch.penalty_last_n[0]");
    expect_draw_error(&with(&[1, 1]), "batch.penalty_last_n: has 2 elements");
    // Without any history or penalty, a window is still checked.
    let alone = Batch { penalty_last_n: Some(&[3, -2, 0]), ..Batch::new(Logits::F32(&x), 3, 10) };
    expect_draw_error(&alone, "batch.penalty_last_n[1]: -2 is negative");
}
