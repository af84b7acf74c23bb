//! The checks of a draw's arguments, before anything is written.

use super::{BadWords, Batch, Output, TokenLists};
use crate::error::{bail_batch, bail_out, Error, Owner, Result};
use crate::kernels::Kernels;

/// Elements spanned by `rows` rows of `vocab` elements of `elem_size` bytes, `stride` elements
/// apart: `(rows - 1) * stride + vocab`, or an error naming `stride_field` of the batch when that
/// many elements do not fit in the address space (`isize::MAX` bytes). `rows` 0 spans nothing.
pub fn span(rows: usize, vocab: usize, stride: usize, elem_size: usize, stride_field: &'static str) -> Result<usize> {
    span_of(Owner::Batch, rows, vocab, stride, elem_size, stride_field)
}

/// [`span`] of a layout that `owner` describes (the batch's inputs or the output's arrays).
pub(crate) fn span_of(
    owner: Owner,
    rows: usize,
    vocab: usize,
    stride: usize,
    elem_size: usize,
    stride_field: &'static str,
) -> Result<usize> {
    if rows == 0 {
        return Ok(0);
    }
    (rows - 1)
        .checked_mul(stride)
        .and_then(|n| n.checked_add(vocab))
        .filter(|&n| n.checked_mul(elem_size).is_some_and(|b| b <= isize::MAX as usize))
        .ok_or_else(|| {
            Error::arg(
                owner,
                stride_field,
                None,
                format!("{stride} x {} rows of {elem_size}-byte elements overflows the address space", rows - 1),
            )
        })
}

fn check_len(owner: Owner, field: &'static str, len: usize, need: usize, what: &str) -> Result<()> {
    if len < need {
        return Err(Error::arg(owner, field, None, format!("has {len} elements, {what} is {need}")));
    }
    Ok(())
}

fn check_rows<T>(owner: Owner, field: &'static str, s: Option<&[T]>, rows: usize) -> Result<()> {
    // A match, not `map_or(Ok(()), ..)`: that form passed its default `Ok` by memory, written
    // in parts and read whole (a stalled store forward per field, most of a call's validation).
    match s {
        None => Ok(()),
        Some(s) => check_len(owner, field, s.len(), rows, "the batch's row count"),
    }
}

/// Checks a per-row value of every row; the first bad one is reported with its row.
fn check_each<T: Copy>(
    field: &'static str,
    s: Option<&[T]>,
    rows: usize,
    bad: impl Fn(T) -> Option<String>,
) -> Result<()> {
    check_rows(Owner::Batch, field, s, rows)?;
    for (r, &v) in s.map_or(&[][..], |s| &s[..rows]).iter().enumerate() {
        if let Some(why) = bad(v) {
            bail_batch!(field, Some(r), "{why}");
        }
    }
    Ok(())
}

/// Checks every argument of a draw call; `max_rows` and `vocab_size` come from the sampler.
pub(crate) fn validate(k: &Kernels, batch: &Batch, out: &Output, max_rows: usize, vocab_size: usize) -> Result<()> {
    validate_but_ids(k, batch, out, (max_rows, vocab_size), Ids::Here)
}

/// Where the token lists' ids (prompt, output, allowed, banned) are checked to lie in
/// `[0, vocab)`: here, or by the task that draws each row ([`row_ids_in_range`]), which reads
/// them next. A batch of 32 rows with 5,120 history ids each holds 164K ids: checked here, on
/// the calling thread, they cost about 20 us while 16 threads wait (a profile's share here; the
/// draw at 16 threads fell from 140 to 99 us when they moved to the rows).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Ids {
    Here,
    InRows,
}

