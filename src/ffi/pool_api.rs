//! The C functions of the noise pool. See `src/noise/pool.rs` for the design.
//!
//! A `tokenrace_pool*` is reference counted: the handle holds one reference, every lease that is
//! out holds one, and a call in progress holds one for its duration. `tokenrace_pool_free()`
//! drops the handle's reference and the handle's ownership of the pool: if no sampler has the
//! pool attached, its producers are stopped and joined right away (even mid-fill) and borrows
//! waiting on it return CLOSED. The memory of leases still out stays valid, and
//! `tokenrace_pool_release()` may still be called for them; the last release frees the handle.
//! `tokenrace_pool_shutdown()` does the first half of that (the ownership) and keeps the handle,
//! for callers that must wake blocked borrowers while other calls may still hold it.

use super::api::tokenrace_sampler;
use super::convert::{check_struct_size, pool_config_from_c, pool_config_to_c, read_versioned, write_versioned};
use super::panic::{guard, guard_void};
use super::types::*;
use crate::config::{self, PoolConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::noise::pool::{Lease, Pool, Shared};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// An opaque noise pool. Safe to use from several threads at once.
pub struct tokenrace_pool {
    inner: PoolHandle,
}

/// What a `tokenrace_pool*` holds (inside an `Arc`).
struct PoolHandle {
    /// The handle's ownership of the pool; taken by `tokenrace_pool_shutdown()` or
    /// `tokenrace_pool_free()`.
    owner: Mutex<Option<Arc<Pool>>>,
    shared: Arc<Shared>,
    leases: Mutex<HashMap<u64, Lease>>,
}

/// Lease ids, unique across every pool of the process: a lease given back to a pool it did not
/// come from is not found there, and is refused.
static NEXT_LEASE_ID: AtomicU64 = AtomicU64::new(1);

/// The default pool settings (the `TOKENRACE_POOL_*` defaults of docs/configuration.md), with
/// `struct_size` set. `vocab` is 0 and must be set before `tokenrace_pool_new()`.
#[no_mangle]
pub extern "C" fn tokenrace_pool_config_default() -> tokenrace_pool_config {
    pool_config_to_c(&PoolConfig::default())
}

/// Writes the default pool settings overridden by the `TOKENRACE_POOL_*` environment variables
/// (read once per process) into `*out`, up to `out->struct_size`, which the caller sets first. A
/// bad variable fails with INVALID_CONFIG naming it; `*out` is then left unchanged.
///
/// # Safety
/// `out` is NULL or points to a writable `tokenrace_pool_config` of `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_pool_config_from_env(out: *mut tokenrace_pool_config) -> tokenrace_status {
    guard("tokenrace_pool_config_from_env", || {
        let (_, pool) = config::from_env()?;
        // SAFETY: the caller's contract for `out`.
        unsafe { write_versioned(out, pool_config_to_c(&pool), "out") }
    })
}

/// Makes a noise pool: a ring buffer of `rows x vocab` noise values (E or ln E, as `kind`
/// says) that `threads` background threads keep filled. `config` NULL means
/// `tokenrace_pool_config_from_env()` (then `TOKENRACE_POOL_VOCAB` must be set). On success
/// `*out` holds a pool to release with `tokenrace_pool_free()`; on failure `*out` is untouched.
///
/// Every value is handed out at most once over the life of the pool. Row number s of the pool's
/// output sequence (see `tokenrace_pool_lease.first_seq`) holds the counter-based noise of the
/// row key `splitmix64(splitmix64(splitmix64(seed) ^ s) ^ 0x706f6f6c6e6f6973)` (the key of the
/// request seeded with `seed` at offset s, mixed into the pool's domain: no request shares a
/// pool's noise), so a seeded pool hands out the same values for the same sequence of borrow
/// sizes, whatever its threads do.
///
/// # Safety
/// `config` is NULL or a valid `tokenrace_pool_config`; `out` points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_pool_new(
    config: *const tokenrace_pool_config,
    out: *mut *mut tokenrace_pool,
) -> tokenrace_status {
    guard("tokenrace_pool_new", || {
        if out.is_null() {
            return Err(Error::invalid_argument("out: is NULL"));
        }
        let cfg = if config.is_null() {
            config::from_env()?.1
        } else {
            // SAFETY: the caller's contract for `config`.
            pool_config_from_c(&unsafe { read_versioned(config, "config") }?)?
        };
        crate::logging::install_from_env();
        let pool = Arc::new(Pool::new(cfg)?);
        let handle = Arc::new(tokenrace_pool {
            inner: PoolHandle {
                shared: pool.shared().clone(),
                owner: Mutex::new(Some(pool)),
                leases: Mutex::new(HashMap::new()),
            },
        });
        // SAFETY: `out` is writable (the caller's contract) and not NULL (checked).
        unsafe { out.write(Arc::into_raw(handle) as *mut tokenrace_pool) };
        Ok(())
    })
}

