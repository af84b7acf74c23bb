//! The sampler: a configuration, the chosen kernels, the key stream of unseeded rows, counters.

use crate::batch::{validate, validate_but_ids, with_held_params, Batch, Ids, Output, VerifyBatch, VerifyOutput};
use crate::config::{Config, DrainPolicy, NoiseKind, NoiseSource, PoolConfig, MAX_POOL_ROWS};
use crate::draw::verify::Drafts;
use crate::draw::RequestStep;
use crate::draw::Workers;
use crate::error::{Error, Result};
use crate::kernels::{self, Kernels, SimdLevel};
use crate::logging;
use crate::noise::pool::{Pool, PoolOptions};
use crate::noise::{entropy_seed, splitmix64, KeyStream};
use crate::plan::{plan, RowCounts};
use crate::process::{current_pid, Birthplace};
use crate::verify;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering, Ordering::Relaxed};
use std::sync::Arc;

mod score;

/// The domain of the seed of a sampler's own pool ("samplerp"): the pool's seed is the sampler's
/// seed mixed into this domain, so that a seeded sampler's pool and the key stream of its
/// unseeded rows, made from the same seed, do not share noise.
const OWN_POOL_SEED_DOMAIN: u64 = 0x7361_6d70_6c65_7270;

/// Declares `SamplerStats` and the atomic counters behind it from one list of fields.
macro_rules! sampler_stats {
    ($($(#[$doc:meta])* $field:ident,)*) => {
        /// Counters of a sampler since it was made.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct SamplerStats {
            $($(#[$doc])* pub $field: u64,)*
        }

        #[derive(Default)]
        struct Counters {
            $($field: AtomicU64,)*
        }

        impl Counters {
            fn snapshot(&self) -> SamplerStats {
                SamplerStats { $($field: self.$field.load(Relaxed),)* }
            }

            /// Counts a draw or verify call that succeeded (once nothing can fail any more): its
            /// rows by how they were planned, and `nonfinite` rows whose flags reported NaN, +inf
            /// or an empty row.
            fn count_call(&self, rows: RowCounts, nonfinite: u64) {
                self.greedy_rows.fetch_add(rows.greedy, Relaxed);
                self.seeded_rows.fetch_add(rows.seeded, Relaxed);
                self.external_noise_rows.fetch_add(rows.external, Relaxed);
                self.inline_rows.fetch_add(rows.inline, Relaxed);
                self.pool_rows.fetch_add(rows.pool, Relaxed);
                self.nonfinite_rows.fetch_add(nonfinite, Relaxed);
                self.calls.fetch_add(1, Relaxed);
            }
        }
    };
}

sampler_stats! {
    /// Successful draw calls.
    calls,
    /// Calls that failed (validation, the noise pool, a worker).
    rejected_calls,
    /// Rows drawn greedily (temperature below the greedy threshold).
    greedy_rows,
    /// Sampling rows with their own seed.
    seeded_rows,
    /// Unseeded sampling rows on inline noise keyed by the sampler's stream.
    inline_rows,
    /// Unseeded sampling rows on the caller's noise.
    external_noise_rows,
    /// Unseeded sampling rows on noise of the sampler's pool (not the pool's capacity).
    pool_rows,
    /// Rows whose flags reported NaN, +inf or an empty row.
    nonfinite_rows,
}

/// Samples next tokens. Usable from several threads at once (`Sync`).
pub struct Sampler {
    cfg: Config,
    kernels: &'static Kernels,
    keys: KeyStream,
    counters: Counters,
    /// Worker threads beyond the caller's, when `threads` > 1.
    workers: Option<Workers>,
    /// The pool unseeded sampling rows take their noise from (noise = pool, or attached).
    pool: Mutex<Option<Arc<Pool>>>,
    /// The process that made the sampler, and the key stream of unseeded rows in a `fork()`
    /// child of it (see `Sampler::forked_keys`).
    birthplace: Birthplace,
    forked: AtomicPtr<ForkedKeys>,
}

/// The key stream of a sampler's unseeded rows in one `fork()` child process.
struct ForkedKeys {
    pid: u32,
    keys: KeyStream,
}

impl Sampler {
    /// Makes a sampler: checks `cfg` (INVALID_CONFIG names a bad field), chooses the kernels of
    /// `cfg.simd` (an error if this CPU lacks that level), starts its worker threads (one fewer
    /// than `threads`, as the caller's thread is one; `threads` 0 counts the cores this process
    /// may use) and, with `noise` = pool, the sampler's own noise pool.
    ///
    /// It installs no logger: its messages go to the process's `log` logger, if the program
    /// set one (only the C entry points install the library's own, and only when the process
    /// has none). Unseeded rows are keyed by a stream seeded from `cfg.seed`, or from OS entropy
    /// when it is `None`.
    pub fn new(cfg: Config) -> Result<Sampler> {
        cfg.validate()?;
        logging::warn_unknown_vars_once();
        let level = kernels::resolve(cfg.simd)?;
        logging::announce_simd(level, cfg.simd);
        let seed = cfg.seed.unwrap_or_else(entropy_seed);
        log::debug!("sampler: simd {}, max_rows {}, vocab {}", level.name(), cfg.max_rows, cfg.vocab_size);
        let threads = cfg.effective_threads();
        let workers = match threads {
            0 | 1 => None,
            n => Some(Workers::new(n - 1).map_err(|e| Error::internal(format!("threads: cannot start workers: {e}")))?),
        };
        let pool = if cfg.noise == NoiseSource::Pool { Some(Arc::new(Self::own_pool(&cfg, level)?)) } else { None };
        Ok(Sampler {
            kernels: kernels::kernels(level),
            keys: KeyStream::new(seed),
            counters: Counters::default(),
            workers,
            pool: Mutex::new(pool),
            birthplace: Birthplace::here(),
            forked: AtomicPtr::new(std::ptr::null_mut()),
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
        let rows = if cfg.pool_rows == 0 { (4 * cfg.max_rows).min(MAX_POOL_ROWS) } else { cfg.pool_rows };
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
            seed: cfg.seed.map(|s| splitmix64(s ^ OWN_POOL_SEED_DOMAIN)),
            policy: DrainPolicy::Inline,
            ..PoolConfig::default()
        };
        Pool::with_options(pc, PoolOptions { level: Some(level), ..PoolOptions::default() })
    }

    /// Makes the unseeded sampling rows take their noise from `pool` (replacing any pool the
    /// sampler had). The pool's vocab must equal `vocab_size`; noise must be auto or pool.
    pub fn attach_pool(&self, pool: Arc<Pool>) -> Result<()> {
        if self.birthplace.elsewhere() {
            return Err(Error::invalid_argument(
                "sampler: was made in the parent of this fork() child; make a new sampler here to attach a pool",
            ));
        }
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

    /// The pool the sampler takes noise from, if any (none in a `fork()` child).
    pub fn pool(&self) -> Option<Arc<Pool>> {
        if self.birthplace.elsewhere() {
            return None; // its lock may be held by a thread of the parent
        }
        self.pool.lock().clone()
    }

    /// The key stream of unseeded rows in this `fork()` child: a new one per process, seeded
    /// from OS entropy and the process id, so a child never repeats its parent's (or a
    /// sibling's) noise, and never waits on the parent's stream, whose lock may be held by a
    /// thread that does not exist here. Made once per process and never freed (another thread
    /// of the child may be reading it); a grandchild makes its own.
    fn forked_keys(&self) -> &KeyStream {
        let pid = current_pid();
        let current = self.forked.load(Ordering::Acquire);
        // SAFETY: a non-null pointer came from `Box::into_raw` below and is never freed while
        // the sampler lives.
        if let Some(f) = unsafe { current.as_ref() } {
            if f.pid == pid {
                return &f.keys;
            }
        }
        let seed = splitmix64(entropy_seed() ^ splitmix64(u64::from(pid)));
        let mine = Box::into_raw(Box::new(ForkedKeys { pid, keys: KeyStream::new(seed) }));
        match self.forked.compare_exchange(current, mine, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: `mine` was just published and is never freed while the sampler lives.
            Ok(_) => unsafe { &(*mine).keys },
            Err(theirs) => {
                // Another thread of this process won: use its stream, free ours.
                // SAFETY: `mine` was never published; `theirs` is as `current` above and was
                // made by this process (only a thread of this process can have swapped it in
                // after our load, as the child starts with one thread).
                unsafe {
                    drop(Box::from_raw(mine));
                    &(*theirs).keys
                }
            }
        }
    }

    /// The configuration the sampler was made with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The SIMD level its kernels run (what `cfg.simd` resolved to on this CPU).
    pub fn simd_level(&self) -> SimdLevel {
        self.kernels.level
    }

    /// What a vocabulary-sharded call (`crate::shard`) needs from the sampler: its kernels, the
    /// key stream of its unseeded rows (the fork child's own in a `fork()` child, as a draw
    /// takes it), and whether unseeded rows would take pool noise.
    pub(crate) fn shard_parts(&self) -> (&'static Kernels, &KeyStream, bool) {
        let keys = if self.birthplace.elsewhere() { self.forked_keys() } else { &self.keys };
        (self.kernels, keys, self.pool().is_some())
    }

    /// A snapshot of its counters (each read on its own: a call in progress may show in some).
    pub fn stats(&self) -> SamplerStats {
        self.counters.snapshot()
    }

    /// Draws one token per row of `batch` into `out`. On error nothing is written.
    pub fn draw(&self, batch: &Batch, out: &mut Output) -> Result<()> {
        with_held_params(batch, |batch| self.try_draw(batch, out)).inspect_err(|_| self.count_rejected())
    }

    /// Counts a draw call refused before it reached [`Sampler::draw`] (by the C layer).
    pub(crate) fn count_rejected(&self) {
        self.counters.rejected_calls.fetch_add(1, Relaxed);
    }

    /// Checks a draw's arguments as [`Sampler::draw`] does, drawing nothing.
    pub(crate) fn check_draw(&self, batch: &Batch, out: &Output) -> Result<()> {
        with_held_params(batch, |batch| validate(self.kernels, batch, out, self.cfg.max_rows, self.cfg.vocab_size))
    }

    /// Draws every row of `batch` greedily into `out`: the tokens and flags [`Sampler::draw`]
    /// gives the same rows at a temperature below `greedy_below` with nothing else set. Only the
    /// batch's logits (rows, vocab, row stride) and the output's tokens and flags are read (the
    /// C entry `tokenrace_draw_greedy` builds nothing else). Its rows take no noise and no key.
    /// On error nothing is written.
    pub(crate) fn draw_greedy(&self, batch: &Batch, out: &mut Output) -> Result<()> {
        let limits = (self.cfg.max_rows, self.cfg.vocab_size);
        let drawn = validate_but_ids(self.kernels, batch, out, limits, Ids::InRows).and_then(|()| {
            let plans = crate::alloc::filled(batch.rows, crate::draw::RowPlan::Greedy, "the row plans")?;
            crate::draw::run(self.kernels, batch, &plans, self.workers.as_ref(), out)
        });
        match drawn {
            Ok(nonfinite) => {
                self.counters.count_call(RowCounts { greedy: batch.rows as u64, ..RowCounts::default() }, nonfinite);
                Ok(())
            }
            Err(e) => {
                self.count_rejected();
                Err(e)
            }
        }
    }

    fn try_draw(&self, batch: &Batch, out: &mut Output) -> Result<()> {
        // The token lists' ids are checked by the rows' tasks (in parallel, as they read them);
        // a call that fails reports what a full validation reports first, as if they were
        // checked here.
        let limits = (self.cfg.max_rows, self.cfg.vocab_size);
        self.draw_checked(batch, out, limits)
            .map_err(|e| validate(self.kernels, batch, out, limits.0, limits.1).err().unwrap_or(e))
    }

    fn draw_checked(&self, batch: &Batch, out: &mut Output, limits: (usize, usize)) -> Result<()> {
        validate_but_ids(self.kernels, batch, out, limits, Ids::InRows)?;
        // In a fork() child, unseeded rows use inline noise from the child's own key stream:
        // the pool's producers do not exist there (see `forked_keys`).
        // (One process-id check for both: it is a system call, a sizeable part of a short call.)
        let forked = self.birthplace.elsewhere();
        let keys = if forked { self.forked_keys() } else { &self.keys };
        let pool = if forked { None } else { self.pool.lock().clone() };
        let plan = plan(batch, (self.cfg.greedy_below, self.cfg.filter_order), keys, pool.as_deref())?;
        let nonfinite = match crate::draw::run(self.kernels, batch, &plan.rows, self.workers.as_ref(), out) {
            Ok(nonfinite) => nonfinite,
            Err(e) => {
                plan.give_back(keys);
                return Err(e);
            }
        };
        self.counters.count_call(plan.counts, nonfinite);
        Ok(())
    }
}

impl Sampler {
    /// Verifies the draft tokens of every request of `batch` against its target rows
    /// (speculative decoding, vLLM's rejection sampling: `docs/semantics.md`) into `out`. On
    /// error nothing is written.
    pub fn verify(&self, batch: &VerifyBatch, out: &mut VerifyOutput) -> Result<()> {
        self.try_verify(batch, out).inspect_err(|_| self.count_rejected())
    }

    /// Checks a verify call's arguments as [`Sampler::verify`] does (but its q rows), verifying
    /// nothing.
    pub(crate) fn check_verify(&self, batch: &VerifyBatch, out: &VerifyOutput) -> Result<()> {
        let limits = (self.cfg.greedy_below, self.cfg.max_rows, self.cfg.vocab_size);
        verify::prepare(self.kernels, batch, out, limits).map(|_| ())
    }

    fn try_verify(&self, batch: &VerifyBatch, out: &mut VerifyOutput) -> Result<()> {
        let greedy_below = self.cfg.greedy_below;
        let target = verify::prepare(self.kernels, batch, out, (greedy_below, self.cfg.max_rows, self.cfg.vocab_size))?;
        let rows = target.batch(batch);
        let keys = if self.birthplace.elsewhere() { self.forked_keys() } else { &self.keys };
        let pool = self.pool();
        let plan = plan(&rows, (greedy_below, self.cfg.filter_order), keys, pool.as_deref())?;
        let (uniforms, uniform_keys) = verify::uniforms(batch, &target, greedy_below, keys);
        let drafts: Vec<Drafts> = target
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| Drafts {
                first_row: r.first_row,
                first_draft: r.first_draft,
                ids: &batch.draft_tokens[r.first_draft..r.first_draft + r.drafts],
                q: batch.draft_probs.map(|q| {
                    let start = if r.drafts == 0 { 0 } else { r.first_draft * q.row_stride };
                    (&q.values[start..], q.row_stride)
                }),
                uniforms: &uniforms[r.first_draft..r.first_draft + r.drafts],
                parents: target.tree.as_ref().map(|t| &t.parents[r.first_draft..r.first_draft + r.drafts]),
                step: batch.step.is_on().then_some(RequestStep { inputs: batch.step, request: i }),
            })
            .collect();
        let workers = self.workers.as_ref();
        let called = crate::draw::verify::run(self.kernels, &rows, &plan.rows, &drafts, workers, (out, target.width));
        let nonfinite = match called {
            Ok(nonfinite) => nonfinite,
            Err(e) => {
                // Given back in the reverse order of their taking.
                if let Some(taken) = uniform_keys {
                    keys.give_back(taken);
                }
                plan.give_back(keys);
                return Err(e);
            }
        };
        self.counters.count_call(plan.counts, nonfinite);
        Ok(())
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        let f = *self.forked.get_mut();
        if !f.is_null() {
            // SAFETY: made by `Box::into_raw` in `forked_keys`; nothing else can use it now.
            // (Dropping a KeyStream does not lock it, so one copied locked from a parent is fine.)
            drop(unsafe { Box::from_raw(f) });
        }
    }
}