/// [`validate`], with the lists' ids checked where `ids` says. With [`Ids::InRows`], a call
/// that fails must report what [`validate`] reports: the caller validates again with
/// [`Ids::Here`] on any error.
pub(crate) fn validate_but_ids(
    k: &Kernels,
    batch: &Batch,
    out: &Output,
    (max_rows, vocab_size): (usize, usize),
    ids: Ids,
) -> Result<()> {
    let (rows, vocab) = (batch.rows, batch.vocab);
    if rows > max_rows {
        bail_batch!("rows", None, "{rows} exceeds the sampler's max_rows {max_rows}");
    }
    if vocab == 0 {
        bail_batch!("vocab", None, "must be at least 1");
    }
    if vocab > i32::MAX as usize {
        bail_batch!("vocab", None, "{vocab} exceeds 2147483647 (token ids are int32)");
    }
    if vocab_size != 0 && vocab != vocab_size {
        bail_batch!("vocab", None, "{vocab} differs from the sampler's vocab_size {vocab_size}");
    }
    if batch.row_stride < vocab {
        bail_batch!("row_stride", None, "{} is smaller than vocab {vocab}", batch.row_stride);
    }
    let logits_rows = logits_rows(batch)?;
    let need = span(logits_rows, vocab, batch.row_stride, batch.logits.elem_size(), "row_stride")?;
    check_len(Owner::Batch, "logits", batch.logits.len(), need, "rows/vocab/row_stride's span")?;
    check_len(Owner::Output, "tokens", out.tokens.len(), rows, "the batch's row count")?;
    check_rows(Owner::Output, "flags", out.flags.as_deref(), rows)?;
    check_rows(Owner::Output, "logprobs", out.logprobs.as_deref(), rows)?;
    check_rows(Owner::Output, "ranks", out.ranks.as_deref(), rows)?;
    check_rows(Owner::Output, "mirostat_mu", out.mirostat_mu.as_deref(), rows)?;
    if out.top_n > 0 {
        if out.top_n > vocab {
            bail_out!("top_n", None, "{} exceeds vocab {vocab}", out.top_n);
        }
        let need = rows
            .checked_mul(out.top_n)
            .ok_or_else(|| Error::arg(Owner::Output, "top_n", None, "rows x top_n overflows"))?;
        for (field, s) in [
            ("topn_ids", out.topn_ids.as_ref().map(|l| l.len())),
            ("topn_logprobs", out.topn_logprobs.as_ref().map(|l| l.len())),
        ] {
            if let Some(len) = s {
                check_len(Owner::Output, field, len, need, "rows x top_n")?;
            }
        }
    }
    validate_params(batch)?;
    validate_range_outputs(batch, out)?;
    check_kept_outputs(batch, out)?;
    if let Some(n) = &batch.noise {
        if n.row_stride != 0 && n.row_stride < vocab {
            bail_batch!("noise_row_stride", None, "{} is neither 0 (broadcast) nor >= vocab {vocab}", n.row_stride);
        }
        let need = noise_span(rows, vocab, n.row_stride)?;
        check_len(Owner::Batch, "noise", n.values.len(), need, "rows/vocab/noise_row_stride's span")?;
    }
    validate_step(k, batch, out, ids)
}

/// Checks the sampling step's inputs of `batch` alone (its lists, penalties, bias, masks): a
/// verify call's per-request ones, and its per-target-row bitmask, each as a batch of their rows.
pub(crate) fn validate_step_inputs(k: &Kernels, batch: &Batch) -> Result<()> {
    validate_step(k, batch, &Output::new(&mut []), Ids::Here)
}

