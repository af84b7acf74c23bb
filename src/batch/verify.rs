//! What a verify call takes and gives back (speculative decoding: `docs/semantics.md`,
//! "Verifying draft tokens"); its checks and its expansion into target rows are `verify.rs`.

use super::{BadWords, ExternalNoise, LogitBias, Logits, LogprobMode, TokenBitmask, TokenLists};

/// The draft model's probabilities: one row of `vocab` f32 per draft token, `row_stride` apart.
#[derive(Clone, Copy, Debug)]
pub struct DraftProbs<'a> {
    /// q of every draft token, row after row (each row a distribution over the vocabulary).
    pub values: &'a [f32],
    /// Elements between rows (>= vocab).
    pub row_stride: usize,
}

/// One verify call's inputs. Per-request slices have at least `requests` elements.
#[derive(Clone, Copy, Debug)]
pub struct VerifyBatch<'a> {
    /// The target logits: `rows = sum(draft_counts) + requests` rows, request after request
    /// (its draft positions, then its bonus position).
    pub logits: Logits<'a>,
    /// Target rows: `sum(draft_counts) + requests`.
    pub rows: usize,
    /// Tokens per row; every draft token is below it.
    pub vocab: usize,
    /// Elements between target rows (>= vocab).
    pub row_stride: usize,
    /// Requests verified by the call; each emits its accepted drafts and one more token.
    pub requests: usize,
    /// Draft tokens per request (>= 0).
    pub draft_counts: &'a [i32],
    /// Every request's draft tokens, one after the other (`sum(draft_counts)` ids).
    pub draft_tokens: &'a [i32],
    /// The draft model's probabilities; `None`: drafts are deterministic (one-hot q).
    pub draft_probs: Option<DraftProbs<'a>>,
    /// Per-request temperature (`None`: 1.0); below the sampler's `greedy_below`: greedy.
    pub temperature: Option<&'a [f32]>,
    /// Per-request top-k of the target distribution (0: off), as in a draw.
    pub top_k: Option<&'a [i32]>,
    /// Per-request top-p of the target distribution (1: off), as in a draw.
    pub top_p: Option<&'a [f32]>,
    /// Per-request min-p of the target distribution (0: off), as in a draw.
    pub min_p: Option<&'a [f32]>,
    /// Per-request seeds: a seeded request's randomness at draft position `j` is a pure
    /// function of (seed, offset + j).
    pub seeds: Option<&'a [u64]>,
    /// Per-request position of the first draft token (`None`: 0).
    pub offsets: Option<&'a [u64]>,
    /// Which requests use their seed (nonzero); `None` with `seeds`: every request.
    pub seeded: Option<&'a [u8]>,
    /// Acceptance uniforms in (0, 1), one per draft token, for the unseeded sampling requests.
    pub uniforms: Option<&'a [f64]>,
    /// Noise of the recovered and bonus draws, one row per target row, for the unseeded
    /// sampling requests.
    pub noise: Option<ExternalNoise<'a>>,
    /// A draft tree per request (`docs/semantics.md`, "Draft trees"): one parent per draft
    /// node, request-local, `-1` for a child of the request's context, else the index of an
    /// earlier node of the same request. `None`: each request's drafts are a chain (node `i`'s
    /// parent is `i - 1`).
    pub draft_parents: Option<&'a [i32]>,
    /// The sampling step applied to every target row before it judges its drafts
    /// (`docs/semantics.md`, "The sampling step in verification"); all `None`: the target rows
    /// are judged as given.
    pub step: VerifyStep<'a>,
}

