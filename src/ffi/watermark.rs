//! `tokenrace_watermark_seeds` and `tokenrace_watermark_detect`: keyed-noise watermarking
//! (docs/semantics.md, "Watermarking"; the rules are `watermark.rs`).

use super::panic::guard;
use super::types::tokenrace_status;
use crate::error::{Error, Result};
use crate::watermark::{context_of, detect, watermark_seed};

/// A caller's array of `len` elements as a slice: NULL only when empty, aligned, inside the
/// address space. Errors name the argument.
///
/// # Safety
/// A non-NULL `ptr` points to `len` readable elements for `'a`.
unsafe fn array<'a, T>(name: &str, ptr: *const T, len: usize) -> Result<&'a [T]> {
    if ptr.is_null() {
        return match len {
            0 => Ok(&[]),
            _ => Err(Error::invalid_argument(format!("{name}: is NULL"))),
        };
    }
    if !(ptr as usize).is_multiple_of(align_of::<T>()) {
        return Err(Error::invalid_argument(format!("{name}: is not aligned to {} bytes", align_of::<T>())));
    }
    let fits = len.checked_mul(size_of::<T>()).is_some_and(|b| b <= isize::MAX as usize);
    if !fits {
        return Err(Error::invalid_argument(format!("{name}: {len} elements overflow the address space")));
    }
    // SAFETY: non-NULL, aligned and `len` elements long by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// One CSR list of `rows` rows: `(ids, offsets)`, both NULL for no list (every row empty).
///
/// # Safety
/// Non-NULL `offsets` hold `rows + 1` entries and `ids` `offsets[rows]`.
unsafe fn lists<'a>(
    (ids_name, offsets_name): (&str, &str),
    ids: *const i32,
    offsets: *const u64,
    rows: usize,
) -> Result<Option<(&'a [i32], &'a [u64])>> {
    if offsets.is_null() {
        if !ids.is_null() {
            return Err(Error::invalid_argument(format!("{ids_name}: given without {offsets_name}")));
        }
        return Ok(None);
    }
    // SAFETY: the caller's contract.
    let off = unsafe { array(offsets_name, offsets, rows + 1)? };
    if let Some(r) = (0..rows).find(|&r| off[r] > off[r + 1]) {
        return Err(Error::invalid_argument(format!(
            "{offsets_name}[{}]: {} is below {offsets_name}[{r}] = {} (offsets never decrease)",
            r + 1,
            off[r + 1],
            off[r]
        )));
    }
    let len = usize::try_from(off[rows]).unwrap_or(usize::MAX);
    // SAFETY: the caller's contract.
    let ids = unsafe { array(ids_name, ids, len)? };
    Ok(Some((ids, off)))
}

/// Row `r` of a CSR list (empty without the list).
fn row_of<'a>(list: Option<(&'a [i32], &'a [u64])>, r: usize) -> &'a [i32] {
    list.map_or(&[], |(ids, off)| &ids[off[r] as usize..off[r + 1] as usize])
}

/// The seeds of `rows` watermarked positions (docs/semantics.md, "Watermarking"): row `r`'s
/// context is the last `k` tokens of its history, its prompt (`prompt_ids`, CSR by
/// `prompt_offsets`) then its output so far (`output_ids`, CSR by `output_offsets`), as the
/// sampling step's lists; fewer when the history is shorter. `seeds[r]` is then the seed of that
/// position under `secrets[r]`: draw row `r` with it and offset 0 (and `seeded` set) to
/// watermark it; each token's distribution is the row's own. NULL offsets (and ids): no list.
/// On failure nothing is written.
///
/// # Safety
/// `secrets` and `seeds` hold `rows` elements; non-NULL offsets `rows + 1` and their ids as many
/// as the last offset says.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tokenrace_watermark_seeds(
    rows: u32,
    secrets: *const u64,
    k: u32,
    prompt_ids: *const i32,
    prompt_offsets: *const u64,
    output_ids: *const i32,
    output_offsets: *const u64,
    seeds: *mut u64,
) -> tokenrace_status {
    guard("tokenrace_watermark_seeds", || {
        let rows = rows as usize;
        // SAFETY (every array): the caller's contract.
        let secrets = unsafe { array("secrets", secrets, rows)? };
        let prompt = unsafe { lists(("prompt_ids", "prompt_offsets"), prompt_ids, prompt_offsets, rows)? };
        let output = unsafe { lists(("output_ids", "output_offsets"), output_ids, output_offsets, rows)? };
        if seeds.is_null() && rows > 0 {
            return Err(Error::invalid_argument("seeds: is NULL"));
        }
        let mut out = Vec::with_capacity(rows);
        let mut history = Vec::new();
        for (r, &secret) in secrets.iter().enumerate() {
            let (p, o) = (row_of(prompt, r), row_of(output, r));
            // Only the last k tokens matter: the output's tail, then the prompt's before it.
            let from_prompt = (k as usize).saturating_sub(o.len()).min(p.len());
            history.clear();
            history.extend_from_slice(&p[p.len() - from_prompt..]);
            history.extend_from_slice(o);
            out.push(watermark_seed(secret, context_of(&history, k as usize)));
        }
        // SAFETY: `seeds` holds `rows` elements (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), seeds, rows) };
        Ok(())
    })
}