/// Releases the caller's handle (NULL is ignored). Unless a sampler has the pool attached (see
/// `tokenrace_sampler_attach_pool()`), the pool shuts down now: its producers are stopped and
/// joined (they stop mid-row), and any `tokenrace_pool_borrow()` waiting on it returns
/// `TOKENRACE_STATUS_CLOSED`. Leases still out stay readable and must still be given back with
/// `tokenrace_pool_release()` (the handle's memory lives until the last one is); no other call may
/// use the handle afterwards. A call must not start on the handle while it is being freed.
///
/// # Safety
/// `pool` is NULL or came from `tokenrace_pool_new()` and was not freed.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_pool_free(pool: *mut tokenrace_pool) {
    if pool.is_null() {
        return;
    }
    guard_void(|| {
        // SAFETY: the handle is live until its reference is dropped here (the caller's contract:
        // not freed before, no call starting on it meanwhile).
        let owner = unsafe { (*pool).inner.owner.lock().take() };
        drop(owner);
        // SAFETY: the handle's own reference, taken once.
        unsafe { Arc::decrement_strong_count(pool as *const tokenrace_pool) };
    });
}

/// Shuts the pool down now, as `tokenrace_pool_free()` does, but keeps the handle: unless a
/// sampler has the pool attached (see `tokenrace_sampler_attach_pool()`), its producers are
/// stopped and joined (they stop mid-row), any `tokenrace_pool_borrow()` waiting on it returns
/// `TOKENRACE_STATUS_CLOSED` at once, and every later borrow fails with CLOSED. With a sampler
/// attached, the pool keeps running until that sampler is freed. Either way
/// `tokenrace_sampler_attach_pool()` fails with CLOSED from now on, while
/// `tokenrace_pool_release()` and `tokenrace_pool_get_stats()` still work and leases still out stay
/// readable. Idempotent; fails with INVALID_ARGUMENT only when `pool` is NULL. The handle must
/// still be freed with `tokenrace_pool_free()`.
///
/// This lets a binding wake its blocked borrowers when the user closes the pool, while calls in
/// progress on other threads still hold the handle (so it cannot be freed yet).
///
/// # Safety
/// `pool` is NULL or a live pool (not freed).
#[no_mangle]
pub unsafe extern "C" fn tokenrace_pool_shutdown(pool: *mut tokenrace_pool) -> tokenrace_status {
    guard("tokenrace_pool_shutdown", || {
        // SAFETY: the caller's contract for `pool`.
        let handle = unsafe { hold(pool) }?;
        // Taken under the lock and dropped after it, so that joining the producers does not hold
        // up a concurrent `tokenrace_sampler_attach_pool()`, which takes the same lock.
        let owner = handle.inner.owner.lock().take();
        drop(owner);
        Ok(())
    })
}

/// A counted reference to the handle for the duration of a call.
unsafe fn hold(pool: *const tokenrace_pool) -> Result<Arc<tokenrace_pool>> {
    if pool.is_null() {
        return Err(Error::invalid_argument("pool: is NULL"));
    }
    // SAFETY: a live handle holds at least one reference (the caller's contract); this call's
    // own reference is taken before it is used and dropped with the returned Arc.
    unsafe {
        Arc::increment_strong_count(pool);
        Ok(Arc::from_raw(pool))
    }
}

/// Borrows the next `n_rows` rows of noise as one contiguous, read-only span of
/// `n_rows x vocab` floats (`out->values`, inside the pool's own buffer except under the INLINE
/// fallback described below). Several threads may borrow at once; each value is handed out at
/// most once. The caller sets `out->struct_size = sizeof(tokenrace_pool_lease)`; on success the
/// other fields are written, and the lease must be given back with `tokenrace_pool_release()`
/// (until then its rows are not refilled).
///
/// When the rows are not ready: policy INLINE generates them on the calling thread (the same
/// values the producers would have made; counted in `inline_rows`); policy BLOCK waits up to
/// `timeout_ms` and then fails with `TOKENRACE_STATUS_TIMEOUT`. Fails with INVALID_ARGUMENT when
/// `n_rows` is 0 or above the capacity, and with `TOKENRACE_STATUS_CLOSED` when the pool was shut
/// down (also while waiting) or in a `fork()` child of the process that made it (make a new pool
/// there). On failure `*out` is untouched.
///
/// # Safety
/// `pool` is a live pool; `out` points to a writable `tokenrace_pool_lease`.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_pool_borrow(
    pool: *mut tokenrace_pool,
    n_rows: u32,
    out: *mut tokenrace_pool_lease,
) -> tokenrace_status {
    guard("tokenrace_pool_borrow", || {
        // SAFETY: the caller's contract for `pool`.
        let handle = unsafe { hold(pool) }?;
        if out.is_null() {
            return Err(Error::invalid_argument("out: is NULL"));
        }
        // SAFETY: the caller's contract for `out`. Checked before borrowing, so that a bad size
        // costs no noise.
        unsafe { check_struct_size(out as *const tokenrace_pool_lease, "out") }?;
        let p = &handle.inner;
        let lease = p.shared.borrow(n_rows as usize)?;
        let id = NEXT_LEASE_ID.fetch_add(1, Relaxed);
        let c = tokenrace_pool_lease {
            struct_size: size_of::<tokenrace_pool_lease>() as u32,
            kind: tokenrace_noise_kind::from(lease.kind()) as u32,
            values: lease.values().as_ptr(),
            rows: lease.rows() as u32,
            vocab: lease.vocab() as u32,
            id,
            first_seq: lease.first_seq(),
            in_ring: lease.in_ring() as u32,
            reserved0: 0,
        };
        // SAFETY: the caller's contract for `out` (its size was checked above).
        unsafe { write_versioned(out, c, "out") }?;
        p.leases.lock().insert(id, lease);
        // SAFETY: the lease's reference to the handle, dropped by its release.
        unsafe { Arc::increment_strong_count(pool as *const tokenrace_pool) };
        Ok(())
    })
}

