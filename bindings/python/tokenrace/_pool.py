"""``NoisePool``: one ``tokenrace_pool``, and ``NoiseLease``: the rows a borrow hands out.

Lifetime of the native pool
---------------------------
``tokenrace_pool_free()`` must not run while another call may start on the handle, and a
lease's memory (or the pool's ring buffer that a lease points into) must outlive every numpy
view of it. So the native handle lives in a ``_Handle`` (``_common.py``, shared with
``Sampler``) that everything able to touch it references: the ``NoisePool``, every
``NoiseLease``, every array made from a lease (through the array's ``base``), and every call in
progress (a local variable). ``tokenrace_pool_free()`` runs when the last of them goes away.
``NoisePool.close()`` first shuts the native pool down (``tokenrace_pool_shutdown()``: its
producers stop, and a borrow blocked in another thread under the BLOCK policy wakes at once with
``ClosedError``), then drops the pool's own reference, so every later call on the pool fails.
Leases out stay readable and are still given back; the handle's memory is freed after the last
of them. A sampler the pool is attached to keeps the pool running until the sampler is freed.

Arrays after release
--------------------
A lease's array is a zero-copy, read-only view of the lease's memory. Leaving the ``with``
block (or ``release()``) gives the rows back to the pool, which refills them: the array still
refers to valid memory of the pool (it keeps the pool alive), but **what it holds afterwards is
undefined** (refilled noise, or for a lease the library had to generate apart, freed memory).
Do not use it after the block; copy what you need to keep (``noise.copy()``).
"""

from __future__ import annotations

import ctypes
import weakref
from ctypes import byref

import numpy as np

from . import _ffi
from ._common import _choice, _Closable, _Default, _from_env, _Handle, _name_of, _unsigned
from ._errors import ClosedError, check

_STATS_FIELDS = ("rows_produced", "rows_borrowed", "borrows_waited", "wait_ns", "inline_rows",
                 "rows_skipped")


def _free_pool(ptr):
    # Looked up at call time: the library is loaded once, and tests observe the call.
    _ffi.lib().tokenrace_pool_free(ptr)


def _release(handle, lease):
    """Gives ``lease`` back; returns the status (a finalizer must not raise)."""
    return _ffi.lib().tokenrace_pool_release(handle.ptr, byref(lease))


class _LeaseMemory:
    """The base object of a lease's arrays: exposes the memory read-only through
    ``__array_interface__`` (so numpy refuses to make the array writeable) and keeps the lease,
    and through it the pool, alive while an array exists."""

    __slots__ = ("lease", "__array_interface__")

    def __init__(self, lease, address, rows, vocab):
        self.lease = lease
        self.__array_interface__ = {
            "version": 3,
            "shape": (rows, vocab),
            "typestr": np.dtype(np.float32).str,
            "data": (address, True),  # True: read-only
            "strides": None,
        }


class NoiseLease:
    """Rows of noise borrowed from a ``NoisePool``: ``with pool.borrow(n) as noise:``.

    Entering the ``with`` block gives ``array``: a read-only ``rows x vocab`` float32 numpy view
    of the lease's memory (no copy); leaving it, also by an exception, gives the rows back
    (``release()``). A lease that is never released explicitly is released when it and every
    array made from it are garbage. Using an array after its lease is released is undefined (see
    the module doc).
    """

    def __init__(self, handle, n_rows):
        n = _unsigned("n_rows", n_rows, 32)
        lease = _ffi.tokenrace_pool_lease()
        check(_ffi.lib().tokenrace_pool_borrow(handle.ptr, n, byref(lease)))
        self._lease = lease
        self._kind = _name_of(lease.kind, _ffi.NOISE_KIND_NAMES)
        self._address = ctypes.cast(lease.values, ctypes.c_void_p).value or 0
        # Kept after the release too: the arrays' memory lies in the pool, which must outlive them.
        self._handle = handle
        self._finalizer = weakref.finalize(self, _release, handle, lease)

    @property
    def rows(self):
        return self._lease.rows

    @property
    def vocab(self):
        return self._lease.vocab

    @property
    def shape(self):
        return (self._lease.rows, self._lease.vocab)

    @property
    def kind(self):
        """What the values are: "exp" (E ~ Exp(1)) or "log_exp" (ln E)."""
        return self._kind

    @property
    def first_seq(self):
        """The pool's sequence number of row 0; row r is ``first_seq + r``."""
        return self._lease.first_seq

    @property
    def address(self):
        """The address of the first value (``tokenrace_pool_lease.values``)."""
        return self._address

    @property
    def released(self):
        return not self._finalizer.alive

    @property
    def array(self):
        """A new read-only ``rows x vocab`` float32 view of the lease's memory (no copy)."""
        if self.released:
            raise ClosedError("NoiseLease: was released; its memory must not be read any more")
        return np.asarray(_LeaseMemory(self, self._address, self._lease.rows, self._lease.vocab))

    def release(self):
        """Gives the rows back to the pool (idempotent). Arrays of the lease must not be used
        afterwards."""
        status = self._finalizer()
        if status is not None:
            check(status)

    def __enter__(self):
        return self.array

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        state = "released" if self.released else "out"
        return (f"<tokenrace.NoiseLease {state} rows={self.rows} vocab={self.vocab} kind={self.kind} "
                f"first_seq={self.first_seq}>")


