//! The C types: status codes, enums, flags and the versioned structs (the opaque handles live
//! with their functions, in `api.rs` and `pool_api.rs`). Every struct starts with
//! `struct_size` so that callers built against an older or newer header keep working
//! (`convert.rs` reads and writes them); enum-valued fields are plain `uint32_t` so that a bad
//! value from C is an error, not undefined behaviour.

use std::ffi::c_void;

/// The result of every fallible call. On anything but `TOKENRACE_STATUS_OK`,
/// `tokenrace_last_error()` says what was wrong, naming the argument, row or variable.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_status {
    /// Success.
    Ok = 0,
    /// An argument is wrong: a NULL pointer, a bad size, a bad per-row value.
    InvalidArgument = 1,
    /// A configuration field or `TOKENRACE_*` variable is wrong.
    InvalidConfig = 2,
    /// An allocation failed.
    OutOfMemory = 3,
    /// A bug in tokenrace (a caught panic); please report it.
    Internal = 4,
    /// Valid, but not possible with this build or CPU (e.g. AVX-512 on a CPU without it).
    Unsupported = 5,
    /// A wait ran out of time (a noise pool under the BLOCK policy).
    Timeout = 6,
    /// The object is shut down or unusable in this process.
    Closed = 7,
}

/// Element type of the logits.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_dtype {
    /// IEEE binary32 (`float`).
    F32 = 0,
    /// bfloat16, as its 16 bits (`uint16_t`).
    Bf16 = 1,
    /// IEEE binary16, as its 16 bits (`uint16_t`, or `_Float16`).
    F16 = 2,
}

/// What noise values hold.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_noise_kind {
    /// E ~ Exp(1) (vLLM's `q`, aiter's `exponentials`).
    Exp = 0,
    /// ln E (the Spyre ring buffer), used as `logits - log_noise`.
    LogExp = 1,
}

/// Instruction set of the kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_simd {
    /// The best level this CPU supports.
    Auto = 0,
    /// One lane at a time (the generic kernels with a lane count of 1).
    Scalar = 1,
    /// Fixed-width arrays the compiler vectorises for the target's baseline (SSE2, NEON; scalar
    /// code on the default s390x target).
    Portable = 2,
    /// x86-64 AVX2 and F16C (no FMA, by design: every level rounds alike).
    Avx2 = 3,
    /// x86-64 AVX-512F.
    Avx512 = 4,
    /// aarch64 NEON (the portable arrays with a NEON first pass).
    Neon = 5,
    /// s390x vector-enhancements 2 (z15 and later; in builds by Rust 1.93 or later).
    Vxe2 = 6,
}

/// Where a sampler's unseeded sampling rows take their noise from.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_noise_source {
    /// The pool attached with `tokenrace_sampler_attach_pool()` when there is one, else inline.
    Auto = 0,
    /// Always inline noise; attaching a pool is refused.
    Inline = 1,
    /// The sampler's own pool (made with it), or the pool attached.
    Pool = 2,
}

/// What a noise pool does when the rows asked for are not ready.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_pool_policy {
    /// Generate the rows on the borrower's thread (counted in `tokenrace_pool_stats.inline_rows`).
    Inline = 0,
    /// Wait for the producers up to `timeout_ms`, then fail with TIMEOUT.
    Block = 1,
}

/// How much the library logs (`tokenrace_config.log_level`, `TOKENRACE_LOG_LEVEL`); also the
/// level passed to a `tokenrace_log_callback`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_log_level {
    /// No messages.
    Off = 0,
    /// Errors only.
    Error = 1,
    /// Warnings (an unknown `TOKENRACE_*` variable, ...) and errors; the default.
    Warn = 2,
    /// The SIMD level draws run on and each pool as it starts, and the above.
    Info = 3,
    /// Each sampler as it is made, and the above.
    Debug = 4,
    /// Every message.
    Trace = 5,
}

/// Which logprobs `tokenrace_output` receives.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_logprob_mode {
    /// log_softmax of the logits as given (vLLM's default).
    Raw = 0,
    /// log_softmax after the sampling step's inputs, temperature and the filters (greedy rows: of the
    /// row after the sampling step's inputs, at temperature 1 and without the filters).
    Processed = 1,
}

/// What `tokenrace_output.full_logprobs` receives for every token (docs/semantics.md).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_full_mode {
    /// log_softmax of the logits as given.
    Raw = 0,
    /// log_softmax of the processed row (masks, bias, penalties, temperature, filters), -inf
    /// outside the kept tokens.
    Processed = 1,
    /// The processed logits: penalised, divided by T, -inf outside the kept tokens.
    ProcessedLogits = 2,
}

/// Whether the filters judge the tempered distribution (vLLM) or the untempered one (llama.cpp).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_filter_order {
    /// vLLM's: temperature, then min-p, top-k, top-p on the tempered distribution.
    TemperatureFirst = 0,
    /// llama.cpp's chain: the filters on the untempered distribution, then temperature.
    FiltersFirst = 1,
}

/// A stage of `tokenrace_batch.order` (ids 8 and 9 are kept for DRY and mirostat).
// For the header only: `order` is read as u32 ids and matched to `filter::chain::Stage`.
#[allow(dead_code)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tokenrace_stage {
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
    /// The temperature, a dynamic one when the row's `dynatemp_range > 0`.
    Temperature = 7,
}

