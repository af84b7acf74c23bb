"""Sampler.verify with ``draft_parents`` (draft trees, docs/semantics.md "Draft trees") through the
binding; the float64 reference of the tree rule is tests/verify_tree.rs:

* a chain given as a tree (parent i - 1) returns today's tokens, counts, flags and logprobs, bit for
  bit, and accepted nodes 0, 1, ...;
* the emitted path follows the tree: each accepted node's parent is the one before (-1 first), its
  token the draft's;
* greedy trees accept the first child equal to the row's argmax;
* the first emitted token of random trees follows p (light chi-square), and the counts reject a
  rule that forgets the residual update;
* bad trees: ValueError for a wrong length before the call, InvalidArgumentError naming the node.
"""

import numpy as np
import pytest

from reference import chi_square, inv_t, wilson_hilferty


def softmax64(x):
    w = np.exp(x - x.max())
    return w / w.sum()


def random_call(rng, vocab, requests, chain):
    counts = rng.integers(0, 6, requests).astype(np.int32)
    parents = []
    for c in counts:
        parents += [j - 1 if chain or j == 0 else int(rng.integers(-1, j)) for j in range(c)]
    drafts = rng.integers(0, vocab, int(counts.sum())).astype(np.int32)
    x = (2 * rng.standard_normal((int(counts.sum()) + requests, vocab))).astype(np.float32)
    return x, drafts, counts, np.array(parents, np.int32)


@pytest.mark.parametrize("threads", [1, 4])
def test_a_chain_given_as_a_tree_is_todays_verify(tokenrace, threads):
    rng = np.random.default_rng(31)
    for trial in range(20):
        x, drafts, counts, parents = random_call(rng, 64, 5, chain=True)
        # Deterministic drafts often the argmax, so that some are accepted.
        rows = np.cumsum(np.concatenate([[0], counts[:-1] + 1]))
        at = 0
        for i, c in enumerate(counts):
            for j in range(c):
                if rng.random() < 0.6:
                    drafts[at] = int(np.argmax(x[rows[i] + j]))
                at += 1
        kw = dict(temperature=rng.choice([0.0, 0.7, 1.0], 5), top_k=rng.choice([0, 10], 5), logprobs=True)
        if trial % 2:
            kw.update(seeds=rng.integers(0, 2**63, 5, dtype=np.uint64), offsets=rng.integers(0, 100, 5))
        a = tokenrace.Sampler(64, seed=9, threads=threads).verify(x, drafts, counts, **kw)
        b = tokenrace.Sampler(64, seed=9, threads=threads).verify(x, drafts, counts, draft_parents=parents, **kw)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.counts, b.counts)
        np.testing.assert_array_equal(a.flags, b.flags)
        np.testing.assert_array_equal(a.logprobs.view(np.uint32), b.logprobs.view(np.uint32))
        for i, c in enumerate(b.counts):
            assert b.accepted_nodes[i, :c - 1].tolist() == list(range(c - 1))
            assert (b.accepted_nodes[i, c - 1:] == -1).all()


def test_the_emitted_path_follows_the_tree(tokenrace):
    rng = np.random.default_rng(32)
    s = tokenrace.Sampler(40, seed=3)
    deeper = 0
    for _ in range(30):
        x, drafts, counts, parents = random_call(rng, 40, 4, chain=False)
        # Drafts from a small set of likely tokens, so that paths go deep.
        x[:, :3] += 4.0
        drafts %= 3
        r = s.verify(x, drafts, counts, draft_parents=parents, temperature=1.0, seeds=7, offsets=[0, 5, 9, 2])
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for i in range(4):
            nodes = r.accepted_nodes[i, :r.counts[i] - 1]
            prev = -1
            for k, n in enumerate(nodes):
                assert parents[first[i] + n] == prev
                assert r.tokens[i, k] == drafts[first[i] + n]
                prev = n
            deeper += len(nodes) >= 2
    assert deeper > 0


def test_greedy_trees_accept_the_first_child_equal_to_the_argmax(tokenrace):
    rng = np.random.default_rng(33)
    x = rng.standard_normal((4, 30)).astype(np.float32)
    top = int(np.argmax(x[0]))
    drafts = [(top + 1) % 30, top, top]
    r = tokenrace.Sampler(30).verify(x, drafts, [3], draft_parents=[-1, -1, -1], temperature=0.0)
    # Node 1 is accepted (node 2, a repeat, is never judged); its row is row 2, a leaf's bonus.
    assert r.accepted_nodes[0].tolist() == [1, -1, -1, -1]
    assert r.tokens[0, :2].tolist() == [top, int(np.argmax(x[2]))]