class NoisePool(_Closable):
    """A ring buffer of Exp(1) noise (E or ln E) that background threads keep filled.

    ``NoisePool(vocab_size, rows=1024, *, kind="log_exp", seed=None, threads=1,
    policy="inline", timeout_ms=None)``

    ``with pool.borrow(n) as noise:`` hands out the next ``n`` rows as a read-only
    ``n x vocab_size`` float32 numpy view (no copy); each value is handed out at most once over
    the life of the pool. A seeded pool hands out the same values for the same sequence of borrow
    sizes, whatever its thread count. ``policy``: what a borrow does when its rows are not ready:
    "inline" generates them on the calling thread, "block" waits up to ``timeout_ms`` and then
    raises ``TokenraceTimeoutError``. Attach a pool to a sampler with ``Sampler.attach_pool``.

    Settings the caller does not pass come from the ``TOKENRACE_POOL_*`` environment variables
    (``docs/configuration.md``), else from the library's defaults; a value passed explicitly
    always wins. ``seed=None`` and ``timeout_ms=None`` mean "not passed" (OS entropy, 1000 ms,
    unless ``TOKENRACE_POOL_SEED`` / ``TOKENRACE_POOL_TIMEOUT_MS`` are set). Memory:
    ``rows x vocab_size x 4`` bytes.
    """

    def __init__(self, vocab_size, rows=_Default(1024), *, kind=_Default("log_exp"), seed=None,
                 threads=_Default(1), policy=_Default("inline"), timeout_ms=None):
        lib = _ffi.lib()
        cfg = _from_env(_ffi.tokenrace_pool_config, lib.tokenrace_pool_config_from_env)
        cfg.vocab = _unsigned("vocab_size", vocab_size, 32)
        if not isinstance(rows, _Default):
            cfg.rows = _unsigned("rows", rows, 32)
        if not isinstance(kind, _Default):
            cfg.kind = _choice("kind", kind, _ffi.NOISE_KIND_NAMES)
        if seed is not None:
            cfg.seed = _unsigned("seed", seed, 64)
            cfg.has_seed = 1
        if not isinstance(threads, _Default):
            cfg.threads = _unsigned("threads", threads, 32)
        if not isinstance(policy, _Default):
            cfg.policy = _choice("policy", policy, _ffi.POOL_POLICY_NAMES)
        if timeout_ms is not None:
            # The range is the library's (PoolConfig::validate), as for every other setting.
            cfg.timeout_ms = _unsigned("timeout_ms", timeout_ms, 64)
        ptr = _ffi.pool_p()
        check(lib.tokenrace_pool_new(byref(cfg), byref(ptr)))
        self._handle = _Handle(ptr, _free_pool)
        self._config = cfg

    # -- lifetime ------------------------------------------------------------------------------

    def close(self):
        """Closes the pool (idempotent): later calls on it raise ``ClosedError``. The native pool
        shuts down now: its producer threads stop, and a borrow waiting in another thread (policy
        "block") raises ``ClosedError`` at once. Leases out stay readable and are still given
        back; the pool's memory is freed once no lease or array of it is left. A sampler the pool
        is attached to keeps it running (and a waiting borrow waiting) until the sampler is
        freed."""
        h = self._handle
        if h is None:
            return
        # Explicitly: dropping the reference frees (and so shuts down) the native pool only once
        # no lease, array or call in another thread holds the handle any more.
        check(_ffi.lib().tokenrace_pool_shutdown(h.ptr))
        self._handle = None

    # -- settings and counters -----------------------------------------------------------------

    @property
    def vocab_size(self):
        return self._config.vocab

    @property
    def rows(self):
        """The capacity in rows: a borrow takes at most this many."""
        return self._config.rows

    @property
    def kind(self):
        return _name_of(self._config.kind, _ffi.NOISE_KIND_NAMES)

    @property
    def threads(self):
        return self._config.threads

    @property
    def policy(self):
        return _name_of(self._config.policy, _ffi.POOL_POLICY_NAMES)

    @property
    def timeout_ms(self):
        return self._config.timeout_ms

    @property
    def seed(self):
        """The seed of the pool's noise, or None for OS entropy."""
        return self._config.seed if self._config.has_seed else None

    @property
    def config(self):
        """The settings the pool was made with, as a dict (enums as their names)."""
        return {"vocab_size": self.vocab_size, "rows": self.rows, "kind": self.kind,
                "threads": self.threads, "seed": self.seed, "policy": self.policy,
                "timeout_ms": self.timeout_ms}

    def stats(self):
        """The pool's counters since it was made, as a dict: rows_produced, rows_borrowed,
        borrows_waited, wait_ns, inline_rows, rows_skipped."""
        h = self._live_handle()
        st = _ffi.tokenrace_pool_stats()
        check(_ffi.lib().tokenrace_pool_get_stats(h.ptr, byref(st)))
        return {k: getattr(st, k) for k in _STATS_FIELDS}

    # -- borrowing -----------------------------------------------------------------------------

    def borrow(self, n_rows):
        """Borrows the next ``n_rows`` rows (1 to ``rows``): a ``NoiseLease``, to use as
        ``with pool.borrow(n) as noise:`` (``noise``: read-only ``n x vocab_size`` float32).

        Raises ``TokenraceTimeoutError`` (policy "block") when the rows are not ready in time,
        ``ValueError`` for ``n_rows`` outside [1, rows], ``ClosedError`` after ``close()``.
        """
        return NoiseLease(self._live_handle(), n_rows)

    def __repr__(self):
        if self.closed:
            return "<tokenrace.NoisePool closed>"
        return (f"<tokenrace.NoisePool vocab_size={self.vocab_size} rows={self.rows} kind={self.kind} "
                f"threads={self.threads} policy={self.policy}>")