// Row flags written to `tokenrace_output.flags`: the values of `crate::batch::flags`, for the
// header (a test checks that they agree).
/// Row flag: the row held at least one NaN logit (NaN never wins).
#[allow(dead_code)]
pub const TOKENRACE_FLAG_HAS_NAN: u32 = 1;
/// Row flag: the row held a +inf logit; the first +inf won.
#[allow(dead_code)]
pub const TOKENRACE_FLAG_HAS_POSINF: u32 = 2;
/// Row flag: the row had no finite and no +inf logit; token 0 was returned.
#[allow(dead_code)]
pub const TOKENRACE_FLAG_EMPTY: u32 = 4;
/// Row flag: the row was drawn greedily (temperature below the greedy threshold).
#[allow(dead_code)]
pub const TOKENRACE_FLAG_GREEDY: u32 = 8;
/// Row flag: the row's forced token is one its sampling step bans (a mask or a -inf bias):
/// returned all the same, with a processed logprob of -inf.
#[allow(dead_code)]
pub const TOKENRACE_FLAG_FORCED_BANNED: u32 = 16;

/// The version of this ABI; bumped on any incompatible change (compatible growth of a struct
/// keeps it: callers set `struct_size`). A struct passed in is read up to its `struct_size`, which
/// must be at least the size of the struct's first version and must not end inside a field
/// (else INVALID_ARGUMENT naming it);
/// fields it does not reach take their defaults. A `struct_size` larger than this library's
/// struct is accepted when the bytes beyond it are zero, and is UNSUPPORTED otherwise (the caller
/// set fields this library does not know). A struct written out is written up to the smaller of
/// the two sizes.
pub const TOKENRACE_ABI_VERSION: u32 = 1;

/// Sampler settings. Get one from `tokenrace_config_default()` or `tokenrace_config_from_env()`,
/// change fields, pass it to `tokenrace_sampler_new()`. `docs/configuration.md` documents each.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tokenrace_config {
    /// sizeof(tokenrace_config) as the caller knows it.
    pub struct_size: u32,
    /// Vocabulary size every batch must have; 0 accepts any.
    pub vocab_size: u32,
    /// Most rows in one call.
    pub max_rows: u32,
    /// Worker threads; 1 draws on the calling thread, 0 uses every core.
    pub threads: u32,
    /// Seed of the stream that keys unseeded rows, used when `has_seed` is nonzero.
    pub seed: u64,
    /// Nonzero: use `seed`; zero: seed from OS entropy.
    pub has_seed: u32,
    /// A `tokenrace_simd`.
    pub simd: u32,
    /// Rows with a temperature below this are greedy.
    pub greedy_below: f32,
    /// A `tokenrace_log_level`.
    pub log_level: u32,
    /// A `tokenrace_noise_source`.
    pub noise: u32,
    /// Capacity in rows of the sampler's own pool (noise = pool); 0 means 4 x max_rows. (The
    /// counter `tokenrace_sampler_stats.pool_rows` is another thing: rows drawn on pool noise.)
    pub pool_rows: u32,
    /// A `tokenrace_filter_order` (since 0.2; 0, the default, is TEMPERATURE_FIRST).
    pub filter_order: u32,
    /// Padding made explicit: 0 (ignored on input, written as 0).
    pub reserved1: u32,
}

