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
CALLEE = ("from numba import njit\n\nfrom archrun.kernels.decode.parts import JIT\n\n\n"
          "@njit(**JIT)\ndef step(x):\n    return x + {}\n")
CALLER = ("from numba import njit\n\nfrom archrun.kernels.decode.parts import JIT\nfrom kpkg.callee import step\n\n\n"
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


def test_processes_with_different_string_hash_seeds_share_one_cache_folder(tmp_path):
    """The folder's digest covers the kernels' numba options; the float flags are a set, whose repr
    follows the process's string-hash seed: unsorted, every other process missed the cache."""
    src, cache = tmp_path / "src", tmp_path / "cache"
    _write_package(src, 1)
    runs = [_run(src, cache, PYTHONHASHSEED=str(seed)) for seed in range(6)]
    assert {r["folder"] for r in runs} == {runs[0]["folder"]}
    assert [r["hits"] for r in runs] == [0, 1, 1, 1, 1, 1]


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


# A parallel callee and a caller that embeds it: the caller's cached code calls numba's threading layer.
PAR_CALLEE = ("from numba import njit, prange\n\nfrom archrun.kernels._jit import JIT_PAR\n\n\n"
              "@njit(**JIT_PAR)\ndef total(x):\n    s = 0.0\n    for i in prange(x.shape[0]):\n"
              "        s += x[i]\n    return s\n")
PAR_CALLER = ("from numba import njit\n\nfrom archrun.kernels._jit import JIT\nfrom ppkg.callee import total\n\n\n"
              "@njit(**JIT)\ndef twice(x):\n    return 2.0 * total(x)\n")
# calls `sys.argv[2]` ("callee" or "caller") first in a fresh process; prints the result, the cache hits
# and how many load hooks the caller's compiled code carries
PAR_RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import ppkg
from ppkg import callee, caller
x = np.arange(64, dtype=np.float64)
if sys.argv[2] == "callee":
    print(json.dumps({"result": float(callee.total(x))}))
else:
    result = float(caller.twice(x))
    (cres,) = caller.twice.overloads.values()
    print(json.dumps({"result": result, "hits": sum(caller.twice.stats.cache_hits.values()),
                      "hooks": len(cres.reload_init)}))
"""


def test_a_caller_compiled_over_a_cached_parallel_callee_loads_first_in_a_new_process(tmp_path):
    """numba gives a library loaded from the cache no load hooks, so a caller compiled over a cached parallel
    callee was cached without the hook that starts the threading layer; a process that then loaded that
    caller first linked it with every external address 0 and crashed on the call (the MoE kernel's
    segfault). archrun keeps the hooks of cached libraries and starts the layer before linking cached code."""
    src, cache = tmp_path / "src", tmp_path / "cache"
    pkg = src / "ppkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(INIT)
    (pkg / "callee.py").write_text(PAR_CALLEE)
    (pkg / "caller.py").write_text(PAR_CALLER)

    def run(first: str) -> dict:
        p = subprocess.run([sys.executable, "-c", PAR_RUN, str(src), first], env=_env(cache),
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"exit {p.returncode}: {p.stderr[-2000:]}"
        return json.loads(p.stdout)

    expected = 2.0 * sum(range(64))
    assert run("callee")["result"] == expected / 2  # the callee alone is cached
    written = run("caller")  # callee from the cache, caller compiled and cached over it
    assert written["result"] == expected and written["hits"] == 0 and written["hooks"] > 0
    loaded = run("caller")  # a new process whose first kernel is the cached caller
    assert loaded["result"] == expected and loaded["hits"] == 1


# A plugin whose kernels call another plugin's (declared: kernel_cache(__file__, embeds=(...)))
USER_INIT = "import kpkg\nfrom archrun.kernels import kernel_cache\n\nkernel_cache(__file__, embeds=(kpkg,))\n"
USER = ("from numba import njit\n\nfrom archrun.kernels.decode.parts import JIT\nfrom kpkg.callee import step\n\n\n"
        "@njit(**JIT)\ndef thrice(x):\n    return step(step(step(x)))\n")
RUN_USER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import kuser
from kuser import user
from archrun.kernels import _jit
print(json.dumps({"result": int(user.thrice(0)), "folder": _jit.kernel_cache(kuser.__file__),
                  "hits": sum(user.thrice.stats.cache_hits.values())}))
"""


def test_an_edit_in_an_embedded_plugin_compiles_the_embedding_kernels_again(tmp_path):
    src, cache = tmp_path / "src", tmp_path / "cache"
    _write_package(src, 1)
    (src / "kuser").mkdir()
    (src / "kuser" / "__init__.py").write_text(USER_INIT)
    (src / "kuser" / "user.py").write_text(USER)

    def run() -> dict:
        done = subprocess.run([sys.executable, "-c", RUN_USER, str(src)], env=_env(cache), capture_output=True,
                              text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = run()
    assert first["result"] == 3 and run() == dict(first, hits=1)
    _write_package(src, 10)  # only the embedded plugin's callee changes
    edited = run()
    assert edited["result"] == 30 and edited["hits"] == 0 and edited["folder"] != first["folder"]


def test_plugin_kernels_declare_the_plugin_kernels_they_call():
    """Every installed plugin kernel package that imports another plugin's kernel package names it in
    kernel_cache(embeds=...): the digest of its cache folder then covers the code its kernels embed."""
    import ast
    import importlib
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    packages = sorted({p.parent for p in root.glob("plugins/*/*/**/__init__.py")
                       if "kernel_cache(__file__" in p.read_text()})
    assert packages, "no plugin kernel package found"
    for pkg in packages:
        importlib.import_module(".".join(pkg.relative_to(root).parts[2:]))  # plugins/<dist>/<package>/...
        sources = _jit._REGISTERED[os.path.realpath(pkg)]
        within = {id(w) for w in sources.within}
        for file in pkg.glob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                           [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                for module in modules:
                    spec = importlib.util.find_spec(module.split(".")[0])
                    if spec is None or spec.origin is None:
                        continue
                    folder = os.path.dirname(os.path.realpath(importlib.util.find_spec(module).origin))
                    other = _jit._REGISTERED.get(folder)
                    if other is None or folder == os.path.realpath(pkg) or other is _jit._REGISTERED[_jit._CORE]:
                        continue
                    assert id(other) in within, f"{file} imports {module}: declare it in kernel_cache(embeds=...)"
