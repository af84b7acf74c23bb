//! The request state (`Requests`): a draw whose rows name requests gives exactly what the same
//! draw with the requests' histories passed as lists gives (tokens, flags, logprobs, ranks,
//! top-n and full logprobs, bit for bit), at every SIMD level, on 1 and 2 threads, in both filter
//! orders, over random calls mixing every input of the step; long histories under every window
//! (rows that defer their histories and rows that do not, the prompt's distinct tokens read in
//! place of the prompt); histories built step by step; refusals that write nothing.
mod common;

use common::step::*;
use common::TestRng;
use tokenrace::*;

/// A state holding row r's histories of `step` as request `ids[r]`, and those ids.
fn state_of(step: &StepInputs, rows: usize, rng: &mut TestRng) -> (Requests, Vec<u64>) {
    let mut state = Requests::new();
    // Ids anywhere in the u64 range, distinct.
    let ids: Vec<u64> = (0..rows as u64).map(|r| (rng.u64() & !0xff) | r).collect();
    for (r, &id) in ids.iter().enumerate() {
        let prompt = step.prompt.as_ref().map_or(&[][..], |l| l.row(r));
        let output = step.output.as_ref().map_or(&[][..], |l| l.row(r));
        state.add(id, prompt, output).unwrap();
    }
    (state, ids)
}

/// `b` with its rows' histories taken from `state` instead of its lists.
fn named<'a>(b: Batch<'a>, state: &'a Requests, ids: &'a [u64]) -> Batch<'a> {
    Batch { prompt_tokens: None, output_tokens: None, requests: Some(RequestRows { state, ids }), ..b }
}

/// Every output as bits, one vector each (a NaN is compared by its bits, not unequal to
/// itself).
fn bits(g: &Got) -> [Vec<u32>; 7] {
    let f = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let i = |v: &[i32]| v.iter().map(|&x| x as u32).collect::<Vec<_>>();
    [i(&g.tokens), g.flags.clone(), f(&g.lps), i(&g.ranks), i(&g.ids), f(&g.tlps), f(&g.full)]
}

/// Two samplers of one setting see the same calls (one with lists, one with the state), so
/// their unseeded rows take the same keys.
fn same_draws(cases: &[Case], seed: u64) {
    tokenrace::internals::force_participants(usize::MAX);
    let mut rng = TestRng::new(seed);
    let states: Vec<(Requests, Vec<u64>)> = cases.iter().map(|c| state_of(&c.step, c.rows, &mut rng)).collect();
    for order in ORDERS {
        common::each_level(|level| {
            for threads in [1usize, 2] {
                let lists = Sampler::new(config(level, threads, order)).unwrap();
                let requests = Sampler::new(config(level, threads, order)).unwrap();
                for (case, (state, ids)) in cases.iter().zip(&states) {
                    let with_lists = case.batch();
                    let with_state = named(case.batch(), state, ids);
                    let what = format!("{}: {threads} threads {order:?}", case.label);
                    let (a, b) = (run_batch(&lists, &with_lists, case), run_batch(&requests, &with_state, case));
                    assert_eq!(bits(&a), bits(&b), "{what}");
                    // Tokens and flags alone: a row may then leave its histories to the blocks
                    // it visits.
                    let lean = |s: &Sampler, b: &Batch| {
                        let (mut tokens, mut flags) = (vec![-7; b.rows], vec![0; b.rows]);
                        s.draw(b, &mut Output { flags: Some(&mut flags), ..Output::new(&mut tokens) }).unwrap();
                        (tokens, flags)
                    };
                    assert_eq!(lean(&lists, &with_lists), lean(&requests, &with_state), "{what}, lean");
                }
            }
        });
    }
}

#[test]
fn random_calls_draw_the_same_from_the_state_as_from_lists() {
    let mut edges = Edges::default();
    let mut all = cases(Dtype::F32, 0x5eed_0001, &mut edges);
    all.extend(cases(Dtype::Bf16, 0x5eed_0002, &mut edges).into_iter().step_by(3));
    same_draws(&all, 11);
}

