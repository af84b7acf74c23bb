//! The histories of the live requests, kept between draws (`docs/semantics.md`, Request state).
//!
//! A runtime's histories grow by a token or a few per request and step; passing every row's
//! whole prompt and output to each draw (and converting them there) costs more than the draw.
//! [`Requests`] holds them instead, keyed by a request id the caller chooses: a request is
//! added once (`O(its history)`), its new tokens appended each step (`O(new tokens)`), and a
//! draw names its rows by request id ([`RequestRows`]).
//!
//! Each request keeps its prompt and output in order (the penalty window reads their last
//! tokens), the prompt's distinct tokens sorted (what the repetition penalty reads of a whole
//! prompt: its set, a tenth or less of a long prompt's length, marked in increasing word order),
//! and the largest token of both (a draw checks it against its vocabulary in `O(1)`).
//!
//! Every operation checks its whole input and makes its room before it changes anything: a
//! failed one (a refused argument, `OUT_OF_MEMORY`) leaves the state as it was.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::alloc;
use crate::error::{Error, ErrorKind, Result};

mod params;
pub use params::RequestParams;

/// The hash of a request id: its bits mixed by one multiplication (Fibonacci hashing), where the
/// standard library's SipHash took 5.5% of the samples of a draw of 32 short rows (vocab 256)
/// naming requests (a draw looks a row's request up a dozen times). Ids come from the runtime,
/// not from its users, so the table needs no defence against chosen collisions.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // (The high bits of the product mix every bit of the id; the table reads the low ones.)
        let h = (self.0 ^ (self.0 >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }
}

/// A token the output repeats, with its occurrences after the first.
pub(crate) type Repeat = (i32, u32);

/// The histories of one live request.
#[derive(Debug)]
pub(crate) struct Request {
    prompt: Vec<i32>,
    /// The prompt's distinct tokens, increasing.
    prompt_set: Vec<i32>,
    /// The prompt's tokens as bits (bit `t % 32` of word `t / 32`), up to the word of its
    /// largest token: what the repetition penalty reads of a whole prompt, ORed into a row's
    /// bitset in `O(vocab / 32)` instead of a load and a store per token of a long prompt.
    prompt_bits: Vec<u32>,
    output: Vec<i32>,
    /// The output's distinct tokens as bits (bit `t % 32` of word `t / 32`), up to the word of
    /// its largest token, and its repeated tokens, increasing, each with its occurrences after
    /// the first: the output's penalty counts, kept as tokens are appended, which a step whose
    /// window keeps the whole output reads in place of the output (`O(vocab / 32 + repeats)`,
    /// not a load and a store per token of a long output).
    output_bits: Vec<u32>,
    repeats: Vec<Repeat>,
    /// The largest token of the prompt and the output (-1 while both are empty).
    largest: i32,
    /// The request's sampling parameters, when it set any (`None`: every one off).
    params: Option<Box<RequestParams>>,
    /// The largest token id the parameters' lists name (-1 when none).
    params_largest: i32,
}

impl Request {
    /// The prompt, in order.
    pub(crate) fn prompt(&self) -> &[i32] {
        &self.prompt
    }
    /// The prompt's distinct tokens, increasing.
    pub(crate) fn prompt_set(&self) -> &[i32] {
        &self.prompt_set
    }
    /// The prompt's tokens as bits, up to the word of its largest token.
    pub(crate) fn prompt_bits(&self) -> &[u32] {
        &self.prompt_bits
    }
    /// The output, in order.
    pub(crate) fn output(&self) -> &[i32] {
        &self.output
    }
    /// The output's distinct tokens as bits, up to the word of its largest token.
    pub(crate) fn output_bits(&self) -> &[u32] {
        &self.output_bits
    }
    /// The output's repeated tokens, increasing, with their occurrences after the first.
    pub(crate) fn repeats(&self) -> &[(i32, u32)] {
        &self.repeats
    }

