//! The sampling parameters a request state holds ([`RequestParams`]), turned into the per-row
//! arrays of a batch that names its rows by request id: each array the batch leaves unset that
//! some row's request sets is made once per call (`O(rows)`, plus the lengths of the lists the
//! requests hold), so that the rest of the draw reads one kind of batch. The draw is then the
//! one the same arrays passed in the batch give, bit for bit.

use super::{Batch, LogitBias, TokenLists};
use crate::alloc;
use crate::error::{Error, Owner, Result};
use crate::requests::RequestParams;

/// The arrays made from the rows' requests for one call (each `None` where the batch gives its
/// own, or no row's request sets it).
#[derive(Default)]
pub(crate) struct HeldParams {
    temperature: Option<Vec<f32>>,
    seeds: Option<Vec<u64>>,
    offsets: Option<Vec<u64>>,
    seeded: Option<Vec<u8>>,
    top_k: Option<Vec<i32>>,
    top_p: Option<Vec<f32>>,
    min_p: Option<Vec<f32>>,
    top_n_sigma: Option<Vec<f32>>,
    min_keep: Option<Vec<i32>>,
    typical_p: Option<Vec<f32>>,
    repetition_penalty: Option<Vec<f32>>,
    frequency_penalty: Option<Vec<f32>>,
    presence_penalty: Option<Vec<f32>>,
    penalty_last_n: Option<Vec<i32>>,
    min_tokens: Option<Vec<i32>>,
    stop: Option<Csr>,
    bias: Option<(Csr, Vec<f32>)>,
    allowed: Option<(Csr, Vec<u8>)>,
    banned: Option<Csr>,
}

/// Per-row token lists in CSR form.
struct Csr {
    ids: Vec<i32>,
    offsets: Vec<u64>,
}

impl Csr {
    fn lists(&self) -> TokenLists<'_> {
        TokenLists { ids: &self.ids, offsets: &self.offsets }
    }
}

/// The parameters of each row's request (`None` for a row whose request set none).
type RowParams<'a> = [Option<&'a RequestParams>];

/// One value a row: `get` of its request's parameters, the default's where it set none; `None`
/// when the batch gives the array (`given`) or every row's value is the default's (the draw
/// without the array is the same).
fn per_row<T: Copy + PartialEq>(
    given: bool,
    rows: &RowParams,
    get: fn(&RequestParams) -> T,
    what: &str,
) -> Result<Option<Vec<T>>> {
    let off = get(&RequestParams::default());
    if given || rows.iter().flatten().all(|p| get(p) == off) {
        return Ok(None);
    }
    alloc::collect(rows.iter().map(|p| p.map_or(off, get)), what).map(Some)
}

