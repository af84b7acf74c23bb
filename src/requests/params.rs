//! The sampling parameters a request keeps between draws ([`RequestParams`]): what a runtime
//! sets once per request (vLLM's and SGLang's per-request sampling parameters, a llama.cpp
//! chain's settings), so that a step that names its rows by request id passes no per-row arrays.

/// The sampling parameters of one request, kept by a [`Requests`](crate::Requests) state.
///
/// A draw whose rows name requests takes each parameter the batch leaves unset (its array
/// `None`) from the row's request; a request that never set parameters, and every field left
/// at its default, gives what a batch without that array gives. Each default is the
/// parameter's off value. The rules of each value are the batch's (`docs/semantics.md`).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestParams {
    /// Temperature, finite and >= 0 (0: greedy); default 1.
    pub temperature: f32,
    /// The request's seed: its rows are seeded rows of this seed, at the batch's offsets, or
    /// where the batch gives none at the request's output length (one position per token it
    /// has generated). `None` (the default): unseeded.
    pub seed: Option<u64>,
    /// Top-k; k <= 0 (the default) or k >= vocab is off.
    pub top_k: i32,
    /// Top-p in (0, 1]; 1 (the default) is off.
    pub top_p: f32,
    /// Min-p in [0, 1]; 0 (the default) is off.
    pub min_p: f32,
    /// Top-nσ n, finite; n <= 0 (the default) is off.
    pub top_n_sigma: f32,
    /// llama.cpp's min_keep, >= 0; 0 (the default) changes nothing.
    pub min_keep: i32,
    /// Locally typical sampling p in (0, 1]; 1 (the default) is off.
    pub typical_p: f32,
    /// Repetition penalty, finite and > 0; 1 (the default) is off.
    pub repetition_penalty: f32,
    /// Frequency penalty, finite; 0 (the default) is off.
    pub frequency_penalty: f32,
    /// Presence penalty, finite; 0 (the default) is off.
    pub presence_penalty: f32,
    /// Penalty window, >= 0: the last n tokens of (prompt ++ output); 0 (the default) counts
    /// every token.
    pub penalty_last_n: i32,
    /// Minimum output length, >= 0: the stop tokens are banned while the output is shorter; 0
    /// (the default) bans none.
    pub min_tokens: i32,
    /// The stop tokens that `min_tokens` bans (ids >= 0).
    pub stop_tokens: Vec<i32>,
    /// The biased token ids (>= 0), one per entry of `bias_values`.
    pub bias_ids: Vec<i32>,
    /// One bias per id: finite (added to the logit), or -inf (a ban).
    pub bias_values: Vec<f32>,
    /// The only tokens the request may draw; `None` (the default): unrestricted.
    pub allowed_tokens: Option<Vec<i32>>,
    /// Tokens the request may not draw.
    pub banned_tokens: Vec<i32>,
}

impl Default for RequestParams {
    /// Every parameter off: the draw a batch without any per-row array gives.
    fn default() -> Self {
        RequestParams {
            temperature: 1.0,
            seed: None,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            top_n_sigma: 0.0,
            min_keep: 0,
            typical_p: 1.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 0,
            min_tokens: 0,
            stop_tokens: Vec::new(),
            bias_ids: Vec::new(),
            bias_values: Vec::new(),
            allowed_tokens: None,
            banned_tokens: Vec::new(),
        }
    }
}

impl RequestParams {
    /// The largest token id its lists name (-1 when they name none): a draw checks it against
    /// its vocabulary in `O(1)`.
    pub(crate) fn largest_id(&self) -> i32 {
        let lists =
            [&self.stop_tokens[..], &self.bias_ids, self.allowed_tokens.as_deref().unwrap_or(&[]), &self.banned_tokens];
        lists.iter().flat_map(|l| l.iter().copied()).max().unwrap_or(-1)
    }
}
