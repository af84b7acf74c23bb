"""The library's log messages reach Python's ``logging`` (logger "tokenrace" and its children),
so that logging's configuration captures or silences them; TOKENRACE_LOG_LEVEL still says which
messages the library produces. Each case runs in a fresh interpreter: the level is fixed when the
process makes its first sampler."""

import os
import subprocess
import sys

SCRIPT = r"""
import logging, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.name, record.levelno, record.getMessage()))
logging.getLogger("tokenrace").addHandler(Keep())
logging.getLogger("tokenrace").setLevel(logging.DEBUG)
logging.getLogger("tokenrace").propagate = False
import tokenrace
tokenrace.Sampler(max_rows=4)
tokenrace.NoisePool(vocab_size=16, rows=2, seed=1).close()
for name, level, text in records:
    print(name, level, text)
"""


def run(env_extra):
    import tokenrace
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(tokenrace.__file__)))
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join([package_dir, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)


def test_messages_reach_the_tokenrace_logger_and_not_stderr():
    r = run({"TOKENRACE_LOG_LEVEL": "info", "TOKENRACE_NOT_A_SETTING": "1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # The SIMD level (info), the pool starting (info), the unknown variable (warning).
    assert any(line.startswith("tokenrace") and " 20 " in line and "SIMD level" in line for line in lines), lines
    assert any(" 30 " in line and "TOKENRACE_NOT_A_SETTING" in line for line in lines), lines
    # Nothing reached stderr: the handler took it all.
    assert "SIMD level" not in r.stderr and "TOKENRACE_NOT_A_SETTING" not in r.stderr, r.stderr


def test_the_library_level_still_filters():
    r = run({"TOKENRACE_LOG_LEVEL": "error", "TOKENRACE_NOT_A_SETTING": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", r.stdout
