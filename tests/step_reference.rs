//! The whole sampling step against the float64 reference of `tests/common/reference.rs`
//! (`rf::effective_row`: the step of `docs/semantics.md` applied literally to a copy of the row,
//! then the reference draw of `tests/reference.rs` on that row): token histories and the three
//! penalties, logit bias, allowed and banned tokens, the grammar bitmask, the filter order and
//! full-vocabulary logprobs.
//!
//! - Random batches mixing every input, every SIMD level, 1 and 2 threads, f32/bf16/f16, seeded,
//!   unseeded and external-noise rows, both filter orders: tokens equal to the reference except
//!   documented near ties (counted, a handful at most), flags equal, logprobs, ranks, top-n and
//!   full-vocabulary logprobs within the documented tolerance.
//! - The same draws against a plain draw (no step inputs) of the processed row the reference
//!   materialises in f32, with the same noise: tokens and flags must be identical.
//! - Batch invariance of seeded rows carrying step inputs; touched tokens tied with untouched
//!   ones; one vocabulary of 151936, drawn whole and from the blocks it visits; pool noise rows.
//!
//! `cargo test --test step_reference -- --nocapture` prints the counts.
mod common;

use common::reference as rf;
use common::step::*;
use common::{Dist, TestRng};
use tokenrace::*;

// ---------------------------------------------------------------------------------------------
// The reference's view of a call.
// ---------------------------------------------------------------------------------------------

struct OrderRef {
    d: rf::Drawn,
    /// Every token's logprob in the call's `logprob_mode`.
    lp: Vec<f64>,
    /// `full_mode` Raw or Processed: every token's logprob.
    full: Option<Vec<f64>>,
    /// `full_mode` ProcessedLogits, where the spec decides it.
    plogits: Option<Vec<f32>>,
}

struct RowRef {
    y: Vec<f32>,
    /// The reference token of the logits as given, without the step (TemperatureFirst).
    x_token: usize,
    orders: Vec<OrderRef>,
}

/// The noise of each row as the library takes it: seeded, external, or the stream's next key
/// (unseeded sampling rows, in row order; greedy rows take none).
fn row_noises<'a>(case: &'a Case, greedy_below: f32, stream: &mut rf::KeyStream) -> Vec<rf::Noise<'a>> {
    (0..case.rows)
        .map(|r| {
            if case.is_seeded(r) {
                rf::Noise::Inline(rf::row_key(case.seeds.as_ref().unwrap()[r], case.offsets[r]))
            } else if let Some((values, kind, stride)) = &case.noise {
                let row = &values[r * stride..r * stride + case.vocab];
                match kind {
                    NoiseKind::Exp => rf::Noise::Exp(row),
                    NoiseKind::LogExp => rf::Noise::LogExp(row),
                }
            } else if case.temps[r] >= greedy_below {
                rf::Noise::Inline(stream.next())
            } else {
                rf::Noise::Inline(0)
            }
        })
        .collect()
}

fn reference_rows(case: &Case, greedy_below: f32, stream: &mut rf::KeyStream) -> Vec<RowRef> {
    let noises = row_noises(case, greedy_below, stream);
    (0..case.rows)
        .map(|r| {
            let x = case.row(r);
            let y = rf::effective_row(x, &case.step.row(r, case.vocab));
            let t = case.temps[r];
            let orders = ORDERS
                .iter()
                .map(|&order| {
                    let d = rf::draw_step(x, &y, t, greedy_below, noises[r], case.filters(r), order);
                    let lp = match case.mode {
                        LogprobMode::Raw => rf::logprobs(x, &d, rf::Mode::Raw),
                        LogprobMode::Processed => rf::logprobs(&y, &d, rf::Mode::Processed),
                    };
                    let (full, plogits) = match case.full_mode {
                        FullMode::Raw => (Some(rf::logprobs(x, &d, rf::Mode::Raw)), None),
                        FullMode::Processed => (Some(rf::logprobs(&y, &d, rf::Mode::Processed)), None),
                        FullMode::ProcessedLogits => (None, rf::processed_logits(&y, &d, t)),
                    };
                    OrderRef { d, lp, full, plogits }
                })
                .collect();
            let x_token = rf::draw(x, t, greedy_below, noises[r], case.filters(r)).token;
            RowRef { y, x_token, orders }
        })
        .collect()
}