/// Gives a lease back: its rows become free for refilling and `lease->values` must not be read
/// any more. Fails with INVALID_ARGUMENT if `lease` is not a lease of this pool that is still
/// out (e.g. released twice). May be called after `tokenrace_pool_free()`.
///
/// # Safety
/// `pool` is a pool handle with this lease out; `lease` points to a lease it wrote.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_pool_release(
    pool: *mut tokenrace_pool,
    lease: *const tokenrace_pool_lease,
) -> tokenrace_status {
    guard("tokenrace_pool_release", || {
        // SAFETY: the caller's contract for `pool`.
        let handle = unsafe { hold(pool) }?;
        if lease.is_null() {
            return Err(Error::invalid_argument("lease: is NULL"));
        }
        // SAFETY: a non-NULL lease was written by `tokenrace_pool_borrow` (the caller's contract).
        let id = unsafe { std::ptr::addr_of!((*lease).id).read_unaligned() };
        let taken = handle.inner.leases.lock().remove(&id);
        match taken {
            None => Err(Error::invalid_argument(format!(
                "lease.id: {id} is not a lease of this pool that is still out (released twice?)"
            ))),
            Some(l) => {
                drop(l);
                drop(handle);
                // SAFETY: the lease's reference, taken by its borrow and dropped once.
                unsafe { Arc::decrement_strong_count(pool as *const tokenrace_pool) };
                Ok(())
            }
        }
    })
}

/// Copies the pool's counters into `*out` (whose `struct_size` the caller sets).
///
/// # Safety
/// `pool` is a live pool; `out` points to a writable `tokenrace_pool_stats` of at least
/// `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_pool_get_stats(
    pool: *const tokenrace_pool,
    out: *mut tokenrace_pool_stats,
) -> tokenrace_status {
    guard("tokenrace_pool_get_stats", || {
        // SAFETY: the caller's contract for `pool`.
        let handle = unsafe { hold(pool) }?;
        let st = handle.inner.shared.stats();
        let stats = tokenrace_pool_stats {
            struct_size: size_of::<tokenrace_pool_stats>() as u32,
            reserved0: 0,
            rows_produced: st.rows_produced,
            rows_borrowed: st.rows_borrowed,
            borrows_waited: st.borrows_waited,
            wait_ns: st.wait_ns,
            inline_rows: st.inline_rows,
            rows_skipped: st.rows_skipped,
        };
        // SAFETY: the caller's contract for `out`.
        unsafe { write_versioned(out, stats, "out") }
    })
}

/// Makes `sampler` take the noise of its unseeded sampling rows from `pool` (one borrow per
/// draw call, of exactly that many rows, released before the call returns), replacing the
/// sampler's own pool if it had one. The sampler keeps the pool running until the sampler is
/// freed, even after `tokenrace_pool_free()`. The pool's `vocab` must equal the sampler's
/// `vocab_size`, and the sampler's `noise` must be AUTO or POOL (INVALID_ARGUMENT otherwise). A
/// draw with more such rows than the pool's capacity fails with INVALID_ARGUMENT. A pool that was
/// shut down (`tokenrace_pool_shutdown()`) cannot be attached: CLOSED.
///
/// # Safety
/// `sampler` and `pool` are live. A draw running concurrently on `sampler` finishes with the
/// noise source it started with.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_sampler_attach_pool(
    sampler: *mut tokenrace_sampler,
    pool: *mut tokenrace_pool,
) -> tokenrace_status {
    guard("tokenrace_sampler_attach_pool", || {
        // SAFETY: NULL or live (the caller's contract).
        let s = unsafe { sampler.as_ref() }.ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
        // SAFETY: the caller's contract for `pool`.
        let handle = unsafe { hold(pool) }?;
        let owner = handle.inner.owner.lock().clone();
        let owner = owner.ok_or_else(|| {
            Error::new(ErrorKind::Closed, "pool: is shut down (tokenrace_pool_shutdown() or tokenrace_pool_free())")
        })?;
        s.inner.attach_pool(owner)
    })
}