/// One draw call's inputs. Zero-initialise, set `struct_size = sizeof(tokenrace_batch)`, then the
/// fields you use; every per-row pointer may be NULL (its default then applies) or point to
/// `rows` elements.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tokenrace_batch {
    /// sizeof(tokenrace_batch) as the caller knows it.
    pub struct_size: u32,
    /// A `tokenrace_dtype`.
    pub dtype: u32,
    /// rows x row_stride elements of `dtype` (the last row needs only `vocab`).
    pub logits: *const c_void,
    /// Rows of logits; at most the sampler's `max_rows`.
    pub rows: u32,
    /// Logits per row; the sampler's `vocab_size` when that is nonzero.
    pub vocab: u32,
    /// Elements between the starts of consecutive rows; 0 means `vocab` (contiguous rows).
    pub row_stride: u64,
    /// Per-row temperature (NULL: 1.0). Below the sampler's greedy threshold a row is greedy.
    pub temperature: *const f32,
    /// Per-row seed (NULL: no row is seeded). A seeded row's noise is a pure function of
    /// (seed, offset, token index): it draws the same token whatever else is in the batch.
    pub seeds: *const u64,
    /// Per-row offset mixed into the seed, e.g. the token's position (NULL: 0).
    pub offsets: *const u64,
    /// Per-row flag, nonzero = the row uses its seed (NULL with `seeds`: every row).
    pub seeded: *const u8,
    /// Noise for the unseeded sampling rows: one f32 per token (NULL: the sampler's own noise).
    pub noise: *const f32,
    /// A `tokenrace_noise_kind`: what `noise` holds.
    pub noise_kind: u32,
    /// Padding made explicit: 0 (ignored on input, written as 0).
    pub reserved0: u32,
    /// Elements between noise rows; 0 broadcasts one noise row to every row.
    pub noise_row_stride: u64,
    /// Per-row top-k (NULL: off); k <= 0 or k >= vocab disables it for the row.
    pub top_k: *const i32,
    /// Per-row top-p in (0, 1] (NULL: off); 1 disables it for the row.
    pub top_p: *const f32,
    /// Per-row min-p in [0, 1] (NULL: off); 0 disables it for the row.
    pub min_p: *const f32,
    // Since 0.2: the rest of the sampling step (docs/semantics.md, The sampling step). Every
    // list is in CSR form: row r's entries are [offsets[r], offsets[r + 1]) of the id (and value)
    // arrays, `offsets` has rows + 1 non-decreasing entries; a NULL offsets array means no list
    // (and then its ids and values must be NULL too: a list without offsets is refused).
    /// The prompt's token ids (repetition penalty): ids in [0, vocab).
    pub prompt_ids: *const i32,
    /// CSR offsets of `prompt_ids`: rows + 1 entries.
    pub prompt_offsets: *const u64,
    /// The tokens generated so far (all three penalties): ids in [0, vocab).
    pub output_ids: *const i32,
    /// CSR offsets of `output_ids`: rows + 1 entries.
    pub output_offsets: *const u64,
    /// Per-row repetition penalty r > 0 (NULL: off); 1 is off for the row.
    pub repetition_penalty: *const f32,
    /// Per-row frequency penalty, finite (NULL: off); 0 is off for the row.
    pub frequency_penalty: *const f32,
    /// Per-row presence penalty, finite (NULL: off); 0 is off for the row.
    pub presence_penalty: *const f32,
    /// Logit bias: (id, value) pairs; a finite value is added, -inf bans; pairs of one id add up.
    pub bias_ids: *const i32,
    /// The value of each `bias_ids` entry.
    pub bias_values: *const f32,
    /// CSR offsets of the bias pairs: rows + 1 entries.
    pub bias_offsets: *const u64,
    /// The only tokens a row may draw, for the rows `allowed_rows` marks (NULL: every row).
    pub allowed_ids: *const i32,
    /// CSR offsets of `allowed_ids`: rows + 1 entries.
    pub allowed_offsets: *const u64,
    /// Per-row flag, nonzero = the row draws only from its allowed list (an empty list allows
    /// nothing); NULL: every row, when there are lists.
    pub allowed_rows: *const u8,
    /// Tokens a row may not draw (bad words of one token, min_tokens' stop ids).
    pub banned_ids: *const i32,
    /// CSR offsets of `banned_ids`: rows + 1 entries.
    pub banned_offsets: *const u64,
    /// A grammar bitmask in xgrammar's layout: rows x ceil(vocab / 32) int32 words,
    /// `bitmask_row_stride` words apart (0: ceil(vocab / 32)); bit j of word w set allows token
    /// 32 w + j. NULL: unconstrained.
    pub token_bitmask: *const i32,
    /// Words between the bitmask's rows; 0 means ceil(vocab / 32).
    pub bitmask_row_stride: u64,
    // Added after 0.2.0: the penalty window (penalty_last_n). A caller built against 0.2.0 sets
    // a struct_size (248) that ends before it, and gets its default (NULL).
    /// Per-row penalty window n >= 0 (NULL: 0 for every row): only the last n tokens of the
    /// row's prompt ++ output count for the penalties (repetition for the prompt's part and the
    /// output's, frequency and presence for the output's). 0 counts every token; unlike
    /// llama.cpp's `penalty_last_n`, 0 does not turn the penalties off (set them to their
    /// neutral values for that), and -1 is refused (0 is the whole history).
    pub penalty_last_n: *const i32,
    // Added after 0.2.0: min_tokens (min_tokens, stop_ids, stop_offsets).
    /// Per-row minimum output length n >= 0 (NULL: 0 for every row): while the row's output list
    /// (`output_ids`, in this call) holds fewer than n tokens, its stop tokens are banned, as
    /// the banned list's are.
    pub min_tokens: *const i32,
    /// The stop tokens of each row (CSR, ids in [0, vocab)), banned before `min_tokens`.
    pub stop_ids: *const i32,
    /// CSR offsets of `stop_ids`: rows + 1 entries.
    pub stop_offsets: *const u64,
    // Added after 0.2.0: llama.cpp's top-nσ (docs/semantics.md, Filters); a caller whose
    // struct_size ends before it gets NULL.
    /// Per-row top-nσ n, finite (NULL: off); n <= 0 disables it for the row. Keeps the tokens
    /// with logit >= max - n * sigma over the row's finite logits.
    pub top_n_sigma: *const f32,
    // Added after 0.2.0: the request state (docs/semantics.md, Request state); a caller whose
    // struct_size ends before it gets NULL.
    /// A request state (NULL: off) whose histories the rows take instead of `prompt_ids` and
    /// `output_ids` (which must then be NULL): row r's prompt and output are those of request
    /// `request_ids[r]`, as if passed as lists. The draw only reads it (a shared lock while it
    /// runs); it never appends its tokens: call `tokenrace_requests_append` with them.
    pub requests: *const super::requests::tokenrace_requests,
    /// `rows` request ids (with `requests`), each live in it; several rows may name one request.
    pub request_ids: *const u64,
    // Added after 0.2.0: llama.cpp's min_keep, locally typical sampling and XTC
    // (docs/semantics.md, Filters); a caller whose struct_size ends before them gets NULL.
    /// Per-row min_keep n >= 0 (NULL: 0): top-p, min-p, typical sampling and XTC each keep at
    /// least n tokens of what they are given (llama.cpp's `min_keep`; not top-k's).
    pub min_keep: *const i32,
    /// Per-row locally typical sampling p in (0, 1] (NULL: off); 1 disables it for the row.
    /// Keeps the tokens whose surprise -ln p is nearest the entropy, up to a mass > p.
    pub typical_p: *const f32,
    /// Per-row XTC probability in [0, 1] (NULL: off); <= 0 disables it for the row. The coin is
    /// drawn from the row's key (seeded rows: a pure function of seed and offset).
    pub xtc_probability: *const f32,
    /// Per-row XTC threshold in [0, 1] (NULL: off); > 0.5 disables it for the row. When the coin
    /// falls below the probability and at least two tokens have p >= threshold, every one of them
    /// but the least probable is removed.
    pub xtc_threshold: *const f32,
    /// Per-row dynamic temperature range >= 0 (NULL: off); 0 disables it for the row. The row's
    /// temperature becomes `min_T + (max_T - min_T) * (H / ln N)^exponent`, `min_T =
    /// max(0, T - range)`, `max_T = T + range`, H the entropy of softmax(x) over the N tokens its
    /// filters keep (llama.cpp's `dynatemp_range`).
    pub dynatemp_range: *const f32,
    /// Per-row dynamic temperature exponent >= 0 (NULL: 1 for every row).
    pub dynatemp_exponent: *const f32,
    // Added after 0.2.0: the sampling step's parity inputs (multi-token bad words); a caller
    // whose struct_size ends before them gets NULL.
    /// The tokens of every row's bad words, one word after the other (ids in [0, vocab); NULL:
    /// no bad words). A word bans its last token where the row's output list (`output_ids`)
    /// ends with the rest of the word; a word of one token always bans it.
    pub bad_words_ids: *const i32,
    /// Word k is `bad_words_ids[bad_word_offsets[k]..bad_word_offsets[k + 1]]`, at least one
    /// token: `bad_words_row_offsets[rows] + 1` non-decreasing entries.
    pub bad_word_offsets: *const u64,
    /// Row r's words are words `bad_words_row_offsets[r]..bad_words_row_offsets[r + 1]`: rows + 1
    /// non-decreasing entries.
    pub bad_words_row_offsets: *const u64,
    /// Per-row forced token (NULL: none forced): a row whose entry is in [0, vocab) returns
    /// that token, with its logprob, rank and top-n as if it had been drawn (in the chosen
    /// logprob mode), and its noise consumed as a drawn row's, so that every other row draws
    /// what it would have drawn; -1 draws the row; anything else is refused. A forced token the
    /// step bans (a mask or a -inf bias) is returned all the same, flagged
    /// TOKENRACE_FLAG_FORCED_BANNED (its processed logprob is -inf).
    pub forced_tokens: *const i32,
    /// Per-row token ids whose logprobs the output's `token_logprobs` (and ranks its
    /// `token_ranks`) receive, CSR (ids in [0, vocab); NULL: none): vLLM's `logprob_token_ids`,
    /// SGLang's `token_ids_logprobs`.
    pub logprob_token_ids: *const i32,
    /// CSR offsets of `logprob_token_ids`: rows + 1 entries.
    pub logprob_token_offsets: *const u64,
    // Added after 0.2.0: the order of the filter stages (docs/semantics.md, Filter order); a
    // caller whose struct_size ends before it gets NULL.
    /// `order_len` `tokenrace_stage` ids (NULL: the sampler's `filter_order`): every row applies
    /// the listed stages whose filter is on, in this order, each on what the ones before it
    /// kept; each stage at most once; the temperature last when left out; a filter on for a row
    /// must have its stage listed. llama.cpp's default chain is TOP_K, TYPICAL, TOP_P, MIN_P,
    /// XTC, TEMPERATURE.
    pub order: *const u32,
    /// The number of ids in `order` (1 to 16).
    pub order_len: u64,
    // Added after 0.2.0: llama.cpp's DRY; a caller whose struct_size ends before it gets NULL.
    /// Per-row DRY multiplier, finite and >= 0 (NULL: DRY off); 0 turns DRY off for the row. A
    /// token that would extend a sequence the row's history repeats (n >= dry_allowed_length
    /// tokens) loses `multiplier * base^(n - dry_allowed_length)` from its value, after every
    /// other penalty (llama.cpp's `dry_multiplier`; the exact rule is in docs/semantics.md).
    pub dry_multiplier: *const f32,
    /// Per-row DRY base, finite (NULL: 1.75); below 1 turns DRY off for the row.
    pub dry_base: *const f32,
    /// Per-row DRY allowed length >= 0 (NULL: 2): repeats up to this long are not penalised.
    pub dry_allowed_length: *const i32,
    /// Per-row DRY window (NULL: -1): DRY reads the last n tokens of the row's prompt ++
    /// output; -1 reads them all, 0 turns DRY off for the row.
    pub dry_penalty_last_n: *const i32,
    /// The tokens of every row's DRY sequence breakers, one breaker after the other (ids in [0,
    /// vocab); NULL: none). A breaker is a head token and its tail: no repeat DRY counts spans
    /// one, and the head of a one-token breaker is never penalised (llama.cpp's
    /// `dry_sequence_breakers`, as token ids).
    pub dry_breaker_ids: *const i32,
    /// Breaker k is `dry_breaker_ids[dry_breaker_offsets[k]..dry_breaker_offsets[k + 1]]`, at
    /// least one token: `dry_breakers_row_offsets[rows] + 1` non-decreasing entries.
    pub dry_breaker_offsets: *const u64,
    /// Row r's breakers are breakers `dry_breakers_row_offsets[r]..dry_breakers_row_offsets[r +
    /// 1]`: rows + 1 non-decreasing entries.
    pub dry_breakers_row_offsets: *const u64,
    // Added after 0.2.0: several outputs from one logits row; a caller whose struct_size ends
    // before it gets NULL.
    /// `rows` logits rows, one per row (vLLM's `n > 1`, FlashInfer's `indices`): row r reads
    /// logits row `row_index[r]` in place (never copied), each row with its own seed, offset,
    /// parameters and outputs; `logits` then holds `max(row_index) + 1` rows `row_stride` apart.
    /// A negative entry is INVALID_ARGUMENT naming the row. NULL: row r reads logits row r.
    pub row_index: *const i32,
    // Added after 0.2.0: llama.cpp's mirostat; a caller whose struct_size ends before it gets
    // NULL (off).
    /// Per-row mirostat, llama.cpp's final sampler in place of the plain draw (NULL: off for
    /// every row): 0 off, 1 v1, 2 v2. It narrows what the row's chain keeps, after the
    /// temperature and every other filter, and the row draws from that set renormalised: v2
    /// keeps the tokens of surprise `-log2 p <= mu` (at least the most probable), v1 the k most
    /// probable with k from the Zipf exponent estimated over the `mirostat_m` most probable. The
    /// row's mu then becomes `mu - eta * (-log2 p(drawn) - tau)`, returned in the output's
    /// `mirostat_mu` (exact rule: docs/semantics.md, Mirostat). A row with a forced token may
    /// not use it.
    pub mirostat: *const i32,
    /// Per-row target surprise tau in bits, finite (NULL: 5, llama.cpp's default).
    pub mirostat_tau: *const f32,
    /// Per-row learning rate eta, finite (NULL: 0.1, llama.cpp's default).
    pub mirostat_eta: *const f32,
    /// Per-row m >= 1: v1 estimates the Zipf exponent from the m most probable kept tokens
    /// (NULL: 100, llama.cpp's value).
    pub mirostat_m: *const i32,
    /// Per-row mu going in, finite (NULL: 2 tau, a sequence's first draw): pass back the
    /// output's `mirostat_mu` of the row's previous draw.
    pub mirostat_mu: *const f32,
    /// Nonzero (with `requests`): once the draw succeeds, each row's token is appended to the
    /// output of its request (`request_ids[r]`), in row order, as
    /// `tokenrace_requests_append(requests, rows, request_ids, out.tokens, NULL)` would: the
    /// next step's histories then hold it. The draw holds the state from its start to the
    /// append (draws without the flag may read it meanwhile; its writers, and other draws with
    /// the flag, wait), and a failed draw appends nothing. 0 (and older callers): the draw never changes the state. Refused by
    /// `tokenrace_score`, which draws nothing.
    pub append_to_requests: u32,
    /// Must be zero.
    pub reserved1: u32,
}