#[derive(Default, Debug)]
struct Counts {
    calls: usize,
    rows: usize,
    raced: usize,
    /// Rows checked against a near tie or not at all.
    unchecked: Unchecked,
    greedy: usize,
    /// Rows whose effective row differs from their logits; rows whose reference token differs
    /// from the token of the logits without the step (the same noise); rows whose token
    /// differs between the filter orders.
    changed_rows: usize,
    changed_tokens: usize,
    order_changed_tokens: usize,
    /// Rows the masks or bans left empty (the logits had a finite or +inf value).
    emptied: usize,
    greedy_penalised: usize,
    posinf: usize,
    nan: usize,
    /// Rows (of the exact check) whose logprobs and full rows were bit-identical to the plain draw's.
    bit_identical: usize,
    full_checked: usize,
    plogits_skipped: usize,
}

fn order_index(order: rf::Order) -> usize {
    ORDERS.iter().position(|&o| o == order).unwrap()
}

/// Checks one call of one setup against the reference (`first`: the counts are taken).
fn check_reference(case: &Case, refs: &[RowRef], got: &Got, setup: &Setup, counts: &mut Counts, first: bool) {
    let (level, threads, order) = (setup.level, setup.threads, setup.order);
    let at = |r: usize| format!("{} [{} level, {threads} threads, {order:?}]", case.describe_row(r), level.name());
    let fs = case.full_stride;
    for (r, rr) in refs.iter().enumerate() {
        let o = &rr.orders[order_index(order)];
        let d = &o.d;
        let x = case.row(r);
        let tok = got.tokens[r];
        assert!((0..case.vocab as i32).contains(&tok), "{}: token {tok} out of range", at(r));
        let tok = tok as usize;
        assert_eq!(got.flags[r], d.flags, "{}: flags (effective row {:?})", at(r), rr.y);
        if first {
            counts.rows += 1;
            counts.raced += d.raced as usize;
            counts.greedy += d.greedy as usize;
            let changed = x.iter().zip(&rr.y).any(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()));
            counts.changed_rows += changed as usize;
            counts.emptied += (d.flags & rf::EMPTY != 0 && rf::row_flags(x, false) & rf::EMPTY == 0) as usize;
            counts.changed_tokens += (d.token != rr.x_token) as usize;
            let p = case.step.row(r, case.vocab);
            counts.greedy_penalised += (d.greedy && (p.repetition != 1.0 || !p.output.is_empty())) as usize;
            counts.posinf += (d.flags & rf::HAS_POSINF != 0) as usize;
            counts.nan += (d.flags & rf::HAS_NAN != 0) as usize;
        }
        let processed = !d.greedy;
        let lp_processed = case.mode == LogprobMode::Processed && processed;
        let full_processed = case.full_mode != FullMode::Raw && processed;
        check_drawn_token(tok, d, first.then_some(&mut counts.unchecked), &at(r), || {
            format!("; effective row {:?}", rr.y)
        });
        if !(d.ambiguous && lp_processed) {
            let want = o.lp[tok];
            assert!(
                rf::lp_close(got.lps[r], want),
                "{}: logprob of token {tok}: got {:e}, want {want:e} (logits {:?}, effective row {:?})",
                at(r),
                got.lps[r],
                &x[..x.len().min(8)],
                &rr.y[..x.len().min(8)]
            );
            let (lo, hi) = rf::rank_range(&o.lp, tok);
            let rank = got.ranks[r] as usize;
            assert!(lo <= rank && rank <= hi, "{}: rank of token {tok}: got {rank}, want {lo}..={hi}", at(r));
            let n = case.top_n;
            if n > 0 {
                let want_ids = rf::top_n(&o.lp, n);
                let ids = &got.ids[r * n..(r + 1) * n];
                let tl = &got.tlps[r * n..(r + 1) * n];
                for j in 0..n {
                    let id = ids[j];
                    assert!((0..case.vocab as i32).contains(&id), "{}: top-n id {id} out of range", at(r));
                    let (a, b) = (o.lp[id as usize], o.lp[want_ids[j]]);
                    assert!(rf::lp_close(tl[j], a), "{}: top-n entry {j}: id {id}: {:e}, want {a:e}", at(r), tl[j]);
                    assert!(
                        id as usize == want_ids[j] || a == b || (a - b).abs() <= rf::lp_tolerance(b),
                        "{}: top-n entry {j}: got id {id} ({a:e}), want id {} ({b:e}); got {ids:?}, want {want_ids:?}",
                        at(r),
                        want_ids[j]
                    );
                }
            }
        }
        // The full row, and the padding after it untouched.
        let full = &got.full[r * fs..r * fs + case.vocab];
        assert!(
            got.full[r * fs + case.vocab..(r + 1) * fs].iter().all(|&v| v == SENTINEL),
            "{}: full_logprobs written past vocab (the row stride's padding)",
            at(r)
        );
        if d.ambiguous && full_processed {
            continue;
        }
        if let Some(want) = &o.full {
            if first {
                counts.full_checked += 1;
            }
            for i in 0..case.vocab {
                assert!(
                    rf::lp_close(full[i], want[i]),
                    "{}: full_logprobs ({:?}) of token {i}: got {:e}, want {:e} (logit {}, effective {})",
                    at(r),
                    case.full_mode,
                    full[i],
                    want[i],
                    x[i],
                    rr.y[i]
                );
            }
        } else if let Some(want) = &o.plogits {
            if first {
                counts.full_checked += 1;
            }
            for i in 0..case.vocab {
                assert!(
                    full[i] == want[i],
                    "{}: processed logit of token {i}: got {:e}, want {:e} (logit {}, effective {})",
                    at(r),
                    full[i],
                    want[i],
                    x[i],
                    rr.y[i]
                );
            }
        } else {
            // ProcessedLogits of a sampling row with +inf: the spec leaves the kept set open, but
            // masked tokens are -inf whatever it is.
            if first {
                counts.plogits_skipped += 1;
            }
            let masked = rf::masked(&case.step.row(r, case.vocab), case.vocab);
            for i in 0..case.vocab {
                if masked[i] || x[i].is_nan() {
                    assert_eq!(full[i], f32::NEG_INFINITY, "{}: processed logit of masked token {i}", at(r));
                }
            }
        }
    }
}

