"""Array-likes to the pointers and sizes of the C ABI, without copying.

``rows_view()`` turns a 2-D (or 1-D: one row) numpy array or CPU torch tensor into a
``RowsView``: a data pointer, a ``tokenrace_dtype``, rows, vocab and a row stride in elements.
Only the element inside a row must be unit-stride; rows may be any distance apart, so slices
such as ``big[:, :vocab]`` or ``big[::2]`` are read in place. ``per_row()`` turns a scalar or a
1-D array-like into a contiguous numpy array of one value per row (these are small; they are
converted, and the caller keeps them alive for the call).

torch is imported only when an object's type comes from torch.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _ffi
from ._call import address

_NUMPY_DTYPES = {np.dtype(np.float32): _ffi.DTYPE_F32, np.dtype(np.float16): _ffi.DTYPE_F16}
_DTYPE_NAMES = {_ffi.DTYPE_F32: "float32", _ffi.DTYPE_F16: "float16", _ffi.DTYPE_BF16: "bfloat16"}

LOGITS_DTYPES = (_ffi.DTYPE_F32, _ffi.DTYPE_F16, _ffi.DTYPE_BF16)
NOISE_DTYPES = (_ffi.DTYPE_F32,)

_U32_MAX = 2**32 - 1


class RowsView(NamedTuple):
    """Rows of values in memory that the caller owns. ``owner`` must stay alive during the call."""

    ptr: int
    dtype: int  # a tokenrace_dtype
    rows: int
    vocab: int
    row_stride: int  # elements between row starts; 0 only for a broadcast row (see rows_view)
    ndim: int  # of the object given (1 or 2)
    owner: object


# RowsView(...) runs the NamedTuple's Python __new__ (~0.3 µs); tuple.__new__ builds the same.
_new_view = RowsView._make


def is_torch_tensor(obj) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def as_torch(arr):
    """``arr`` (a numpy array the call allocated) as a CPU torch tensor sharing its memory
    (``torch.from_numpy``: no copy). For outputs of calls whose logits came as a tensor, so that a
    torch caller gets tensors back. uint32 (the row flags) comes back as an int32 view of the same
    bits, the dtype every torch version can hold."""
    import torch

    if arr.dtype == np.uint32:
        arr = arr.view(np.int32)
    return torch.from_numpy(arr)


def _numpy_code(dtype):
    """The tokenrace_dtype of a numpy dtype, whatever its byte order (checked apart), or None."""
    code = _NUMPY_DTYPES.get(dtype)  # the common case first: one hash lookup
    if code is not None:
        return code
    if dtype.kind == "f" and not dtype.isnative:
        dtype = dtype.newbyteorder("=")
    if dtype in _NUMPY_DTYPES:
        return _NUMPY_DTYPES[dtype]
    if dtype.name == "bfloat16" and dtype.itemsize == 2:  # ml_dtypes.bfloat16
        return _ffi.DTYPE_BF16
    return None


def _accepted(allowed):
    return ", ".join(_DTYPE_NAMES[d] for d in allowed)


def _row_stride(stride, rows, vocab, name, broadcast_ok):
    """Checks a row stride given in elements; returns the value for the C struct."""
    if rows <= 1:
        return vocab
    if stride == 0 and broadcast_ok:
        return 0
    if stride < 0:
        raise ValueError(f"{name}: has a negative row stride ({stride} elements); tokenrace reads rows "
                         f"in increasing address order, pass a copy (np.ascontiguousarray)")
    if stride < vocab:
        raise ValueError(f"{name}: rows overlap (row stride {stride} elements < {vocab} values per row); "
                         f"pass a copy (np.ascontiguousarray)")
    return stride


def _check_shape(name, ndim, shape):
    if ndim not in (1, 2):
        raise ValueError(f"{name}: must be 2-D (rows x vocab) or 1-D (one row), got {ndim}-D with shape "
                         f"{tuple(shape)}")
    rows, vocab = (1, shape[0]) if ndim == 1 else (shape[0], shape[1])
    if rows > _U32_MAX or vocab > _U32_MAX:
        raise ValueError(f"{name}: shape {tuple(shape)} exceeds the 32-bit rows/vocab of the C ABI")
    return rows, vocab


def contiguous_rows(arr, allowed):
    """``(ptr, dtype, rows, vocab)`` of the common case, a non-empty, aligned, C-contiguous 2-D
    numpy array of an accepted dtype (each check a flag or a lookup; the row stride is the
    vocab); None for anything else, which ``rows_view`` checks in full."""
    code = _NUMPY_DTYPES.get(arr.dtype)
    if code is None or code not in allowed or arr.ndim != 2 or not arr.size:
        return None
    flags = arr.flags
    if not (flags.c_contiguous and flags.aligned):
        return None
    rows, vocab = arr.shape
    if rows > _U32_MAX or vocab > _U32_MAX:
        return None
    return address(arr), code, rows, vocab


def rows_view(obj, name="logits", allowed=LOGITS_DTYPES, broadcast_ok=False) -> RowsView:
    """The zero-copy view of ``obj`` for the C ABI.

    ``broadcast_ok``: a row stride of 0 (``np.broadcast_to``) is passed on as 0, which the noise
    argument reads as one row broadcast to every row; otherwise rows must not overlap.
    A 1-D ``obj`` is one row.
    """
    if type(obj) is np.ndarray:
        fast = contiguous_rows(obj, allowed)
        if fast is not None:
            ptr, code, rows, vocab = fast
            return _new_view((ptr, code, rows, vocab, vocab, 2, obj))
    if is_torch_tensor(obj):
        return _torch_view(obj, name, allowed, broadcast_ok)
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        arr = np.asarray(obj)
        if _numpy_code(arr.dtype) not in allowed and arr.dtype.kind in "fiub":
            # Not an array to begin with (a list, a memoryview...): converting copies anyway.
            arr = arr.astype(np.float32)
    code = _numpy_code(arr.dtype)
    if code is None or code not in allowed:
        raise ValueError(f"{name}: dtype {arr.dtype} is not supported; accepted: {_accepted(allowed)} "
                         f"(convert explicitly, e.g. {name}.astype(np.float32))")
    if not arr.dtype.isnative:
        raise ValueError(f"{name}: has non-native byte order ({arr.dtype.str}); pass "
                         f"{name}.astype({arr.dtype.newbyteorder('=').name})")
    rows, vocab = _check_shape(name, arr.ndim, arr.shape)
    if not arr.flags.aligned:
        raise ValueError(f"{name}: is not aligned to its {arr.itemsize}-byte elements; pass a copy")
    item = arr.itemsize
    inner = arr.strides[-1]
    if rows == 0 or vocab == 0:  # nothing is read; numpy gives empty arrays arbitrary strides
        return RowsView(address(arr), code, rows, vocab, vocab, arr.ndim, arr)
    if vocab > 1 and inner != item:
        raise ValueError(f"{name}: values inside a row must be contiguous (inner stride {inner} bytes, "
                         f"element size {item}); pass np.ascontiguousarray({name})")
    outer = arr.strides[0] if arr.ndim == 2 else 0
    if rows > 1 and outer % item:
        raise ValueError(f"{name}: row stride of {outer} bytes is not a multiple of the element size {item}")
    stride = _row_stride(outer // item, rows, vocab, name, broadcast_ok)
    return RowsView(address(arr), code, rows, vocab, stride, arr.ndim, arr)


def _torch_dtypes():
    import torch

    return {torch.float32: _ffi.DTYPE_F32, torch.float16: _ffi.DTYPE_F16, torch.bfloat16: _ffi.DTYPE_BF16}


def _torch_view(t, name, allowed, broadcast_ok) -> RowsView:
    import torch

    if t.device.type != "cpu":
        raise ValueError(f"{name}: is a tensor on device '{t.device}'; tokenrace reads host memory, "
                         f"pass {name}.cpu()")
    if t.layout != torch.strided:
        raise ValueError(f"{name}: has layout {t.layout}; only dense (strided) tensors are supported")
    code = _torch_dtypes().get(t.dtype)
    if code is None or code not in allowed:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported; accepted: {_accepted(allowed)}")
    if (hasattr(t, "is_neg") and t.is_neg()) or (hasattr(t, "is_conj") and t.is_conj()):
        raise ValueError(f"{name}: is a lazily negated/conjugated view; call .resolve_neg() first")
    rows, vocab = _check_shape(name, t.dim(), tuple(t.shape))
    strides = t.stride()
    if rows == 0 or vocab == 0:
        return RowsView(t.data_ptr(), code, rows, vocab, vocab, t.dim(), t)
    if vocab > 1 and strides[-1] != 1:
        raise ValueError(f"{name}: values inside a row must be contiguous (inner stride {strides[-1]} "
                         f"elements); pass {name}.contiguous()")
    stride = _row_stride(strides[0] if t.dim() == 2 else 0, rows, vocab, name, broadcast_ok)
    ptr = t.data_ptr()
    item = t.element_size()
    if ptr % item:
        raise ValueError(f"{name}: is not aligned to its {item}-byte elements; pass {name}.clone()")
    return RowsView(ptr, code, rows, vocab, stride, t.dim(), t)


def _torch_to_numpy(t, name):
    if t.device.type != "cpu":
        raise ValueError(f"{name}: is a tensor on device '{t.device}'; pass {name}.cpu()")
    t = t.detach()
    if not (t.dtype.is_floating_point or t.dtype.is_complex) or t.element_size() > 2:
        return t.numpy()
    return t.float().numpy()  # float16/bfloat16: numpy may lack the type


def _python_ints(value, name):
    """Python ints (scalar or sequence) as uint64 without a detour through float64, which numpy
    takes for lists holding values above 2**63; anything else is returned as it is."""
    seq = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in seq):
        return value
    for i, v in enumerate(seq):
        if not 0 <= int(v) < 2**64:
            where = f"{name}[{i}]" if isinstance(value, (list, tuple)) else name
            raise ValueError(f"{where}: {int(v)} is not in [0, 2**64); {name} are unsigned 64-bit integers")
    arr = np.array([int(v) for v in seq], dtype=np.uint64)
    return arr if isinstance(value, (list, tuple)) else arr[0]


def _python_int32s(value, name):
    """Python ints (scalar or sequence) as int32, range-checked exactly; bools are refused (a
    ``True`` top-k is a bug, not a 1); anything else is returned as it is."""
    seq = value if isinstance(value, (list, tuple)) else [value]
    for i, v in enumerate(seq):
        where = f"{name}[{i}]" if isinstance(value, (list, tuple)) else name
        if isinstance(v, (bool, np.bool_)):
            raise ValueError(f"{where}: must be an integer, got a bool")
    if not all(isinstance(v, (int, np.integer)) for v in seq):
        return value
    for i, v in enumerate(seq):
        if not -2**31 <= int(v) < 2**31:
            where = f"{name}[{i}]" if isinstance(value, (list, tuple)) else name
            raise ValueError(f"{where}: {int(v)} does not fit in an int32")
    arr = np.array([int(v) for v in seq], dtype=np.int32)
    return arr if isinstance(value, (list, tuple)) else arr[0]


def per_row(value, rows, dtype, name, unit="row"):
    """One value per row as a contiguous numpy array of ``dtype`` (None stays None).

    A scalar is broadcast to every row; a 1-D array-like must have ``rows`` elements.
    ``dtype`` is np.float32, np.uint64 (non-negative integers), np.int32 (integers) or np.uint8
    (a boolean mask). ``unit`` names what a row is in messages ("request" for a verify call's
    per-request values: "the call has 3 requests").
    """
    if value is None:
        return None
    if is_torch_tensor(value):
        value = _torch_to_numpy(value, name)
    if np.dtype(dtype) == np.uint64 and not isinstance(value, np.ndarray):
        value = _python_ints(value, name)
    elif np.dtype(dtype) == np.int32 and not isinstance(value, np.ndarray):
        value = _python_int32s(value, name)
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = arr.reshape(1).repeat(rows)
    elif arr.ndim != 1:
        raise ValueError(f"{name}: must be a scalar or 1-D (one value per {unit}), got shape {arr.shape}")
    elif arr.shape[0] != rows:
        owner = "the batch has" if unit == "row" else "the call has"
        raise ValueError(f"{name}: has {arr.shape[0]} elements, {owner} {rows} {unit}s")
    target = np.dtype(dtype)
    kind = arr.dtype.kind
    if target == np.uint8:
        if kind not in "biuf":
            raise ValueError(f"{name}: must be booleans, got dtype {arr.dtype}")
        return np.ascontiguousarray(arr != 0, dtype=np.uint8)
    if target == np.float32:
        if kind not in "biuf":
            raise ValueError(f"{name}: must be numbers, got dtype {arr.dtype}")
        return np.ascontiguousarray(arr, dtype=np.float32)
    if target == np.int32:
        if kind not in "iu":
            raise ValueError(f"{name}: must be integers, got dtype {arr.dtype}")
        if arr.size and arr.dtype != np.int32:  # int32 values fit by construction
            info = np.iinfo(np.int32)
            bad = (arr < info.min) | (arr > info.max)
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"{name}[{i}]: {arr[i]} does not fit in an int32")
        return np.ascontiguousarray(arr, dtype=np.int32)
    if target == np.uint64:
        if kind == "i" and arr.size and arr.min() < 0:
            i = int(np.argmax(arr < 0))
            raise ValueError(f"{name}[{i}]: {arr[i]} is negative; {name} are unsigned 64-bit integers")
        if kind == "f":
            if not np.all(np.isfinite(arr) & (arr == np.floor(arr)) & (arr >= 0) & (arr < 2.0**64)):
                raise ValueError(f"{name}: must be non-negative integers, got {arr.dtype} values")
        elif kind == "O":
            try:
                arr = np.array([int(v) for v in arr.tolist()], dtype=np.uint64)
            except (OverflowError, TypeError, ValueError):
                raise ValueError(f"{name}: must be integers in [0, 2**64)") from None
        elif kind not in "biu":
            raise ValueError(f"{name}: must be non-negative integers, got dtype {arr.dtype}")
        return np.ascontiguousarray(arr, dtype=np.uint64)
    raise TypeError(f"per_row: unsupported target dtype {target}")


def byte_span(obj):
    """``(low, high)``: the bytes ``[low, high)`` a numpy array or torch tensor spans (its data
    pointer and the reach of its strides in each direction), or None for anything else or an
    empty one. Two arrays whose spans meet may share memory; interleaved rows (``a[::2]`` and
    ``a[1::2]``) count as meeting."""
    if isinstance(obj, np.ndarray):
        if obj.size == 0:
            return None
        ptr, item, strides = obj.__array_interface__["data"][0], obj.itemsize, obj.strides
    elif is_torch_tensor(obj):
        if any(n == 0 for n in obj.shape):
            return None
        item = obj.element_size()
        ptr, strides = obj.data_ptr(), tuple(s * item for s in obj.stride())
    else:
        return None
    low = high = ptr
    for n, stride in zip(obj.shape, strides):
        if stride < 0:
            low += (n - 1) * stride
        else:
            high += (n - 1) * stride
    return low, high + item


def arrays_in(value):
    """The numpy arrays and torch tensors an argument holds: itself, or the items of a list or
    tuple (per-row lists, CSR tuples)."""
    if isinstance(value, np.ndarray) or is_torch_tensor(value):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(v for v in value if isinstance(v, np.ndarray) or is_torch_tensor(v))
    return ()


def _ndim(obj):
    """The number of dimensions of an array-like (a torch tensor's ``dim()``)."""
    if is_torch_tensor(obj):
        return obj.dim()
    return obj.ndim if isinstance(obj, np.ndarray) else np.ndim(obj)


def int32_vector(value, name):
    """A 1-D integer array-like (numpy array, CPU torch tensor, list or tuple) as a contiguous
    int32 numpy array: passed through without a copy when it is one already; other integer dtypes
    are converted with every value checked to fit. Floats and bools are refused (a draft id of
    ``3.0`` or ``True`` is a bug, not a token)."""
    if is_torch_tensor(value):
        value = _torch_to_numpy(value, name)
    elif isinstance(value, (list, tuple)):
        if not value:
            return np.zeros(0, np.int32)
        value = _python_int32s(value, name)
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name}: must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name}: must be integers, got dtype {arr.dtype}")
    if arr.dtype != np.int32 and arr.size:
        info = np.iinfo(np.int32)
        bad = (arr < info.min) | (arr > info.max)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{name}[{i}]: {arr[i]} does not fit in an int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


def float64_vector(value, name):
    """A 1-D array-like of float64 values (numpy array, CPU torch tensor, list or tuple) as a
    contiguous float64 numpy array, without a copy when it is one already. Arrays of a narrower
    float type are refused, not widened: their values have fewer random bits than the 53 an
    acceptance uniform needs (vLLM #54843)."""
    if is_torch_tensor(value):
        value = _torch_to_numpy(value, name)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise ValueError(f"{name}[{i}]: must be a number, got {type(v).__name__}")
        value = np.array(value, dtype=np.float64)
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name}: must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind != "f" or arr.dtype.itemsize != 8:
        raise ValueError(f"{name}: has dtype {arr.dtype}; tokenrace takes float64 (53-bit uniforms), pass "
                         f"an array of float64 values (converting narrower floats does not add the bits)")
    return np.ascontiguousarray(arr, dtype=np.float64)
