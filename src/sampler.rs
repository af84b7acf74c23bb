//! The sampler: a configuration, the chosen kernels, the key stream of unseeded rows, counters.

use crate::config::{Config, LogLevel};
use crate::draw::batch::{validate, Batch, Output};
use crate::draw::logprob::Logprobs;
use crate::draw::workers::WorkerPool;
use crate::draw::{draw_batch, ext_kind, inv_temperature, NoiseSrc, RowInfo, RowPlan};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::{self, Kernels, SimdLevel};
use crate::noise::{entropy_seed, seeded_row_key, KeyStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of a sampler since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplerStats {
    /// Successful draw calls.
    pub calls: u64,
    /// Rows drawn, by kind.
    pub greedy_rows: u64,
    pub seeded_rows: u64,
    pub inline_rows: u64,
    pub external_noise_rows: u64,
    pub pool_rows: u64,
    /// Rows whose flags reported NaN, +inf or an empty row.
    pub nonfinite_rows: u64,
    /// Calls that failed validation.
    pub rejected_calls: u64,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    greedy_rows: AtomicU64,
    seeded_rows: AtomicU64,
    inline_rows: AtomicU64,
    external_noise_rows: AtomicU64,
    pool_rows: AtomicU64,
    nonfinite_rows: AtomicU64,
    rejected_calls: AtomicU64,
}

/// Samples next tokens. Usable from several threads at once (`Sync`).
pub struct Sampler {
    cfg: Config,
    kernels: &'static Kernels,
    keys: KeyStream,
    counters: Counters,
    /// Worker threads beyond the caller's, when `threads` > 1.
    workers: Option<WorkerPool>,
}

/// Installs `env_logger` at the configured level, once per process, unless a logger exists.
fn init_logging(level: LogLevel) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = match level {
            LogLevel::Off => log::LevelFilter::Off,
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
        };
        let _ = env_logger::Builder::new().filter_module("tokenrace", filter).try_init();
    });
}

impl Sampler {
    pub fn new(cfg: Config) -> Result<Sampler> {
        cfg.validate()?;
        init_logging(cfg.log_level);
        let level = kernels::resolve(cfg.simd)?;
        let seed = cfg.seed.unwrap_or_else(entropy_seed);
        log::debug!("sampler: simd {}, max_rows {}, vocab {}", level.name(), cfg.max_rows, cfg.vocab_size);
        let threads = cfg.effective_threads();
        let workers = match threads {
            0 | 1 => None,
            n => Some(
                WorkerPool::new(n - 1).map_err(|e| Error::internal(format!("threads: cannot start workers: {e}")))?,
            ),
        };
        Ok(Sampler {
            kernels: kernels::kernels(level),
            keys: KeyStream::new(seed),
            counters: Counters::default(),
            workers,
            cfg,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn simd_level(&self) -> SimdLevel {
        self.kernels.level
    }

    pub fn stats(&self) -> SamplerStats {
        let c = &self.counters;
        SamplerStats {
            calls: c.calls.load(Relaxed),
            greedy_rows: c.greedy_rows.load(Relaxed),
            seeded_rows: c.seeded_rows.load(Relaxed),
            inline_rows: c.inline_rows.load(Relaxed),
            external_noise_rows: c.external_noise_rows.load(Relaxed),
            pool_rows: c.pool_rows.load(Relaxed),
            nonfinite_rows: c.nonfinite_rows.load(Relaxed),
            rejected_calls: c.rejected_calls.load(Relaxed),
        }
    }

    /// Draws one token per row of `batch` into `out`. On error nothing is written.
    pub fn draw(&self, batch: &Batch, out: &mut Output) -> Result<()> {
        if let Err(e) = validate(batch, out, self.cfg.max_rows, self.cfg.vocab_size) {
            self.counters.rejected_calls.fetch_add(1, Relaxed);
            return Err(e);
        }
        let plans = self.plan(batch);
        let mut tokens = vec![0i32; batch.rows];
        let mut row_flags = vec![0u32; batch.rows];
        let mut info = vec![RowInfo::default(); batch.rows];
        if !draw_batch(self.kernels, batch, &plans, self.workers.as_ref(), &mut tokens, &mut row_flags, &mut info) {
            return Err(Error::new(ErrorKind::Internal, "a worker thread panicked; nothing was written"));
        }
        let lps = out.wants_logprobs().then(|| Logprobs::compute(batch, &plans, &info, &tokens, out));
        let nonfinite = row_flags.iter().filter(|&&f| f & 0b111 != 0).count() as u64;
        self.counters.nonfinite_rows.fetch_add(nonfinite, Relaxed);
        self.counters.calls.fetch_add(1, Relaxed);
        out.tokens[..batch.rows].copy_from_slice(&tokens);
        if let Some(f) = out.flags.as_deref_mut() {
            f[..batch.rows].copy_from_slice(&row_flags);
        }
        if let Some(l) = lps {
            l.write(out, batch.rows);
        }
        Ok(())
    }

    /// Decides each row's mode and noise. Unseeded rows take their keys from the stream in row
    /// order, one per row, so a row's token does not depend on threads or SIMD level.
    fn plan(&self, batch: &Batch) -> Vec<RowPlan> {
        let c = &self.counters;
        let mut plans = Vec::with_capacity(batch.rows);
        let mut unseeded = Vec::new();
        for r in 0..batch.rows {
            let t = batch.temperature(r);
            if t < self.cfg.greedy_below {
                c.greedy_rows.fetch_add(1, Relaxed);
                plans.push(RowPlan::Greedy);
                continue;
            }
            let inv_t = inv_temperature(t);
            let noise = if let Some((seed, offset)) = batch.seed_of(r) {
                c.seeded_rows.fetch_add(1, Relaxed);
                NoiseSrc::Inline(seeded_row_key(seed, offset))
            } else if let Some(n) = &batch.noise {
                c.external_noise_rows.fetch_add(1, Relaxed);
                // SAFETY: validate() checked that this row's noise lies inside the slice.
                let ptr = unsafe { n.values.as_ptr().add(r * n.row_stride) };
                NoiseSrc::External(ptr, ext_kind(n.kind))
            } else {
                c.inline_rows.fetch_add(1, Relaxed);
                unseeded.push(r);
                NoiseSrc::Inline(0) // keyed below, in row order
            };
            plans.push(RowPlan::Sample { inv_t, noise });
        }
        let mut keys = vec![0u64; unseeded.len()];
        self.keys.next_keys(&mut keys);
        for (&r, &key) in unseeded.iter().zip(&keys) {
            if let RowPlan::Sample { noise, .. } = &mut plans[r] {
                *noise = NoiseSrc::Inline(key);
            }
        }
        plans
    }
}
