"""Tiered start: answer at once on the reference backend while the fast kernels compile, then go fast.

On a machine whose kernel cache does not yet hold a model's fast kernels, loading it on the fast
backend first compiles them (minutes with numba). `load` instead returns a `TieredModel`: it runs
the reference backend (numpy float32, no compilation) and starts a background process
(`python -m archrun.run.tiered PATH`) that loads the model on the fast backend and runs a prefill
and a decode step, which compiles every kernel those paths use into the shared cache. When that
process has finished, the next call of a model method loads the fast model (from the cache, about
a second) and every later token runs on it; the KV cache is the same object on both backends
(the attention ops of both make the same slots), so a generation continues where it was.

The process leaves a stamp in the core's kernel cache folder (named by a digest of the model file
and the kernel folders of this installation): with the stamp present `load` loads the fast model
directly. Both backends are tested against HF; greedy choices can differ where two logits are
closer than their rounding difference.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from archrun.errors import ArchrunWarning

# prompts the warm-up prefills (the first then takes one decode step), each on a fresh cache: prompt ops
# choose their paths by length, and each path a user's first prompt meets uncompiled costs seconds.
# archrun-blocks' attention takes tiles from 64 queries on (~30 s to compile cold), below that a per-query
# loop, in parallel over the queries once a prompt's work is large (~3 s: measured on SmolLM2's 40-token
# first chat turn after a warm-up that prefilled only 72 tokens), else serial
_WARM_PROMPTS = (72, 48, 8)


def _stamp(path: str | os.PathLike) -> Path | None:
    """Where the warm-up of this model file leaves its stamp: in the core's kernel cache folder, whose
    name is a digest of the core's kernel sources (None when the kernel cache is unusable: then every
    process compiles anyway).

    The key is the file alone: the plugin kernel folders a process has registered depend on what it
    happened to import (a warm-up process imports only what its model uses), so keying on them made
    a warmed model look cold again. A plugin whose kernels changed since the warm-up compiles them
    on the next fast load (a slower first token, never a wrong one)."""
    from archrun.kernels import _jit

    core = _jit._REGISTERED.get(_jit._CORE)
    if core is None or core.path is None:
        return None
    st = os.stat(path)
    key = "\n".join([os.path.realpath(path), str(st.st_size), str(st.st_mtime_ns)])
    return Path(core.path) / f"warm-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def is_warm(path: str | os.PathLike) -> bool:
    """Whether this model's fast kernels are known to be in the kernel cache."""
    stamp = _stamp(path)
    return stamp is None or stamp.exists()


def _claim_warm_up(path: str | os.PathLike) -> tuple[Any, bool]:
    """(an open file holding the exclusive lock of this model's warm-up, or None; whether another process
    holds it: a warm-up of the same file into the same kernel cache is running). Without a usable cache
    or advisory locks: (None, False), and every start runs its own warm-up."""
    from archrun.kernels import _jit

    stamp = _stamp(path)
    if stamp is None or _jit.fcntl is None:
        return None, False
    lock = open(stamp.with_name(stamp.name + ".compiling"), "a+b")  # noqa: SIM115 (held by the warm-up)
    try:
        _jit.fcntl.flock(lock, _jit.fcntl.LOCK_EX | _jit.fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return None, True
    return lock, False


class TieredModel:
    """A Decoder on the reference backend until the fast model is ready, then on the fast one.

    Every attribute is the active model's (descriptor, tokenizer, caps, init_cache,
    forward_step, ...); reading one first switches to the fast model when its warm-up has
    finished, so a generation switches at a token boundary. `backend` says which one runs.
    One warm-up runs per model file and kernel cache: a start that finds another process's warm-up
    of the same file running waits for its stamp instead of compiling the same kernels again.
    """

    def __init__(self, path: str | os.PathLike, load_kwargs: dict[str, Any]):
        from archrun.api import load

        self._path, self._kwargs, self._failed, self._elsewhere = str(path), load_kwargs, False, False
        self._proc: subprocess.Popen | None = None
        self._active = load(self._path, backend="reference", **load_kwargs)
        self._start_warm_up()

    def _start_warm_up(self) -> None:
        """Start this model's warm-up process, unless another process's is running (then wait for its stamp)."""
        lock, self._elsewhere = _claim_warm_up(self._path)
        if self._elsewhere:
            return
        hints = json.dumps(dict(self._kwargs.get("hints") or {}))
        # the warm-up outlives this process if it must (the next start is then fast); its messages
        # go to a file, not a pipe nobody may read; it inherits the lock and holds it until it exits
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (kept open while the warm-up runs)
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", "archrun.run.tiered", self._path, hints],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
                                          pass_fds=(lock.fileno(),) if lock is not None else ())
        finally:
            if lock is not None:
                lock.close()  # the child's copy keeps the lock

    @property
    def backend(self) -> str:
        """"reference" while the fast kernels compile, then "fast"."""
        return "reference" if self._proc is not None or self._elsewhere or self._failed else "fast"

    def _switch(self) -> None:
        if self._elsewhere:
            self._after_other_warm_up()
            return
        if self._proc is None or self._proc.poll() is None:
            return
        proc, self._proc = self._proc, None
        self._log.seek(0)
        err = self._log.read().decode(errors="replace").strip()
        self._log.close()
        if proc.returncode != 0:
            self._failed = True
            warnings.warn(f"archrun: compiling the fast kernels failed (exit {proc.returncode}); staying on the "
                          f"reference backend: {err.splitlines()[-1] if err else 'no message'}", ArchrunWarning,
                          stacklevel=3)
            return
        from archrun.api import load

        self._active = load(self._path, backend="fast", **self._kwargs)

    def _after_other_warm_up(self) -> None:
        """Another process's warm-up: go fast once its stamp is there; if it ended without one, warm up here."""
        if is_warm(self._path):
            from archrun.api import load

            self._elsewhere = False
            self._active = load(self._path, backend="fast", **self._kwargs)
            return
        lock, running = _claim_warm_up(self._path)
        if lock is not None:
            lock.close()
        if not running:  # it ended (killed, failed) before its stamp
            self._start_warm_up()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # this wrapper's own state (absent only while constructing)
            raise AttributeError(name)
        self._switch()
        return getattr(self._active, name)

    def close(self) -> None:
        """Stop a warm-up still running (the kernels it compiled so far stay cached). Without
        close, a warm-up outlives the model and this process, so that the next start is fast."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait()
        self._proc = None
        with contextlib.suppress(Exception):
            self._log.close()

    def wait_fast(self, timeout: float | None = None) -> bool:
        """Wait for the warm-up (at most `timeout` s) and switch; whether the fast model now runs."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._elsewhere and (deadline is None or time.monotonic() < deadline):
            self._switch()
            if self._elsewhere:
                time.sleep(0.05)
        if self._proc is not None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(left)
        self._switch()
        return self.backend == "fast"


