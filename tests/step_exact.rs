//! Rows of the sampling step that the spec (`docs/semantics.md`, The sampling step) decides
//! exactly: hand-made rows (overflows, -inf bias on +inf and NaN, bias sums, empty allowed
//! lists), a signed-zero tie of raw logprobs, CSR windows, empty batches and inputs that change
//! nothing, and the filters of a processed row decided after the race.
mod common;

use common::reference as rf;
use common::step::*;
use common::TestRng;
use tokenrace::*;

/// Found by the random batches (an F16 row of N(0, 300) logits whose history tokens were set to
/// -0.0 and 0.0, every token masked): RAW logprobs are those of the logits as given, whatever the
/// step does, so a row whose maximum 0 is held by a -0.0 before a +0.0 has every zero at
/// `-ln(count of zeros)`, as a plain draw of the same logits reports.
#[test]
fn raw_logprobs_of_a_processed_row_whose_maximum_is_a_signed_zero_tie() {
    let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    let x = [-0.0f32, 0.0, 0.0, -5.0];
    let z = 3.0f64 + (-5.0f64).exp();
    let want = [-z.ln(), -z.ln(), -z.ln(), -5.0 - z.ln()];
    let bias = LogitBias { ids: &[3], values: &[0.0], offsets: &[0, 1] };
    let banned = TokenLists { ids: &[0, 1, 2, 3], offsets: &[0, 4] };
    for (what, b) in [
        ("no step input", Batch::new(Logits::F32(&x), 1, 4)),
        ("a bias of 0 on token 3", Batch { logit_bias: Some(bias), ..Batch::new(Logits::F32(&x), 1, 4) }),
        ("every token banned", Batch { banned_tokens: Some(banned), ..Batch::new(Logits::F32(&x), 1, 4) }),
    ] {
        let (mut tok, mut lp, mut full) = ([0i32], [0f32], [0f32; 4]);
        s.draw(
            &b,
            &mut Output {
                logprobs: Some(&mut lp),
                full_logprobs: Some(&mut full),
                full_row_stride: 4,
                ..Output::new(&mut tok)
            },
        )
        .unwrap();
        assert!(
            rf::lp_close(lp[0], want[tok[0] as usize]),
            "{what}: RAW logprob of token {}: got {}, want {}",
            tok[0],
            lp[0],
            want[tok[0] as usize]
        );
        for i in 0..4 {
            assert!(
                rf::lp_close(full[i], want[i]),
                "{what}: full RAW logprob of token {i}: got {}, want {}",
                full[i],
                want[i]
            );
        }
    }
}