/// Where a draw writes. Only `tokens` is required. Nothing is written if the call fails. No
/// array may share memory with an input array or another output array (refused).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tokenrace_output {
    /// sizeof(tokenrace_output) as the caller knows it.
    pub struct_size: u32,
    /// A `tokenrace_logprob_mode` for `logprobs` and `topn_logprobs`.
    pub logprob_mode: u32,
    /// `rows` token ids, each in [0, vocab).
    pub tokens: *mut i32,
    /// `rows` TOKENRACE_FLAG_* bit sets (NULL: not reported).
    pub flags: *mut u32,
    /// `rows` logprobs of the sampled tokens (NULL: not computed).
    pub logprobs: *mut f32,
    /// `rows` ranks of the sampled tokens: the count of tokens whose logprob is >= its own
    /// (NULL: not computed; a rank costs a count over the row, so ask only when it is used).
    pub ranks: *mut i32,
    /// Ids and logprobs of the `top_n` most probable tokens per row, `rows x top_n`, descending,
    /// lowest id first on ties (NULL or top_n = 0: not computed).
    pub top_n: u32,
    /// Padding made explicit: 0 (ignored on input, written as 0).
    pub reserved0: u32,
    /// `rows x top_n` token ids (NULL: not computed).
    pub topn_ids: *mut i32,
    /// `rows x top_n` logprobs of those ids, in `logprob_mode` (NULL: not computed).
    pub topn_logprobs: *mut f32,
    // Since 0.2.
    /// rows x vocab values, `full_row_stride` apart (0: vocab): every token's logprob or logit,
    /// as `full_mode` says (NULL: not computed).
    pub full_logprobs: *mut f32,
    /// Elements between the rows of `full_logprobs`; 0 means vocab.
    pub full_row_stride: u64,
    /// A `tokenrace_full_mode`.
    pub full_mode: u32,
    /// Padding made explicit: 0 (ignored on input, written as 0).
    pub reserved1: u32,
    // Added after 0.2.0: the logprobs of given ids (the batch's `logprob_token_ids`); a caller
    // whose struct_size ends before them gets NULL.
    /// One logprob per entry of the batch's `logprob_token_ids` (row r's at its offsets), in
    /// `logprob_mode`, computed in the pass of the sampled token's (NULL: not computed).
    pub token_logprobs: *mut f32,
    /// One rank per entry of the batch's `logprob_token_ids`: the count of tokens whose logprob
    /// is >= the id's (NULL: not computed; each costs a count over the row).
    pub token_ranks: *mut i32,
    // Added after 0.2.0: the kept set of each row (vLLM's sampling masks, SGLang's
    // `return_sampling_masks`); a caller whose struct_size ends before them gets NULL. A row keeps
    // its finite values at or above its filters' floor (the +inf ones, when it has one); greedy
    // rows keep every finite value of their processed row. Refused for rows with typical_p, XTC
    // or dynatemp on.
    /// `rows` thresholds: the smallest kept value, in the values the filters judge (the logit,
    /// or the processed value of a row with a sampling step, before the temperature); +inf when
    /// the row's +inf values are kept, NaN when nothing is (NULL: not reported).
    pub kept_threshold: *mut f32,
    /// `rows` counts of the kept tokens (NULL: not reported).
    pub kept_count: *mut i32,
    /// `rows` kept masses: the share of the row's probability its kept tokens hold, at the
    /// temperature its filters judge it at (1/T with temperature first, 1 with filters first or
    /// greedy), in f64 (NULL: not reported).
    pub kept_mass: *mut f64,
    /// `rows x ceil(vocab / 32)` words, xgrammar's bitmask layout: bit i of word j of a row is
    /// set when the row keeps token 32 j + i; bits past vocab are 0 (NULL: not reported).
    pub kept_bitmask: *mut i32,
    // Added after 0.2.0: mirostat's state; a caller whose struct_size ends before it gets NULL.
    /// `rows` mu values after the draw (NULL: not reported): a mirostat row's updated mu, NaN
    /// for a row without mirostat. Written only when the call succeeds; it may not share
    /// memory with the batch's `mirostat_mu` (copy it back for the next draw).
    pub mirostat_mu: *mut f32,
}