    /// Counts token `t` (>= 0), just appended to the output, into `output_bits` and `repeats`,
    /// whose room was made ([`Requests::make_room`]): allocates nothing.
    fn count_output(&mut self, t: i32) {
        let (w, bit) = (t as usize / 32, 1u32 << (t % 32));
        if w >= self.output_bits.len() {
            debug_assert!(self.output_bits.capacity() > w);
            self.output_bits.resize(w + 1, 0);
        }
        if self.output_bits[w] & bit == 0 {
            self.output_bits[w] |= bit;
            return;
        }
        match self.repeats.binary_search_by_key(&t, |&(id, _)| id) {
            Ok(i) => self.repeats[i].1 += 1,
            Err(i) => {
                debug_assert!(self.repeats.len() < self.repeats.capacity());
                self.repeats.insert(i, (t, 1));
            }
        }
    }
    /// The largest token of the histories, -1 when they are empty.
    pub(crate) fn largest(&self) -> i32 {
        self.largest
    }
    /// The request's sampling parameters, when it set any.
    pub(crate) fn params(&self) -> Option<&RequestParams> {
        self.params.as_deref()
    }
    /// The largest token id its parameters' lists name, -1 when they name none.
    pub(crate) fn params_largest(&self) -> i32 {
        self.params_largest
    }
}

/// The prompt and output histories of the live requests, keyed by a caller-chosen `u64` id.
///
/// Not locked: a draw reads it through a shared borrow ([`RequestRows`]), the operations that
/// change it take `&mut self` (the C handle wraps it in a lock).
#[derive(Default)]
pub struct Requests {
    live: HashMap<u64, Request, BuildHasherDefault<IdHasher>>,
    /// How many live requests hold parameters: a draw looks for them only when some do.
    with_params: usize,
}

impl std::fmt::Debug for Requests {
    /// The count alone: a batch's debug print would otherwise hold every history.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Requests({} requests)", self.live.len())
    }
}

/// The rows of a draw named by request id: row `r`'s prompt and output are those of request
/// `ids[r]` of `state` (instead of the batch's `prompt_tokens` and `output_tokens`).
#[derive(Clone, Copy, Debug)]
pub struct RequestRows<'a> {
    /// The state that holds the requests.
    pub state: &'a Requests,
    /// One request id per row (`rows` entries); a request may be named by several rows.
    pub ids: &'a [u64],
}

impl<'a> RequestRows<'a> {
    /// The request of row `r`, when the state holds it (always, in a validated batch).
    pub(crate) fn row(&self, r: usize) -> Option<&'a Request> {
        self.state.live.get(&self.ids[r])
    }
}

fn out_of_memory(what: &str) -> Error {
    Error::new(ErrorKind::OutOfMemory, format!("{what}: cannot allocate"))
}

/// The first token of `tokens` that is not an id (negative), as an error naming `what`.
fn check_tokens(tokens: &[i32], what: &str) -> Result<()> {
    match tokens.iter().position(|&t| t < 0) {
        Some(j) => Err(Error::invalid_argument(format!("{what}[{j}]: {} is not a token id (>= 0)", tokens[j]))),
        None => Ok(()),
    }
}

impl Requests {
    /// An empty state.
    pub fn new() -> Requests {
        Requests::default()
    }

    /// How many requests it holds.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether it holds no request.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Whether it holds request `id`.
    pub fn contains(&self, id: u64) -> bool {
        self.live.contains_key(&id)
    }

    /// The prompt of request `id`, in order.
    pub fn prompt(&self, id: u64) -> Option<&[i32]> {
        self.live.get(&id).map(|q| &q.prompt[..])
    }

    /// The output of request `id`, in order.
    pub fn output(&self, id: u64) -> Option<&[i32]> {
        self.live.get(&id).map(|q| &q.output[..])
    }

    /// Adds request `id` with its `prompt` and the `output` it has so far (token ids >= 0; the
    /// vocabulary is checked by each draw that names it). Refused when `id` is live.
    pub fn add(&mut self, id: u64, prompt: &[i32], output: &[i32]) -> Result<()> {
        if self.live.contains_key(&id) {
            return Err(Error::invalid_argument(format!("id: request {id} is already in the state")));
        }
        check_tokens(prompt, "prompt")?;
        check_tokens(output, "output")?;
        let mut prompt_set = alloc::collect(prompt.iter().copied(), "the request's prompt tokens")?;
        prompt_set.sort_unstable();
        prompt_set.dedup();
        let words = prompt_set.last().map_or(0, |&t| t as usize / 32 + 1);
        let mut prompt_bits = alloc::filled(words, 0u32, "the request's prompt bits")?;
        for &t in &prompt_set {
            prompt_bits[t as usize / 32] |= 1 << (t % 32);
        }
        let (output_bits, repeats) = output_counts(output)?;
        let request = Request {
            prompt: alloc::collect(prompt.iter().copied(), "the request's prompt")?,
            prompt_set,
            prompt_bits,
            output: alloc::collect(output.iter().copied(), "the request's output")?,
            output_bits,
            repeats,
            largest: prompt.iter().chain(output).copied().max().unwrap_or(-1),
            params: None,
            params_largest: -1,
        };
        self.live.try_reserve(1).map_err(|_| out_of_memory("the requests' table"))?;
        self.live.insert(id, request);
        Ok(())
    }

