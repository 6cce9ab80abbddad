"""Several models in one server, within a memory budget.

`archrun serve A.gguf B.gguf` (or `--models-dir DIR`) serves each file under its own id (the file's
name); a request's `model` picks one. A model loads on its first request (the first model at
start) and gets its own Server: engine, batch, inference thread. `--max-memory` bounds what the
loaded models hold: each model's weights (its file's bytes) and every KV cache its engine has
made. Loading a model that would pass the bound first unloads the least recently used models no
request is using; when that cannot make room, the request is answered 503 (MemoryBudgetExceeded)
and the server goes on serving the others. A model whose own weights and one sequence's cache
exceed the bound is refused the same way, without loading it.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
from starlette.concurrency import run_in_threadpool

from archrun.errors import ArchrunError, InvalidRequest
from archrun.serve.memory import MemoryBudget, MemoryBudgetExceeded, size_text


class ModelNotFound(InvalidRequest):
    """The request names a model this server does not serve (HTTP 404)."""

    http_status, http_kind = 404, "invalid_request_error"  # as OpenAI answers an unknown model



@attrs.frozen
class ModelFacts:
    """What /v1/models tells of a model, read from its file's header (without loading it)."""

    id: str
    path: Path
    architecture: str
    parameters: int
    context_length: int | None
    quantization: str
    file_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "parameters": self.parameters,
                "n_ctx_train": self.context_length, "quantization": self.quantization,
                "file_bytes": self.file_bytes}


def model_facts(model_id: str, path: str | os.PathLike) -> ModelFacts:
    """The ModelFacts of a GGUF file (a ModelLoadError for a file that is not one)."""
    import gguf as gguf_py

    from archrun.io.ggufset import open_gguf

    path = Path(path)
    with open_gguf(path) as g:
        meta = g.metadata
        arch = str(meta.get("general.architecture", "unknown"))
        params = sum(math.prod(t.shape) for t in g.tensors.values())
        ctx = meta.get(f"{arch}.context_length")
        ftype = meta.get("general.file_type")
        files = [p for p in g.paths]
    try:
        quant = gguf_py.LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_") if ftype is not None else "unknown"
    except ValueError:
        quant = f"file_type {ftype}"
    return ModelFacts(id=model_id, path=path, architecture=arch, parameters=int(params),
                      context_length=int(ctx) if isinstance(ctx, int) else None, quantization=quant,
                      file_bytes=sum(os.path.getsize(p) for p in files))


def model_files(paths: Sequence[str | os.PathLike], models_dir: str | os.PathLike | None = None,
                model_name: str | None = None) -> list[tuple[str, Path]]:
    """(id, path) of every model to serve: the paths given, then the .gguf files of models_dir (split
    models: their first part). Ids are the file names; `model_name` renames a single model."""
    files = [Path(p) for p in paths]
    if models_dir is not None:
        folder = Path(models_dir)
        if not folder.is_dir():
            raise InvalidRequest(f"--models-dir {str(folder)!r} is not a directory")
        files += sorted(p for p in folder.glob("*.gguf")
                        if not re.search(r"-0*([2-9]|[1-9][0-9]+)-of-[0-9]+\.gguf$", p.name))
    if not files:
        raise InvalidRequest("no model to serve: give .gguf paths or --models-dir with .gguf files in it")
    if model_name is not None and len(files) > 1:
        raise InvalidRequest("--model-name names a single model; with several, each is known by its file name")
    out: dict[str, Path] = {}
    for f in files:
        if not f.is_file():
            raise InvalidRequest(f"no model file at {str(f)!r}")
        name = model_name or f.name
        if name in out and out[name].resolve() != f.resolve():
            raise InvalidRequest(f"two models are named {name!r}: {out[name]} and {f}")
        out[name] = f
    return list(out.items())