/// The fused draw on the raw logits against a plain draw of the materialised effective rows with
/// the same noise: the same tokens, the same flags (but HAS_NAN, which the fused draw takes from
/// the raw logits), and in PROCESSED modes the same logprobs.
fn check_plain(
    case: &Case,
    refs: &[RowRef],
    fused: &Got,
    plain: &Got,
    setup: &Setup,
    counts: &mut Counts,
    first: bool,
) {
    let (level, threads, order) = (setup.level, setup.threads, setup.order);
    let at = |r: usize| {
        format!(
            "{} [{} level, {threads} threads, {order:?}] against the plain draw",
            case.describe_row(r),
            level.name()
        )
    };
    let fs = case.full_stride;
    for (r, rr) in refs.iter().enumerate() {
        assert_eq!(
            fused.tokens[r],
            plain.tokens[r],
            "{}: the fused draw and the plain draw of the effective row {:?} differ",
            at(r),
            rr.y
        );
        assert_eq!(fused.flags[r] & !rf::HAS_NAN, plain.flags[r] & !rf::HAS_NAN, "{}: flags", at(r));
        let x_nan = case.row(r).iter().any(|v| v.is_nan());
        assert_eq!(fused.flags[r] & rf::HAS_NAN != 0, x_nan, "{}: HAS_NAN of the raw logits", at(r));
        let mut identical = true;
        if case.mode == LogprobMode::Processed {
            let n = case.top_n;
            let (a, b) = (fused.lps[r], plain.lps[r]);
            identical &= a.to_bits() == b.to_bits();
            assert!(a == b || rf::lp_close(a, b as f64), "{}: logprob {a:e} vs plain {b:e}", at(r));
            let (ta, tb) = (&fused.tlps[r * n..(r + 1) * n], &plain.tlps[r * n..(r + 1) * n]);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            if a.to_bits() == b.to_bits() && bits(ta) == bits(tb) {
                assert_eq!(fused.ranks[r], plain.ranks[r], "{}: rank vs plain", at(r));
                assert_eq!(&fused.ids[r * n..(r + 1) * n], &plain.ids[r * n..(r + 1) * n], "{}: top-n ids", at(r));
            } else {
                identical = false;
                for j in 0..n {
                    assert!(ta[j] == tb[j] || rf::lp_close(ta[j], tb[j] as f64), "{}: top-n {j} vs plain", at(r));
                }
            }
        }
        let (fa, fb) = (&fused.full[r * fs..r * fs + case.vocab], &plain.full[r * fs..r * fs + case.vocab]);
        match case.full_mode {
            FullMode::Raw => {}
            FullMode::Processed => {
                for i in 0..case.vocab {
                    identical &= fa[i].to_bits() == fb[i].to_bits();
                    assert!(
                        fa[i] == fb[i] || rf::lp_close(fa[i], fb[i] as f64),
                        "{}: full processed logprob of {i}: {:e} vs plain {:e}",
                        at(r),
                        fa[i],
                        fb[i]
                    );
                }
            }
            FullMode::ProcessedLogits => {
                for i in 0..case.vocab {
                    assert!(
                        fa[i].to_bits() == fb[i].to_bits() || fa[i] == fb[i],
                        "{}: processed logit of {i}: {:e} vs plain {:e}",
                        at(r),
                        fa[i],
                        fb[i]
                    );
                }
            }
        }
        if first {
            counts.bit_identical += identical as usize;
        }
    }
}

