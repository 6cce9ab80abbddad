"""The tiered start (archrun.run.tiered): the reference backend answers while a background process
compiles the fast kernels; the model then continues on the fast backend with the same cache."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.errors import ArchrunWarning
from archrun.io.ggufset import open_gguf
from archrun.run import tiered

FIXTURE = Path(__file__).parents[2] / "families/archrun-llama/tests/goldens/llama_gqa.gguf"


@pytest.fixture
def fresh(tmp_path) -> Path:
    """A copy of a tiny fixture: a file no warm-up has stamped yet."""
    return Path(shutil.copy(FIXTURE, tmp_path / "model.gguf"))


def _ids(model, n: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(5).integers(0, model.descriptor.n_vocab, n)]


def test_switches_to_fast_at_a_token_boundary_with_the_same_cache(fresh):
    assert not tiered.is_warm(fresh)
    model = tiered.load(fresh)
    try:
        assert isinstance(model, tiered.TieredModel) and model.backend == "reference"
        ids = _ids(model, 12)
        cache = model.init_cache(32)
        model.forward_step(ids[:10], cache)                 # the prompt on the reference backend
        assert model.wait_fast(timeout=900)
        got = model.forward_step(ids[10:12], cache)          # the fast backend continues its cache
    finally:
        model.close()
    fast = archrun.load(fresh, backend="fast")
    c = fast.init_cache(32)
    fast.forward_step(ids[:10], c)
    want = fast.forward_step(ids[10:12], c)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert tiered.is_warm(fresh)                               # the warm-up left its stamp
    assert not isinstance(tiered.load(fresh), tiered.TieredModel)  # so the next start is fast at once


def test_a_failed_warm_up_keeps_the_reference_backend(fresh, monkeypatch):
    monkeypatch.setattr(tiered.sys, "executable", shutil.which("false") or "/bin/false")
    model = tiered.load(fresh)
    try:
        with pytest.warns(ArchrunWarning, match="staying on the reference backend"):
            assert not model.wait_fast(timeout=60)
        assert model.backend == "reference"
        cache = model.init_cache(8)
        assert model.forward_step(_ids(model, 3), cache).shape == (model.descriptor.n_vocab,)
    finally:
        model.close()
    monkeypatch.setattr(tiered.sys, "executable", sys.executable)


def test_the_cli_starts_tiered_unless_a_backend_is_named(fresh, monkeypatch, capsys):
    from archrun import cli

    seen = []
    monkeypatch.setenv("ARCHRUN_TIERED", "1")
    monkeypatch.setattr(tiered, "load", lambda path, **kw: seen.append(path) or archrun.load(path, backend="fast"))
    assert cli.main(["run", str(fresh), "-p", "hi", "-n", "2", "--temp", "0"]) == 0
    assert cli.main(["run", str(fresh), "-p", "hi", "-n", "2", "--temp", "0", "--backend", "fast"]) == 0
    monkeypatch.setenv("ARCHRUN_TIERED", "0")  # the switch users (and this suite) turn it off with
    assert cli.main(["run", str(fresh), "-p", "hi", "-n", "2", "--temp", "0"]) == 0
    assert seen == [str(fresh)]


def test_a_tiered_start_that_would_not_fit_loads_the_fast_model_directly(fresh, monkeypatch):
    """The reference phase holds float32 weights beside the warm-up's fast copy; where the memory
    available now cannot hold both, the fast model is loaded at once (compiling first), with a warning."""
    need = tiered.tiered_bytes(fresh)
    with open_gguf(fresh) as g:
        n_float = sum(int(np.prod(t.shape)) for t in g.tensors.values())
    assert need == 4 * n_float + fresh.stat().st_size + 2 * tiered._RUNTIME_BYTES
    monkeypatch.setattr(tiered, "available_memory", lambda: need)  # 80 % of it is not enough
    with pytest.warns(ArchrunWarning, match=r"compiling the fast kernels before the first token.*GiB are available"):
        model = tiered.load(fresh)
    assert not isinstance(model, tiered.TieredModel)  # the fast model itself
    monkeypatch.setattr(tiered, "available_memory", lambda: 2 * need)
    model = tiered.load(fresh)
    try:
        assert isinstance(model, tiered.TieredModel)
    finally:
        model.close()


def test_available_memory_reads_the_os_figure():
    available = tiered.available_memory()
    if Path("/proc/meminfo").exists():
        assert available is not None and available > 0


def test_one_warm_up_per_model_and_kernel_cache(fresh):
    """A second start while the first one's warm-up runs compiles nothing itself: it waits for that stamp."""
    first = tiered.load(fresh)
    second = tiered.load(fresh)
    try:
        assert first._proc is not None
        assert second._proc is None and second.backend == "reference"  # no second compile of the same kernels
        cache = second.init_cache(8)
        assert second.forward_step(_ids(second, 3), cache).shape == (second.descriptor.n_vocab,)
        assert second.wait_fast(timeout=900) and tiered.is_warm(fresh)
        assert second._proc is None
    finally:
        first.close()
        second.close()