/// Counters of a sampler since it was made.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tokenrace_sampler_stats {
    /// sizeof(tokenrace_sampler_stats) as the caller knows it; set by the caller.
    pub struct_size: u32,
    /// Padding made explicit: 0 (ignored on input, written as 0).
    pub reserved0: u32,
    /// Successful draw and verify calls.
    pub calls: u64,
    /// Calls that failed (bad arguments, the noise pool, a worker).
    pub rejected_calls: u64,
    /// Rows drawn greedily (temperature below the greedy threshold).
    pub greedy_rows: u64,
    /// Sampling rows with their own seed.
    pub seeded_rows: u64,
    /// Unseeded sampling rows drawn on inline noise keyed by the sampler's stream (not to be
    /// confused with `tokenrace_pool_stats.inline_rows`, rows a pool generated on a borrower's
    /// thread).
    pub inline_rows: u64,
    /// Unseeded sampling rows drawn on the caller's `noise`.
    pub external_noise_rows: u64,
    /// Unseeded sampling rows drawn on pool noise (a count of rows drawn, not
    /// `tokenrace_config.pool_rows`, the capacity of the sampler's own pool).
    pub pool_rows: u64,
    /// Rows whose flags reported NaN, +inf or an empty row.
    pub nonfinite_rows: u64,
}