    /// Removes request `id` (its storage is freed). Refused when `id` is not live.
    pub fn remove(&mut self, id: u64) -> Result<()> {
        match self.live.remove(&id) {
            Some(q) => {
                self.with_params -= q.params.is_some() as usize;
                Ok(())
            }
            None => Err(Error::invalid_argument(format!("id: request {id} is not in the state"))),
        }
    }

    /// Removes every request.
    pub fn reset(&mut self) {
        self.live = HashMap::default();
        self.with_params = 0;
    }

    /// Sets the sampling parameters of request `id` (replacing any it had; the default turns
    /// every one off): a draw that names the request takes from them each parameter its batch
    /// leaves unset ([`RequestParams`]). Refused when `id` is not live or a value breaks the
    /// batch's rule for it (`params.top_p: 1.5 is not in (0, 1]`); a refused call changes
    /// nothing. Token ids are checked against each draw's vocabulary when it names the request.
    pub fn set_params(&mut self, id: u64, params: RequestParams) -> Result<()> {
        crate::batch::check_request_params(&params)?;
        let Some(q) = self.live.get_mut(&id) else {
            return Err(Error::invalid_argument(format!("id: request {id} is not in the state")));
        };
        let had = q.params.is_some();
        if params == RequestParams::default() {
            (q.params, q.params_largest) = (None, -1);
        } else {
            let boxed = Box::new(params);
            q.params_largest = boxed.largest_id();
            q.params = Some(boxed);
        }
        self.with_params = self.with_params - had as usize + q.params.is_some() as usize;
        Ok(())
    }

    /// The sampling parameters of request `id`: `None` when it is not live, the defaults when it
    /// set none.
    pub fn params(&self, id: u64) -> Option<RequestParams> {
        self.live.get(&id).map(|q| q.params.as_deref().cloned().unwrap_or_default())
    }

    /// Whether any live request holds parameters.
    pub(crate) fn any_params(&self) -> bool {
        self.with_params > 0
    }

    /// Appends new output tokens to several requests at once: request `ids[i]` gets
    /// `tokens[offsets[i]..offsets[i + 1]]` (`offsets` has `ids.len() + 1` non-decreasing
    /// entries), or `tokens[i]` alone without `offsets` (a step's drawn tokens). A request named
    /// twice gets both lists, in order. Every id must be live and every token >= 0; a refused
    /// call appends nothing.
    pub fn append(&mut self, ids: &[u64], tokens: &[i32], offsets: Option<&[u64]>) -> Result<()> {
        let span = |i: usize| match offsets {
            Some(o) => o[i] as usize..o[i + 1] as usize,
            None => i..i + 1,
        };
        match offsets {
            Some(o) => check_offsets(o, ids.len(), tokens.len())?,
            None if tokens.len() < ids.len() => {
                return Err(Error::invalid_argument(format!(
                    "tokens: has {} entries, one per id is {}",
                    tokens.len(),
                    ids.len()
                )))
            }
            None => {}
        }
        self.append_spans(ids, tokens, span)
    }

    /// Appends a verify call's emitted tokens: request `ids[i]` gets `counts[i]` tokens from
    /// `tokens[i * stride ..]` (`tokenrace_verify_output`'s `tokens`, `tokens_stride` and
    /// `counts`: each count in `[0, stride]`, `tokens` holding `ids.len() * stride` entries). A
    /// request named twice gets both, in order; every id must be live and every appended token
    /// >= 0: a refused call appends nothing.
    pub fn append_strided(&mut self, ids: &[u64], tokens: &[i32], stride: usize, counts: &[i32]) -> Result<()> {
        let n = ids.len();
        if counts.len() < n {
            return Err(Error::invalid_argument(format!("counts: has {} entries, one per id is {n}", counts.len())));
        }
        if let Some(i) = (0..n).find(|&i| counts[i] < 0 || counts[i] as usize > stride) {
            return Err(Error::invalid_argument(format!(
                "counts[{i}]: {} is not in [0, {stride}] (the stride)",
                counts[i]
            )));
        }
        let need = n.checked_mul(stride).filter(|&need| need <= tokens.len());
        if need.is_none() {
            return Err(Error::invalid_argument(format!(
                "tokens: has {} entries, ids x stride is {n} x {stride}",
                tokens.len()
            )));
        }
        self.append_spans(ids, tokens, |i| i * stride..i * stride + counts[i] as usize)
    }