_RUNTIME_BYTES = 300 << 20  # a process's fixed part: imports, compiled kernels, tokenizer (docs/performance.md)
_HEADROOM = 0.8  # of the memory available now, what the tiered start may plan to use


def available_memory() -> int | None:
    """Bytes the OS reports available now (Linux MemAvailable), or None where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def tiered_bytes(path: str | os.PathLike) -> int:
    """Memory a tiered start needs at once: this process on the reference backend (every weight as
    float32) plus the warm-up process on the fast one (about the file, repacked), each with its runtime."""
    from archrun.io.ggufset import open_gguf

    with open_gguf(path) as g:
        float32 = sum(4 * math.prod(t.shape) for t in g.tensors.values())
        file_bytes = sum(os.path.getsize(p) for p in g.paths)  # every part of a split model
    return float32 + file_bytes + 2 * _RUNTIME_BYTES


def load(path: str | os.PathLike, **load_kwargs: Any) -> Any:
    """The fast model when its kernels are cached (or the cache is unusable), else a TieredModel.

    A tiered start holds the weights as float32 in this process while the warm-up process holds the
    fast copy: several times the file. When that would not fit in the memory available now, the fast
    model is loaded directly (its kernels compile first) and an ArchrunWarning says why.
    load_kwargs go to archrun.load (hints, threads, progress, plugins ...), never `backend`.
    """
    from archrun.api import load as load_model

    if is_warm(path):
        return load_model(path, backend="fast", **load_kwargs)
    need, available = tiered_bytes(path), available_memory()
    if available is not None and need > _HEADROOM * available:
        warnings.warn(f"compiling the fast kernels before the first token: a tiered start (float32 weights "
                      f"while they compile) needs ~{need / 2**30:.1f} GiB, {available / 2**30:.1f} GiB are "
                      "available", ArchrunWarning, stacklevel=2)
        return load_model(path, backend="fast", **load_kwargs)
    return TieredModel(path, load_kwargs)


def warm(path: str | os.PathLike, hints: dict[str, Any] | None = None) -> None:
    """Compile the fast kernels a model's prefill and decode use, then leave the stamp."""
    from archrun.api import load as load_model

    model = load_model(path, backend="fast", hints=hints)
    for k, length in enumerate(_WARM_PROMPTS):
        n = min(length, model.descriptor.n_ctx - 1)
        cache = model.init_cache(n + 1)
        logits = model.forward_step([i % model.descriptor.n_vocab for i in range(1, n + 1)], cache)  # prefill
        if k == 0:
            model.forward_step([int(logits.argmax())], cache)  # the fused decode step
    stamp = _stamp(path)
    if stamp is not None:
        stamp.touch()


if __name__ == "__main__":
    warm(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else None)