/// Hand-made rows whose token the spec decides without a race (greedy, +inf, a single
/// candidate): every level, both thread counts and orders, and the reference, must agree exactly.
#[test]
fn hand_made_rows_follow_the_spec_exactly() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let none = rf::RowInputs::NONE;
    let no_bits: &[i32] = &[0b110];
    // (what, logits, inputs, temperature, token, flags)
    type Row<'a> = (&'a str, Vec<f32>, rf::RowInputs<'a>, f32, usize, u32);
    // Rows of four blocks of 256 tokens (the blocks the draw bounds and works out one by one),
    // -1 everywhere but at the named tokens.
    let blocks = |spikes: &[(usize, f32)]| {
        let mut x = vec![-1.0f32; 1024];
        for &(i, v) in spikes {
            x[i] = v;
        }
        x
    };
    let falling = blocks(&[(10, 5.0), (300, 4.8), (600, 4.7)]);
    let rows: Vec<Row> = vec![
        // The maximum (block 0) and the next (block 1) are repeated below the third (block 2).
        (
            "repeated maxima of two blocks, greedy",
            falling.clone(),
            rf::RowInputs { prompt: &[10, 300], repetition: 1.2, ..none },
            0.0,
            600,
            rf::GREEDY,
        ),
        (
            "repeated maxima of two blocks, sampled",
            falling.clone(),
            rf::RowInputs { prompt: &[300, 10], repetition: 1.2, ..none },
            1e-3,
            600,
            0,
        ),
        (
            "counted maxima of two blocks",
            falling.clone(),
            rf::RowInputs { output: &[300, 10, 10], frequency: 0.2, presence: 0.1, ..none },
            0.0,
            600,
            rf::GREEDY,
        ),
        (
            "a raising bias in another block",
            blocks(&[(10, 5.0), (700, 1.0)]),
            rf::RowInputs { bias_ids: &[700], bias_values: &[10.0], ..none },
            0.0,
            700,
            rf::GREEDY,
        ),
        (
            "a raising bias under repetition",
            blocks(&[(10, 5.0), (700, 1.0)]),
            rf::RowInputs { prompt: &[700, 10], repetition: 1.1, bias_ids: &[700], bias_values: &[10.0], ..none },
            1e-3,
            700,
            0,
        ),
        // 5 / 1.25 = 4 exactly: three blocks tie at 4, the lowest token wins.
        (
            "a tie of a repeated and two untouched maxima",
            blocks(&[(10, 5.0), (300, 4.0), (600, 4.0)]),
            rf::RowInputs { prompt: &[10], repetition: 1.25, ..none },
            0.0,
            10,
            rf::GREEDY,
        ),
        (
            "a tie below a repeated maximum",
            blocks(&[(5, 4.0), (300, 5.0)]),
            rf::RowInputs { prompt: &[300], repetition: 1.25, ..none },
            0.0,
            5,
            rf::GREEDY,
        ),
        (
            "a masked maximum and a repeated one",
            blocks(&[(10, 5.0), (300, 4.8), (600, 4.7)]),
            rf::RowInputs { prompt: &[300], repetition: 1.2, banned: &[10], ..none },
            0.0,
            600,
            rf::GREEDY,
        ),
        ("a banned +inf", vec![1.0, inf, 2.0], rf::RowInputs { banned: &[1], ..none }, 0.0, 2, rf::GREEDY),
        (
            "a -inf bias on +inf",
            vec![1.0, inf, 2.0],
            rf::RowInputs { bias_ids: &[1], bias_values: &[f32::NEG_INFINITY], ..none },
            0.0,
            2,
            rf::GREEDY,
        ),
        (
            "a masked NaN",
            vec![nan, 1.0, 2.0],
            rf::RowInputs { bitmask: Some(no_bits), ..none },
            0.0,
            2,
            rf::GREEDY | rf::HAS_NAN,
        ),
        (
            "a -inf bias on NaN",
            vec![nan, 1.0, 2.0],
            rf::RowInputs { bias_ids: &[0], bias_values: &[f32::NEG_INFINITY], ..none },
            0.0,
            2,
            rf::GREEDY | rf::HAS_NAN,
        ),
        (
            "a bias overflowing to +inf",
            vec![1.0, 3e38, 2.0],
            rf::RowInputs { bias_ids: &[1], bias_values: &[3e38], ..none },
            1.0,
            1,
            rf::HAS_POSINF,
        ),
        (
            "a bias on -inf",
            vec![f32::NEG_INFINITY, -1.0, -2.0],
            rf::RowInputs { bias_ids: &[0], bias_values: &[50.0], ..none },
            0.0,
            1,
            rf::GREEDY,
        ),
        (
            "repetition on +inf",
            vec![1.0, inf, inf],
            rf::RowInputs { prompt: &[1], repetition: 2.0, ..none },
            1.0,
            1,
            rf::HAS_POSINF,
        ),
        (
            "frequency reorders",
            vec![1.0, 2.0],
            rf::RowInputs { output: &[1, 1, 1], frequency: 1.0, ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        (
            "presence reorders",
            vec![1.0, 1.5],
            rf::RowInputs { output: &[1], presence: 0.6, ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        // r > 1 on a negative logit makes it smaller, on a positive one smaller too; r < 1 the reverse.
        (
            "repetition on a negative logit",
            vec![-1.0, -1.5],
            rf::RowInputs { prompt: &[0], repetition: 2.0, ..none },
            0.0,
            1,
            rf::GREEDY,
        ),
        (
            "repetition below 1 on a negative logit",
            vec![-1.0, -0.6],
            rf::RowInputs { prompt: &[0], repetition: 0.5, ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        (
            "repetition on zero",
            vec![0.0, -0.1],
            rf::RowInputs { output: &[0], repetition: 3.0, ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        (
            "f * c overflows to -inf",
            vec![1.0, 2.0],
            rf::RowInputs { output: &[1, 1], frequency: 3e38, ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        // -f * c overflows to +inf: the token becomes +inf, a banned one stays -inf (never NaN).
        (
            "-f * c overflows to +inf",
            vec![1.0, 2.0, 0.0],
            rf::RowInputs { output: &[1, 1, 2, 2], frequency: -3e38, banned: &[2], ..none },
            1.0,
            1,
            rf::HAS_POSINF,
        ),
        // The biases of one id are summed first: (1e8 + -1e8) = 0, so y = 1 (not (1 + 1e8) - 1e8 = 0).
        (
            "biases summed before they are added",
            vec![1.0, 0.9],
            rf::RowInputs { bias_ids: &[0, 0], bias_values: &[1e8, -1e8], ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        (
            "-inf bias on the only finite token",
            vec![f32::NEG_INFINITY, 4.0],
            rf::RowInputs { bias_ids: &[1], bias_values: &[f32::NEG_INFINITY], ..none },
            1.0,
            0,
            rf::EMPTY,
        ),
        ("an empty allowed list", vec![1.0, 2.0], rf::RowInputs { allowed: Some(&[]), ..none }, 1.0, 0, rf::EMPTY),
        ("an allowed list of one", vec![1.0, 2.0, 3.0], rf::RowInputs { allowed: Some(&[0, 0]), ..none }, 1.0, 0, 0),
        ("banned twice", vec![5.0, 2.0, 3.0], rf::RowInputs { banned: &[0, 0], ..none }, 0.0, 2, rf::GREEDY),
        (
            "a large bias on a banned token",
            vec![5.0, 2.0, 3.0],
            rf::RowInputs { banned: &[1], bias_ids: &[1], bias_values: &[100.0], ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
    ];
    let setups = setups();
    for (what, x, p, t, token, fl) in &rows {
        let vocab = x.len();
        let y = rf::effective_row(x, p);
        let d = rf::draw_step(
            x,
            &y,
            *t,
            1e-5,
            rf::Noise::Inline(rf::row_key(3, 4)),
            rf::Filters::OFF,
            rf::Order::TemperatureFirst,
        );
        // (The effective row of a short row says what went wrong; a long one would bury it.)
        let shown = if vocab <= 16 { format!("{y:?}") } else { format!("{vocab} tokens") };
        assert_eq!((d.token, d.flags), (*token, *fl), "the reference on {what}: effective row {shown}");
        let lists = |ids: &[i32]| Csr::from_rows(&[ids.to_vec()]);
        let mut bias = BiasCsr::new();
        bias.push(&p.bias_ids.iter().copied().zip(p.bias_values.iter().copied()).collect::<Vec<_>>());
        let step = StepInputs {
            prompt: Some(lists(p.prompt)),
            output: Some(lists(p.output)),
            repetition: Some(vec![p.repetition]),
            frequency: Some(vec![p.frequency]),
            presence: Some(vec![p.presence]),
            last_n: Some(vec![p.last_n]),
            bias: Some(bias),
            allowed: p.allowed.map(lists),
            allowed_rows: None,
            banned: Some(lists(p.banned)),
            bitmask: p.bitmask.map(|w| (w.to_vec(), 1)),
            min_tokens: Some(vec![p.min_tokens]),
            stop: Some(lists(p.stop)),
        };
        for setup in &setups {
            let b = step.apply(Batch {
                temperature: Some(std::slice::from_ref(t)),
                seeds: Some(&[3]),
                offsets: Some(&[4]),
                ..Batch::new(Logits::F32(x), 1, vocab)
            });
            let (tokens, flags) = common::draw(&setup.fused, &b);
            assert_eq!(
                (tokens[0] as usize, flags[0]),
                (*token, *fl),
                "{what} [{} level, {} threads, {:?}]: effective row {shown}",
                setup.level.name(),
                setup.threads,
                setup.order
            );
        }
    }
}

/// CSR offsets need not start at 0 (rows may be a window of a longer list), a batch of no rows
/// takes one offset, and an all-ones bitmask, an unrestricted row's allowed list and r = 1
/// change nothing.
#[test]
fn csr_windows_empty_batches_and_inputs_that_change_nothing() {
    let s = Sampler::new(Config { seed: Some(5), ..Config::default() }).unwrap();
    let mut rng = TestRng::new(9);
    let (rows, vocab) = (3usize, 300usize);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let seeds = [1u64, 2, 3];
    let base = Batch { seeds: Some(&seeds), ..Batch::new(Logits::F32(&x), rows, vocab) };
    let ids: Vec<i32> = (0..40).map(|_| rng.below(vocab) as i32).collect();
    let values: Vec<f32> = (0..40).map(|_| (rng.normal() * 3.0) as f32).collect();
    let at_zero: Vec<u64> = vec![0, 5, 5, 17];
    let windowed: Vec<u64> = at_zero.iter().map(|o| o + 11).collect();
    let with = |offsets: &[u64], ids: &[i32], values: &[f32]| {
        let lists = TokenLists { ids, offsets };
        let b = Batch {
            prompt_tokens: Some(lists),
            output_tokens: Some(lists),
            repetition_penalty: Some(&[1.5, 0.5, 2.0]),
            frequency_penalty: Some(&[0.5, 0.5, 0.5]),
            logit_bias: Some(LogitBias { ids, values, offsets }),
            banned_tokens: Some(lists),
            ..base
        };
        common::draw(&s, &b)
    };
    assert_eq!(with(&windowed, &ids, &values), with(&at_zero, &ids[11..], &values[11..]), "a window of the lists");
    // Inputs that change nothing draw what the plain call draws.
    let plain = common::draw(&s, &base);
    let ones = vec![-1i32; rows * vocab.div_ceil(32)];
    let free = Batch {
        token_bitmask: Some(TokenBitmask { words: &ones, row_stride: vocab.div_ceil(32) }),
        allowed_tokens: Some(TokenLists { ids: &ids, offsets: &at_zero }),
        allowed_rows: Some(&[0, 0, 0]),
        prompt_tokens: Some(TokenLists { ids: &ids, offsets: &at_zero }),
        repetition_penalty: Some(&[1.0; 3]),
        frequency_penalty: Some(&[0.0; 3]),
        presence_penalty: Some(&[0.0; 3]),
        ..base
    };
    assert_eq!(common::draw(&s, &free), plain, "an all-ones bitmask, unrestricted rows, r = 1");
    // No rows: one offset, nothing drawn.
    let none = TokenLists { ids: &[], offsets: &[0] };
    let empty = Batch {
        prompt_tokens: Some(none),
        banned_tokens: Some(none),
        token_bitmask: Some(TokenBitmask { words: &[], row_stride: 10 }),
        ..Batch::new(Logits::F32(&[]), 0, vocab)
    };
    s.draw(&empty, &mut Output { full_logprobs: Some(&mut []), full_row_stride: vocab, ..Output::new(&mut []) })
        .unwrap();
    let err = s.draw(
        &Batch { prompt_tokens: Some(TokenLists { ids: &[], offsets: &[] }), ..empty },
        &mut Output::new(&mut []),
    );
    assert!(err.unwrap_err().message.contains("batch.prompt_offsets: has 0 elements, rows + 1 is 1"));
}

/// A row with a step (penalties, bias, banned tokens) and filters, on a peaked row, may be raced
/// block by block and have its filters decided for the winner alone, without its processed
/// values written out; a call asking for processed logprobs writes them out and computes the
/// floor first. Both must give the same token for the same seed, at every level, both filter
/// orders, f32 and bf16. The histories hold the peaks (the touched tokens are the likely ones),
/// a positive bias raises a token of the bulk to the top in some rows, and four near-equal peaks
/// share a block in every third row, so that top-k 2-3 and top-p 0.3-0.8 cut between them.
#[test]
fn filters_of_a_processed_row_decided_after_the_race_give_the_tokens_of_the_threshold() {
    let mut rng = TestRng::new(43);
    let (rows, vocab) = (36usize, 20_003usize);
    let mut x = Vec::new();
    let (mut prompt, mut output, mut bias_ids, mut bias_values, mut banned) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut p_off, mut o_off, mut b_off, mut ban_off) = (vec![0u64], vec![0u64], vec![0u64], vec![0u64]);
    for r in 0..rows {
        let mut row = common::peaked_logits(&mut rng, vocab, 1.0, 12.0);
        if r % 3 == 0 {
            for (j, i) in [(0, 5002), (1, 5003), (2, 5004), (3, 5010)] {
                row[i] = 12.0 - 0.25 * j as f32;
            }
        }
        let mut top: Vec<usize> = (0..vocab).collect();
        top.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        // The prompt: the two likeliest tokens and 200 random ones; the output: the third
        // likeliest three times and 50 random ones.
        prompt.extend(top[..2].iter().map(|&i| i as i32));
        prompt.extend((0..200).map(|_| rng.below(vocab) as i32));
        output.extend([top[2] as i32; 3]);
        output.extend((0..50).map(|_| rng.below(vocab) as i32));
        if r % 4 == 1 {
            // A bulk token raised to the top, and a peak banned by bias.
            bias_ids.extend([top[5000] as i32, top[1] as i32]);
            bias_values.extend([12.0 - row[top[5000]] + 0.1, f32::NEG_INFINITY]);
        }
        if r % 5 == 2 {
            banned.push(top[0] as i32);
        }
        p_off.push(prompt.len() as u64);
        o_off.push(output.len() as u64);
        b_off.push(bias_ids.len() as u64);
        ban_off.push(banned.len() as u64);
        x.extend(row);
    }
    let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.7, 1.2, 0.9][r % 4]).collect();
    let ps: Vec<f32> = (0..rows).map(|r| [0.9, 0.5, 0.75, 0.99, 0.3, 0.95, 1.0][r % 7]).collect();
    let mps: Vec<f32> = (0..rows).map(|r| [0.0, 0.0, 0.02, 0.0, 0.2][r % 5]).collect();
    let ks: Vec<i32> = (0..rows).map(|r| [3, 2, 0, 2, 50, 1][r % 6]).collect();
    let rep: Vec<f32> = (0..rows).map(|r| [1.1, 1.3, 1.0, 1.2][r % 4]).collect();
    let (freq, pres) = (vec![0.2f32; rows], vec![0.1f32; rows]);
    let b16: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
    for order in [rf::Order::TemperatureFirst, rf::Order::FiltersFirst] {
        for level in supported_levels() {
            let s = Sampler::new(config(level, 1, order)).unwrap();
            for logits in [Logits::F32(&x), Logits::Bf16(&b16)] {
                for call in 0..10u64 {
                    let seeds: Vec<u64> = (0..rows as u64).map(|r| call * 1000 + r).collect();
                    let b = Batch {
                        temperature: Some(&temps),
                        seeds: Some(&seeds),
                        top_k: Some(&ks),
                        top_p: Some(&ps),
                        min_p: Some(&mps),
                        prompt_tokens: Some(TokenLists { ids: &prompt, offsets: &p_off }),
                        output_tokens: Some(TokenLists { ids: &output, offsets: &o_off }),
                        repetition_penalty: Some(&rep),
                        frequency_penalty: Some(&freq),
                        presence_penalty: Some(&pres),
                        logit_bias: Some(LogitBias { ids: &bias_ids, values: &bias_values, offsets: &b_off }),
                        banned_tokens: Some(TokenLists { ids: &banned, offsets: &ban_off }),
                        ..Batch::new(logits, rows, vocab)
                    };
                    let mut plain = vec![-1; rows];
                    s.draw(&b, &mut Output::new(&mut plain)).unwrap();
                    let (mut tokens, mut lps) = (vec![-1; rows], vec![0f32; rows]);
                    let out = Output {
                        logprobs: Some(&mut lps),
                        logprob_mode: LogprobMode::Processed,
                        ..Output::new(&mut tokens)
                    };
                    s.draw(&b, &mut { out }).unwrap();
                    assert_eq!(plain, tokens, "{order:?} {level:?} call {call}");
                    for (r, &t) in plain.iter().enumerate() {
                        assert!(
                            !banned[ban_off[r] as usize..ban_off[r + 1] as usize].contains(&t),
                            "row {r} drew a banned token"
                        );
                    }
                }
            }
        }
    }
}