    /// Appends `tokens[span(i)]` to request `ids[i]`, each span within `tokens`: every id
    /// checked live and every token >= 0, then the room made, then the pushes, which cannot
    /// fail.
    fn append_spans(
        &mut self,
        ids: &[u64],
        tokens: &[i32],
        span: impl Fn(usize) -> std::ops::Range<usize>,
    ) -> Result<()> {
        for (i, &id) in ids.iter().enumerate() {
            if !self.live.contains_key(&id) {
                return Err(Error::invalid_argument(format!("ids[{i}]: request {id} is not in the state")));
            }
            let s = span(i);
            check_tokens(&tokens[s.clone()], &format!("tokens (of ids[{i}], from entry {})", s.start))?;
        }
        let largest = |i: usize| tokens[span(i)].iter().copied().max().unwrap_or(-1);
        self.make_room(ids.iter().enumerate().map(|(i, &id)| (id, span(i).len(), largest(i))))?;
        for (i, &id) in ids.iter().enumerate() {
            self.push_output(id, &tokens[span(i)]);
        }
        Ok(())
    }

    /// Makes room in the output of each live request that `ids` names for one more token per
    /// naming (a token below `vocab`), so that [`Requests::append_drawn`] of those ids cannot
    /// fail. Ids that are not live are skipped (a draw that names one is refused before anything
    /// is appended).
    pub(crate) fn reserve_drawn(&mut self, ids: &[u64], vocab: usize) -> Result<()> {
        let live = ids.iter().filter(|&&id| self.live.contains_key(&id));
        let named = alloc::collect(live.map(|&id| (id, 1, vocab.saturating_sub(1) as i32)), "the rows' ids")?;
        self.make_room(named.into_iter())
    }

    /// Appends a draw's tokens, `tokens[r]` to request `ids[r]` in row order, after
    /// [`Requests::reserve_drawn`] of `ids` and a draw that validated them: nothing can fail.
    pub(crate) fn append_drawn(&mut self, ids: &[u64], tokens: &[i32]) {
        for (&id, &t) in ids.iter().zip(tokens) {
            self.push_output(id, &[t]);
        }
    }

    /// Grows the storage of each named request for `(id, new tokens, largest new token)`: its
    /// output by the total of its entries (a request may be named several times), its repeats
    /// as much (each new token may repeat one), its output bits to the word of the largest. A
    /// failed allocation leaves the room already made, which changes no history.
    fn make_room(&mut self, named: impl Iterator<Item = (u64, usize, i32)>) -> Result<()> {
        let mut totals = alloc::collect(named, "the append's totals")?;
        totals.sort_unstable_by_key(|&(id, _, _)| id);
        let mut at = 0;
        while at < totals.len() {
            let id = totals[at].0;
            let (mut more, mut largest) = (0, -1);
            while at < totals.len() && totals[at].0 == id {
                more += totals[at].1;
                largest = largest.max(totals[at].2);
                at += 1;
            }
            let q = self.live.get_mut(&id).expect("live: checked by the caller");
            // (`try_reserve`, not exact: one token a step must grow the output geometrically.)
            q.output.try_reserve(more).map_err(|_| out_of_memory("the request's output"))?;
            q.repeats.try_reserve(more).map_err(|_| out_of_memory("the request's output counts"))?;
            let words = usize::try_from(largest).map_or(0, |t| t / 32 + 1);
            let grow = words.saturating_sub(q.output_bits.len());
            q.output_bits.try_reserve(grow).map_err(|_| out_of_memory("the request's output counts"))?;
        }
        Ok(())
    }

    /// Appends `new` to the output of live request `id`, whose room was made.
    fn push_output(&mut self, id: u64, new: &[i32]) {
        let q = self.live.get_mut(&id).expect("live: checked by the caller");
        debug_assert!(q.output.capacity() - q.output.len() >= new.len());
        q.output.extend_from_slice(new);
        q.largest = new.iter().copied().fold(q.largest, i32::max);
        for &t in new {
            q.count_output(t);
        }
    }
}