/// Runs every case of a dtype on every setup, against the reference and the plain draw.
fn compare_dtype(dtype: Dtype, seed: u64) {
    let started = std::time::Instant::now();
    let mut edges = Edges::default();
    let cases = cases(dtype, seed, &mut edges);
    let setups = setups();
    let greedy_below = setups[0].fused.config().greedy_below;
    let mut stream = rf::KeyStream::new(STREAM_SEED);
    let mut counts = Counts::default();
    let mut logits = 0;
    for case in &cases {
        let refs = reference_rows(case, greedy_below, &mut stream);
        let y: Vec<f32> = refs.iter().flat_map(|r| r.y.iter().copied()).collect();
        counts.calls += 1;
        logits += case.rows * case.vocab;
        for (k, setup) in setups.iter().enumerate() {
            let first = k == 0 || (setup.order == rf::Order::FiltersFirst && k == setups.len() / 2);
            let got = run_batch(&setup.fused, &case.batch(), case);
            check_reference(case, &refs, &got, setup, &mut counts, first);
            check_lean(setup, &case.batch(), case, &got);
            let plain = run_batch(&setup.plain, &case.plain(&y), case);
            check_plain(case, &refs, &got, &plain, setup, &mut counts, first);
        }
        for rr in &refs {
            counts.order_changed_tokens += (rr.orders[0].d.token != rr.orders[1].d.token) as usize;
        }
    }
    let levels: Vec<&str> = supported_levels().iter().map(|l| l.name()).collect();
    eprintln!(
        "step {dtype:?}: levels {levels:?} x threads [1, 2] x both orders; {} calls, {logits} logits; {counts:?}; \
         edges {edges:?}; {:.1?}",
        counts.calls,
        started.elapsed()
    );
    // A test that skips everything tests nothing.
    assert!(counts.raced * 3 > counts.rows, "too few raced rows: {} of {}", counts.raced, counts.rows);
    counts.unchecked.assert_few(counts.raced, 4);
    assert!(
        counts.changed_rows * 2 > counts.rows,
        "the step changed only {} of {} rows",
        counts.changed_rows,
        counts.rows
    );
    assert!(
        counts.changed_tokens * 5 > counts.rows,
        "the step changed only {} tokens: {counts:?}",
        counts.changed_tokens
    );
    assert!(counts.emptied >= 5 && counts.greedy_penalised >= 5, "too few edge rows: {counts:?}");
    assert!(counts.posinf >= 5 && counts.nan >= 5, "too few non-finite rows: {counts:?}");
    assert!(
        edges.ban_only_finite >= 3 && edges.empty_allowed >= 3 && edges.zero_bitmask >= 3 && edges.bias_on_banned >= 3,
        "too few edge rows: {edges:?}"
    );
}

#[test]
fn f32_step_draws_match_the_reference_and_the_plain_draw() {
    compare_dtype(Dtype::F32, 901);
}

#[test]
fn bf16_step_draws_match_the_reference_and_the_plain_draw() {
    compare_dtype(Dtype::Bf16, 902);
}

#[test]
fn f16_step_draws_match_the_reference_and_the_plain_draw() {
    compare_dtype(Dtype::F16, 903);
}

// ---------------------------------------------------------------------------------------------
// Batch invariance, and a realistic vocabulary.
// ---------------------------------------------------------------------------------------------

