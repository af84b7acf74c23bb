//! An order of the filter stages that the caller composes (llama.cpp's sampler chain).
//!
//! A call may give its stages as a list ([`Stage`], each at most once); a row applies, in that
//! order, the stages whose filter is on for it, each on what the stages before it kept, with
//! probabilities renormalised over them; the temperature is a stage too: a stage before it
//! judges `softmax(x)`, one after it `softmax(x / T)`. The temperature goes last when the list
//! leaves it out. A row with a dynamic temperature (`dynatemp_range > 0`) judges by its base `T`
//! and is drawn at `T'` computed over the tokens the whole chain keeps: llama.cpp's `temp_ext`
//! where it ends the chain (its default), and the rule of both fixed orders.
//!
//! The two fixed orders are two lists ([`TEMPERATURE_FIRST`], [`FILTERS_FIRST`]): a row whose
//! stages come in the relative order of one of them is drawn by that order's path, so its token
//! is the one the sampler configured with that order draws. Any other row is drawn by
//! [`kept_range`]: the leading stages that keep a top set of the row (top-k, min-p, top-p,
//! top-nσ while nothing is removed yet, the temperature) give one floor without sorting;
//! the candidates at or above it are sorted once and the remaining stages narrow them, each
//! keeping a range of them.

use super::llama::{typical, weigh, xtc_removed, Candidate, KeptRange};
use super::{min_p, top_k, top_n_sigma, top_p, Filters};
use crate::batch::inv_temperature;
use crate::config::FilterOrder;
use crate::error::Result;
use crate::kernels::Kernels;
use crate::row::RowValues;

/// One stage of a filter order (the C enum `tokenrace_stage`). Ids 8 and 9 are kept for DRY and
/// mirostat, which are stages of llama.cpp's chain too.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// top-k (`top_k`).
    TopK = 1,
    /// top-p (`top_p`, `min_keep`).
    TopP = 2,
    /// min-p (`min_p`, `min_keep`).
    MinP = 3,
    /// Locally typical sampling (`typical_p`, `min_keep`).
    Typical = 4,
    /// XTC (`xtc_probability`, `xtc_threshold`, `min_keep`).
    Xtc = 5,
    /// top-nσ (`top_n_sigma`).
    TopNSigma = 6,
    /// The temperature (`temperature`; the dynamic temperature when `dynatemp_range > 0`).
    Temperature = 7,
}

/// Stage ids kept for stages not in this build: DRY (8) and mirostat (9).
pub const RESERVED_STAGE_IDS: [(u32, &str); 2] = [(8, "dry"), (9, "mirostat")];

impl Stage {
    /// Every stage, by id.
    pub const ALL: [Stage; 7] =
        [Stage::TopK, Stage::TopP, Stage::MinP, Stage::Typical, Stage::Xtc, Stage::TopNSigma, Stage::Temperature];

    /// The stage of C id `id`, if any.
    pub fn from_id(id: u32) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| *s as u32 == id)
    }

    /// The stage's name (the Python binding's and the error messages'): its batch field.
    pub fn name(self) -> &'static str {
        match self {
            Stage::TopK => "top_k",
            Stage::TopP => "top_p",
            Stage::MinP => "min_p",
            Stage::Typical => "typical",
            Stage::Xtc => "xtc",
            Stage::TopNSigma => "top_n_sigma",
            Stage::Temperature => "temperature",
        }
    }
}

/// vLLM's order (`FilterOrder::TemperatureFirst`) as a list. top-nσ keeps the same set before
/// and after min-p here (both keep a top set relative to the row's maximum).
pub const TEMPERATURE_FIRST: [Stage; 7] =
    [Stage::Temperature, Stage::TopNSigma, Stage::MinP, Stage::TopK, Stage::Typical, Stage::TopP, Stage::Xtc];

