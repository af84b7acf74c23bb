"""The per-thread call state of the binding (tokenrace/_call.py): scalars passed through cached
per-row arrays and reused structs must give exactly what explicit per-row arrays give, whatever
changes between calls, in every thread, and when a draw runs inside another draw."""

import threading

import numpy as np
import pytest


def _explicit(rows, temperature, seeds, top_k, top_p):
    """The same arguments as per-row numpy arrays (the path that caches nothing)."""
    return dict(temperature=np.full(rows, temperature, np.float32), seeds=np.full(rows, seeds, np.uint64),
                top_k=np.full(rows, top_k, np.int32), top_p=np.full(rows, top_p, np.float32))


CASES = [  # (rows, temperature, seed, top_k, top_p): each differs from the one before in something
    (1, 0.7, 5, 3, 0.9), (1, 0.7, 5, 3, 0.9), (1, 1.3, 5, 3, 0.9), (40, 1.3, 5, 3, 0.9),
    (3, 1.3, 5, 3, 0.9), (3, 1.3, 6, 3, 0.9), (3, 1.3, 6, 0, 0.9), (64, 0.0, 6, 0, 1.0),
    (2, 2.0, 2**64 - 1, 7, 0.5), (40, 2.0, 0, 7, 0.5),
]


def test_scalars_equal_per_row_arrays_across_changing_calls(tokenrace, rng):
    x = rng.standard_normal((64, 300)).astype(np.float32) * 3
    s = tokenrace.Sampler(300, seed=1)
    for rows, t, seed, k, p in CASES:
        got = s.draw(x[:rows], temperature=t, seeds=seed, top_k=k, top_p=p)
        want = s.draw(x[:rows], **_explicit(rows, t, seed, k, p))
        np.testing.assert_array_equal(got, want, err_msg=str((rows, t, seed, k, p)))
        assert got.shape == (rows,) and got.dtype == np.int32


def test_returned_tokens_are_not_overwritten_by_the_next_call(tokenrace, rng):
    x = rng.standard_normal((8, 50)).astype(np.float32)
    s = tokenrace.Sampler(50)
    first = s.draw(x, temperature=0)
    kept = first.copy()
    s.draw(-x, temperature=0)
    np.testing.assert_array_equal(first, kept)
    tokens, flags = s.draw(x, temperature=0, return_flags=True)
    s.draw(x, temperature=1.0, return_flags=True)
    assert (flags & tokenrace.FLAG_GREEDY).all()


def test_threads_with_their_own_scalars(tokenrace, rng):
    x = rng.standard_normal((32, 200)).astype(np.float32) * 2
    s = tokenrace.Sampler(200, max_rows=32)
    settings = [(rows, 0.5 + i / 4, 100 + i, 2 + i) for i, rows in enumerate((1, 5, 32, 17))]
    want = [s.draw(x[:r], **_explicit(r, t, seed, k, 1.0)) for r, t, seed, k in settings]
    errors = []

    def work(i):
        rows, t, seed, k = settings[i]
        for _ in range(300):
            got = s.draw(x[:rows], temperature=t, seeds=seed, top_k=k)
            if not np.array_equal(got, want[i]):
                errors.append((i, got, want[i]))
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(settings))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


def test_a_draw_inside_a_draw_uses_its_own_state(tokenrace, rng, monkeypatch):
    """A draw started while this thread's state is in use (from a finalizer or a signal handler)
    must not clobber the outer call's structs."""
    lib = tokenrace._ffi.lib()
    x = rng.standard_normal((4, 100)).astype(np.float32)
    s = tokenrace.Sampler(100)
    want_outer = s.draw(x, temperature=0.9, seeds=11, top_k=5)
    # (A per-row temperature: a scalar 0 alone is the plain greedy call, which uses no state.)
    want_inner = s.draw(-x[:1], temperature=[0.0])
    real_draw = lib.tokenrace_draw
    inner, started = [], []

    def draw(ptr, batch, out):
        if not started:
            started.append(True)
            inner.append(s.draw(-x[:1], temperature=[0.0]))
        return real_draw(ptr, batch, out)

    monkeypatch.setattr(lib, "tokenrace_draw", draw)
    np.testing.assert_array_equal(s.draw(x, temperature=0.9, seeds=11, top_k=5), want_outer)
    np.testing.assert_array_equal(inner[0], want_inner)