#[test]
fn seeded_rows_with_step_inputs_draw_the_same_alone_and_in_a_batch() {
    let setups = setups();
    let mut rng = TestRng::new(77);
    let mut edges = Edges::default();
    let (mut checked, mut changed) = (0, 0);
    for index in 0..24 {
        let vocab = [33usize, 257, 1000, 3000][index % 4];
        let mut case = make_case(&mut rng, Dtype::F32, index, vocab, 9, &mut edges);
        if index % 3 == 0 {
            case = make_case(&mut rng, [Dtype::Bf16, Dtype::F16][index % 2], index, vocab, 9, &mut edges);
        }
        // Every row seeded but the external-noise ones (also batch-invariant).
        case.seeds.get_or_insert_with(|| (0..9).map(|r| r as u64 * 1000 + 5).collect());
        for r in 0..9 {
            case.seeded[r] = (case.noise.is_none() || r % 2 == 0) as u8;
        }
        for setup in &setups {
            let all = run_batch(&setup.fused, &case.batch(), &case);
            for r in 0..9 {
                let one = case.single(r);
                let alone = run_batch(&setup.fused, &one.batch(), &one);
                let at = format!(
                    "{} [{} level, {} threads, {:?}]",
                    case.describe_row(r),
                    setup.level.name(),
                    setup.threads,
                    setup.order
                );
                assert_eq!(alone.tokens[0], all.tokens[r], "{at}: the token alone and in the batch");
                assert_eq!(alone.flags[0], all.flags[r], "{at}: flags");
                assert_eq!(alone.lps[0].to_bits(), all.lps[r].to_bits(), "{at}: logprob");
                let fs = case.full_stride;
                let (a, b) = (&alone.full[..vocab], &all.full[r * fs..r * fs + vocab]);
                assert!(a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()), "{at}: full row");
                if setup.threads == 1
                    && setup.level == supported_levels()[0]
                    && setup.order == rf::Order::TemperatureFirst
                {
                    checked += 1;
                    let x = case.row(r);
                    let y = rf::effective_row(x, &case.step.row(r, vocab));
                    changed += x.iter().zip(&y).any(|(a, b)| a.to_bits() != b.to_bits() && !a.is_nan()) as usize;
                }
            }
        }
    }
    eprintln!("batch invariance: {checked} rows, {changed} changed by their step inputs");
    assert!(changed * 2 > checked);
}

/// Rows where tokens the penalties touched tie with untouched ones, so that the race among them
/// is decided by the noise alone: a touched token is raced apart from its block's kept tokens,
/// and a bound of its key off by a fraction of a logit skips it where it wins. Half the touched
/// ones are at 0, which the repetition penalty leaves at 0 (the bound, its logit, is then its
/// value exactly); the others at 5, which it takes to 4 (5 / 1.25). Every draw must equal the
/// plain draw of the processed rows. The vocabulary is no multiple of a vector, so that touched
/// tokens lie in the last block's tail too, which the race's vectors do not cover.
#[test]
fn touched_tokens_tied_with_untouched_ones_race_exactly() {
    let (vocab, rows) = (1021usize, 256usize);
    let mut rng = TestRng::new(1025);
    let (mut x, mut y) = (vec![-3.0f32; rows * vocab], vec![-3.0f32; rows * vocab]);
    let mut touched = vec![false; rows * vocab];
    let mut prompt = Vec::new();
    for r in 0..rows {
        let mut ids = Vec::new();
        for k in 0..64 {
            let t = rng.below(vocab);
            if x[r * vocab + t] != -3.0 {
                continue;
            }
            // Rows of two kinds: ties at 0 (a touched token's logit is its value) or at 4.
            let tie = if r % 2 == 0 { 0.0 } else { 4.0 };
            let (given, value) = match k % 4 {
                0 if r % 2 == 0 => (0.0, 0.0),
                0 => (5.0, 4.0),
                _ => (tie, tie),
            };
            (x[r * vocab + t], y[r * vocab + t]) = (given, value);
            if k % 4 == 0 {
                ids.push(t as i32);
                touched[r * vocab + t] = true;
            }
        }
        prompt.push(ids);
    }
    let prompt = Csr::from_rows(&prompt);
    // External noise too (the caller's, as a pool's rows reach the draw): ln E and E, one
    // value per token, where touched blocks are passed over on a bound of their keys.
    let uniform = |rng: &mut TestRng| (rng.below(1 << 20) as f32 + 0.5) / (1 << 20) as f32;
    let e: Vec<f32> = (0..rows * vocab).map(|_| -uniform(&mut rng).ln()).collect();
    let ln_e: Vec<f32> = e.iter().map(|&e| e.ln()).collect();
    let noises = [
        None,
        Some(ExternalNoise { values: &ln_e[..], kind: NoiseKind::LogExp, row_stride: vocab }),
        Some(ExternalNoise { values: &e[..], kind: NoiseKind::Exp, row_stride: vocab }),
    ];
    let mut wins = [0usize; 2];
    for setup in &setups() {
        for (call, (t, noise)) in [1.0f32, 0.5, 2.0].into_iter().flat_map(|t| noises.map(|n| (t, n))).enumerate() {
            let temps = vec![t; rows];
            let seeds: Vec<u64> = (0..rows as u64).map(|r| r * 7 + call as u64 * 1000).collect();
            let seeds = noise.is_none().then_some(&seeds[..]);
            let base = |logits| Batch { temperature: Some(&temps), seeds, noise, ..Batch::new(logits, rows, vocab) };
            let fused = Batch {
                prompt_tokens: Some(TokenLists { ids: &prompt.ids, offsets: &prompt.offsets }),
                repetition_penalty: Some(&[1.25; 256][..]),
                ..base(Logits::F32(&x))
            };
            let (got, _) = common::draw(&setup.fused, &fused);
            let (want, _) = common::draw(&setup.plain, &base(Logits::F32(&y)));
            for r in 0..rows {
                let kind = noise.map(|n| n.kind);
                let at = format!(
                    "row {r}, T = {t}, noise {kind:?} [{} level, {} threads]",
                    setup.level.name(),
                    setup.threads
                );
                assert_eq!(got[r], want[r], "{at}");
                wins[touched[r * vocab + got[r] as usize] as usize] += 1;
            }
        }
    }
    // Both kinds win often, so both ways of racing are exercised.
    eprintln!("untouched / touched winners: {wins:?}");
    assert!(wins[0] > 100 && wins[1] > 100, "untouched / touched winners: {wins:?}");
}