/// Checks the per-row sampling parameters of `batch.rows` rows (temperature, filters, seeds):
/// a draw's, or a verify call's per-request ones.
pub(crate) fn validate_params(batch: &Batch) -> Result<()> {
    let rows = batch.rows;
    check_rows(Owner::Batch, "top_k", batch.top_k, rows)?;
    check_each("top_p", batch.top_p, rows, |p: f32| (!(p > 0.0 && p <= 1.0)).then(|| format!("{p} is not in (0, 1]")))?;
    check_each("min_p", batch.min_p, rows, |p: f32| {
        (!(0.0..=1.0).contains(&p)).then(|| format!("{p} is not in [0, 1]"))
    })?;
    check_each("top_n_sigma", batch.top_n_sigma, rows, |n: f32| {
        (!n.is_finite()).then(|| format!("{n} is not a finite number"))
    })?;
    validate_llama_filters(batch)?;
    validate_mirostat(batch)?;
    validate_order(batch)?;
    check_each("temperature", batch.temperature, rows, |t: f32| {
        (!(t.is_finite() && t >= 0.0)).then(|| format!("{t} is not a finite number >= 0"))
    })?;
    check_rows(Owner::Batch, "seeds", batch.seeds, rows)?;
    check_rows(Owner::Batch, "offsets", batch.offsets, rows)?;
    if batch.seeded.is_some() && batch.seeds.is_none() {
        bail_batch!("seeded", None, "given without seeds");
    }
    check_rows(Owner::Batch, "seeded", batch.seeded, rows)?;
    Ok(())
}

/// Checks llama.cpp's filters: min_keep, locally typical sampling and XTC. An unseeded row with
/// XTC on may not take the caller's noise: its coin is drawn from the row's key, which such a row
/// does not have.
fn validate_llama_filters(batch: &Batch) -> Result<()> {
    let rows = batch.rows;
    check_each("min_keep", batch.min_keep, rows, |n: i32| (n < 0).then(|| format!("{n} is negative")))?;
    check_each("typical_p", batch.typical_p, rows, |p: f32| {
        (!(p > 0.0 && p <= 1.0)).then(|| format!("{p} is not in (0, 1]"))
    })?;
    for (field, values) in [("xtc_probability", batch.xtc_probability), ("xtc_threshold", batch.xtc_threshold)] {
        check_each(field, values, rows, |v: f32| (!(0.0..=1.0).contains(&v)).then(|| format!("{v} is not in [0, 1]")))?;
    }
    for (field, values) in [("dynatemp_range", batch.dynatemp_range), ("dynatemp_exponent", batch.dynatemp_exponent)] {
        check_each(field, values, rows, |v: f32| {
            (!(v.is_finite() && v >= 0.0)).then(|| format!("{v} is not a finite number >= 0"))
        })?;
    }
    if batch.noise.is_some() {
        if let Some(r) = (0..rows).find(|&r| crate::filter::xtc_on(batch, r) && batch.seed_of(r).is_none()) {
            bail_batch!(
                "xtc_probability",
                Some(r),
                "XTC on an unseeded row with caller-supplied noise (its coin comes from the row's key: seed the row)"
            );
        }
    }
    Ok(())
}

/// Checks mirostat's inputs: a mode of 0, 1 or 2, finite tau, eta and mu, m >= 1, and no forced
/// token on a mirostat row (its mu follows the token its own draw picks).
fn validate_mirostat(batch: &Batch) -> Result<()> {
    let rows = batch.rows;
    check_each("mirostat", batch.mirostat, rows, |m: i32| {
        (!(0..=2).contains(&m)).then(|| format!("{m} is not 0 (off), 1 (v1) or 2 (v2)"))
    })?;
    for (field, values) in
        [("mirostat_tau", batch.mirostat_tau), ("mirostat_eta", batch.mirostat_eta), ("mirostat_mu", batch.mirostat_mu)]
    {
        check_each(field, values, rows, |v: f32| (!v.is_finite()).then(|| format!("{v} is not a finite number")))?;
    }
    check_each("mirostat_m", batch.mirostat_m, rows, |m: i32| (m < 1).then(|| format!("{m} is below 1")))?;
    let Some(modes) = batch.mirostat else { return Ok(()) };
    let forced = |r: usize| batch.forced_tokens.and_then(|f| f.get(r)).is_some_and(|&t| t >= 0);
    if let Some(r) = (0..rows).find(|&r| modes[r] != 0 && forced(r)) {
        bail_batch!(
            "mirostat",
            Some(r),
            "on for a row with a forced token (a scored row's too): mirostat's mu follows the token its draw picks"
        );
    }
    Ok(())
}