@pytest.mark.parametrize("with_q", [False, True])
def test_the_first_token_follows_p_for_trees(tokenrace, with_q):
    x0 = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, 0.3, 1.2, -1.0, 0.8, -2.0, 0.1], np.float32)
    vocab, n, t = 12, 5000, 0.8
    p0 = softmax64(x0.astype(np.float64) * inv_t(t))
    q0 = softmax64(np.array([0.0, 1.0, 2.0, 0.5, 1.5, -0.5, 0.3, -1.0, 0.0, 0.2, 1.0, 0.4]))
    rng = np.random.default_rng(34)
    s = tokenrace.Sampler(vocab, max_rows=4 * n, seed=5)
    first = np.zeros(vocab)
    fixed = [0, 1, 7]
    for _ in range(4):
        # Three children of the root each: drawn from q0, or the fixed drafts.
        if with_q:
            drafts = np.minimum(np.searchsorted(np.cumsum(q0), rng.random(3 * n), side="right"), vocab - 1)
        else:
            drafts = np.tile(fixed, n)
        x = np.concatenate([np.tile(x0, (n, 1))[:, None, :],
                            rng.standard_normal((n, 3, vocab)).astype(np.float32)], axis=1).reshape(4 * n, vocab)
        r = s.verify(x, drafts.astype(np.int32), np.full(n, 3, np.int32), draft_parents=np.tile([-1, -1, -1], n),
                     draft_probs=np.tile(q0.astype(np.float32), (3 * n, 1)) if with_q else None, temperature=t)
        first += np.bincount(r.tokens[:, 0], minlength=vocab)
    critical = wilson_hilferty(vocab - 1, 4.5)
    assert chi_square(first, p0) < critical
    # A rule that forgets the residual: each child judged against p itself.
    if with_q:
        both = np.minimum(p0, q0)
        beta = both.sum()
        forgot = both * (1 - (1 - beta) ** 3) / beta + (1 - beta) ** 2 * (p0 - both)
    else:
        forgot, none = np.zeros(vocab), 1.0
        for d in fixed:
            forgot[d] += none * p0[d]
            none *= 1 - p0[d]
        rest = np.ones(vocab, bool)
        rest[fixed] = False
        forgot[rest] += none * p0[rest] / p0[rest].sum()
    assert chi_square(first, forgot) > critical


def test_bad_trees_are_refused(tokenrace):
    x = np.zeros((5, 10), np.float32)
    s = tokenrace.Sampler(10)
    with pytest.raises(ValueError, match=r"draft_parents: has 2 values, draft_counts add up to 3"):
        s.verify(x, [1, 2, 3], [3, 0], draft_parents=[-1, 0])
    with pytest.raises(tokenrace.InvalidArgumentError,
                       match=r"batch.draft_parents\[2\]: request 0, node 2: parent 2 is neither -1"):
        s.verify(x, [1, 2, 3], [3, 0], draft_parents=[-1, 0, 2])
    q = np.full((3, 10), 0.1, np.float32)
    q[1, :2] = [0.15, 0.05]
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"batch.draft_probs\[1\]: request 0, node 1: token 0"):
        s.verify(x, [1, 2, 3], [3, 0], draft_parents=[-1, -1, 0], draft_probs=q)


def test_rejection_sample_passes_the_tree(tokenrace):
    torch = pytest.importorskip("torch")
    from tokenrace.torch import rejection_sample
    rng = np.random.default_rng(35)
    x, drafts, counts, parents = random_call(rng, 40, 3, chain=False)
    s = tokenrace.Sampler(40, seed=1)
    got = rejection_sample(torch.from_numpy(x), torch.from_numpy(drafts), counts.tolist(), 0.9, sampler=s,
                           seeds=[4, 5, 6], draft_parents=torch.from_numpy(parents))
    want = tokenrace.Sampler(40, seed=1).verify(x, drafts, counts, temperature=0.9, seeds=[4, 5, 6],
                                                draft_parents=parents)
    np.testing.assert_array_equal(got.numpy(), want.tokens)