/// A serving-sized row: vocabulary 151936, 4096 prompt and 1024 output tokens, the three
/// penalties, 16 biased ids, a bitmask allowing about 10%; one row (tiled on 2 threads) and two
/// rows, seeded and external noise, top-p, PROCESSED logprobs and the full row.
/// A call of `rows` rows of vocabulary 151936 with the sampling step's inputs at a serving size: 4096 prompt and 1024
/// output tokens favouring the likely tokens (as a real history does), r = 1.1, f = 0.2, p = 0.1,
/// 16 biased ids (one -inf), a bitmask allowing about 10% (the likely tokens among them). Row
/// `r` has the peak `peaks[r]` over N(0, 2) and temperature `temps[r]`. `filtered`: top-p 0.9 on
/// external noise; else no filter, on seeded inline noise.
fn realistic_case(
    rng: &mut TestRng,
    peaks: &[f64],
    temps: &[f32],
    filtered: bool,
    modes: (FullMode, LogprobMode),
) -> Case {
    let (vocab, rows) = (151_936usize, peaks.len());
    let mut x: Vec<f32> = Vec::new();
    let (mut prompt, mut output, mut bias) = (Csr::new(), Csr::new(), BiasCsr::new());
    let words = vocab.div_ceil(32);
    let mut bitmask: Vec<i32> = Vec::new();
    for &peak in peaks {
        let row = common::peaked_logits(rng, vocab, 2.0, peak);
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
        let pick = |rng: &mut TestRng| {
            if rng.below(2) == 0 {
                order[rng.below(200)] as i32
            } else {
                rng.below(vocab) as i32
            }
        };
        prompt.push(&(0..4096).map(|_| pick(rng)).collect::<Vec<_>>());
        output.push(&(0..1024).map(|_| pick(rng)).collect::<Vec<_>>());
        bias.push(
            &(0..16)
                .map(|k| (pick(rng), if k == 0 { f32::NEG_INFINITY } else { (rng.normal() * 2.0) as f32 }))
                .collect::<Vec<_>>(),
        );
        let mut w: Vec<i32> = (0..words).map(|_| (rng.u64() & rng.u64() & rng.u64()) as i32).collect();
        for &i in &order[..100] {
            if rng.below(2) == 0 {
                w[i / 32] |= 1 << (i % 32);
            }
        }
        bitmask.extend(w);
        x.extend(row);
    }
    let noise = filtered.then(|| ((0..vocab).map(|_| rng.exp() as f32).collect(), NoiseKind::Exp, 0));
    Case {
        label: format!("vocab 151936, {rows} rows, filtered {filtered}"),
        vocab,
        rows,
        row_stride: vocab,
        dists: vec![Dist::Peaked; rows],
        f32s: x.clone(),
        x,
        bf16: Vec::new(),
        f16: Vec::new(),
        dtype: Dtype::F32,
        temps: temps.to_vec(),
        seeds: Some((0..rows as u64).map(|r| 42 + r).collect()),
        offsets: (0..rows as u64).map(|r| 7 + r).collect(),
        // Every row seeded when unfiltered (the inline noise of an unseeded row is the stream's).
        seeded: (0..rows).map(|r| (!filtered || r == 0) as u8).collect(),
        top_k: None,
        top_p: filtered.then(|| vec![0.9; rows]),
        min_p: None,
        noise,
        mode: modes.1,
        top_n: 5,
        full_mode: modes.0,
        full_stride: vocab,
        step: StepInputs {
            prompt: Some(prompt),
            output: Some(output),
            repetition: Some(vec![1.1; rows]),
            frequency: Some(vec![0.2; rows]),
            presence: Some(vec![0.1; rows]),
            last_n: None,
            bias: Some(bias),
            allowed: None,
            allowed_rows: None,
            banned: None,
            bitmask: Some((bitmask, words)),
            min_tokens: None,
            stop: None,
        },
    }
}