/// Scores `tokens` (`n_tokens` ids, the text to test) written after `prefix` (`prefix_len` ids:
/// the prompt, whose tail gives the first contexts) for the watermark of `secret` with context
/// window `k`: `*score` = the sum of `-ln(1 - U_t)` over the tokens whose (context, token) pair
/// was not seen before in the text, `U_t = exp(-E_t)` the race's uniform of token `t` at its
/// position's key; `*scored` = how many; `*p_value` = P(Gamma(scored, 1) >= score), the chance of
/// that score without the watermark (1 when nothing was scored). Negative ids are refused naming
/// the position. Any output pointer may be NULL (not reported).
///
/// # Safety
/// `prefix` and `tokens` hold the elements their lengths say.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tokenrace_watermark_detect(
    secret: u64,
    k: u32,
    prefix: *const i32,
    prefix_len: u64,
    tokens: *const i32,
    n_tokens: u64,
    score: *mut f64,
    scored: *mut u64,
    p_value: *mut f64,
) -> tokenrace_status {
    guard("tokenrace_watermark_detect", || {
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        // SAFETY (both arrays): the caller's contract.
        let prefix = unsafe { array("prefix", prefix, size(prefix_len))? };
        let tokens = unsafe { array("tokens", tokens, size(n_tokens))? };
        for (name, ids) in [("prefix", prefix), ("tokens", tokens)] {
            if let Some(i) = ids.iter().position(|&t| t < 0) {
                return Err(Error::invalid_argument(format!("{name}[{i}]: {} is not a token id", ids[i])));
            }
        }
        let d = detect(secret, k as usize, prefix, tokens);
        // SAFETY: each non-NULL output points to one writable value (the caller's contract).
        unsafe {
            if let Some(s) = score.as_mut() {
                *s = d.score;
            }
            if let Some(n) = scored.as_mut() {
                *n = d.scored;
            }
            if let Some(p) = p_value.as_mut() {
                *p = d.p_value;
            }
        }
        Ok(())
    })
}

/// The seeds of the target rows of a watermarked verification (docs/semantics.md,
/// "Watermarking", "Verification"): request `i` has `draft_counts[i]` drafts (in `draft_tokens`,
/// request after request) and `draft_counts[i] + 1` target rows, laid out as `tokenrace_verify`
/// lays them out; row `j` of request `i` gets the seed of the position after its history (the
/// last `k` tokens of its prompt then its output, CSR lists as in `tokenrace_watermark_seeds`)
/// followed by its drafts `0 .. j`. Draw the target rows with these seeds (offset 0, seeded) and
/// keep each request's drafts while they equal the drawn tokens, then its first other drawn
/// token: the position-by-position watermarked text. `seeds` receives `sum(draft_counts) +
/// requests` seeds. On failure nothing is written.
///
/// # Safety
/// `secrets` and `draft_counts` hold `requests` elements, `draft_tokens` their sum, `seeds`
/// their sum plus `requests`; the lists as in `tokenrace_watermark_seeds`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tokenrace_watermark_verify_seeds(
    requests: u32,
    secrets: *const u64,
    k: u32,
    prompt_ids: *const i32,
    prompt_offsets: *const u64,
    output_ids: *const i32,
    output_offsets: *const u64,
    draft_counts: *const i32,
    draft_tokens: *const i32,
    seeds: *mut u64,
) -> tokenrace_status {
    guard("tokenrace_watermark_verify_seeds", || {
        let n = requests as usize;
        // SAFETY (every array): the caller's contract.
        let secrets = unsafe { array("secrets", secrets, n)? };
        let counts = unsafe { array("draft_counts", draft_counts, n)? };
        if let Some(i) = counts.iter().position(|&c| c < 0) {
            return Err(Error::invalid_argument(format!("draft_counts[{i}]: {} is negative", counts[i])));
        }
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        let drafts = unsafe { array("draft_tokens", draft_tokens, total)? };
        let prompt = unsafe { lists(("prompt_ids", "prompt_offsets"), prompt_ids, prompt_offsets, n)? };
        let output = unsafe { lists(("output_ids", "output_offsets"), output_ids, output_offsets, n)? };
        if seeds.is_null() && total + n > 0 {
            return Err(Error::invalid_argument("seeds: is NULL"));
        }
        let mut out = Vec::with_capacity(total + n);
        let (mut at, mut history) = (0, Vec::new());
        for (i, &secret) in secrets.iter().enumerate() {
            let mine = &drafts[at..at + counts[i] as usize];
            at += mine.len();
            history.clear();
            history.extend_from_slice(row_of(prompt, i));
            history.extend_from_slice(row_of(output, i));
            out.extend(crate::watermark::watermark_verify_seeds(secret, k as usize, &history, mine));
        }
        // SAFETY: `seeds` holds `total + requests` elements (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), seeds, out.len()) };
        Ok(())
    })
}