/// Rows of long histories (thousands of tokens, with repeats) under windows around both
/// histories' boundaries, with only-lowering penalties (deferred rows) and a negative frequency
/// penalty (marked up front), seeded and unseeded, with and without the repetition penalty.
#[test]
fn long_histories_under_every_window_draw_the_same() {
    let mut rng = TestRng::new(77);
    let mut out = Vec::new();
    for (vocab, prompt_len, output_len) in [(300usize, 40usize, 30usize), (4096, 2500, 1500), (20000, 5000, 120)] {
        let (p, o) = (prompt_len as i32, output_len as i32);
        let windows = [0, 1, o - 1, o, o + 1, p + o - 1, p + o, p + o + 1, 100_000];
        let rows = windows.len();
        let mut case = make_case(&mut rng, Dtype::F32, out.len(), vocab, rows, &mut Edges::default());
        let (mut prompt, mut output) = (Csr::new(), Csr::new());
        for _ in 0..rows {
            let hot: Vec<i32> = (0..8).map(|_| rng.below(vocab) as i32).collect();
            let mut pick = || if rng.below(2) == 0 { hot[rng.below(8)] } else { rng.below(vocab) as i32 };
            prompt.push(&(0..prompt_len).map(|_| pick()).collect::<Vec<_>>());
            output.push(&(0..output_len).map(|_| pick()).collect::<Vec<_>>());
        }
        let pick3 = |rng: &mut TestRng, v: [f32; 3]| (0..rows).map(|_| v[rng.below(3)]).collect::<Vec<f32>>();
        case.step = StepInputs {
            prompt: Some(prompt),
            output: Some(output),
            repetition: Some(pick3(&mut rng, [1.0, 1.5, 0.8])),
            frequency: Some(pick3(&mut rng, [0.0, 0.4, -0.3])),
            presence: Some(pick3(&mut rng, [0.0, 0.2, 0.5])),
            last_n: Some(windows.to_vec()),
            ..StepInputs::default()
        };
        out.push(case);
    }
    same_draws(&out, 12);
}

/// A state built as a runtime builds it (a request added with its prompt, then a token or a
/// few appended each step, some by a list per request) holds the histories the lists hold, and
/// draws the same.
#[test]
fn histories_built_step_by_step_draw_the_same() {
    let (vocab, rows) = (1000usize, 5usize);
    let mut rng = TestRng::new(3);
    let mut state = Requests::new();
    let ids: Vec<u64> = (0..rows as u64).map(|r| 1000 + 17 * r).collect();
    let mut histories: Vec<(Vec<i32>, Vec<i32>)> = Vec::new();
    for &id in &ids {
        let prompt: Vec<i32> = (0..rng.below(300)).map(|_| rng.below(vocab) as i32).collect();
        state.add(id, &prompt, &[]).unwrap();
        histories.push((prompt, Vec::new()));
    }
    let s_lists = Sampler::new(Config { seed: Some(5), ..Config::default() }).unwrap();
    let s_state = Sampler::new(Config { seed: Some(5), ..Config::default() }).unwrap();
    let x: Vec<f32> = (0..rows * vocab).map(|_| rng.normal() as f32 * 2.0).collect();
    let rep = vec![1.3f32; rows];
    let freq = vec![0.2f32; rows];
    let last_n: Vec<i32> = vec![0, 5, 50, 400, 0];
    for step in 0..40 {
        let (prompt, output) = (
            Csr::from_rows(&histories.iter().map(|h| h.0.clone()).collect::<Vec<_>>()),
            Csr::from_rows(&histories.iter().map(|h| h.1.clone()).collect::<Vec<_>>()),
        );
        let base = Batch {
            repetition_penalty: Some(&rep),
            frequency_penalty: Some(&freq),
            penalty_last_n: Some(&last_n),
            ..Batch::new(Logits::F32(&x), rows, vocab)
        };
        let with_lists = Batch { prompt_tokens: Some(prompt.lists()), output_tokens: Some(output.lists()), ..base };
        let (a, fa) = common::draw(&s_lists, &with_lists);
        let (b, fb) = common::draw(&s_state, &named(base, &state, &ids));
        assert_eq!((&a, &fa), (&b, &fb), "step {step}");
        if step % 4 == 3 {
            // Several tokens per request (a verify call's accepted tokens), request 0 twice.
            let each: Vec<Vec<i32>> =
                (0..rows + 1).map(|_| (0..rng.below(4)).map(|_| rng.below(vocab) as i32).collect()).collect();
            let names: Vec<u64> = ids.iter().copied().chain([ids[0]]).collect();
            let lists = Csr::from_rows(&each);
            state.append(&names, &lists.ids, Some(&lists.offsets)).unwrap();
            for (i, new) in each.iter().enumerate() {
                histories[i % rows].1.extend_from_slice(new);
            }
        } else {
            state.append(&ids, &a, None).unwrap();
            for (h, &t) in histories.iter_mut().zip(&a) {
                h.1.push(t);
            }
        }
        for (r, &id) in ids.iter().enumerate() {
            assert_eq!(state.output(id).unwrap(), &histories[r].1[..]);
        }
    }
}