/// `case` drawn by every setup matches the reference and the plain draw of its processed rows,
/// and gives the same tokens and flags when asked for nothing else.
fn check_realistic(case: &Case, setups: &[Setup]) {
    let greedy_below = setups[0].fused.config().greedy_below;
    let mut stream = rf::KeyStream::new(0); // no unseeded inline row here
    let refs = reference_rows(case, greedy_below, &mut stream);
    let y: Vec<f32> = refs.iter().flat_map(|r| r.y.iter().copied()).collect();
    let mut counts = Counts::default();
    for (k, setup) in setups.iter().enumerate() {
        let first = k == 0;
        let started = std::time::Instant::now();
        let got = run_batch(&setup.fused, &case.batch(), case);
        let took = started.elapsed();
        check_reference(case, &refs, &got, setup, &mut counts, first);
        check_lean(setup, &case.batch(), case, &got);
        let plain = run_batch(&setup.plain, &case.plain(&y), case);
        check_plain(case, &refs, &got, &plain, setup, &mut counts, first);
        if first {
            eprintln!(
                "{}, {:?}, {:?}: tokens {:?} (the reference's {:?}) in {took:.1?}",
                case.label,
                case.mode,
                case.full_mode,
                got.tokens,
                refs.iter().map(|r| r.orders[0].d.token).collect::<Vec<_>>()
            );
        }
    }
    assert_eq!(counts.changed_rows, case.rows);
}

#[test]
fn a_realistic_vocabulary_matches_the_reference_and_the_plain_draw() {
    let mut rng = TestRng::new(151);
    let setups = setups();
    for (rows, full_mode, mode) in [
        (1usize, FullMode::Processed, LogprobMode::Processed),
        (1, FullMode::Raw, LogprobMode::Raw),
        (2, FullMode::ProcessedLogits, LogprobMode::Processed),
        (2, FullMode::Raw, LogprobMode::Raw),
    ] {
        let case = realistic_case(&mut rng, &[12.0; 2][..rows], &[1.0, 0.8][..rows], true, (full_mode, mode));
        check_realistic(&case, &setups);
    }
}

/// Rows without filters or logprobs leave their histories to the blocks they visit when few are
/// within reach of the largest value (a sharp peak), and mark them whole otherwise (a peak of
/// 12 over N(0, 2) leaves every block within reach): the same tokens either way, greedy rows and
/// temperatures from 0.3 to 2 among them.
#[test]
fn rows_drawn_from_their_visited_blocks_match_the_reference() {
    let mut rng = TestRng::new(152);
    let setups = setups();
    let peaks = [24.0, 30.0, 24.0, 12.0, 26.0, 12.0];
    for temps in [[1.0f32, 0.3, 0.0, 1.0, 2.0, 0.0], [0.7, 1.0, 1.0, 0.0, 0.0, 0.8]] {
        let case = realistic_case(&mut rng, &peaks, &temps, false, (FullMode::Raw, LogprobMode::Raw));
        check_realistic(&case, &setups);
    }
}