/// Noise pool settings. Get one from `tokenrace_pool_config_default()` or
/// `tokenrace_pool_config_from_env()`, change fields (at least `vocab`), pass it to
/// `tokenrace_pool_new()`. `docs/configuration.md` documents each (`TOKENRACE_POOL_*`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tokenrace_pool_config {
    /// sizeof(tokenrace_pool_config) as the caller knows it.
    pub struct_size: u32,
    /// Capacity in rows; a borrow takes at most this many.
    pub rows: u32,
    /// Values per row (the vocabulary size); must be set (the default 0 is rejected).
    pub vocab: u32,
    /// A `tokenrace_noise_kind`: E or ln E.
    pub kind: u32,
    /// Background producer threads, >= 1.
    pub threads: u32,
    /// Nonzero: use `seed`; zero: seed from OS entropy.
    pub has_seed: u32,
    /// Seed of the pool's noise, used when `has_seed` is nonzero.
    pub seed: u64,
    /// A `tokenrace_pool_policy`: what a borrow does when its rows are not ready.
    pub policy: u32,
    /// Padding made explicit: 0 (ignored on input, written as 0).
    pub reserved0: u32,
    /// How long a borrow under the BLOCK policy waits before it fails with TIMEOUT, in ms.
    pub timeout_ms: u64,
}