/// The counts of a request's `output` (token ids >= 0): its distinct tokens as bits and its
/// repeated tokens, increasing, with their occurrences after the first.
fn output_counts(output: &[i32]) -> Result<(Vec<u32>, Vec<Repeat>)> {
    let mut sorted = alloc::collect(output.iter().copied(), "the request's output counts")?;
    sorted.sort_unstable();
    let words = sorted.last().map_or(0, |&t| t as usize / 32 + 1);
    let mut bits = alloc::filled(words, 0u32, "the request's output counts")?;
    let repeated = sorted.chunk_by(|a, b| a == b).filter(|run| run.len() > 1).count();
    let mut repeats = alloc::with_capacity(repeated, "the request's output counts")?;
    for run in sorted.chunk_by(|a, b| a == b) {
        let t = run[0];
        bits[t as usize / 32] |= 1 << (t % 32);
        if run.len() > 1 {
            repeats.push((t, run.len() as u32 - 1));
        }
    }
    Ok((bits, repeats))
}

/// Checks `offsets` of an append: `n + 1` non-decreasing entries, the last within `have` tokens.
fn check_offsets(offsets: &[u64], n: usize, have: usize) -> Result<()> {
    if offsets.len() < n + 1 {
        return Err(Error::invalid_argument(format!("offsets: has {} entries, ids + 1 is {}", offsets.len(), n + 1)));
    }
    for i in 0..n {
        if offsets[i] > offsets[i + 1] {
            return Err(Error::invalid_argument(format!(
                "offsets[{}]: {} is below the previous offset {} (offsets must not decrease)",
                i + 1,
                offsets[i + 1],
                offsets[i]
            )));
        }
    }
    if offsets[n] > have as u64 {
        return Err(Error::invalid_argument(format!("offsets[{n}]: {} exceeds the {have} tokens", offsets[n])));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_append_remove_keep_the_histories() {
        let mut s = Requests::new();
        s.add(7, &[3, 1, 3, 2], &[5]).unwrap();
        s.add(9, &[], &[]).unwrap();
        assert!(s.add(7, &[1], &[]).is_err());
        s.append(&[9, 7, 9], &[4, 6, 8, 8], Some(&[0, 1, 2, 4])).unwrap();
        s.append(&[7, 9], &[0, 2], None).unwrap();
        assert_eq!(s.output(7).unwrap(), &[5, 6, 0]);
        assert_eq!(s.output(9).unwrap(), &[4, 8, 8, 2]);
        // The output's counts, kept as tokens come: the distinct tokens' bits, the repeats.
        let q = s.live.get(&9).unwrap();
        assert_eq!((q.output_bits(), q.repeats()), (&[0b1_0001_0100][..], &[(8, 1)][..]));
        s.append(&[9, 9], &[8, 40], None).unwrap();
        let q = s.live.get(&9).unwrap();
        assert_eq!((q.output_bits(), q.repeats()), (&[0b1_0001_0100, 1 << 8][..], &[(8, 2)][..]));
        s.add(11, &[], &[3, 3, 70, 3, 1]).unwrap();
        let q = s.live.get(&11).unwrap();
        assert_eq!((q.output_bits(), q.repeats()), (&[0b1010, 0, 1 << 6][..], &[(3, 2)][..]));
        s.remove(11).unwrap();
        let q = s.live.get(&7).unwrap();
        assert_eq!((q.prompt_set(), q.largest(), q.prompt_bits()), (&[1, 2, 3][..], 6, &[0b1110][..]));
        // A refused append changes nothing.
        assert!(s.append(&[7, 8], &[1, 1], None).unwrap_err().message.contains("ids[1]: request 8"));
        assert!(s.append(&[7, 9], &[1, -1], None).unwrap_err().message.contains("-1"));
        assert_eq!(s.output(7).unwrap(), &[5, 6, 0]);
        // A verify call's emitted tokens: rows of stride 3, counts 2 and 1 (request 9 twice).
        s.append_strided(&[7, 9], &[10, 11, -1, 12, -1, -1], 3, &[2, 1]).unwrap();
        assert_eq!(
            (s.output(7).unwrap(), s.output(9).unwrap()),
            (&[5, 6, 0, 10, 11][..], &[4, 8, 8, 2, 8, 40, 12][..])
        );
        assert!(s.append_strided(&[7, 9], &[1, 2, 3, 4, 5], 3, &[1, 1]).unwrap_err().message.contains("tokens: has 5"));
        assert!(s.append_strided(&[7, 9], &[1; 6], 3, &[4, 1]).unwrap_err().message.contains("counts[0]: 4"));
        assert!(s.append_strided(&[7, 9], &[1, 1, 1, -1, 1, 1], 3, &[1, 1]).unwrap_err().message.contains("ids[1]"));
        assert_eq!(s.output(7).unwrap().len(), 5);
        s.remove(7).unwrap();
        assert!(s.remove(7).is_err());
        assert_eq!(s.len(), 1);
        s.reset();
        assert!(s.is_empty());
    }
}