/// The lists of every row (`get` of its request's parameters; empty where it set none), unless
/// the batch gives them or every one is empty.
fn lists<'p>(
    given: bool,
    rows: &[Option<&'p RequestParams>],
    get: fn(&'p RequestParams) -> &'p [i32],
    what: &str,
) -> Result<Option<Csr>> {
    let list = |p: &Option<&'p RequestParams>| p.map_or(&[][..], get);
    if given || rows.iter().all(|p| list(p).is_empty()) {
        return Ok(None);
    }
    let total = rows.iter().map(|p| list(p).len()).sum();
    let mut ids = alloc::with_capacity(total, what)?;
    let mut offsets = alloc::with_capacity(rows.len() + 1, what)?;
    offsets.push(0);
    for p in rows {
        ids.extend_from_slice(list(p));
        offsets.push(ids.len() as u64);
    }
    Ok(Some(Csr { ids, offsets }))
}

impl HeldParams {
    /// The arrays `batch`'s rows' requests give it, or `None` when the batch names no request
    /// that holds parameters (then the batch is drawn as given).
    pub(crate) fn of(batch: &Batch) -> Result<Option<HeldParams>> {
        // (Too few request ids, or a row whose request is not live, is refused by the
        // validation, which sees the batch as given then.)
        let Some(q) = batch.requests.filter(|q| q.state.any_params() && q.ids.len() >= batch.rows) else {
            return Ok(None);
        };
        let params =
            alloc::collect((0..batch.rows).map(|r| q.row(r).and_then(|x| x.params())), "the rows' parameters")?;
        HeldParams::of_rows(batch, &params).map(Some)
    }

    /// The arrays of `batch` whose row r's request holds parameters `p[r]`.
    fn of_rows(batch: &Batch, p: &RowParams) -> Result<HeldParams> {
        let (b, rows) = (batch, p.len());
        let mut held = HeldParams {
            temperature: per_row(b.temperature.is_some(), p, |x| x.temperature, "the rows' temperatures")?,
            top_k: per_row(b.top_k.is_some(), p, |x| x.top_k, "the rows' top-k")?,
            top_p: per_row(b.top_p.is_some(), p, |x| x.top_p, "the rows' top-p")?,
            min_p: per_row(b.min_p.is_some(), p, |x| x.min_p, "the rows' min-p")?,
            top_n_sigma: per_row(b.top_n_sigma.is_some(), p, |x| x.top_n_sigma, "the rows' top-nσ")?,
            min_keep: per_row(b.min_keep.is_some(), p, |x| x.min_keep, "the rows' min_keep")?,
            typical_p: per_row(b.typical_p.is_some(), p, |x| x.typical_p, "the rows' typical_p")?,
            repetition_penalty: per_row(b.repetition_penalty.is_some(), p, |x| x.repetition_penalty, "penalties")?,
            frequency_penalty: per_row(b.frequency_penalty.is_some(), p, |x| x.frequency_penalty, "penalties")?,
            presence_penalty: per_row(b.presence_penalty.is_some(), p, |x| x.presence_penalty, "penalties")?,
            penalty_last_n: per_row(b.penalty_last_n.is_some(), p, |x| x.penalty_last_n, "the rows' windows")?,
            min_tokens: per_row(b.min_tokens.is_some(), p, |x| x.min_tokens, "the rows' min_tokens")?,
            stop: lists(b.stop_tokens.is_some(), p, |x| &x.stop_tokens, "the rows' stop tokens")?,
            banned: lists(b.banned_tokens.is_some(), p, |x| &x.banned_tokens, "the rows' banned tokens")?,
            ..HeldParams::default()
        };
        held.seeds_of(batch, p)?;
        if let Some(ids) = lists(b.logit_bias.is_some(), p, |x| &x.bias_ids, "the rows' bias")? {
            let values = p.iter().flat_map(|x| x.map_or(&[][..], |x| &x.bias_values[..]).iter().copied());
            held.bias = Some((ids, alloc::collect(values, "the rows' bias")?));
        }
        let restricted = |x: &Option<&RequestParams>| x.is_some_and(|x| x.allowed_tokens.is_some());
        if b.allowed_tokens.is_none() && b.allowed_rows.is_none() && p.iter().any(restricted) {
            let allowed = lists(false, p, |x| x.allowed_tokens.as_deref().unwrap_or(&[]), "the rows' allowed tokens")?;
            let csr = match allowed {
                Some(csr) => csr,
                // (Every restricted row allows nothing: empty lists.)
                None => Csr { ids: Vec::new(), offsets: alloc::filled(rows + 1, 0, "the rows' allowed tokens")? },
            };
            held.allowed =
                Some((csr, alloc::collect(p.iter().map(|x| restricted(x) as u8), "the rows' allowed lists")?));
        }
        Ok(held)
    }

    /// The seeds of the rows whose request has one (when the batch gives no seeds): each row
    /// seeded by its request's seed, at the batch's offset, or else at its request's output
    /// length (the position of the token it draws).
    fn seeds_of(&mut self, batch: &Batch, p: &RowParams) -> Result<()> {
        if batch.seeds.is_some() || batch.seeded.is_some() || p.iter().flatten().all(|x| x.seed.is_none()) {
            return Ok(());
        }
        let seed = |x: &Option<&RequestParams>| x.and_then(|x| x.seed);
        self.seeds = Some(alloc::collect(p.iter().map(|x| seed(x).unwrap_or(0)), "the rows' seeds")?);
        self.seeded = Some(alloc::collect(p.iter().map(|x| seed(x).is_some() as u8), "the rows' seeds")?);
        if batch.offsets.is_none() {
            let made = (0..p.len()).map(|r| batch.output_row(r).len() as u64);
            self.offsets = Some(alloc::collect(made, "the rows' offsets")?);
        }
        Ok(())
    }

    /// `batch` with the arrays made here in place of those it leaves unset.
    pub(crate) fn apply<'b>(&'b self, batch: &Batch<'b>) -> Batch<'b> {
        let b = batch;
        Batch {
            temperature: b.temperature.or(self.temperature.as_deref()),
            seeds: b.seeds.or(self.seeds.as_deref()),
            offsets: b.offsets.or(self.offsets.as_deref()),
            seeded: b.seeded.or(self.seeded.as_deref()),
            top_k: b.top_k.or(self.top_k.as_deref()),
            top_p: b.top_p.or(self.top_p.as_deref()),
            min_p: b.min_p.or(self.min_p.as_deref()),
            top_n_sigma: b.top_n_sigma.or(self.top_n_sigma.as_deref()),
            min_keep: b.min_keep.or(self.min_keep.as_deref()),
            typical_p: b.typical_p.or(self.typical_p.as_deref()),
            repetition_penalty: b.repetition_penalty.or(self.repetition_penalty.as_deref()),
            frequency_penalty: b.frequency_penalty.or(self.frequency_penalty.as_deref()),
            presence_penalty: b.presence_penalty.or(self.presence_penalty.as_deref()),
            penalty_last_n: b.penalty_last_n.or(self.penalty_last_n.as_deref()),
            min_tokens: b.min_tokens.or(self.min_tokens.as_deref()),
            stop_tokens: b.stop_tokens.or(self.stop.as_ref().map(Csr::lists)),
            banned_tokens: b.banned_tokens.or(self.banned.as_ref().map(Csr::lists)),
            logit_bias: b.logit_bias.or(self.bias.as_ref().map(|(l, values)| LogitBias {
                ids: &l.ids,
                values,
                offsets: &l.offsets,
            })),
            allowed_tokens: b.allowed_tokens.or(self.allowed.as_ref().map(|(l, _)| l.lists())),
            allowed_rows: b.allowed_rows.or(self.allowed.as_ref().map(|(_, rows)| &rows[..])),
            ..*b
        }
    }
}

/// Runs `f` on `batch` with the parameters its rows' requests hold in place of the arrays it
/// leaves unset ([`HeldParams`]), or on `batch` itself when they hold none.
pub(crate) fn with_held_params<R>(batch: &Batch, f: impl FnOnce(&Batch) -> Result<R>) -> Result<R> {
    match HeldParams::of(batch)? {
        Some(held) => f(&held.apply(batch)),
        None => f(batch),
    }
}

/// Checks a request's parameters by the batch's rules for each value (as a batch of one row,
/// its lists' ids only against being negative: the vocabulary is the draw's). Errors name the
/// field of the parameters: `params.top_p: 1.5 is not in (0, 1]`.
pub(crate) fn check_request_params(p: &RequestParams) -> Result<()> {
    if p.bias_ids.len() != p.bias_values.len() {
        return Err(Error::arg(
            Owner::Params,
            "bias_values",
            None,
            format!("has {} entries, bias_ids has {}", p.bias_values.len(), p.bias_ids.len()),
        ));
    }
    // (Only values other than the defaults make arrays: the defaults pass every check.)
    let empty = Batch::new(super::Logits::F32(&[]), 1, i32::MAX as usize);
    let held = HeldParams::of_rows(&empty, &[Some(p)])?;
    let one = held.apply(&empty);
    super::validate_params(&one)
        .and_then(|_| super::validate_step_inputs(crate::kernels::kernels(crate::kernels::SimdLevel::Scalar), &one))
        .map_err(as_params_error)
}

/// `e`, a batch's error about a value of a one-row batch made from a request's parameters, as
/// an error about that parameter: `params.top_p: ...` in place of `batch.top_p[0]: ...`.
fn as_params_error(e: Error) -> Error {
    let Some(at) = e.location else { return e };
    let field = match at.field {
        // (The C struct's names, as every error's: its lists have no offsets.)
        "bias_offsets" => "bias_ids",
        "stop_offsets" => "stop_ids",
        "allowed_offsets" => "allowed_ids",
        "banned_offsets" => "banned_ids",
        f => f,
    };
    let what = e.message.strip_prefix(&format!("{at}: ")).unwrap_or(&e.message);
    Error::arg(Owner::Params, field, None, what)
}