/// llama.cpp's order of the fixed chain (`FilterOrder::FiltersFirst`) as a list.
pub const FILTERS_FIRST: [Stage; 7] =
    [Stage::TopNSigma, Stage::MinP, Stage::TopK, Stage::Typical, Stage::TopP, Stage::Xtc, Stage::Temperature];

/// The stages a row applies, in the caller's order: those whose filter is on, and the
/// temperature (unless it is 1 without a dynamic temperature, where its place changes nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chain {
    stages: [Stage; 7],
    len: usize,
}

/// How a row's stages are applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// By the path of a fixed order (its stages come in that order's relative order).
    Preset(FilterOrder),
    /// By [`kept_range`].
    Custom(Chain),
}

impl Chain {
    pub(crate) fn stages(&self) -> &[Stage] {
        &self.stages[..self.len]
    }

    /// Whether every stage keeps a top set of the row given what the stages before it kept (top-k,
    /// min-p, top-p, the temperature, and top-nσ before any other filter): the chain is then one
    /// floor ([`floor`]), and the row races as a row of a fixed order does.
    pub(crate) fn floor_only(&self) -> bool {
        let mut filtered = false;
        self.stages().iter().all(|&s| match s {
            Stage::Temperature => true,
            Stage::TopK | Stage::MinP | Stage::TopP => {
                filtered = true;
                true
            }
            Stage::TopNSigma => !filtered,
            Stage::Typical | Stage::Xtc => false,
        })
    }

    /// Whether the stages come in the relative order of `preset`.
    fn follows(&self, preset: &[Stage; 7]) -> bool {
        let place = |s: Stage| preset.iter().position(|p| *p == s).unwrap_or(usize::MAX);
        self.stages().windows(2).all(|w| place(w[0]) < place(w[1]))
    }
}

/// Whether row filters `f` (temperature `t`) turn stage `s` on.
pub(crate) fn stage_on(s: Stage, f: &Filters, t: f32) -> bool {
    match s {
        Stage::TopK => f.top_k > 0,
        Stage::TopP => f.top_p < 1.0,
        Stage::MinP => f.min_p > 0.0,
        Stage::Typical => f.typical_p < 1.0,
        Stage::Xtc => f.xtc_on(),
        Stage::TopNSigma => f.top_n_sigma > 0.0,
        Stage::Temperature => t != 1.0 || f.dynatemp_range > 0.0,
    }
}

/// The stages of `order` that filters `f` (temperature `t`) turn on, the temperature last when
/// `order` leaves it out.
fn chain_of(order: &[Stage], f: &Filters, t: f32) -> Chain {
    let mut chain = Chain { stages: [Stage::Temperature; 7], len: 0 };
    let listed = order.iter().copied().chain((!order.contains(&Stage::Temperature)).then_some(Stage::Temperature));
    for s in listed.filter(|&s| stage_on(s, f, t)) {
        // At most seven: `validate` refuses a stage listed twice.
        if chain.len < chain.stages.len() {
            chain.stages[chain.len] = s;
            chain.len += 1;
        }
    }
    chain
}

/// The route of a row with filters `f` and temperature `t` under the caller's `order`.
pub(crate) fn route(order: &[Stage], f: &Filters, t: f32) -> Route {
    let chain = chain_of(order, f, t);
    if chain.follows(&TEMPERATURE_FIRST) {
        Route::Preset(FilterOrder::TemperatureFirst)
    } else if chain.follows(&FILTERS_FIRST) {
        Route::Preset(FilterOrder::FiltersFirst)
    } else {
        Route::Custom(chain)
    }
}

