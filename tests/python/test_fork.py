"""fork() while a thread draws: the child draws right, and frees its sampler and pool, in time.

Each case runs a script in a fresh interpreter (forking pytest itself, with its threads, would
risk the suite). The script makes one sampler (1 or 4 threads; inline noise, an attached pool or
a pool of its own), starts a thread that draws continuously, and forks FORKS times while it
draws. Each child, on its only thread, draws the seeded batches and compares every token with the
parent's (a seeded row is a pure function of seed, offset, logits and settings), draws an
unseeded batch (must succeed, ids in range), and ends either

* "close": ``close()`` on the sampler and the pool, then ``os._exit``; or
* "exit": ``sys.exit`` through the normal interpreter exit, where the finalizers free them.

Either way the child reports through a pipe that ``tokenrace_sampler_free`` returned. (The
parent's thread draws through the C function directly; the script says why.) The parent
waits for each child at most CHILD_TIMEOUT s, kills one that hangs and stops there; the script as
a whole runs in its own session, killed entirely when it outlives SCRIPT_TIMEOUT.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import BINDINGS

FORKS = 8
CHILD_TIMEOUT = 10.0
SCRIPT_TIMEOUT = 150.0

SCRIPT = r"""
import ctypes, json, os, sys, threading, time
import numpy as np
import tokenrace
from tokenrace import _ffi

threads, source, ending, forks, child_timeout = (int(sys.argv[1]), sys.argv[2], sys.argv[3],
                                                 int(sys.argv[4]), float(sys.argv[5]))
V, ROWS, SMALL = 32000, 8, 2  # 8 rows: spread over workers; 2 rows: tiles of a row
rng = np.random.default_rng(7)
logits = (rng.standard_normal((ROWS, V)) * 3).astype(np.float32)
seeds = np.arange(ROWS, dtype=np.uint64) * 977 + 5
offsets = np.arange(ROWS, dtype=np.uint64) * 7 + 1
temps = np.array([1.0, 0.7, 1.3, 0.0, 1.0, 0.9, 2.0, 1.0], np.float32)
top_k = np.array([0, 0, 0, 0, 50, 0, 0, 0], np.int32)
top_p = np.array([1, 1, 1, 1, 1, 0.9, 1, 1], np.float32)

kw = {"noise": "pool"} if source == "own_pool" else {}
sampler = tokenrace.Sampler(V, max_rows=ROWS, threads=threads, seed=11, **kw)
pool = None
if source == "attached_pool":
    pool = tokenrace.NoisePool(V, 64, seed=3)
    sampler.attach_pool(pool)


def seeded(n):
    return sampler.draw(logits[:n], temperature=temps[:n], seeds=seeds[:n], offsets=offsets[:n],
                        top_k=top_k[:n], top_p=top_p[:n])


def unseeded():
    return sampler.draw(logits, temperature=1.0)


ref, ref_small = seeded(ROWS), seeded(SMALL)
assert (ref_small == ref[:SMALL]).all()  # batch-invariant


def check_draws():
    # The problems of one round of draws, as strings.
    problems = []
    if not (seeded(ROWS) == ref).all():
        problems.append("seeded tokens of the full batch differ from the parent's")
    if not (seeded(SMALL) == ref_small).all():
        problems.append("seeded tokens of the small batch differ from the parent's")
    t = unseeded()
    if not ((t >= 0) & (t < V)).all():
        problems.append(f"an unseeded token out of range: {t}")
    return problems


stop = threading.Event()
parent = {"draws": 0, "errors": []}

# The parent's drawing thread calls tokenrace_draw on the raw pointer, not through the binding: a
# thread that fork() cuts off inside a binding call leaves its frame's references in the child
# (CPython does not release a vanished thread's frames), which would keep the sampler's handle
# alive there, so that close() in the child rightly could not free it.
raw = sampler._handle.ptr
lib = _ffi.lib()


