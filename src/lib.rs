//! tokenrace: fast, exact next-token sampling on the CPU host.
//!
//! The draw is the exponential race in log space: for each row, the token is
//! `argmax_i (x_i - m)/T - ln E_i` with E_i ~ Exp(1), which is a draw from softmax(x/T); rows
//! with T below a threshold are greedy. See `docs/semantics.md` for the exact rules.
//!
//! Layout: `config` (every setting, one table), `noise` (streams, the pool), `kernels` (SIMD,
//! chosen at run time), `draw` (the row algorithms and batch types), `sampler` (the object that
//! ties them together), `ffi` (the C ABI and nothing else).

pub mod config;
pub mod draw;
pub mod error;
pub mod ffi;
pub mod kernels;
pub mod noise;
pub mod sampler;

pub use config::{Config, DrainPolicy, LogLevel, NoiseKind, NoiseSource, PoolConfig, SimdChoice};
pub use draw::batch::{flags, Batch, ExternalNoise, Logits, LogprobMode, Output};
pub use error::{Error, ErrorKind, Result};
pub use kernels::{best_level, supported_levels, Bf16, SimdLevel, F16};
pub use sampler::{Sampler, SamplerStats};

/// The library version, from Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