/// Checks the order of stages: each stage at most once, and every filter a row turns on
/// listed (a stage left out would be skipped silently otherwise).
fn validate_order(batch: &Batch) -> Result<()> {
    use crate::filter::chain::{stage_on, Stage};
    let Some(order) = batch.order else { return Ok(()) };
    for (i, s) in order.iter().enumerate() {
        if let Some(first) = order[..i].iter().position(|e| e == s) {
            bail_batch!("order", Some(i), "stage {} is listed twice (first at position {first})", s.name());
        }
    }
    let field = |s: Stage| match s {
        Stage::TopK => "top_k",
        Stage::TopP => "top_p",
        Stage::MinP => "min_p",
        Stage::Typical => "typical_p",
        Stage::Xtc => "xtc_probability",
        Stage::TopNSigma => "top_n_sigma",
        Stage::Temperature => "temperature",
    };
    for r in 0..batch.rows {
        let f = crate::filter::Filters::of(batch, r).unwrap_or_default();
        let t = batch.temperature(r);
        if let Some(s) =
            Stage::ALL.into_iter().find(|&s| stage_on(s, &f, t) && !order.contains(&s) && s != Stage::Temperature)
        {
            bail_batch!(field(s), Some(r), "on for this row, but the batch's order has no {} stage", s.name());
        }
    }
    Ok(())
}

/// Refuses processed logprobs and processed full-vocabulary outputs for a row whose filters keep
/// a range (typical sampling, XTC): those outputs know a floor, not a range.
fn validate_range_outputs(batch: &Batch, out: &Output) -> Result<()> {
    let per_token = out.logprobs.is_some() || out.ranks.is_some() || out.top_n > 0;
    let processed_logprobs = per_token && out.logprob_mode == crate::batch::LogprobMode::Processed;
    let processed_full = out.full_logprobs.is_some() && out.full_mode != crate::batch::FullMode::Raw;
    if !(processed_logprobs || processed_full) || !batch.keeps_ranges() {
        return Ok(());
    }
    let ranged = |r: &usize| crate::filter::Filters::of(batch, *r).is_some_and(|f| f.keeps_range());
    if let Some(r) = (0..batch.rows).find(ranged) {
        let (owner_field, what) = if processed_logprobs {
            ("logprob_mode", "processed logprobs")
        } else {
            ("full_mode", "a processed full output")
        };
        return Err(Error::arg(
            Owner::Output,
            owner_field,
            Some(r),
            format!("{what} are not available for a row with typical_p, XTC, dynatemp or mirostat on, or whose stages follow neither fixed order (raw ones are)"),
        ));
    }
    Ok(())
}

/// Checks DRY's inputs: a multiplier finite and >= 0 (DRY only lowers values), a finite base,
/// an allowed length >= 0, a window >= -1 and the sequence breakers.
fn validate_dry(k: &Kernels, batch: &Batch, ids: Ids) -> Result<()> {
    let rows = batch.rows;
    check_each("dry_multiplier", batch.dry_multiplier, rows, |m: f32| {
        (!(m.is_finite() && m >= 0.0)).then(|| format!("{m} is not a finite number >= 0"))
    })?;
    check_each("dry_base", batch.dry_base, rows, |b: f32| (!b.is_finite()).then(|| format!("{b} is not finite")))?;
    check_each("dry_allowed_length", batch.dry_allowed_length, rows, |n: i32| {
        (n < 0).then(|| format!("{n} is negative"))
    })?;
    check_each("dry_penalty_last_n", batch.dry_penalty_last_n, rows, |n: i32| {
        (n < -1).then(|| format!("{n} is below -1 (-1 counts the whole history, 0 turns DRY off)"))
    })?;
    if let Some(w) = batch.dry_breakers {
        check_words(k, w, (rows, batch.vocab, ids), DRY_BREAKERS)?;
    }
    Ok(())
}

