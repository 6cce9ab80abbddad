"""The kernels' compiled code is cached under a digest of the kernel sources a process imported
(kernels._jit): processes with different sources never share cache entries, even while one of them
keeps running after an edit; the same sources load from the cache; old folders are pruned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from archrun.kernels import _jit

# A kernel package whose caller embeds a callee of another file: numba keys the caller's cached code
# by the caller's file and bytecode only, so an edit of the callee alone must change its cache folder.
INIT = "from archrun.kernels import kernel_cache\n\nkernel_cache(__file__)\n"
CALLEE = ("from numba import njit\n\nfrom archrun.kernels.parts import JIT\n\n\n"
          "@njit(**JIT)\ndef step(x):\n    return x + {}\n")
CALLER = ("from numba import njit\n\nfrom archrun.kernels.parts import JIT\nfrom kpkg.callee import step\n\n\n"
          "@njit(**JIT)\ndef twice(x):\n    return step(step(x))\n")

# imports the package, calls the caller (compiled lazily); with a go file, waits for it before
# importing the kernel modules ("import") or before the call ("call")
RUN = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])

def wait(where):
    if sys.argv[3:] == [where]:
        open(sys.argv[2] + ".ready", "w").close()
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.02)

import kpkg
from archrun.kernels import _jit
wait("import")
from kpkg import caller
wait("call")
result = caller.twice(0)
stats = getattr(caller.twice, "stats", None)
print(json.dumps({"result": int(result), "folder": _jit.kernel_cache(kpkg.__file__),
                  "used": caller.twice.stats.cache_path if stats else None,
                  "hits": sum(stats.cache_hits.values()) if stats else None}))
"""


def _write_package(root: Path, increment: int) -> None:
    pkg = root / "kpkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(INIT)
    (pkg / "caller.py").write_text(CALLER)
    (pkg / "callee.py").write_text(CALLEE.format(increment))


def _env(cache: Path, **extra: str) -> dict[str, str]:
    return dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1", **extra)


def _start(src: Path, cache: Path, *go: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUN, str(src), *go], env=_env(cache, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ready(p: subprocess.Popen, go: Path) -> None:
    deadline = time.monotonic() + 120
    while not Path(f"{go}.ready").exists():
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)


def _run(src: Path, cache: Path, **extra: str) -> dict:
    p = _start(src, cache, **extra)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return json.loads(out)


def _entries(folder: str) -> set[str]:
    return {f.name for f in Path(folder).iterdir() if f.suffix in (".nbi", ".nbc")}


def test_an_edited_callee_gets_its_own_cache_folder_and_a_warm_run_loads_from_it(tmp_path):
    src, cache = tmp_path / "src", tmp_path / "cache"
    _write_package(src, 1)
    first = _run(src, cache)
    assert first["result"] == 2 and first["hits"] == 0
    assert {n.split("-")[0] for n in _entries(first["folder"])} == {"caller.twice", "callee.step"}
    warm = _run(src, cache)
    assert first["used"] == first["folder"]
    assert warm == dict(first, hits=1)  # same sources: same folder, compiled code loaded from it
    _write_package(src, 10)  # the caller's file and bytecode are unchanged
    edited = _run(src, cache)
    assert edited["result"] == 20 and edited["hits"] == 0 and edited["folder"] != first["folder"]
    assert Path(edited["folder"]).parent == Path(first["folder"]).parent == cache


def test_a_process_that_imported_old_sources_never_writes_where_new_sources_read(tmp_path):
    src, cache, go = tmp_path / "src", tmp_path / "cache", tmp_path / "go"
    _write_package(src, 1)
    old = _start(src, cache, str(go), "call")  # imports the old sources, then waits
    _wait_ready(old, go)
    _write_package(src, 10)
    new = _run(src, cache)  # the new sources compile and cache first
    new_entries = {n: (Path(new["folder"]) / n).stat().st_mtime_ns for n in _entries(new["folder"])}
    go.touch()  # then the old process compiles and writes its entries
    out, _ = old.communicate(timeout=300)
    stale = json.loads(out)
    assert stale["used"] == stale["folder"]
    assert old.returncode == 0 and stale["result"] == 2 and stale["folder"] != new["folder"]
    assert {n.split("-")[0] for n in _entries(stale["folder"])} == {"caller.twice", "callee.step"}
    assert {n: (Path(new["folder"]) / n).stat().st_mtime_ns for n in _entries(new["folder"])} == new_entries
    again = _run(src, cache)  # a new process with the new sources loads their code, not the old process's
    assert again["result"] == 20 and again["hits"] == 1 and again["folder"] == new["folder"]