/// The sampling step of a verify call: each target row is processed exactly as a draw of that
/// row with these inputs would process it, its output history being the request's output
/// followed by the drafts before its position (a tree node's: the drafts of its ancestors).
/// Lists and parameters are per REQUEST (CSR lists of `requests` rows); the bitmask is per
/// TARGET ROW. The fields mean what the [`Batch`](super::Batch) fields of the same names mean.
#[derive(Clone, Copy, Debug, Default)]
pub struct VerifyStep<'a> {
    /// Each request's prompt (the repetition penalty).
    pub prompt_tokens: Option<TokenLists<'a>>,
    /// Each request's output so far, before its drafts (the penalties, bad words, min_tokens).
    pub output_tokens: Option<TokenLists<'a>>,
    /// Per-request repetition penalty r > 0; 1 is off.
    pub repetition_penalty: Option<&'a [f32]>,
    /// Per-request frequency penalty, finite; 0 is off.
    pub frequency_penalty: Option<&'a [f32]>,
    /// Per-request presence penalty, finite; 0 is off.
    pub presence_penalty: Option<&'a [f32]>,
    /// Each request's sparse (id, bias) pairs.
    pub logit_bias: Option<LogitBias<'a>>,
    /// The only tokens each request may emit (requests that `allowed_rows` leaves out are
    /// unrestricted).
    pub allowed_tokens: Option<TokenLists<'a>>,
    /// Which requests carry an allowed list (nonzero); `None` with `allowed_tokens`: every one.
    pub allowed_rows: Option<&'a [u8]>,
    /// Tokens each request may not emit.
    pub banned_tokens: Option<TokenLists<'a>>,
    /// Each request's bad words (a word's prefix is matched against the row's history).
    pub bad_words: Option<BadWords<'a>>,
    /// Per-request minimum output length: a target row whose history (output and drafts before
    /// it) is shorter bans the request's stop tokens.
    pub min_tokens: Option<&'a [i32]>,
    /// Each request's stop tokens.
    pub stop_tokens: Option<TokenLists<'a>>,
    /// A grammar bitmask row per TARGET ROW (xgrammar's layout), `rows` rows.
    pub token_bitmask: Option<TokenBitmask<'a>>,
}

impl VerifyStep<'_> {
    /// Whether any input is given (else the target rows are judged as given).
    pub fn is_on(&self) -> bool {
        let s = self;
        s.prompt_tokens.is_some()
            || s.output_tokens.is_some()
            || s.repetition_penalty.is_some()
            || s.frequency_penalty.is_some()
            || s.presence_penalty.is_some()
            || s.logit_bias.is_some()
            || s.allowed_tokens.is_some()
            || s.allowed_rows.is_some()
            || s.banned_tokens.is_some()
            || s.bad_words.is_some()
            || s.min_tokens.is_some()
            || s.stop_tokens.is_some()
            || s.token_bitmask.is_some()
    }
}

impl<'a> VerifyBatch<'a> {
    /// A call with contiguous target rows, deterministic drafts and no per-request options.
    pub fn new(logits: Logits<'a>, vocab: usize, draft_counts: &'a [i32], draft_tokens: &'a [i32]) -> Self {
        let drafts: i64 = draft_counts.iter().map(|&c| c.max(0) as i64).sum();
        VerifyBatch {
            logits,
            rows: drafts as usize + draft_counts.len(),
            vocab,
            row_stride: vocab,
            requests: draft_counts.len(),
            draft_counts,
            draft_tokens,
            draft_probs: None,
            temperature: None,
            top_k: None,
            top_p: None,
            min_p: None,
            seeds: None,
            offsets: None,
            seeded: None,
            uniforms: None,
            noise: None,
            draft_parents: None,
            step: VerifyStep::default(),
        }
    }
}

/// Where a verify call writes; nothing is written unless it succeeds.
#[derive(Debug)]
pub struct VerifyOutput<'a> {
    /// `requests` rows of `tokens_stride` int32: the emitted tokens, then -1 (vLLM's
    /// placeholder).
    pub tokens: &'a mut [i32],
    /// Elements between requests' rows of `tokens` (and `logprobs`); 0: `max(draft_counts) + 1`.
    pub tokens_stride: usize,
    /// Emitted tokens per request (accepted drafts + 1).
    pub counts: &'a mut [i32],
    /// Per request: the `flags` of every target row it looked at, or-ed.
    pub flags: Option<&'a mut [u32]>,
    /// The logprob of each emitted token in its target row, in `logprob_mode` (NaN padding).
    pub logprobs: Option<&'a mut [f32]>,
    /// Whether `logprobs` are of the raw target row or of the processed one.
    pub logprob_mode: LogprobMode,
    /// As `tokens`: the request-local index of each accepted draft node, in path order, then -1
    /// (the recovered or bonus token is no node).
    pub accepted_nodes: Option<&'a mut [i32]>,
}

impl<'a> VerifyOutput<'a> {
    /// An output of the emitted `tokens` (`requests x (max drafts + 1)`, contiguous) and their
    /// `counts`, without flags or logprobs.
    pub fn new(tokens: &'a mut [i32], counts: &'a mut [i32]) -> Self {
        VerifyOutput {
            tokens,
            tokens_stride: 0,
            counts,
            flags: None,
            logprobs: None,
            logprob_mode: LogprobMode::Raw,
            accepted_nodes: None,
        }
    }
}