/// Checks the kept-set outputs: one entry per row (the bitmask `ceil(vocab / 32)` words per
/// row), and no row whose filters keep a range (typical sampling, XTC, dynamic temperature:
/// their kept set is not the values above a threshold).
fn check_kept_outputs(batch: &Batch, out: &Output) -> Result<()> {
    let rows = batch.rows;
    check_rows(Owner::Output, "kept_threshold", out.kept_threshold.as_deref(), rows)?;
    check_rows(Owner::Output, "kept_count", out.kept_count.as_deref(), rows)?;
    check_rows(Owner::Output, "kept_mass", out.kept_mass.as_deref(), rows)?;
    if let Some(bits) = out.kept_bitmask.as_deref() {
        let need = rows
            .checked_mul(batch.vocab.div_ceil(32))
            .ok_or_else(|| Error::arg(Owner::Output, "kept_bitmask", None, "rows x ceil(vocab / 32) overflows"))?;
        check_len(Owner::Output, "kept_bitmask", bits.len(), need, "rows x ceil(vocab / 32)")?;
    }
    if !out.wants_kept() || !batch.keeps_ranges() {
        return Ok(());
    }
    let ranged = |r: &usize| crate::filter::Filters::of(batch, *r).is_some_and(|f| f.keeps_range());
    if let Some(r) = (0..rows).find(ranged) {
        let field = [
            ("kept_threshold", out.kept_threshold.is_some()),
            ("kept_count", out.kept_count.is_some()),
            ("kept_mass", out.kept_mass.is_some()),
            ("kept_bitmask", out.kept_bitmask.is_some()),
        ]
        .into_iter()
        .find_map(|(f, on)| on.then_some(f))
        .unwrap_or("kept_threshold");
        bail_out!(field, Some(r), "the kept set is not reported for a row that keeps a range (typical_p, XTC, dynatemp or mirostat on, or top-nσ after another filter in `order`)");
    }
    Ok(())
}

/// Checks the inputs of the sampling step before the filters (histories, penalties, bias,
/// allowed and banned lists, bitmask) and the full-vocabulary output.
fn validate_step(k: &Kernels, batch: &Batch, out: &Output, ids: Ids) -> Result<()> {
    let (rows, vocab) = (batch.rows, batch.vocab);
    validate_requests(batch)?;
    for (list, ids_field, offsets_field) in token_lists(batch) {
        if let Some(l) = list {
            check_offsets(l.ids.len(), l.offsets, rows, offsets_field)?;
            if ids == Ids::Here {
                for r in 0..rows {
                    check_row_ids(k, l, r, vocab, ids_field)?;
                }
            }
        }
    }
    check_each("repetition_penalty", batch.repetition_penalty, rows, |r: f32| {
        (!(r.is_finite() && r > 0.0)).then(|| format!("{r} is not a finite number > 0"))
    })?;
    for field in ["frequency_penalty", "presence_penalty"] {
        let s = if field == "frequency_penalty" { batch.frequency_penalty } else { batch.presence_penalty };
        check_each(field, s, rows, |v: f32| (!v.is_finite()).then(|| format!("{v} is not finite")))?;
    }
    check_each("penalty_last_n", batch.penalty_last_n, rows, |n: i32| {
        (n < 0).then(|| format!("{n} is negative (0 counts the whole history)"))
    })?;
    check_each("min_tokens", batch.min_tokens, rows, |n: i32| (n < 0).then(|| format!("{n} is negative")))?;
    if let Some(w) = batch.bad_words {
        check_bad_words(k, w, rows, vocab, ids)?;
    }
    validate_dry(k, batch, ids)?;
    check_each("forced_tokens", batch.forced_tokens, rows, |t: i32| {
        (t < -1 || t as i64 >= vocab as i64)
            .then(|| format!("{t} is not a token id in [0, {vocab}) nor -1 (not forced)"))
    })?;
    if let Some(b) = batch.logit_bias {
        check_offsets(b.ids.len().min(b.values.len()), b.offsets, rows, "bias_offsets")?;
        let list = TokenLists { ids: b.ids, offsets: b.offsets };
        for r in 0..rows {
            check_row_ids(k, list, r, vocab, "bias_ids")?;
        }
        for r in 0..rows {
            let (a, _) = (b.offsets[r] as usize, b.offsets[r + 1] as usize);
            for (j, &v) in b.row(r).1.iter().enumerate() {
                if v.is_nan() || v == f32::INFINITY {
                    bail_batch!(
                        "bias_values",
                        Some(r),
                        "position {j} (entry {}): {v} is not a bias (finite, or -inf to ban)",
                        a + j
                    );
                }
            }
        }
    }
    if batch.allowed_rows.is_some() && batch.allowed_tokens.is_none() {
        bail_batch!("allowed_rows", None, "given without allowed lists");
    }
    check_rows(Owner::Batch, "allowed_rows", batch.allowed_rows, rows)?;
    if let Some(m) = batch.token_bitmask {
        let words = vocab.div_ceil(32);
        if m.row_stride < words {
            bail_batch!("bitmask_row_stride", None, "{} is smaller than ceil(vocab / 32) = {words}", m.row_stride);
        }
        let need = span(rows, words, m.row_stride, 4, "bitmask_row_stride")?;
        check_len(Owner::Batch, "token_bitmask", m.words.len(), need, "rows x ceil(vocab / 32) words at its stride")?;
    }
    check_token_logprobs(batch, out)?;
    if let Some(full) = out.full_logprobs.as_deref() {
        if out.full_row_stride < vocab {
            bail_out!("full_row_stride", None, "{} is smaller than vocab {vocab}", out.full_row_stride);
        }
        let need = span_of(Owner::Output, rows, vocab, out.full_row_stride, 4, "full_row_stride")?;
        check_len(Owner::Output, "full_logprobs", full.len(), need, "rows/vocab/full_row_stride's span")?;
    }
    Ok(())
}

