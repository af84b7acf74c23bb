//! tokenrace: fast, exact next-token sampling on the CPU host.
//!
//! The draw is the exponential race in log space: for each row, the token is
//! `argmax_i (x_i - m)/T - ln E_i` with E_i ~ Exp(1), which is a draw from softmax(x/T); rows
//! with T below a threshold are greedy. See `docs/semantics.md` for the exact rules and
//! `docs/architecture.md` for the layers:
//!
//! `ffi` → [`Sampler`] → `plan` → `draw` (driver, tiles, workers) → `filter`, `logprob` →
//! `mass` → `row` → `kernels` (one module per instruction set) ; `noise` (keys, the pool) and
//! `batch`, `config`, `error` (data) beside them.
//!
//! The Rust API is [`Sampler`] with [`Batch`] and [`Output`], [`Config`], [`NoisePool`] and
//! [`Error`]. The `internals` feature exposes test and benchmark seams; it is not part of the
//! supported API. The `half` feature lets rows of `half::bf16` / `half::f16` be passed as they
//! are (`Logits::from(&rows[..])`, no copy) and converts those types to [`Bf16`] / [`F16`] and
//! back.

// Every unsafe operation sits in its own `unsafe` block, with the contract it relies on next to
// it (`// SAFETY:`), also inside `unsafe fn`s.
#![deny(unsafe_op_in_unsafe_fn)]
// Every public item is documented: the crate is used from Rust as well as through its C ABI.
#![warn(missing_docs)]

mod alloc;
mod batch;
mod config;
mod draw;
mod error;
mod ffi;
mod filter;
#[cfg(feature = "half")]
mod half_interop;
mod kernels;
mod logging;
mod logprob;
mod mass;
mod noise;
mod order;
mod plan;
mod process;
mod requests;
mod row;
mod sampler;
mod shard;
mod step;
mod verify;
mod watermark;

pub use batch::{
    flags, BadWords, Batch, DraftProbs, ExternalNoise, FullMode, LogitBias, Logits, LogprobMode, Output, TokenBitmask,
    TokenLists, VerifyBatch, VerifyOutput, VerifyStep,
};
pub use config::{
    from_env as config_from_env, Config, DrainPolicy, FilterOrder, LogLevel, NoiseKind, NoiseSource, PoolConfig,
    SimdChoice,
};
pub use error::{Error, ErrorKind, Location, Owner, Result};
pub use filter::chain::{Stage, FILTERS_FIRST, RESERVED_STAGE_IDS, TEMPERATURE_FIRST};
pub use kernels::{best_level, supported_levels, Bf16, SimdLevel, F16};
pub use noise::pool::{Lease, Pool as NoisePool, PoolStats};
pub use requests::{RequestParams, RequestRows, Requests};
pub use sampler::{Sampler, SamplerStats};
pub use shard::shard_logprobs;
pub use shard::{
    combine_top as shard_combine_top, cut_advance as shard_cut_advance, cut_pending as shard_cut_pending,
    cut_phase as shard_cut_phase, finish as shard_finish, top_k_candidates as shard_top_k_candidates, ShardCut,
    ShardLogprobPartial, ShardMass, ShardPartial, ShardRow, ShardRows, ShardStep, ShardTopEntry,
    CUT_BINS as SHARD_CUT_BINS,
};
pub use watermark::{
    context_of as watermark_context, detect as detect_watermark, gamma_upper_tail, token_noise, watermark_accept,
    watermark_seed, watermark_verify_seeds, Detection,
};

/// The library version, from Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Test and benchmark seams: kernel tables and read floors, the scalar noise functions, the mass
/// kernels of one level, the filters' floor of one row, pool internals, the settings table, and
/// the C entry points as Rust functions. Not a supported API: it changes with the implementation.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    /// Every C entry point as a Rust function.
    pub mod api {
        pub use crate::ffi::api::*;
        pub use crate::ffi::draw::*;
        pub use crate::ffi::greedy::*;
        pub use crate::ffi::pool_api::*;
        pub use crate::ffi::requests::*;
        pub use crate::ffi::score::*;
        pub use crate::ffi::shard::*;
        pub use crate::ffi::verify::*;
        pub use crate::ffi::watermark::*;
    }
    /// The settings table behind [`Config::default`](crate::Config) and
    /// [`config_from_env`](crate::config_from_env), row by row (the fuzz target and the tests
    /// apply its rows one at a time).
    pub use crate::config::{Apply, Setting, SETTINGS};
    pub use crate::draw::cost::force_participants;
    /// The bytes the calling thread keeps from one call for the next, and the most it keeps
    /// after a call (`docs/reliability.md`, Memory).
    pub use crate::draw::{kept_bytes as thread_kept_bytes, KEPT_PER_THREAD};
    pub use crate::ffi::pool_api;
    pub use crate::ffi::types;
    pub use crate::filter::chain::kept_range_in_order_at;
    pub use crate::filter::top_p::{
        dropped_on_this_thread, gathered_on_this_thread, refined_on_this_thread, tier_counts,
    };
    pub use crate::filter::{kept_floor, kept_floor_at, kept_floor_with_sigma_at, kept_range_at, LlamaFilters};
    pub use crate::kernels::test_support::{at_level, each_level};
    pub use crate::kernels::{read_floor, read_floor_two, scalar_noise, scan_rows};
    pub use crate::mass::hooks;
    pub use crate::noise::pool::{pool_row_key, Generator, Pool, PoolOptions};
    pub use crate::noise::{seeded_row_key, splitmix64};
}