def memory_available() -> int | None:
    """The kernel's estimate of memory available without swapping (/proc/meminfo MemAvailable), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class _Entry:
    """One model of the pool: its facts, its Server once loaded, who uses it."""

    def __init__(self, facts: ModelFacts):
        self.facts = facts
        self.server: Any = None
        self.active = 0          # requests using it now
        self.last_used = 0.0
        self.loading = asyncio.Lock()
        self.weights = 0         # bytes reserved for its weights while loaded


class ModelPool:
    """The models of a server (see the module docstring).

    load(path) returns a model; serve(model, id, budget) its started Server (the budget is the one its
    engine reserves KV caches from). `acquire(name)` gives the Server of a model, loading it (and
    unloading idle ones) as needed; every acquire is paired with `release(server)`. loaders: models
    loaded otherwise than load(path), by id (e.g. a base model with a LoRA adapter merged, served under
    the adapter's name: its entry's path is the base model's file).
    """

    def __init__(self, files: Sequence[tuple[str, Path]], load: Callable[[Path], Any],
                 serve: Callable[[Any, str, MemoryBudget], Any], max_memory: int | None = None,
                 context_for: Callable[[int], int] | None = None,
                 loaders: dict[str, Callable[[], Any]] | None = None):
        self.entries = {name: _Entry(model_facts(name, path)) for name, path in files}
        self._loaders = dict(loaders or {})
        self.default = next(iter(self.entries))
        self.budget = MemoryBudget(max_memory)
        self._load, self._serve = load, serve
        self._context_for = context_for or (lambda n: n)
        self._lock = threading.Lock()   # entries' server / active / weights

    def entry(self, name: Any) -> _Entry:
        """The entry a request's `model` names (None or absent: the first model); ModelNotFound else."""
        if name is None:
            return self.entries[self.default]
        found = self.entries.get(name) if isinstance(name, str) else None
        if found is None and isinstance(name, str):  # the file name without .gguf also names it
            found = self.entries.get(name + ".gguf")
        if found is None:
            raise ModelNotFound(f"the model {str(name)[:100]!r} does not exist on this server (GET /v1/models "
                                f"lists them: {', '.join(self.entries)})"[:500])
        return found

    async def acquire(self, name: Any) -> Any:
        """The started Server of model `name` (loaded now if needed), held until release()."""
        entry = self.entry(name)
        with self._lock:
            entry.active += 1
            entry.last_used = time.monotonic()
        try:
            if entry.server is None:
                async with entry.loading:
                    if entry.server is None:
                        await run_in_threadpool(self._bring_in, entry)
        except BaseException:
            with self._lock:
                entry.active -= 1
            raise
        return entry.server

    def release(self, server: Any) -> None:
        with self._lock:
            for entry in self.entries.values():
                if entry.server is server:
                    entry.active -= 1
                    entry.last_used = time.monotonic()

    def _bring_in(self, entry: _Entry) -> None:
        """Reserve the weights' bytes (unloading idle models to make room), load, start."""
        need = entry.facts.file_bytes
        limit = self.budget.limit
        if limit is not None and need > limit:
            raise MemoryBudgetExceeded(f"the model {entry.facts.id!r} needs {size_text(need)} for its weights alone, "
                                       f"more than --max-memory ({size_text(limit)})")
        free = memory_available()
        if free is not None and need > free:
            raise MemoryBudgetExceeded(f"the model {entry.facts.id!r} needs {size_text(need)}; the system has "
                                       f"{size_text(free)} available (MemAvailable)")
        while not self.budget.try_reserve(need):
            victim = self._take_idle_lru(entry)
            if victim is None:
                raise MemoryBudgetExceeded(
                    f"the model {entry.facts.id!r} needs {size_text(need)} to load and {self.budget.describe()} by "
                    "models serving requests; try again when they finish")
            self._unload(*victim)
        try:
            loader = self._loaders.get(entry.facts.id)
            model = loader() if loader is not None else self._load(entry.facts.path)
            server = self._serve(model, entry.facts.id, self.budget)
        except BaseException:
            self.budget.free(need)
            raise
        with self._lock:
            entry.server, entry.weights = server, need

    def _take_idle_lru(self, keep: _Entry) -> tuple[Any, int] | None:
        """The least recently used loaded model no request uses (and its Server), taken out of service at
        once: a request arriving meanwhile loads it again."""
        with self._lock:
            idle = [e for e in self.entries.values() if e is not keep and e.server is not None and e.active == 0]
            if not idle:
                return None
            entry = min(idle, key=lambda e: e.last_used)
            taken = entry.server, entry.weights
            entry.server, entry.weights = None, 0
            return taken

    def _unload(self, server: Any, weights: int) -> None:
        server.close()   # stops its engine and frees its caches' reservations
        self.budget.free(weights)

    def listing(self) -> list[dict[str, Any]]:
        """/v1/models' entries: id, the file's facts, whether it is loaded."""
        out = []
        for entry in self.entries.values():
            server, facts = entry.server, entry.facts
            if server is not None:
                ctx = server.ctx
            else:
                try:
                    ctx = self._context_for(facts.context_length) if facts.context_length else None
                except ArchrunError:  # --ctx beyond this model's context: its load will say so
                    ctx = None
            out.append({"id": facts.id, "object": "model", "created": int(os.path.getmtime(facts.path)),
                        "owned_by": "archrun", "context_length": ctx, **facts.to_json(), "loaded": server is not None})
        return out

    def servers(self) -> list[tuple[str, Any]]:
        """(id, Server) of the loaded models."""
        return [(name, e.server) for name, e in self.entries.items() if e.server is not None]

    def close(self) -> None:
        """Stop every loaded model's engine."""
        for entry in self.entries.values():
            with self._lock:
                server, weights = entry.server, entry.weights
                entry.server, entry.weights = None, 0
            if server is not None:
                self._unload(server, weights)
