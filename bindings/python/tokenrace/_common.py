"""Helpers shared by ``Sampler`` and ``NoisePool``: keyword defaults that defer to the
environment, integer and enum checks, reading a settings struct from the environment, and the
handle that owns a native pointer.

Lifetime of a native object
---------------------------
A ``tokenrace_*_free()`` must not run while a call on the object is in progress in another
thread (ctypes releases the GIL during the call). So the native pointer lives in a ``_Handle``
that frees it when the handle is garbage, and every call takes the handle into a local variable
for its whole duration (``h = self._live_handle()``, then ``h.ptr``). ``close()`` drops the
object's own reference: later calls raise ``ClosedError``, and the native object is freed as soon
as no call (nor, for a pool, any lease or array of it) still holds the handle.
(``NoisePool.close()`` also shuts the native pool down at once, to wake its blocked borrowers.)

In a ``fork()`` child, a thread that was inside a call at the fork has vanished but its frame's
references stay (CPython does not release them), so such a handle is freed only by the
finalizers at interpreter exit (not at all after ``os._exit``): a leak, never a free under a call.
"""

from __future__ import annotations

import ctypes
import operator
import weakref

from . import _ffi
from ._errors import ClosedError, check


class _Default:
    """The default of a keyword the caller did not pass: the environment then decides.

    Its repr is the library's default, so that ``help(Sampler)`` shows the effective default.
    """

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return repr(self.value)


def _unsigned(name, value, bits, low=0, high=None):
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: must be an integer, got {type(value).__name__}") from None
    if high is None:
        high = 2**bits - 1
    if not low <= v <= high:
        raise ValueError(f"{name}: {v} is not in [{low}, {high}]")
    return v


def _choice(name, value, names):
    if not isinstance(value, str) or value.lower() not in names:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(names)}")
    return names[value.lower()]


def _name_of(code, names):
    return next((k for k, v in names.items() if v == code), code)


def _from_env(cls, function):
    """``function(cls *out)`` (a ``tokenrace_*_from_env``): the library writes at most
    ``out->struct_size`` bytes, so a library newer than this binding never overruns it."""
    cfg = cls()
    cfg.struct_size = ctypes.sizeof(cls)
    check(function(ctypes.byref(cfg)))
    return cfg


class _Handle:
    """A native pointer and the function that frees it, called once, when this object is garbage
    (or at interpreter exit, by ``weakref.finalize``). See the module doc.

    This finalizer is the only place that frees the pointer, which makes a double free
    impossible: ``weakref.finalize`` takes its entry out of its registry (one atomic ``dict.pop``)
    before calling, so of the collector, the last reference going away and the exit hook only the
    first calls ``free``. ``close()`` therefore only drops a reference and never frees itself:
    any number of threads may close at once, each draw holding the handle."""

    __slots__ = ("ptr", "__weakref__")

    def __init__(self, ptr, free):
        self.ptr = ptr
        # ``free`` must not refer to this object, or it would never become garbage. (The
        # finalizer keeps itself registered until it has run.)
        weakref.finalize(self, free, ptr)


class _Closable:
    """The life cycle shared by the native handles: ``close()`` (defined by the class),
    ``closed``, use as a context manager, and ``_live_handle()``, the ``_Handle`` that a call holds
    while it runs, which raises ``ClosedError`` (a ``RuntimeError``) naming the class once
    closed."""

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _live_handle(self):
        h = self._handle
        if h is None:
            raise ClosedError(f"{type(self).__name__}: is closed")
        return h


def _offsets_without_seeds(unit):
    """Refuses ``offsets`` given without ``seeds``: an offset only means something for seeded
    rows, and without seeds every row takes keys from the sampler's stream, so the caller's
    offsets would be silently ignored. (``seeded`` without ``seeds`` the library refuses.)"""
    raise ValueError(f"offsets: given without seeds; an offset is mixed into a seeded {unit}'s seed (e.g. its "
                     f"position), so it needs seeds= (without seeds every {unit} is unseeded and takes keys "
                     f"from the sampler's stream)")