def test_a_kernel_file_edited_during_the_import_compiles_into_a_folder_of_that_process_alone(tmp_path):
    src, cache, go = tmp_path / "src", tmp_path / "cache", tmp_path / "go"
    _write_package(src, 1)
    p = _start(src, cache, str(go), "import")  # digests the old sources, then waits before importing them
    _wait_ready(p, go)
    _write_package(src, 10)
    go.touch()
    out, err = p.communicate(timeout=300)
    res = json.loads(out)
    assert p.returncode == 0 and res["result"] == 20 and "changed while it was imported" in err
    assert Path(res["used"]).parent != cache and not _entries(res["folder"])  # nothing under the old digest
    assert not Path(res["used"]).exists()  # removed when the process exited
    fresh = _run(src, cache)
    assert fresh["result"] == 20 and fresh["used"] == fresh["folder"] != res["folder"]


def test_without_the_jit_the_package_runs_and_caches_nothing(tmp_path):
    src, cache = tmp_path / "src", tmp_path / "cache"
    _write_package(src, 1)
    res = _run(src, cache, NUMBA_DISABLE_JIT="1")
    assert res == {"result": 2, "folder": None, "used": None, "hits": None}
    assert not cache.exists() or not any(cache.rglob("*.nb[ic]"))


def test_cache_folders_beyond_the_most_recent_are_pruned_unless_a_running_process_holds_them(tmp_path):
    fcntl = pytest.importorskip("fcntl")
    src, cache = tmp_path / "src", tmp_path / "cache"
    _write_package(src, 1)
    old = []
    for i in range(_jit.KEEP + 2):  # older than anything the run below creates, oldest first
        folder = cache / f"archrun-old-{i:016x}"
        folder.mkdir(parents=True)
        (folder / "in-use").touch()
        os.utime(folder / "in-use", (1e9 + i, 1e9 + i))
        old.append(folder)
    foreign = [cache / "kernels_0123456789abcdef0123456789abcdef01234567", cache / "archrun-notours"]
    for folder in foreign:
        folder.mkdir()
    with open(old[0] / "in-use", "rb") as held:  # a running process uses the oldest
        fcntl.flock(held, fcntl.LOCK_SH)
        res = _run(src, cache)
    kept = {p.name for p in cache.iterdir()}
    ours = {n for n in kept if _jit._FOLDER.fullmatch(n)}
    assert old[0].name in ours and Path(res["folder"]).name in ours
    assert len(ours - {old[0].name}) == _jit.KEEP  # the KEEP most recently used
    assert old[-1].name in ours and old[1].name not in ours
    assert {f.name for f in foreign} <= kept  # not archrun's: never touched


def test_concurrent_writers_of_one_kernel_never_share_a_data_file(tmp_path):
    """numba names a new entry's data file by the first number its index does not use: a writer that read
    the index before another's entry landed picked the same name and overwrote that entry's code (which
    the other's index then ran: a crash). archrun names data files by their key: a writer that never saw
    an entry cannot overwrite it, and each key loads its own data."""
    from numba.core.caching import IndexDataCacheFile

    cache = IndexDataCacheFile(str(tmp_path), "kernel-1.py311", b"stamp")
    cache.save(("sig a",), "code for a")
    index = tmp_path / "kernel-1.py311.nbi"
    index.unlink()  # a second writer that read the index before the first entry was saved
    cache.save(("sig b",), "code for b")
    assert len(list(tmp_path.glob("*.nbc"))) == 2  # numba's counter would have given both "1"
    assert cache.load(("sig b",)) == "code for b"
    first = IndexDataCacheFile(str(tmp_path), "kernel-1.py311", b"stamp")
    first.save(("sig a",), "code for a")  # the first writer's entry comes back under its own name
    assert first.load(("sig a",)) == "code for a" and first.load(("sig b",)) == "code for b"
