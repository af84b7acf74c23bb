//! The sampler: a configuration, the chosen kernels, the key stream of unseeded rows, counters.

use crate::config::{Config, DrainPolicy, LogLevel, NoiseKind, NoiseSource, PoolConfig};
use crate::draw::batch::{validate, Batch, Output};
use crate::draw::logprob::Logprobs;
use crate::draw::workers::WorkerPool;
use crate::draw::{draw_batch, ext_kind, inv_temperature, NoiseSrc, RowInfo, RowPlan};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::{self, Kernels, SimdLevel};
use crate::noise::pool::{Lease, Pool, PoolOptions};
use crate::noise::{entropy_seed, seeded_row_key, splitmix64, KeyStream};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

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
    /// The pool unseeded sampling rows take their noise from (noise = pool, or attached).
    pool: Mutex<Option<Arc<Pool>>>,
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
        let pool = if cfg.noise == NoiseSource::Pool { Some(Arc::new(Self::own_pool(&cfg, level)?)) } else { None };
        Ok(Sampler {
            kernels: kernels::kernels(level),
            keys: KeyStream::new(seed),
            counters: Counters::default(),
            workers,
            pool: Mutex::new(pool),
            cfg,
        })
    }

    /// The pool of a sampler made with noise = pool: ln E, one producer, INLINE when drained,
    /// seeded from the sampler's seed when it has one.
    fn own_pool(cfg: &Config, level: SimdLevel) -> Result<Pool> {
        if cfg.vocab_size == 0 {
            return Err(Error::invalid_config(
                "vocab_size: must be set (nonzero) when noise = pool, since the pool's rows have vocab_size values",
            ));
        }
        let rows = if cfg.pool_rows == 0 { (4 * cfg.max_rows).min(1 << 20) } else { cfg.pool_rows };
        if rows < cfg.max_rows {
            return Err(Error::invalid_config(format!(
                "pool_rows: {rows} is smaller than max_rows {} (a draw borrows up to max_rows rows)",
                cfg.max_rows
            )));
        }
        let pc = PoolConfig {
            rows,
            vocab: cfg.vocab_size,
            kind: NoiseKind::LogExp,
            threads: 1,
            seed: cfg.seed.map(|s| splitmix64(s ^ 0x7361_6d70_6c65_7270)),
            policy: DrainPolicy::Inline,
            ..PoolConfig::default()
        };
        Pool::with_options(pc, PoolOptions { level: Some(level), ..PoolOptions::default() })
    }

    /// Makes the unseeded sampling rows take their noise from `pool` (replacing any pool the
    /// sampler had). The pool's vocab must equal `vocab_size`; noise must be auto or pool.
    pub fn attach_pool(&self, pool: Arc<Pool>) -> Result<()> {
        if self.cfg.noise == NoiseSource::Inline {
            return Err(Error::invalid_argument(
                "sampler: its noise is inline; make it with noise = auto or pool to attach a pool",
            ));
        }
        if pool.config().vocab != self.cfg.vocab_size {
            return Err(Error::invalid_argument(format!(
                "pool: its vocab {} differs from the sampler's vocab_size {}",
                pool.config().vocab,
                self.cfg.vocab_size
            )));
        }
        *self.pool.lock() = Some(pool);
        Ok(())
    }

    /// The pool the sampler takes noise from, if any.
    pub fn pool(&self) -> Option<Arc<Pool>> {
        self.pool.lock().clone()
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
        let pool = self.pool();
        let (plans, _lease) = self.plan(batch, pool.as_deref()).inspect_err(|_| {
            self.counters.rejected_calls.fetch_add(1, Relaxed);
        })?;
        let mut tokens = vec![0i32; batch.rows];
        let mut row_flags = vec![0u32; batch.rows];
        let mut info = vec![RowInfo::default(); batch.rows];
        if !draw_batch(self.kernels, batch, &plans, self.workers.as_ref(), &mut tokens, &mut row_flags, &mut info) {
            return Err(Error::new(ErrorKind::Internal, "a worker thread panicked; nothing was written"));
        }
        let lps = out.wants_logprobs().then(|| Logprobs::compute(self.kernels, batch, &plans, &info, &tokens, out));
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
    /// With a pool, the unseeded rows take one row each of a single lease, in row order; the
    /// lease must outlive the draw.
    fn plan(&self, batch: &Batch, pool: Option<&Pool>) -> Result<(Vec<RowPlan>, Option<Lease>)> {
        let mut plans = Vec::with_capacity(batch.rows);
        let mut unseeded = Vec::new();
        let (mut greedy, mut seeded, mut external) = (0u64, 0u64, 0u64);
        for r in 0..batch.rows {
            let t = batch.temperature(r);
            if t < self.cfg.greedy_below {
                greedy += 1;
                plans.push(RowPlan::Greedy);
                continue;
            }
            let inv_t = inv_temperature(t);
            let noise = if let Some((seed, offset)) = batch.seed_of(r) {
                seeded += 1;
                NoiseSrc::Inline(seeded_row_key(seed, offset))
            } else if let Some(n) = &batch.noise {
                external += 1;
                // SAFETY: validate() checked that this row's noise lies inside the slice.
                let ptr = unsafe { n.values.as_ptr().add(r * n.row_stride) };
                NoiseSrc::External(ptr, ext_kind(n.kind))
            } else {
                unseeded.push(r);
                NoiseSrc::Inline(0) // keyed below, in row order
            };
            plans.push(RowPlan::Sample { inv_t, noise });
        }
        let mut lease = None;
        if let (Some(pool), false) = (pool, unseeded.is_empty()) {
            let l =
                pool.borrow(unseeded.len()).map_err(|e| Error::new(e.kind, format!("noise pool: {}", e.message)))?;
            for (i, &r) in unseeded.iter().enumerate() {
                if let RowPlan::Sample { noise, .. } = &mut plans[r] {
                    *noise = NoiseSrc::External(l.row(i).as_ptr(), ext_kind(l.kind()));
                }
            }
            lease = Some(l);
        } else {
            let mut keys = vec![0u64; unseeded.len()];
            self.keys.next_keys(&mut keys);
            for (&r, &key) in unseeded.iter().zip(&keys) {
                if let RowPlan::Sample { noise, .. } = &mut plans[r] {
                    *noise = NoiseSrc::Inline(key);
                }
            }
        }
        // Counted only once nothing can fail any more.
        let c = &self.counters;
        c.greedy_rows.fetch_add(greedy, Relaxed);
        c.seeded_rows.fetch_add(seeded, Relaxed);
        c.external_noise_rows.fetch_add(external, Relaxed);
        let counter = if lease.is_some() { &c.pool_rows } else { &c.inline_rows };
        counter.fetch_add(unseeded.len() as u64, Relaxed);
        Ok((plans, lease))
    }
}