def raw_call(n, with_seeds):
    extra = dict(seeds=seeds[:n], offsets=offsets[:n]) if with_seeds else dict(seeds=None, offsets=None)
    batch, keep = sampler._batch(logits[:n], temps[:n] if with_seeds else 1.0, extra["seeds"],
                                 extra["offsets"], None, None, "exp", top_k[:n] if with_seeds else None,
                                 top_p[:n] if with_seeds else None)
    tokens = np.full(n, -1, np.int32)
    out = _ffi.tokenrace_output()
    out.tokens = tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    return batch, out, tokens, keep


calls = [(raw_call(ROWS, True), ref), (raw_call(SMALL, True), ref_small), (raw_call(ROWS, False), None)]


def drawer():
    while not stop.is_set():
        for (batch, out, tokens, _keep), want in calls:
            tokens.fill(-1)
            if lib.tokenrace_draw(raw, ctypes.byref(batch), ctypes.byref(out)) != 0:
                parent["errors"].append("a draw failed: " + tokenrace._errors.last_error())
            elif want is not None and not (tokens == want).all():
                parent["errors"].append("seeded tokens differ from the reference")
            elif not ((tokens >= 0) & (tokens < V)).all():
                parent["errors"].append(f"a token out of range: {tokens}")
        parent["draws"] += 1
        if parent["errors"]:
            return


def child(w):
    # In the fork child, on its only thread. Never returns.
    def say(msg):
        os.write(w, (msg + "\n").encode())

    lib = _ffi.lib()
    real_free = lib.tokenrace_sampler_free

    def free(ptr):  # the binding looks the function up at call time
        real_free(ptr)
        say("freed")

    lib.tokenrace_sampler_free = free
    code = 0
    try:
        for p in check_draws() + check_draws():
            say(p)
            code = 1
    except Exception as e:
        say(f"a draw raised {e!r}")
        code = 1
    if ending == "close":
        sampler.close()
        if pool is not None:
            pool.close()
        say("closed")
        os._exit(code)
    sys.exit(code)  # interpreter exit: the finalizers free the sampler and the pool


t = threading.Thread(target=drawer, daemon=True)
t.start()
while parent["draws"] == 0 and t.is_alive():
    time.sleep(0.001)
results = []
for k in range(forks):
    time.sleep((k % 4) / 1000)  # fork at different points of the parent's draws
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        child(w)
    os.close(w)
    deadline = time.monotonic() + child_timeout
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
        elif time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            status = "hung"
        else:
            time.sleep(0.005)
    with os.fdopen(r) as f:
        said = f.read().split("\n")[:-1]
    results.append({"fork": k, "status": status, "said": said})
    if status != 0:
        break  # one failure says it; a hang would cost child_timeout per fork
stop.set()
t.join(30)
print(json.dumps({"results": results, "parent": parent, "drawer_alive": t.is_alive()}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available on this platform")
@pytest.mark.parametrize("ending", ["close", "exit"])
@pytest.mark.parametrize("source", ["inline", "attached_pool", "own_pool"])
@pytest.mark.parametrize("threads", [1, 4])
def test_fork_children_draw_and_free(threads, source, ending):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BINDINGS, env.get("PYTHONPATH")) if p)
    args = [sys.executable, "-c", SCRIPT, str(threads), source, ending, str(FORKS), str(CHILD_TIMEOUT)]
    # A session of its own, so that a hung script is killed with every child it forked.
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=SCRIPT_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the script hung (killed after {SCRIPT_TIMEOUT} s):\n{err[-4000:]}")
    assert proc.returncode == 0, f"the script failed ({proc.returncode}):\n{err[-4000:]}"
    report = json.loads(out.strip().splitlines()[-1])
    results, parent = report["results"], report["parent"]
    for r in results:
        where = f"fork {r['fork']} (threads={threads}, {source}, {ending})"
        assert r["status"] != "hung", f"{where}: the child hung (killed after {CHILD_TIMEOUT} s); it said {r['said']}"
        assert r["status"] == 0, f"{where}: the child exited with {r['status']}; it said {r['said']}"
        # Every child freed its sampler, and said nothing else (no wrong or failed draw).
        want = ["freed", "closed"] if ending == "close" else ["freed"]
        assert r["said"] == want, f"{where}: the child said {r['said']}"
    assert len(results) == FORKS
    assert parent["draws"] > 0 and not parent["errors"], parent
    assert not report["drawer_alive"]
