"""The binding's parity inputs of the sampling step: ``bad_words=`` (multi-token bad words by
vLLM's prefix rule, applied by the library) and ``forced_tokens=`` (a row returns a given token,
its logprobs as if drawn, the other rows untouched), against a plain Python reference, with the
refusals naming the argument, row and position, and a later call without them unaffected."""

import numpy as np
import pytest


def bans_of(output, words):
    """The reference: each word's last token when the output ends with its other tokens."""
    bans = []
    for word in words:
        prefix = word[:-1]
        if len(prefix) <= len(output) and list(output[len(output) - len(prefix):]) == list(prefix):
            bans.append(word[-1])
    return bans


@pytest.fixture
def rows():
    rng = np.random.default_rng(5)
    return rng.normal(size=(6, 64)).astype(np.float32) * 2


def test_bad_words_ban_by_the_prefix_rule(tokenrace):
    s = tokenrace.Sampler(0)
    x = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], np.float32)
    for output, words, want in (
        ([], [[6]], 5),
        ([1, 2], [[2, 6]], 5),
        ([2, 1], [[2, 6]], 6),
        ([3, 4, 1], [[3, 4, 6]], 6),
        ([1, 3, 4], [[3, 4, 6]], 5),
        ([4], [[3, 4, 6]], 6),
        ([0, 2], [[2, 6], [5], [1, 4]], 4),
    ):
        r = s.draw_full(x, temperature=0.0, output_tokens=[output], bad_words=[words], full_logprobs="processed")
        assert r.tokens[0] == want, (output, words)
        banned = np.isneginf(r.full_logprobs[0])
        assert sorted(np.flatnonzero(banned).tolist()) == sorted(set(bans_of(output, words)))
    # A later call without bad words bans nothing.
    assert s.draw(x, temperature=0.0, output_tokens=[[1, 2]])[0] == 6


def test_bad_words_draw_what_their_bans_as_a_banned_list_draw(tokenrace, rows):
    rng = np.random.default_rng(9)
    n, vocab = rows.shape
    outputs = [rng.integers(0, vocab, 8).tolist() for _ in range(n)]
    words = []
    for r in range(n):
        top = np.argsort(-rows[r])[:3].tolist()
        words.append([outputs[r][-2:] + [top[0]], [outputs[r][0], top[1]], [top[2]]] if r % 3 else None)
    bans = [bans_of(outputs[r], words[r] or []) for r in range(n)]
    assert any(len(b) > 1 for b in bans)
    kwargs = dict(temperature=[0.0, 0.7, 1.0, 1.2, 0.9, 0.0], seeds=np.arange(n, dtype=np.uint64) + 3,
                  output_tokens=outputs, logprobs=2, ranks=True, logprob_mode="processed")
    for _ in range(2):
        got = tokenrace.Sampler(0, seed=3).draw_full(rows, bad_words=words, **kwargs)
        want = tokenrace.Sampler(0, seed=3).draw_full(rows, banned_tokens=bans, **kwargs)
        for field in ("tokens", "flags", "logprobs", "ranks", "topn_ids", "topn_logprobs"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)


def test_bad_words_that_break_the_rules_are_refused(tokenrace):
    s = tokenrace.Sampler(0)
    x = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match=r"bad_words\[1\]\[0\]: must be a non-empty list of token ids"):
        s.draw(x, bad_words=[None, [[]]])
    with pytest.raises(ValueError, match="bad_words: has 1 rows, the batch has 2"):
        s.draw(x, bad_words=[[[1]]])
    with pytest.raises(TypeError, match="bad_words: must be a list"):
        s.draw(x, bad_words={0: [[1]]})
    with pytest.raises(ValueError, match=r"batch\.bad_words_ids\[1\]: word 1 position 1 \(entry 3\): 10 is not a token "
                                         r"id in \[0, 10\).*\(argument bad_words\)"):
        s.draw(x, output_tokens=[[1], [2]], bad_words=[[[1]], [[2], [3, 10]]])


def test_forced_rows_leave_the_other_rows_as_drawn(tokenrace, rows):
    n, vocab = rows.shape
    kwargs = dict(temperature=[1.0, 0.0, 0.8, 1.0, 1.3, 0.5], seeds=np.arange(n, dtype=np.uint64),
                  seeded=[1, 0, 1, 0, 1, 0])
    unforced = tokenrace.Sampler(0, seed=11)
    drawn = unforced.draw(rows, **kwargs)
    second = unforced.draw(rows, **kwargs)
    for f in range(n):
        forced = [-1] * n
        forced[f] = int((drawn[f] + 1) % vocab)
        s = tokenrace.Sampler(0, seed=11)
        got = s.draw(rows, forced_tokens=forced, **kwargs)
        want = drawn.copy()
        want[f] = forced[f]
        np.testing.assert_array_equal(got, want)
        # The stream moved as for a drawn row, and the block is zeroed for the next call.
        np.testing.assert_array_equal(s.draw(rows, **kwargs), second)