/// A borrowed span of noise, written by `tokenrace_pool_borrow()`. The caller sets
/// `struct_size = sizeof(tokenrace_pool_lease)`; the rest is output. Give it back with
/// `tokenrace_pool_release()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tokenrace_pool_lease {
    /// sizeof(tokenrace_pool_lease) as the caller knows it; set by the caller.
    pub struct_size: u32,
    /// A `tokenrace_noise_kind`: what `values` holds.
    pub kind: u32,
    /// `rows x vocab` values, row after row, read-only, valid until the lease is released.
    pub values: *const f32,
    /// The number of rows lent.
    pub rows: u32,
    /// Values per row (the pool's `vocab`).
    pub vocab: u32,
    /// Opaque; identifies the lease to `tokenrace_pool_release()`.
    pub id: u64,
    /// The sequence number of row 0; row r has `first_seq + r` (its noise is keyed by it).
    pub first_seq: u64,
    /// 1 if `values` points into the pool's ring (its memory stays mapped, and is refilled,
    /// after the release); 0 if it is a private copy that the release frees (the INLINE policy
    /// makes one when a slot it needs is still held by an older lease).
    pub in_ring: u32,
    /// Padding made explicit: 0 (ignored on input, written as 0).
    pub reserved0: u32,
}

/// Counters of a noise pool since it was made. The caller sets `struct_size`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tokenrace_pool_stats {
    /// sizeof(tokenrace_pool_stats) as the caller knows it; set by the caller.
    pub struct_size: u32,
    /// Padding made explicit: 0 (ignored on input, written as 0).
    pub reserved0: u32,
    /// Rows generated by the producer threads.
    pub rows_produced: u64,
    /// Rows handed out by successful borrows.
    pub rows_borrowed: u64,
    /// Borrows that had to wait for a producer (BLOCK, or INLINE waiting for a row mid-fill).
    pub borrows_waited: u64,
    /// Total time those borrows waited, in nanoseconds.
    pub wait_ns: u64,
    /// Rows generated on the calling thread by the INLINE policy (the fallback count).
    pub inline_rows: u64,
    /// Sequence numbers never handed out: skipped at the wrap, or by a borrow that failed.
    pub rows_skipped: u64,
}