/// The range of a row `v` (block maxima `bmax`, finite maximum `m`, temperature `t`) kept by
/// its stages `chain` with filters `f` (`xtc_applies`: XTC's coin fell below its probability).
/// The stages after the temperature judge `softmax(x / T)` at the row's base `T`; a dynamic
/// temperature is then computed over the kept range ([`super::llama::dynamic_temperature`]).
pub(crate) fn kept_range<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (m, t): (f32, f32),
    (f, chain, xtc_applies): (Filters, Chain, bool),
) -> Result<KeptRange> {
    let inv_t = inv_temperature(t);
    let stages = chain.stages();
    let (floor, scale, next) = leading_floor(k, v, bmax, (m, inv_t), f, stages)?;
    if next == stages.len() {
        return Ok(KeptRange { lo: floor, hi: m });
    }
    // The finite values >= floor, gathered from the blocks that reach it (sorted: their order
    // does not matter).
    let mut values = super::row_values_ge(k, v, bmax, floor)?;
    super::llama::sort_descending(&mut values)?;
    let mut on = Candidates { values, a: 0, b: 0, scale };
    on.b = on.values.len();
    for &s in &stages[next..] {
        on.apply(s, inv_t, f, xtc_applies)?;
    }
    Ok(KeptRange { lo: on.values[on.b - 1], hi: on.values[on.a] })
}

/// The floor of a chain that [`Chain::floor_only`] accepts, on a row `v` (block maxima `bmax`,
/// finite maximum `m`) drawn at `inv_t`: the race keeps `x >= floor`.
pub(crate) fn floor<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (m, inv_t): (f32, f32),
    f: Filters,
    chain: Chain,
) -> Result<f32> {
    Ok(leading_floor(k, v, bmax, (m, inv_t), f, chain.stages())?.0)
}

/// The leading stages of `stages` that keep a top set of the row: one floor, no sort (every set
/// kept so far is `x >= floor`, which holds the row's maximum `m`). Returns the floor, the scale
/// the next stage judges at (1 before the temperature, `inv_t` after it) and how many stages it
/// applied.
fn leading_floor<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    (m, inv_t): (f32, f32),
    f: Filters,
    stages: &[Stage],
) -> Result<(f32, f32, usize)> {
    let mut scale = 1.0f32;
    let mut floor = f32::NEG_INFINITY;
    // min_keep's value on the row: its min_keep-th largest finite value (-inf if fewer).
    let keep_floor =
        || -> Result<f32> { Ok(top_k::kth_largest(k, v, bmax, f.min_keep)?.map_or(f32::NEG_INFINITY, |(kth, _)| kth)) };
    let mut next = 0;
    for &s in stages {
        match s {
            Stage::Temperature => scale = inv_t,
            Stage::TopK => {
                if let Some((kth, _)) = top_k::kth_largest(k, v, bmax, f.top_k)? {
                    floor = floor.max(kth);
                }
            }
            Stage::MinP => {
                let mut own = min_p::floor(m, scale, f.min_p);
                if f.min_keep > 1 {
                    own = own.min(keep_floor()?);
                }
                floor = floor.max(own);
            }
            Stage::TopP => {
                let before = floor;
                floor = top_p::floor(k, v, bmax, m, scale, floor, f.top_p)?;
                if f.min_keep > 1 {
                    floor = floor.min(keep_floor()?.max(before));
                }
            }
            Stage::TopNSigma if floor == f32::NEG_INFINITY => floor = top_n_sigma::floor(v, m, f.top_n_sigma),
            _ => break,
        }
        next += 1;
    }
    Ok((floor, scale, next))
}

/// The candidates of the stages after the leading ones: `values[a..b]` kept (sorted by value,
/// descending; never empty), judged at `scale` (1 before the temperature).
struct Candidates {
    values: Vec<f32>,
    a: usize,
    b: usize,
    scale: f32,
}

impl Candidates {
    fn kept(&self) -> &[f32] {
        &self.values[self.a..self.b]
    }

    /// The kept candidates with their weights at the current scale.
    fn weighed(&self) -> Result<Vec<Candidate>> {
        weigh(self.kept(), self.scale)
    }

    /// Keeps the first `n` kept candidates and every one tied with the last of them.
    fn keep_first(&mut self, n: usize) {
        let c = self.kept();
        let mut len = n.clamp(1, c.len());
        while len < c.len() && c[len] == c[len - 1] {
            len += 1;
        }
        self.b = self.a + len;
    }