def test_batches_built_for_later_are_independent(tokenrace, rng):
    """``Sampler._batch`` (a batch held beyond the call) owns its struct and arrays."""
    s = tokenrace.Sampler(30)
    a, keep_a = s._batch(np.zeros((2, 30), np.float32), 0.5, 7, None, None, None, "exp", 4)
    b, keep_b = s._batch(np.zeros((3, 30), np.float32), 1.5, 8, None, None, None, "exp", 9)
    assert (a.rows, b.rows) == (2, 3)
    assert (a.temperature[0], a.seeds[0], a.top_k[1]) == (0.5, 7, 4)
    assert (b.temperature[2], b.seeds[0], b.top_k[2]) == (1.5, 8, 9)
    assert not a.top_p and not b.min_p


@pytest.mark.parametrize("value,message", [
    (True, "top_k: must be an integer, got a bool"),
    (2**31, "top_k: 2147483648 does not fit in an int32"),
    (1.5, "top_k: must be integers"),
])
def test_scalars_outside_the_fast_path_keep_their_errors(tokenrace, value, message):
    with pytest.raises(ValueError, match=message):
        tokenrace.Sampler(10).draw(np.zeros((2, 10), np.float32), top_k=value)


def test_out_of_range_scalar_seed_and_temperature(tokenrace):
    s = tokenrace.Sampler(10)
    x = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match=r"seeds: -1 is not in \[0, 2\*\*64\)"):
        s.draw(x, seeds=-1)
    with pytest.raises(ValueError, match=r"temperature\[0\]"):
        s.draw(x, temperature=float("nan"))
    with pytest.raises(ValueError, match=r"temperature\[0\]"), np.errstate(over="ignore"):
        s.draw(x, temperature=1e300)


def test_the_packed_layouts_set_every_field_of_the_ctypes_structs(tokenrace):
    """The layouts of each struct (the fields of 0.1, then those packed only by the calls that
    use them, at their offset: the batch's sampling step, its top-nσ pointer and the request
    state's two pointers, the output's full-vocabulary fields) must write each field where ctypes (checked against the C compiler by
    test_abi.py) has it, and together cover every field and every byte: distinct values in, the
    same values read back field by field."""
    import ctypes

    from tokenrace import _call, _ffi

    # Each struct: its parts as (layout, offset, first field), in order.
    parts = ((_ffi.tokenrace_batch, ((_call.BATCH_LAYOUT, 0, "struct_size"),
                                     (_call.STEP_LAYOUT, _call.STEP_OFFSET, _ffi.BATCH_STEP_FIRST),
                                     (_call.POINTER_LAYOUT, _call.TOP_N_SIGMA_OFFSET, _ffi.BATCH_STEP_END),
                                     (_call.REQUESTS_LAYOUT, _call.REQUESTS_OFFSET, "requests"),
                                     (_call.LLAMA_LAYOUT, _call.LLAMA_OFFSET, _ffi.BATCH_LLAMA_FIRST),
                                     (_call.PARITY_LAYOUT, _call.PARITY_OFFSET, _ffi.BATCH_PARITY_FIRST),
                                     (_call.ORDER_LAYOUT, _call.ORDER_OFFSET, _ffi.BATCH_ORDER_FIRST),
                                     (_call.DRY_LAYOUT, _call.DRY_OFFSET, _ffi.BATCH_DRY_FIRST),
                                     (_call.POINTER_LAYOUT, _call.ROW_INDEX_OFFSET, "row_index"),
                                     (_call.MIROSTAT_LAYOUT, _call.MIROSTAT_OFFSET, _ffi.BATCH_MIROSTAT_FIRST),
                                     (_call.APPEND_LAYOUT, _call.APPEND_OFFSET, _ffi.BATCH_APPEND_FIRST))),
             (_ffi.tokenrace_output, ((_call.OUTPUT_LAYOUT, 0, "struct_size"),
                                      (_call.FULL_LAYOUT, _call.FULL_OFFSET, _ffi.OUTPUT_FULL_FIRST),
                                      (_call.GIVEN_LAYOUT, _call.GIVEN_OFFSET, _ffi.OUTPUT_GIVEN_FIRST),
                                      (_call.KEPT_LAYOUT, _call.KEPT_OFFSET, _ffi.OUTPUT_KEPT_FIRST),
                                      (_call.POINTER_LAYOUT, _call.MIROSTAT_OUT_OFFSET, _ffi.OUTPUT_MIROSTAT_FIRST))))
    for cls, layouts in parts:
        ends = [offset for _, offset, _ in layouts[1:]] + [ctypes.sizeof(cls)]
        for (layout, offset, _), end in zip(layouts, ends):
            assert offset + layout.size == end, (cls.__name__, offset)
        fields = cls._fields_
        names = [name for name, _ in fields]
        values = [0x1000 * (i + 1) if issubclass(t, ctypes._Pointer) else 0.5 + i if t is ctypes.c_float else i + 1
                  for i, (_, t) in enumerate(fields)]
        splits = [names.index(first) for _, _, first in layouts] + [len(fields)]
        obj = cls()
        for (layout, offset, _), lo, hi in zip(layouts, splits, splits[1:]):
            layout.pack_into(obj, offset, *values[lo:hi])
        for (name, ctype), want in zip(fields, values):
            got = getattr(obj, name)
            if issubclass(ctype, ctypes._Pointer):
                got = ctypes.cast(got, ctypes.c_void_p).value
            assert got == want, (cls.__name__, name)
        tail, tail_offset = layouts[1][0], layouts[1][1]
        zeros = _call.STEP_ZEROS if cls is _ffi.tokenrace_batch else _call.FULL_ZEROS
        tail.pack_into(obj, tail_offset, *zeros)
        assert bytes(obj)[tail_offset:tail_offset + tail.size] == bytes(tail.size), cls.__name__