#[test]
fn bad_request_rows_are_refused_naming_the_row_and_id() {
    let x = vec![0.5f32; 3 * 10];
    let mut state = Requests::new();
    state.add(1, &[1, 2], &[3]).unwrap();
    state.add(2, &[], &[9]).unwrap();
    state.add(3, &[10], &[]).unwrap();
    let base = Batch { repetition_penalty: Some(&[1.5, 1.5, 1.5]), ..Batch::new(Logits::F32(&x), 3, 10) };
    let rows = |ids| Batch { requests: Some(RequestRows { state: &state, ids }), ..base };
    // Every row naming live requests within the vocabulary draws.
    common::draw(&Sampler::new(Config::default()).unwrap(), &rows(&[1, 2, 2]));
    expect_draw_error(&rows(&[1, 4, 2]), "batch.request_ids[1]: request 4 is not in the requests state");
    expect_draw_error(&rows(&[1, 2, 3]), "batch.request_ids[2]: request 3's histories hold token 10, outside vocab 10");
    expect_draw_error(&rows(&[1, 2]), "batch.request_ids: has 2 elements");
    let output = TokenLists { ids: &[1, 2, 3], offsets: &[0, 1, 2, 3] };
    expect_draw_error(
        &Batch { output_tokens: Some(output), ..rows(&[1, 2, 2]) },
        "batch.request_ids: given with output_ids",
    );
    let prompt = output;
    expect_draw_error(
        &Batch { prompt_tokens: Some(prompt), ..rows(&[1, 2, 2]) },
        "batch.request_ids: given with prompt_ids",
    );
}

#[test]
fn refused_operations_change_nothing() {
    let mut state = Requests::new();
    state.add(5, &[1, 2, 3], &[4]).unwrap();
    let err = state.add(5, &[9], &[]).unwrap_err();
    assert!(err.message.contains("request 5 is already in the state"), "{err}");
    assert!(state.add(6, &[1, -2], &[]).unwrap_err().message.contains("prompt[1]: -2 is not a token id"));
    assert!(!state.contains(6));
    assert!(state.append(&[5, 6], &[7, 8], None).unwrap_err().message.contains("ids[1]: request 6"));
    assert!(state.append(&[5], &[7], Some(&[0, 2])).unwrap_err().message.contains("offsets[1]: 2 exceeds"));
    assert!(state.append(&[5, 5], &[7], Some(&[1, 0, 1])).unwrap_err().message.contains("offsets[1]: 0 is below"));
    assert!(state.append(&[5, 5], &[7], None).unwrap_err().message.contains("tokens: has 1 entries"));
    assert_eq!(state.output(5).unwrap(), &[4]);
    assert_eq!(state.prompt(5).unwrap(), &[1, 2, 3]);
    assert!(state.remove(6).unwrap_err().message.contains("request 6 is not in the state"));
    assert_eq!(state.len(), 1);
}

