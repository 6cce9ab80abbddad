"""The benchmark scripts in bench/ import: a module the core or the tests moved must not leave one broken.

Each script is imported in its own process (as `python bench/X.py` runs it: bench/ on the path; the
tests folder too, as the scripts that build fixtures document with PYTHONPATH), without running main().
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("bench_*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_bench_script_imports(name):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT / "tests")]),
               NUMBA_DISABLE_JIT="1")
    done = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT / "bench", env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