/// Unseeded rows drawing from a noise pool: pool row s holds the per-token E of the key
/// `rf::pool_key(seed, s)` (no blocks), handed to the unseeded sampling rows in order, one lease
/// per call, whole in the ring (a 16-row ring here, which wraps several times). A seeded
/// pool hands out the same values for the same borrows, so two samplers with equal pools must
/// draw the fused and the plain call alike, and the reference follows both.
#[test]
fn pool_noise_rows_match_the_reference_and_the_plain_draw() {
    let vocab = 700;
    let pool_seed = 42;
    let setups: Vec<(SimdLevel, Sampler, Sampler)> = supported_levels()
        .into_iter()
        .map(|level| {
            let make = || {
                let cfg = Config { vocab_size: vocab, ..config(level, 2, rf::Order::TemperatureFirst) };
                let s = Sampler::new(cfg).unwrap();
                let pool = NoisePool::new(PoolConfig {
                    rows: POOL_ROWS,
                    vocab,
                    kind: NoiseKind::Exp,
                    seed: Some(pool_seed),
                    policy: DrainPolicy::Inline,
                    ..PoolConfig::default()
                })
                .unwrap();
                s.attach_pool(std::sync::Arc::new(pool)).unwrap();
                s
            };
            (level, make(), make())
        })
        .collect();
    let greedy_below = setups[0].1.config().greedy_below;
    let mut rng = TestRng::new(55);
    let mut edges = Edges::default();
    const POOL_ROWS: usize = 16;
    let (mut next_row, mut skipped) = (0u64, false);
    let (mut rows, mut from_pool) = (0, 0);
    for index in 0..30 {
        let n = 1 + rng.below(8);
        let mut case = make_case(&mut rng, Dtype::F32, index, vocab, n, &mut edges);
        case.noise = None;
        // The pool rows of the unseeded sampling rows, in row order: one lease per call, whole
        // in the ring (rows up to the ring's end are skipped when it would wrap).
        let lease = (0..case.rows).filter(|&r| !case.is_seeded(r) && case.temps[r] >= greedy_below).count() as u64;
        if lease > 0 && next_row % POOL_ROWS as u64 + lease > POOL_ROWS as u64 {
            next_row += POOL_ROWS as u64 - next_row % POOL_ROWS as u64;
            skipped = true;
        }
        let pool_rows: Vec<Option<Vec<f32>>> = (0..case.rows)
            .map(|r| {
                (!case.is_seeded(r) && case.temps[r] >= greedy_below).then(|| {
                    let key = rf::pool_key(pool_seed, next_row);
                    next_row += 1;
                    (0..vocab).map(|i| rf::exp_of_bits(rf::token_bits(key, i)) as f32).collect()
                })
            })
            .collect();
        let y: Vec<f32> =
            (0..case.rows).flat_map(|r| rf::effective_row(case.row(r), &case.step.row(r, vocab))).collect();
        for (level, fused, plain) in &setups {
            let got = run_batch(fused, &case.batch(), &case);
            let want = run_batch(plain, &case.plain(&y), &case);
            for r in 0..case.rows {
                let at = format!("{} [{} level, pool noise]", case.describe_row(r), level.name());
                assert_eq!(got.tokens[r], want.tokens[r], "{at}: the fused and the plain draw differ");
                assert_eq!(got.flags[r] & !rf::HAS_NAN, want.flags[r] & !rf::HAS_NAN, "{at}: flags");
                let noise = match &pool_rows[r] {
                    Some(e) => rf::Noise::Exp(e),
                    None if case.is_seeded(r) => {
                        rf::Noise::Inline(rf::row_key(case.seeds.as_ref().unwrap()[r], case.offsets[r]))
                    }
                    None => rf::Noise::Inline(0),
                };
                let yr = &y[r * vocab..(r + 1) * vocab];
                let d = rf::draw_step(
                    case.row(r),
                    yr,
                    case.temps[r],
                    greedy_below,
                    noise,
                    case.filters(r),
                    rf::Order::TemperatureFirst,
                );
                assert_eq!(got.flags[r], d.flags, "{at}: flags against the reference");
                if !d.ambiguous {
                    let tok = got.tokens[r] as usize;
                    let e = |i: usize| pool_rows[r].as_ref().map(|v| v[i]);
                    assert!(
                        tok == d.token || d.near.contains(&tok),
                        "{at}: token {tok}, the reference's {} (near {:?}); effective {} and {}, E {:?} and {:?}; \
                         pool rows so far {next_row}",
                        d.token,
                        d.near,
                        yr[tok],
                        yr[d.token],
                        e(tok),
                        e(d.token),
                    );
                }
                if *level == supported_levels()[0] {
                    rows += 1;
                    from_pool += pool_rows[r].is_some() as usize;
                }
            }
        }
    }
    eprintln!("pool noise: {rows} rows, {from_pool} from the pool");
    assert!(from_pool * 4 > rows, "too few pool rows: {from_pool} of {rows}");
    assert!(skipped && next_row > 2 * POOL_ROWS as u64, "the ring wrapped too little: {next_row} rows");
}