/// A bad word's prefix is matched against the output the row names: with the state, its
/// request's output (found by fuzzing: the state's rows once matched against no output at all,
/// so a word longer than one token never banned anything there).
#[test]
fn bad_words_match_the_requests_output() {
    let vocab = 8usize;
    // Token 5 is by far the most probable; every row but the first has it banned by a word
    // whose prefix ends its output.
    let mut x = vec![0.0f32; 4 * vocab];
    for r in 0..4 {
        x[r * vocab + 5] = 30.0;
    }
    let mut state = Requests::new();
    let outputs: [&[i32]; 4] = [&[1, 3], &[1, 2], &[7, 1, 2], &[2]];
    for (r, o) in outputs.iter().enumerate() {
        state.add(r as u64, &[4], o).unwrap();
    }
    let ids = [0u64, 1, 2, 3];
    // Row r's words: [1, 2, 5] (bans 5 after ..1, 2), and for row 3 [2, 5].
    let words = [1, 2, 5, 1, 2, 5, 1, 2, 5, 2, 5];
    let word_offsets = [0u64, 3, 6, 9, 11];
    let row_offsets = [0u64, 1, 2, 3, 4];
    let bad = BadWords { ids: &words, word_offsets: &word_offsets, row_offsets: &row_offsets };
    let (out_ids, out_offsets): (Vec<i32>, Vec<u64>) = {
        let mut offs = vec![0u64];
        let mut ids = Vec::new();
        for o in outputs {
            ids.extend_from_slice(o);
            offs.push(ids.len() as u64);
        }
        (ids, offs)
    };
    let base = Batch {
        temperature: Some(&[0.0, 0.0, 1.0, 1.0]),
        seeds: Some(&[1, 2, 3, 4]),
        bad_words: Some(bad),
        ..Batch::new(Logits::F32(&x), 4, vocab)
    };
    let with_lists = Batch { output_tokens: Some(TokenLists { ids: &out_ids, offsets: &out_offsets }), ..base };
    let with_state = Batch { requests: Some(RequestRows { state: &state, ids: &ids }), ..base };
    common::each_level(|level| {
        let s = Sampler::new(config(level, 1, ORDERS[0])).unwrap();
        let a = common::draw(&s, &with_lists);
        let b = common::draw(&s, &with_state);
        assert_eq!(a, b, "{level:?}: the state and the lists drew differently");
        assert_eq!(a.0[0], 5, "{level:?}: row 0's output does not end with the prefix");
        assert!(a.0[1..].iter().all(|&t| t != 5), "{level:?}: a banned token was drawn: {a:?}");
    });
}

/// The sampling parameters of row `r` of `b` (a validated batch), as a request holds them.
fn params_of(b: &Batch, r: usize) -> RequestParams {
    let f = |s: Option<&[f32]>, off: f32| s.map_or(off, |s| s[r]);
    let i = |s: Option<&[i32]>, off: i32| s.map_or(off, |s| s[r]);
    let list = |l: Option<TokenLists>| l.map_or(Vec::new(), |l| l.row(r).to_vec());
    let (bias_ids, bias_values) = b.logit_bias.map_or((&[][..], &[][..]), |l| l.row(r));
    let restricted = b.allowed_tokens.is_some() && b.allowed_rows.is_none_or(|m| m[r] != 0);
    RequestParams {
        temperature: f(b.temperature, 1.0),
        seed: b.seed_of(r).map(|(seed, _)| seed),
        top_k: i(b.top_k, 0),
        top_p: f(b.top_p, 1.0),
        min_p: f(b.min_p, 0.0),
        top_n_sigma: f(b.top_n_sigma, 0.0),
        min_keep: i(b.min_keep, 0),
        typical_p: f(b.typical_p, 1.0),
        repetition_penalty: f(b.repetition_penalty, 1.0),
        frequency_penalty: f(b.frequency_penalty, 0.0),
        presence_penalty: f(b.presence_penalty, 0.0),
        penalty_last_n: i(b.penalty_last_n, 0),
        min_tokens: i(b.min_tokens, 0),
        stop_tokens: list(b.stop_tokens),
        bias_ids: bias_ids.to_vec(),
        bias_values: bias_values.to_vec(),
        allowed_tokens: restricted.then(|| list(b.allowed_tokens)),
        banned_tokens: list(b.banned_tokens),
    }
}

