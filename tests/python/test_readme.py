"""The README's examples are the example files, whole (scripts/sync-readme.py rewrites them)."""

import importlib.util
import os

from conftest import REPO


def _sync_module():
    spec = importlib.util.spec_from_file_location("sync_readme", os.path.join(REPO, "scripts", "sync-readme.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_readme_example_equals_its_file():
    sync = _sync_module()
    with open(sync.README) as f:
        text = f.read()
    _, stale = sync.synced(text)
    assert not stale, f"README.md shows stale copies of {stale}: run scripts/sync-readme.py"


def test_the_readme_shows_every_example_program():
    sync = _sync_module()
    with open(sync.README) as f:
        shown = set(sync.example_paths(f.read()))
    programs = set()
    for sub in ("c", "cpp", "python", "cmake"):
        for name in os.listdir(os.path.join(REPO, "examples", sub)):
            if name.endswith((".c", ".cpp", ".py", ".txt")):
                programs.add(f"examples/{sub}/{name}")
    assert programs <= shown, f"not in the README: {sorted(programs - shown)}"