    fn apply(&mut self, s: Stage, inv_t: f32, f: Filters, xtc_applies: bool) -> Result<()> {
        match s {
            // Later stages judge softmax(x / T) (a dynamic temperature is applied at the draw).
            Stage::Temperature => self.scale = inv_t,
            Stage::TopK => self.keep_first(f.top_k),
            Stage::TopP => {
                let c = self.weighed()?;
                let z: f64 = c.iter().map(|t| t.w).sum();
                let mut mass = 0.0;
                let mut len = c.len();
                for (n, t) in c.iter().enumerate() {
                    mass += t.w / z;
                    if mass >= f.top_p && n + 1 >= f.min_keep {
                        len = n + 1;
                        break;
                    }
                }
                self.keep_first(len);
            }
            Stage::MinP => {
                // p >= min_p * p_max: the weight relative to the kept maximum is >= min_p.
                let c = self.weighed()?;
                let passing = c.iter().take_while(|t| t.w >= f.min_p).count();
                self.keep_first(passing.max(f.min_keep));
            }
            Stage::Typical => {
                let (a, b) = typical(&self.weighed()?, f.typical_p, f.min_keep);
                (self.a, self.b) = (self.a + a, self.a + b);
            }
            Stage::Xtc => {
                if xtc_applies {
                    self.a += xtc_removed(&self.weighed()?, f.xtc_threshold, f.min_keep);
                }
            }
            Stage::TopNSigma => {
                let c = self.kept();
                let n = c.len() as f64;
                let mean = c.iter().map(|&x| x as f64).sum::<f64>() / n;
                let variance = c.iter().map(|&x| (x as f64 - mean) * (x as f64 - mean)).sum::<f64>() / n;
                let threshold = c[0] as f64 - f.top_n_sigma * variance.sqrt();
                let passing = c.iter().take_while(|&&x| x as f64 >= threshold).count();
                self.keep_first(passing);
            }
        }
        Ok(())
    }
}

/// Test seam: the values `[lo, hi]` one f32 row (temperature `t` > 0) keeps under the stages
/// `order` (validated: each stage at most once) with filters `lf` (XTC applied when on), at the
/// kernels of `level`, and its dynamic temperature when it has one. `None` when the row has no
/// finite maximum.
#[cfg(feature = "internals")]
pub fn kept_range_in_order_at(
    level: crate::SimdLevel,
    x: &[f32],
    t: f32,
    lf: super::LlamaFilters,
    (top_n_sigma, dynatemp_range, dynatemp_exponent): (f32, f32, f32),
    order: &[Stage],
) -> Option<((f32, f32), Option<f64>)> {
    let bmax: Vec<f32> = x
        .chunks(crate::kernels::BLOCK)
        .map(|c| c.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a }))
        .collect();
    let m = bmax.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a }) + 0.0;
    if !m.is_finite() {
        return None;
    }
    let f = Filters {
        top_k: if lf.top_k <= 0 || lf.top_k as usize >= x.len() { 0 } else { lf.top_k as usize },
        top_p: lf.top_p as f64,
        min_p: lf.min_p as f64,
        top_n_sigma: (top_n_sigma as f64).max(0.0),
        min_keep: lf.min_keep.max(0) as usize,
        typical_p: lf.typical_p as f64,
        xtc_probability: lf.xtc_probability as f64,
        xtc_threshold: lf.xtc_threshold as f64,
        dynatemp_range: dynatemp_range as f64,
        dynatemp_exponent: dynatemp_exponent as f64,
        ..Filters::OFF
    };
    let chain = chain_of(order, &f, t);
    let k = crate::kernels::kernels(level);
    let r = kept_range(k, x, &bmax, (m, t), (f, chain, true)).expect("the test rows fit in memory");
    Some(((r.lo, r.hi), super::llama::dynamic_temperature(x, r, t, f)))
}