/// `b` without the arrays a request's parameters hold (its offsets kept: a seeded row's
/// position stays the batch's).
fn without_params(b: Batch) -> Batch {
    Batch {
        temperature: None,
        seeds: None,
        seeded: None,
        top_k: None,
        top_p: None,
        min_p: None,
        top_n_sigma: None,
        min_keep: None,
        typical_p: None,
        repetition_penalty: None,
        frequency_penalty: None,
        presence_penalty: None,
        penalty_last_n: None,
        min_tokens: None,
        stop_tokens: None,
        logit_bias: None,
        allowed_tokens: None,
        allowed_rows: None,
        banned_tokens: None,
        ..b
    }
}

/// Random calls mixing every input of the step, each row's sampling parameters held by its
/// request instead of passed as arrays: the same outputs, bit for bit, at every level, on 1 and
/// 2 threads, in both filter orders.
#[test]
fn parameters_held_by_the_state_draw_as_the_batch_arrays() {
    tokenrace::internals::force_participants(usize::MAX);
    let mut edges = Edges::default();
    let mut all = cases(Dtype::F32, 0x5eed_0003, &mut edges);
    all.extend(cases(Dtype::Bf16, 0x5eed_0004, &mut edges).into_iter().step_by(3));
    let mut rng = TestRng::new(13);
    let states: Vec<(Requests, Vec<u64>)> = all
        .iter()
        .map(|c| {
            let (mut state, ids) = state_of(&c.step, c.rows, &mut rng);
            let b = c.batch();
            for (r, &id) in ids.iter().enumerate() {
                state.set_params(id, params_of(&b, r)).unwrap();
            }
            (state, ids)
        })
        .collect();
    for order in ORDERS {
        common::each_level(|level| {
            for threads in [1usize, 2] {
                let lists = Sampler::new(config(level, threads, order)).unwrap();
                let held = Sampler::new(config(level, threads, order)).unwrap();
                for (case, (state, ids)) in all.iter().zip(&states) {
                    let with_state = without_params(named(case.batch(), state, ids));
                    let what = format!("{}: {threads} threads {order:?}", case.label);
                    let (a, b) = (run_batch(&lists, &case.batch(), case), run_batch(&held, &with_state, case));
                    assert_eq!(bits(&a), bits(&b), "{what}");
                }
            }
        });
    }
}

/// A batch's own array wins over what the requests hold, for every row; a request without
/// parameters draws with the defaults; a seeded request without the batch's offsets draws at
/// its output length (and moves on as tokens are appended); the parameters come back as set.
#[test]
fn batch_arrays_override_the_held_parameters_and_seeds_follow_the_output() {
    let (vocab, rows) = (500usize, 4usize);
    let mut rng = TestRng::new(21);
    let x: Vec<f32> = (0..rows * vocab).map(|_| rng.normal() as f32 * 2.0).collect();
    let mut state = Requests::new();
    let ids = [40u64, 41, 42, 43];
    let mut outputs: Vec<Vec<i32>> = vec![vec![], vec![3, 3], vec![9; 7], vec![1]];
    for (r, &id) in ids.iter().enumerate() {
        state.add(id, &[5, 6, 7], &outputs[r]).unwrap();
    }
    let held =
        RequestParams { temperature: 0.7, seed: Some(99), top_p: 0.8, repetition_penalty: 1.3, ..Default::default() };
    for &id in &ids[..3] {
        state.set_params(id, held.clone()).unwrap();
    }
    assert_eq!(state.params(40).unwrap(), held);
    assert_eq!(state.params(43).unwrap(), RequestParams::default());
    let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    for step in 0..6 {
        // The same draw spelled out: row 3 (no parameters) unseeded at the defaults, the
        // others seeded at their output lengths.
        let (prompt, output) = (Csr::from_rows(&vec![vec![5, 6, 7]; 4]), Csr::from_rows(&outputs));
        let offsets: Vec<u64> = outputs.iter().map(|o| o.len() as u64).collect();
        let spelled = Batch {
            temperature: Some(&[0.7, 0.7, 0.7, 1.0]),
            seeds: Some(&[99, 99, 99, 0]),
            seeded: Some(&[1, 1, 1, 0]),
            offsets: Some(&offsets),
            top_p: Some(&[0.8, 0.8, 0.8, 1.0]),
            repetition_penalty: Some(&[1.3, 1.3, 1.3, 1.0]),
            prompt_tokens: Some(prompt.lists()),
            output_tokens: Some(output.lists()),
            ..Batch::new(Logits::F32(&x), rows, vocab)
        };
        let named = Batch {
            requests: Some(RequestRows { state: &state, ids: &ids }),
            ..Batch::new(Logits::F32(&x), rows, vocab)
        };
        let seeded = |b: &Batch| common::draw(&s, b).0[..3].to_vec();
        assert_eq!(seeded(&named), seeded(&spelled), "step {step}");
        // The batch's temperature, when given, is every row's.
        let temps = [0.0f32, 2.0, 0.0, 0.0];
        let (a, b) = (
            seeded(&Batch { temperature: Some(&temps), ..named }),
            seeded(&Batch { temperature: Some(&temps), ..spelled }),
        );
        assert_eq!(a, b, "step {step}, the batch's temperatures");
        let drawn = seeded(&named);
        let new = [drawn[0], drawn[1], drawn[2], 0];
        state.append(&ids, &new, None).unwrap();
        for (o, &t) in outputs.iter_mut().zip(&new) {
            o.push(t);
        }
    }
    assert_eq!(state.params(41).unwrap(), held);
}