/// Checks the rows named by request id: not with the history lists, one id a row, each a
/// request of the state whose tokens lie in the vocabulary (its largest, kept by the state:
/// `O(rows)`, not `O(history)`).
fn validate_requests(batch: &Batch) -> Result<()> {
    let Some(q) = batch.requests else { return Ok(()) };
    for (given, field) in [(batch.prompt_tokens.is_some(), "prompt_ids"), (batch.output_tokens.is_some(), "output_ids")]
    {
        if given {
            bail_batch!(
                "request_ids",
                None,
                "given with {field}: a row's histories come from the requests state or from the lists, not both"
            );
        }
    }
    check_rows(Owner::Batch, "request_ids", Some(q.ids), batch.rows)?;
    for r in 0..batch.rows {
        let id = q.ids[r];
        let Some(request) = q.row(r) else {
            bail_batch!("request_ids", Some(r), "request {id} is not in the requests state");
        };
        if request.largest() >= 0 && request.largest() as usize >= batch.vocab {
            bail_batch!(
                "request_ids",
                Some(r),
                "request {id}'s histories hold token {}, outside vocab {}",
                request.largest(),
                batch.vocab
            );
        }
        if request.params_largest() >= 0 && request.params_largest() as usize >= batch.vocab {
            bail_batch!(
                "request_ids",
                Some(r),
                "request {id}'s parameters name token {}, outside vocab {}",
                request.params_largest(),
                batch.vocab
            );
        }
    }
    Ok(())
}

/// Checks the logprobs of given ids: the batch's ids (offsets checked) and the output's arrays
/// come together, each array holding one entry per id.
fn check_token_logprobs(batch: &Batch, out: &Output) -> Result<()> {
    let wanted = out.token_logprobs.is_some() || out.token_ranks.is_some();
    let Some(ids) = batch.logprob_token_ids else {
        if wanted {
            let field = if out.token_logprobs.is_some() { "token_logprobs" } else { "token_ranks" };
            bail_out!(field, None, "given without the batch's logprob_token_ids");
        }
        return Ok(());
    };
    if !wanted {
        bail_batch!("logprob_token_ids", None, "given without the output's token_logprobs or token_ranks");
    }
    let need = ids.offsets[batch.rows] as usize;
    let what = "the count of the batch's logprob_token_ids";
    if let Some(l) = out.token_logprobs.as_deref() {
        check_len(Owner::Output, "token_logprobs", l.len(), need, what)?;
    }
    if let Some(r) = out.token_ranks.as_deref() {
        check_len(Owner::Output, "token_ranks", r.len(), need, what)?;
    }
    Ok(())
}