def test_a_forced_token_reports_its_logprobs(tokenrace, rows):
    n, vocab = rows.shape
    forced = [5, -1, 63, 0, 17, 9]
    banned = [[], [], [], [], [], [9]]
    for mode in ("raw", "processed"):
        s = tokenrace.Sampler(0, seed=2)
        r = s.draw_full(rows, temperature=1.0, forced_tokens=np.array(forced, np.int32), banned_tokens=banned,
                        logprobs=3, ranks=True, logprob_mode=mode, full_logprobs=mode)
        for row in range(n):
            token = forced[row] if forced[row] >= 0 else r.tokens[row]
            assert r.tokens[row] == token
            full = r.full_logprobs[row].astype(np.float64)
            want = full[token]
            if np.isneginf(want):
                assert np.isneginf(r.logprobs[row])
            else:
                assert abs(r.logprobs[row] - want) <= 1e-5 + 1e-6 * abs(want), (mode, row)
                assert r.ranks[row] == np.count_nonzero(full >= want - 1e-6) or r.ranks[row] == np.count_nonzero(
                    full >= want + 1e-6), (mode, row)
        flagged = (r.flags & tokenrace.FLAG_FORCED_BANNED) != 0
        assert flagged.tolist() == [False] * 5 + [True]
        assert np.isneginf(r.logprobs[5]) == (mode == "processed")


def test_forced_tokens_out_of_range_are_refused(tokenrace):
    s = tokenrace.Sampler(0)
    x = np.zeros((2, 10), np.float32)
    tokens = None
    with pytest.raises(ValueError, match=r"batch\.forced_tokens\[1\]: 10 is not a token id in \[0, 10\) nor -1"):
        tokens = s.draw(x, forced_tokens=[0, 10])
    with pytest.raises(ValueError, match=r"batch\.forced_tokens\[0\]: -2"):
        s.draw(x, forced_tokens=[-2, 0])
    assert tokens is None
    assert s.draw(x, temperature=0.0, forced_tokens=[3, -1]).tolist() == [3, 0]
    assert s.draw(x, temperature=0.0).tolist() == [0, 0]


def test_logprobs_of_given_ids(tokenrace, rows):
    n, vocab = rows.shape
    ids = [[0, 5, 5], [], [63], [1, 2, 3, 4], [7], [9, 10]]
    s = tokenrace.Sampler(0, seed=4)
    for mode in ("raw", "processed"):
        r = s.draw_full(rows, temperature=[1.0, 0.0, 0.7, 1.0, 1.2, 0.9], banned_tokens=[[5], [], [], [], [], [10]],
                        logprob_token_ids=ids, ranks=True, logprob_mode=mode, full_logprobs=mode)
        assert r.token_logprobs.shape == (sum(map(len, ids)),) and r.token_ranks.dtype == np.int32
        at = 0
        for row in range(n):
            full = r.full_logprobs[row].astype(np.float64)
            for token in ids[row]:
                want = full[token]
                if np.isneginf(want):
                    assert np.isneginf(r.token_logprobs[at])
                else:
                    assert abs(r.token_logprobs[at] - want) <= 1e-5 + 1e-6 * abs(want), (mode, row, token)
                    lo, hi = np.count_nonzero(full >= want + 1e-6), np.count_nonzero(full >= want - 1e-6)
                    assert lo <= r.token_ranks[at] <= hi, (mode, row, token)
                at += 1
        assert np.isneginf(r.token_logprobs[2]) == (mode == "processed")  # row 0's banned 5
    # Without ranks, only the logprobs; a later call without ids returns none.
    r = s.draw_full(rows, logprob_token_ids=ids)
    assert r.token_ranks is None and r.token_logprobs.shape == (11,)
    r = s.draw_full(rows, logprobs=1)
    assert r.token_logprobs is None
    with pytest.raises(ValueError, match=r"batch\.logprob_token_ids\[2\]: position 0 \(entry 3\): 64 is not a token id"):
        s.draw_full(rows, logprob_token_ids=[[0, 5, 5], [], [64], [], [], []])


def test_rows_with_typical_or_xtc_report_forced_and_given_logprobs(tokenrace, rows):
    # Typical sampling and XTC draw a row by a range of values (a path of their own): a forced
    # token's logprob and the given ids' logprobs are still theirs (RAW: the only mode those rows
    # report), as on every other path.
    n, vocab = rows.shape
    forced = [5, -1, 63, 0, 17, 9]
    ids = [[0, 5], [1], [63, 2], [], [7], [9, 10]]
    s = tokenrace.Sampler(0, seed=3)
    r = s.draw_full(rows, temperature=1.0, typical_p=[0.5, 0.9, 0.7, 1.0, 0.6, 0.8],
                    xtc_probability=[0.0, 1.0, 0.0, 1.0, 0.0, 1.0], xtc_threshold=0.05,
                    forced_tokens=np.array(forced, np.int32), logprob_token_ids=ids, ranks=True,
                    full_logprobs="raw")
    at = 0
    for row in range(n):
        full = r.full_logprobs[row].astype(np.float64)
        token = forced[row] if forced[row] >= 0 else r.tokens[row]
        assert r.tokens[row] == token
        assert abs(r.logprobs[row] - full[token]) <= 1e-5 + 1e-6 * abs(full[token]), row
        for t in ids[row]:
            assert abs(r.token_logprobs[at] - full[t]) <= 1e-5 + 1e-6 * abs(full[t]), (row, t)
            at += 1