/// A refused parameter names its field and leaves the request's parameters as they were; a
/// listed token outside a draw's vocabulary refuses that draw naming the row and request.
#[test]
fn bad_parameters_are_refused_naming_the_field() {
    let mut state = Requests::new();
    state.add(8, &[1], &[]).unwrap();
    let good = RequestParams { top_k: 5, ..Default::default() };
    state.set_params(8, good.clone()).unwrap();
    let cases: [(RequestParams, &str); 8] = [
        (RequestParams { top_p: 1.5, ..Default::default() }, "params.top_p: 1.5 is not in (0, 1]"),
        (
            RequestParams { temperature: -1.0, ..Default::default() },
            "params.temperature: -1 is not a finite number >= 0",
        ),
        (
            RequestParams { repetition_penalty: 0.0, ..Default::default() },
            "params.repetition_penalty: 0 is not a finite number > 0",
        ),
        (RequestParams { min_tokens: -2, ..Default::default() }, "params.min_tokens: -2 is negative"),
        (RequestParams { banned_tokens: vec![3, -4], ..Default::default() }, "params.banned_ids"),
        (RequestParams { bias_ids: vec![3], bias_values: vec![f32::NAN], ..Default::default() }, "params.bias_values"),
        (
            RequestParams { bias_ids: vec![3, 4], bias_values: vec![1.0], ..Default::default() },
            "params.bias_values: has 1 entries",
        ),
        (RequestParams { typical_p: 0.0, ..Default::default() }, "params.typical_p: 0 is not in (0, 1]"),
    ];
    for (p, want) in cases {
        let err = state.set_params(8, p).unwrap_err();
        assert!(err.message.starts_with(want), "{err} (wanted {want})");
        assert_eq!(state.params(8).unwrap(), good);
    }
    assert!(state.set_params(9, good.clone()).unwrap_err().message.contains("request 9 is not in the state"));
    state.set_params(8, RequestParams { stop_tokens: vec![10], min_tokens: 2, ..Default::default() }).unwrap();
    let x = vec![0.5f32; 10];
    let b = Batch { requests: Some(RequestRows { state: &state, ids: &[8] }), ..Batch::new(Logits::F32(&x), 1, 10) };
    expect_draw_error(&b, "batch.request_ids[0]: request 8's parameters name token 10, outside vocab 10");
}