/// One `tokenrace_verify()` call's inputs (speculative decoding, since 0.2). Zero-initialise, set
/// `struct_size = sizeof(tokenrace_verify_batch)`, then the fields you use; every per-request
/// pointer may be NULL (its default then applies) or point to `requests` elements.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tokenrace_verify_batch {
    /// sizeof(tokenrace_verify_batch) as the caller knows it.
    pub struct_size: u32,
    /// A `tokenrace_dtype`.
    pub dtype: u32,
    /// The target logits, rows x row_stride elements of `dtype`: request after request, the
    /// positions of its draft tokens, then its bonus position.
    pub logits: *const c_void,
    /// Target rows: sum(draft_counts) + requests.
    pub rows: u32,
    /// Logits per target row; the sampler's `vocab_size` when that is nonzero.
    pub vocab: u32,
    /// Elements between target rows; 0 means `vocab`.
    pub row_stride: u64,
    /// Requests (sequences) verified; their target rows follow each other in `logits`.
    pub requests: u32,
    /// Padding made explicit: 0 (ignored on input, written as 0).
    pub reserved0: u32,
    /// `requests` draft counts, each >= 0.
    pub draft_counts: *const i32,
    /// sum(draft_counts) draft token ids, request after request, each in [0, vocab) or -1 (vLLM's
    /// placeholder for a draft not proposed: rejected, the request's output ends at that
    /// position with a token drawn as for any rejected draft).
    pub draft_tokens: *const i32,
    /// The draft model's probabilities: one row of `vocab` f32 per draft token (>= 0, summing to
    /// 1 within 1e-3), `draft_probs_row_stride` apart (0: vocab). NULL: the drafts are
    /// deterministic (q one-hot at the draft).
    pub draft_probs: *const f32,
    /// Elements between the rows of `draft_probs`; 0 means vocab.
    pub draft_probs_row_stride: u64,
    /// Per-request temperature (NULL: 1.0); below the sampler's greedy threshold a request is
    /// greedy.
    pub temperature: *const f32,
    /// Per-request top-k (NULL: off), as in `tokenrace_batch`.
    pub top_k: *const i32,
    /// Per-request top-p (NULL: off), as in `tokenrace_batch`.
    pub top_p: *const f32,
    /// Per-request min-p (NULL: off), as in `tokenrace_batch`.
    pub min_p: *const f32,
    /// Per-request seed (NULL: none is seeded): a seeded request's acceptance uniforms and noise
    /// at draft position j are a pure function of (seed, offset + j).
    pub seeds: *const u64,
    /// Per-request position of its first draft token (NULL: 0).
    pub offsets: *const u64,
    /// Per-request flag, nonzero = the request uses its seed (NULL with `seeds`: every one).
    pub seeded: *const u8,
    /// sum(draft_counts) acceptance uniforms in (0, 1), for the unseeded sampling requests
    /// (NULL: from the sampler's stream).
    pub uniforms: *const f64,
    /// Noise of the recovered and bonus draws of the unseeded sampling requests: one row per
    /// target row, as `tokenrace_batch.noise` (NULL: the sampler's own).
    pub noise: *const f32,
    /// A `tokenrace_noise_kind`.
    pub noise_kind: u32,
    /// Padding made explicit: 0 (ignored on input, written as 0).
    pub reserved1: u32,
    /// Elements between noise rows; 0 broadcasts one noise row to every target row.
    pub noise_row_stride: u64,
    /// sum(draft_counts) int32, request-local: each draft node's parent, -1 for a child of the
    /// request's context, else an earlier node of the same request (a draft tree per request,
    /// judged by recursive rejection sampling: docs/semantics.md, "Draft trees"). Target row 0
    /// of a request is its root's, row 1 + i node i's. NULL: chains (node i's parent is i - 1).
    pub draft_parents: *const i32,
    // The sampling step inside verification (since 0.3): each target row is processed exactly
    // as a draw of it with these inputs would be (penalties, bias, masks, bad words,
    // min_tokens), its output history being the request's output followed by the drafts before
    // its position (a tree node's: its ancestors' drafts and its own). Every list and parameter
    // is per REQUEST (CSR lists of `requests` rows, as `tokenrace_batch`'s of `rows` rows); the
    // bitmask is per TARGET ROW. All NULL: the target rows are judged as given.
    // docs/semantics.md, "The sampling step in verification".
    /// Each request's prompt ids (the repetition penalty); NULL: none.
    pub prompt_ids: *const i32,
    /// `requests + 1` offsets into `prompt_ids`.
    pub prompt_offsets: *const u64,
    /// Each request's output ids so far, before its drafts; NULL: none.
    pub output_ids: *const i32,
    /// `requests + 1` offsets into `output_ids`.
    pub output_offsets: *const u64,
    /// Per-request repetition penalty (> 0; 1 off); NULL: off.
    pub repetition_penalty: *const f32,
    /// Per-request frequency penalty (finite; 0 off); its counts include the drafts before the
    /// position. NULL: off.
    pub frequency_penalty: *const f32,
    /// Per-request presence penalty (finite; 0 off); NULL: off.
    pub presence_penalty: *const f32,
    /// Each request's biased ids, with `bias_values` (finite, or -inf to ban), CSR by
    /// `bias_offsets`; NULL: none.
    pub bias_ids: *const i32,
    /// One bias per entry of `bias_ids`.
    pub bias_values: *const f32,
    /// `requests + 1` offsets into `bias_ids` and `bias_values`.
    pub bias_offsets: *const u64,
    /// Each request's allowed ids (only these may be emitted); NULL: unrestricted.
    pub allowed_ids: *const i32,
    /// `requests + 1` offsets into `allowed_ids`.
    pub allowed_offsets: *const u64,
    /// Per-request flag, nonzero = the request carries an allowed list (NULL with the lists:
    /// every request).
    pub allowed_rows: *const u8,
    /// Each request's banned ids; NULL: none.
    pub banned_ids: *const i32,
    /// `requests + 1` offsets into `banned_ids`.
    pub banned_offsets: *const u64,
    /// A grammar bitmask row per TARGET ROW (`rows` rows, xgrammar's packed layout, as
    /// `tokenrace_batch.token_bitmask`); NULL: none.
    pub token_bitmask: *const i32,
    /// int32 words between bitmask rows; 0 means ceil(vocab / 32).
    pub bitmask_row_stride: u64,
    /// The tokens of every bad word, as `tokenrace_batch.bad_words_ids`; a word's prefix is
    /// matched against each target row's history (output, then the drafts before it).
    pub bad_words_ids: *const i32,
    /// One more offset than there are words: positions into `bad_words_ids`.
    pub bad_word_offsets: *const u64,
    /// `requests + 1` offsets into the words; NULL: no bad words.
    pub bad_words_row_offsets: *const u64,
    /// Per-request minimum output length: a target row whose history (output and the drafts
    /// before it) is shorter bans the request's stop ids. NULL: 0.
    pub min_tokens: *const i32,
    /// Each request's stop ids (banned below `min_tokens`); NULL: none.
    pub stop_ids: *const i32,
    /// `requests + 1` offsets into `stop_ids`.
    pub stop_offsets: *const u64,
}

/// Where `tokenrace_verify()` writes. `tokens` and `counts` are required. Nothing is written if
/// the call fails. No array may share memory with an input array or another output array
/// (refused).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tokenrace_verify_output {
    /// sizeof(tokenrace_verify_output) as the caller knows it.
    pub struct_size: u32,
    /// A `tokenrace_logprob_mode` for `logprobs`.
    pub logprob_mode: u32,
    /// requests x tokens_stride int32: each request's emitted tokens (its accepted drafts, then
    /// the recovered or bonus token), then -1.
    pub tokens: *mut i32,
    /// Elements between requests in `tokens` and `logprobs`; 0 means max(draft_counts) + 1.
    pub tokens_stride: u64,
    /// `requests` emitted counts, from 1 to `draft_counts[i] + 1`.
    pub counts: *mut i32,
    /// `requests` TOKENRACE_FLAG_* sets: those of every target row the request looked at, or-ed
    /// (NULL: not reported).
    pub flags: *mut u32,
    /// As `tokens`: the logprob of each emitted token in its target row, in `logprob_mode`; NaN
    /// in the padding (NULL: not computed).
    pub logprobs: *mut f32,
    /// As `tokens`: the request-local index of each accepted draft node in path order, then -1
    /// (NULL: not reported).
    pub accepted_nodes: *mut i32,
}