def test_a_call_without_the_sampling_step_clears_what_the_last_one_set(tokenrace, rng):
    """The thread's cached batch and output keep the step fields of a call that set them;
    the next call without them must see them cleared (the fast path packs only 0.1's fields)."""
    from tokenrace import _call

    x = rng.standard_normal((3, 64)).astype(np.float32)
    s = tokenrace.Sampler(64, seed=3)
    # Greedy rows by per-row temperatures: a scalar 0 with nothing else is the plain greedy
    # call, which leaves the cached batch alone (_greedy.py).
    zeros = [0.0] * 3
    plain = s.draw(x, temperature=zeros)
    banned = s.draw(x, temperature=0, banned_tokens=[[int(t)] for t in plain])
    assert (banned != plain).all()
    state = _call.take_state()
    _call.release_state(state)
    assert state.step_packed
    np.testing.assert_array_equal(s.draw(x, temperature=zeros), plain)
    step_end = _call.STEP_OFFSET + _call.STEP_LAYOUT.size
    assert not state.step_packed and bytes(state.batch)[_call.STEP_OFFSET:step_end] == bytes(_call.STEP_LAYOUT.size)
    # The same for top-nσ's pointer, packed apart.
    sigma = slice(_call.TOP_N_SIGMA_OFFSET, _call.TOP_N_SIGMA_OFFSET + 8)
    s.draw(x, temperature=1.0, top_n_sigma=1.0)
    assert state.sigma_packed and bytes(state.batch)[sigma] != bytes(8)
    np.testing.assert_array_equal(s.draw(x, temperature=zeros), plain)
    assert not state.sigma_packed and bytes(state.batch)[sigma] == bytes(8)
    # And for the request state's two pointers.
    req = slice(_call.REQUESTS_OFFSET, _call.REQUESTS_OFFSET + 16)
    requests = tokenrace.Requests()
    requests.add(1, [])
    s.draw(x, temperature=0, requests=requests, request_ids=[1, 1, 1])
    assert state.requests_packed and bytes(state.batch)[req] != bytes(16)
    np.testing.assert_array_equal(s.draw(x, temperature=zeros), plain)
    assert not state.requests_packed and bytes(state.batch)[req] == bytes(16)
    # And for llama.cpp's filters' block.
    llama = slice(_call.LLAMA_OFFSET, _call.LLAMA_OFFSET + 48)
    s.draw(x, temperature=1.0, typical_p=0.5)
    assert state.llama_packed and bytes(state.batch)[llama] != bytes(48)
    np.testing.assert_array_equal(s.draw(x, temperature=zeros), plain)
    assert not state.llama_packed and bytes(state.batch)[llama] == bytes(48)
    # The same for the parity block (bad words, forced tokens), packed apart.
    forced = s.draw(x, temperature=0, forced_tokens=[int(t + 1) % 64 for t in plain])
    assert (forced != plain).all() and state.parity_packed
    parity = slice(_call.PARITY_OFFSET, _call.ORDER_OFFSET)
    assert bytes(state.batch)[parity] != bytes(_call.PARITY_LAYOUT.size)
    np.testing.assert_array_equal(s.draw(x, temperature=zeros), plain)
    assert not state.parity_packed and bytes(state.batch)[parity] == bytes(_call.PARITY_LAYOUT.size)
    # The same for the order of the filter stages, packed apart.
    s.draw(x, temperature=0.5, top_p=0.9, order=("top_p", "temperature"))
    assert state.order_packed and bytes(state.batch)[_call.ORDER_OFFSET:_call.DRY_OFFSET] != bytes(_call.ORDER_LAYOUT.size)
    np.testing.assert_array_equal(s.draw(x, temperature=zeros), plain)
    assert not state.order_packed and bytes(state.batch)[_call.ORDER_OFFSET:_call.DRY_OFFSET] == bytes(_call.ORDER_LAYOUT.size)
    # The same for DRY's block: a history "t+1 t t+1" makes the greedy token t extend a repeat.
    history = [[int(t + 1) % 64, int(t), int(t + 1) % 64] for t in plain]
    dried = s.draw(x, temperature=0, output_tokens=history, dry_multiplier=1e30, dry_allowed_length=1)
    assert (dried != plain).all() and state.dry_packed
    assert bytes(state.batch)[_call.DRY_OFFSET:_call.ROW_INDEX_OFFSET] != bytes(_call.DRY_LAYOUT.size)
    np.testing.assert_array_equal(s.draw(x, temperature=zeros), plain)
    assert not state.dry_packed and bytes(state.batch)[_call.DRY_OFFSET:_call.ROW_INDEX_OFFSET] == bytes(_call.DRY_LAYOUT.size)
    # And for the row index (draw_full's), which the next draw() resets.
    index = slice(_call.ROW_INDEX_OFFSET, _call.ROW_INDEX_OFFSET + 8)
    s.draw_full(x, temperature=0, row_index=[2, 1, 0])
    assert state.row_index_packed and bytes(state.batch)[index] != bytes(8)
    np.testing.assert_array_equal(s.draw(x, temperature=zeros), plain)
    assert not state.row_index_packed and bytes(state.batch)[index] == bytes(8)
    r = s.draw_full(x, temperature=0, full_logprobs="raw")
    assert r.full_logprobs.shape == (3, 64) and state.full_packed
    r = s.draw_full(x, temperature=0)
    assert r.full_logprobs is None and not state.full_packed
    full_end = _call.FULL_OFFSET + _call.FULL_LAYOUT.size
    assert bytes(state.full_output)[_call.FULL_OFFSET:full_end] == bytes(_call.FULL_LAYOUT.size)
    # The same for the logprobs of given ids, packed apart.
    r = s.draw_full(x, temperature=0, logprob_token_ids=[[1], [2], [3]])
    assert r.token_logprobs.shape == (3,) and state.given_packed
    r = s.draw_full(x, temperature=0)
    assert r.token_logprobs is None and not state.given_packed
    given_end = _call.GIVEN_OFFSET + _call.GIVEN_LAYOUT.size
    assert bytes(state.full_output)[_call.GIVEN_OFFSET:given_end] == bytes(_call.GIVEN_LAYOUT.size)
    # The same for the kept-set outputs.
    r = s.draw_full(x, temperature=0, kept_set=True, kept_bitmask=True)
    assert r.kept_count.shape == (3,) and r.kept_bitmask.shape == (3, 2) and state.kept_packed
    r = s.draw_full(x, temperature=0)
    assert r.kept_count is None and not state.kept_packed
    kept_end = _call.KEPT_OFFSET + _call.KEPT_LAYOUT.size
    assert bytes(state.full_output)[_call.KEPT_OFFSET:kept_end] == bytes(_call.KEPT_LAYOUT.size)
    # The same for mirostat's block and both outputs' mu pointer: v2 at mu -100 keeps each row's
    # maximum alone, so a sampling row draws its greedy token.
    miro = slice(_call.MIROSTAT_OFFSET, _call.MIROSTAT_OFFSET + _call.MIROSTAT_LAYOUT.size)
    mu_ptr = slice(_call.MIROSTAT_OUT_OFFSET, _call.MIROSTAT_OUT_OFFSET + 8)
    mu_out = np.zeros(3, np.float32)
    hot = s.draw(x * 30, temperature=1.0, mirostat=2, mirostat_mu=-100.0, mirostat_mu_out=mu_out)
    assert state.mirostat_packed and state.draw_mu_packed and (mu_out != 0).all()
    assert bytes(state.batch)[miro] != bytes(_call.MIROSTAT_LAYOUT.size)
    np.testing.assert_array_equal(hot, s.draw(x * 30, temperature=0))
    np.testing.assert_array_equal(s.draw(x, temperature=zeros), plain)
    assert not state.mirostat_packed and bytes(state.batch)[miro] == bytes(_call.MIROSTAT_LAYOUT.size)
    assert not state.draw_mu_packed and bytes(state.tokens_output)[mu_ptr] == bytes(8)
    r = s.draw_full(x, temperature=1.0, mirostat=1)
    assert r.mirostat_mu.shape == (3,) and state.mirostat_out_packed
    r = s.draw_full(x, temperature=0)
    assert r.mirostat_mu is None and not state.mirostat_out_packed and not state.mirostat_packed
    assert bytes(state.full_output)[mu_ptr] == bytes(8)