/// Long outputs that repeat their likeliest tokens a different number of times each, so that
/// the winner turns on each token's exact count, and likelier tokens that only the prompt holds:
/// the state's counts of the output (its bits and repeats) and its prompt's bits, read in place
/// of the lists where the window keeps them whole, in rows marked up front (unmasked) and in
/// rows that work out only the blocks they visit (with a bitmask), draw what the lists draw,
/// greedy and seeded, at every level.
#[test]
fn held_output_counts_draw_what_the_list_draws() {
    let (vocab, rows) = (20000usize, 8usize);
    let mut rng = TestRng::new(41);
    let mut x = vec![0f32; rows * vocab];
    let mut state = Requests::new();
    let ids: Vec<u64> = (0..rows as u64).map(|r| 500 + r).collect();
    let (mut prompts, mut outputs) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let row = &mut x[r * vocab..(r + 1) * vocab];
        row.iter_mut().for_each(|v| *v = rng.normal() as f32);
        // Twenty hot tokens near 10, each repeated 1 to 60 times in the output, and ten near 9.5
        // that only the prompt holds: the repetition penalty takes them below the least
        // repeated of the twenty, without it they would win.
        let hot: Vec<i32> = (0..30).map(|_| rng.below(vocab) as i32).collect();
        let mut output = Vec::new();
        for &t in &hot[..20] {
            row[t as usize] = 10.0 + 0.05 * rng.below(20) as f32;
            output.extend(std::iter::repeat_n(t, 1 + rng.below(60)));
        }
        for &t in &hot[20..] {
            row[t as usize] = 9.0 + 0.05 * rng.below(20) as f32;
        }
        output.extend((0..3000).map(|_| rng.below(vocab) as i32));
        // (Shuffled: the counts, not the order, decide.)
        for i in (1..output.len()).rev() {
            output.swap(i, rng.below(i + 1));
        }
        let mut prompt: Vec<i32> = (0..5000).map(|_| rng.below(vocab) as i32).collect();
        prompt.extend(&hot[20..]);
        state.add(ids[r], &prompt, &output).unwrap();
        prompts.push(prompt);
        outputs.push(output);
    }
    let (prompt, output) = (Csr::from_rows(&prompts), Csr::from_rows(&outputs));
    let freq = vec![0.1f32; rows];
    let pres = vec![0.05f32; rows];
    let rep = vec![1.2f32; rows];
    let seeds: Vec<u64> = (0..rows as u64).collect();
    // A bitmask keeping a third of the tokens (the hot ones among them): held histories are
    // then left to the visited blocks, unmasked rows mark them up front.
    let words = vocab.div_ceil(32);
    let mut mask = vec![0i32; rows * words];
    for r in 0..rows {
        for t in 0..vocab {
            if rng.below(3) == 0 || x[r * vocab + t] > 8.5 {
                mask[r * words + t / 32] |= 1 << (t % 32);
            }
        }
    }
    let masks = [None, Some(TokenBitmask { words: &mask, row_stride: words })];
    for (temps, bitmask) in
        [vec![0.0f32; rows], vec![0.3f32; rows]].iter().flat_map(|t| masks.iter().map(move |m| (t, *m)))
    {
        let base = Batch {
            temperature: Some(temps),
            seeds: Some(&seeds),
            token_bitmask: bitmask,
            repetition_penalty: Some(&rep),
            frequency_penalty: Some(&freq),
            presence_penalty: Some(&pres),
            ..Batch::new(Logits::F32(&x), rows, vocab)
        };
        let with_lists = Batch { prompt_tokens: Some(prompt.lists()), output_tokens: Some(output.lists()), ..base };
        let with_state = Batch { requests: Some(RequestRows { state: &state, ids: &ids }), ..base };
        let what = format!("T {}, bitmask {}", temps[0], bitmask.is_some());
        common::each_level(|level| {
            for threads in [1usize, 2] {
                let s = Sampler::new(config(level, threads, ORDERS[0])).unwrap();
                // Tokens and flags alone (rows may defer their histories), then with logprobs
                // (rows marked up front).
                assert_eq!(
                    common::draw(&s, &with_lists),
                    common::draw(&s, &with_state),
                    "{what}: {level:?} {threads} threads"
                );
                let full = |b: &Batch| {
                    let (mut tokens, mut lps) = (vec![-7; rows], vec![0f32; rows]);
                    let mut out = Output {
                        logprobs: Some(&mut lps),
                        logprob_mode: LogprobMode::Processed,
                        ..Output::new(&mut tokens)
                    };
                    s.draw(b, &mut out).unwrap();
                    (tokens, lps.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
                };
                assert_eq!(full(&with_lists), full(&with_state), "{what}: {level:?} {threads} threads, logprobs");
            }
        });
    }
}