/// The token lists of `batch` whose ids the draw reads, with the names of their fields.
fn token_lists<'a>(batch: &Batch<'a>) -> [(Option<TokenLists<'a>>, &'static str, &'static str); 6] {
    [
        (batch.prompt_tokens, "prompt_ids", "prompt_offsets"),
        (batch.output_tokens, "output_ids", "output_offsets"),
        (batch.allowed_tokens, "allowed_ids", "allowed_offsets"),
        (batch.banned_tokens, "banned_ids", "banned_offsets"),
        (batch.stop_tokens, "stop_ids", "stop_offsets"),
        (batch.logprob_token_ids, "logprob_token_ids", "logprob_token_offsets"),
    ]
}

/// Checks the bad words: the rows' offsets into the words, the words' offsets into the ids
/// (each word at least one token: a word bans its last token), and, with [`Ids::Here`], every
/// id (named by its row, word and position).
fn check_bad_words(k: &Kernels, w: BadWords, rows: usize, vocab: usize, ids: Ids) -> Result<()> {
    check_words(k, w, (rows, vocab, ids), BAD_WORDS)
}

/// The fields of a two-level list of words, as errors name them: (ids, word offsets, row
/// offsets, what a word is).
type WordFields = (&'static str, &'static str, &'static str, &'static str);
const BAD_WORDS: WordFields = ("bad_words_ids", "bad_word_offsets", "bad_words_row_offsets", "bad word");
const DRY_BREAKERS: WordFields =
    ("dry_breaker_ids", "dry_breaker_offsets", "dry_breakers_row_offsets", "DRY sequence breaker");

/// Checks a two-level list of words (`names` its fields): the rows' offsets into the words, the
/// words' offsets into the ids (each word at least one token), and, with [`Ids::Here`], every id
/// (named by its row, word and position).
fn check_words(k: &Kernels, w: BadWords, (rows, vocab, ids): (usize, usize, Ids), names: WordFields) -> Result<()> {
    let words = w.word_offsets.len().saturating_sub(1);
    check_offsets(words, w.row_offsets, rows, names.2)?;
    let words = w.row_offsets[rows] as usize;
    check_offsets(w.ids.len(), w.word_offsets, words, names.1)?;
    for r in 0..rows {
        for j in w.row_offsets[r] as usize..w.row_offsets[r + 1] as usize {
            if w.word_offsets[j] == w.word_offsets[j + 1] {
                bail_batch!(names.1, Some(r), "word {j} is empty (a {} holds at least one token)", names.3);
            }
        }
    }
    if ids == Ids::Here {
        for r in 0..rows {
            word_ids_in_range(k, w, r, vocab, names)?;
        }
    }
    Ok(())
}

/// Checks that the ids of row `r`'s words (offsets checked) lie in `[0, vocab)`, naming the
/// word and the position of the first that does not.
fn word_ids_in_range(k: &Kernels, w: BadWords, r: usize, vocab: usize, names: WordFields) -> Result<()> {
    let (first, last) = (w.row_offsets[r] as usize, w.row_offsets[r + 1] as usize);
    let (a, b) = (w.word_offsets[first] as usize, w.word_offsets[last] as usize);
    // SAFETY: `k` is the table of a supported level; vocab < 2^31 was checked first.
    if unsafe { (k.ids_in_range)(&w.ids[a..b], vocab as u32) } {
        return Ok(());
    }
    for j in first..last {
        let start = w.word_offsets[j] as usize;
        for (p, &id) in w.ids[start..w.word_offsets[j + 1] as usize].iter().enumerate() {
            if id < 0 || id as usize >= vocab {
                bail_batch!(
                    names.0,
                    Some(r),
                    "word {} position {p} (entry {}): {id} is not a token id in [0, {vocab})",
                    j - first,
                    start + p
                );
            }
        }
    }
    Ok(())
}

/// Checks a CSR list's offsets: `rows + 1` of them, non-decreasing, the last within the `have`
/// entries of its arrays.
fn check_offsets(have: usize, offsets: &[u64], rows: usize, offsets_field: &'static str) -> Result<()> {
    check_len(Owner::Batch, offsets_field, offsets.len(), rows + 1, "rows + 1")?;
    for r in 0..rows {
        if offsets[r] > offsets[r + 1] {
            bail_batch!(
                offsets_field,
                Some(r + 1),
                "{} is below the previous offset {} (offsets must not decrease)",
                offsets[r + 1],
                offsets[r]
            );
        }
    }
    let last = offsets[rows];
    let have = have as u64;
    if last > have {
        bail_batch!(offsets_field, Some(rows), "{last} is past the end of the list's {have} entries");
    }
    Ok(())
}

/// Checks that every id of row `r` of `list` (offsets checked) lies in `[0, vocab)`: one
/// branch-free pass at the level's width (`ids_in_range`), and the search for the position to
/// name only when some id is out of range.
fn check_row_ids(k: &Kernels, list: TokenLists, r: usize, vocab: usize, ids_field: &'static str) -> Result<()> {
    let (a, b) = (list.offsets[r] as usize, list.offsets[r + 1] as usize);
    let ids = &list.ids[a..b];
    // SAFETY: `k` is the table of a supported level; vocab < 2^31 was checked first.
    if unsafe { (k.ids_in_range)(ids, vocab as u32) } {
        return Ok(());
    }
    for (j, &id) in ids.iter().enumerate() {
        if id < 0 || id as usize >= vocab {
            bail_batch!(ids_field, Some(r), "position {j} (entry {}): {id} is not a token id in [0, {vocab})", a + j);
        }
    }
    Ok(())
}

/// The check of [`Ids::InRows`]: the ids of row `r`'s token lists, in a batch validated but for
/// them.
pub(crate) fn row_ids_in_range(k: &Kernels, batch: &Batch, r: usize) -> Result<()> {
    for (list, ids_field, _) in token_lists(batch) {
        if let Some(l) = list {
            check_row_ids(k, l, r, batch.vocab, ids_field)?;
        }
    }
    if let Some(w) = batch.bad_words {
        word_ids_in_range(k, w, r, batch.vocab, BAD_WORDS)?;
    }
    if let Some(w) = batch.dry_breakers {
        word_ids_in_range(k, w, r, batch.vocab, DRY_BREAKERS)?;
    }
    Ok(())
}

/// Values spanned by the noise rows of a batch (a stride of 0 broadcasts one row).
pub fn noise_span(rows: usize, vocab: usize, stride: usize) -> Result<usize> {
    match (rows, stride) {
        (0, _) => Ok(0),
        (_, 0) => Ok(vocab),
        _ => span(rows, vocab, stride, 4, "noise_row_stride"),
    }
}

/// The logits rows a batch reads: `max(row_index) + 1` with a row index (each entry checked
/// non-negative), else `rows`.
pub(crate) fn logits_rows(batch: &Batch) -> Result<usize> {
    let Some(index) = batch.row_index else { return Ok(batch.rows) };
    check_rows(Owner::Batch, "row_index", Some(index), batch.rows)?;
    let mut most = 0;
    for (r, &i) in index[..batch.rows].iter().enumerate() {
        if i < 0 {
            bail_batch!("row_index", Some(r), "{i} is not a logits row (must be >= 0)");
        }
        most = most.max(i as usize + 1);
    }
    Ok(most)
}
