"""Pipeline stages on Ray: contiguous layer ranges of one model on K Ray actors, run as one Decoder.

    import ray, archrun.pipeline
    ray.init()                                      # or ray.init(address="auto") on a cluster
    model = archrun.pipeline.load("model.gguf", stages=3)
    cache = model.init_cache(256)
    logits = model.forward_step(ids, cache)         # the bits of archrun.load("model.gguf")

Each stage is a Ray actor holding `archrun.load(path, layers=(start, end))`: blocks start..end-1 bound
(the first stage also the embeddings, the last the final norm and the output head); the file is
mapped in every stage, but only the stage's own tensors are read and kept. Between stages pass the
hidden states, float32 [n, d] per sequence, and nothing else: the KV rows and recurrent states of a
layer stay in its stage's caches (one per sequence, keyed by the driver's PipelineCache).

A batch of sequences (the server's continuous batching) is cut into micro-batches, one per stage; each
micro-batch goes stage to stage as a chain of Ray object references, so while stage 2 runs the first
micro-batch stage 1 runs the second. Every stage computes exactly what one process computes on its
layers (the same ops and kernels on the same rows), so logits are bit for bit those of one process:
a decode step's row takes the same fused kernel, a prompt the same prefill path.

The core splits by layer index through the descriptor (`split_layers`); it knows no family.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from archrun.decoder import Caps
from archrun.descriptor import Descriptor
from archrun.errors import ArchrunError, ContextOverflow, InvalidRequest, ModelMismatch, shown


def split_layers(d: Descriptor, tensor_bytes: dict[str, int], stages: int) -> list[tuple[int, int]]:
    """Contiguous (start, end) block ranges, one per stage, each holding about 1/stages of the blocks' weight
    bytes (tensor_bytes: GGUF tensor name -> bytes; a block's tensors are named `blk.<i>.*`)."""
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= d.n_layer:
        raise InvalidRequest(f"stages must be an integer in [1, {d.n_layer}] (the model's blocks), got "
                             f"{shown(stages)}")
    per_layer = np.zeros(d.n_layer)
    for name, n in tensor_bytes.items():
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < d.n_layer:
            per_layer[int(parts[1])] += n
    ends = np.cumsum(per_layer)
    cuts = [0]
    for k in range(1, stages):  # the block boundary nearest k/stages of the bytes, leaving a block a stage
        target = ends[-1] * k / stages
        cut = int(np.argmin(np.abs(ends - target))) + 1
        cuts.append(min(max(cut, cuts[-1] + 1), d.n_layer - (stages - k)))
    cuts.append(d.n_layer)
    return list(itertools.pairwise(cuts))


def _memory() -> dict[str, int]:
    """This process's resident bytes now and at its peak (Linux: /proc/self/status)."""
    out = {"rss": 0, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out["rss" if line.startswith("VmRSS") else "peak"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


class StageWorker:
    """One stage in its own process (a Ray actor): blocks start..end-1 of the model and each sequence's cache
    of those blocks. Steps take token ids (first stage) or hidden states and give hidden states of every
    position (stages before the last) or logits."""

    def __init__(self, path: str, layers: tuple[int, int], load_options: dict[str, Any]):
        import archrun

        self.before_load = _memory()
        self.model = archrun.load(path, layers=layers, **load_options)
        self.caches: dict[int, Any] = {}

    def memory(self) -> dict[str, int]:
        """Resident bytes: before the load (`before_load`), now (`rss`) and at the peak (`peak`)."""
        return {"before_load": self.before_load["rss"], **_memory()}

    def paths(self) -> tuple:
        """What decides which kernel path a step takes (every stage of a model must agree: see load)."""
        return self.model.step_paths()

    def open(self, key: int, capacity: int, max_rewind: int, kv_type: str) -> int:
        self.caches[key] = self.model.init_cache(capacity, max_rewind, kv_type)
        return self.caches[key].nbytes

    def close(self, key: int) -> None:
        self.caches.pop(key, None)

    def call(self, key: int, method: str, *args: Any) -> Any:
        """A cache method (rewind, clear, checkpoint, restore_point) or property (max_rewind) of one sequence."""
        value = getattr(self.caches[key], method)
        return value(*args) if callable(value) else value

    def step(self, keys: Sequence[int], inputs: Sequence[Any], all_logits: bool, batch: bool) -> list[np.ndarray]:
        """One step of each sequence keys[i] on inputs[i] (token ids, or the previous stage's hidden states):
        what forward_step (batch False) or forward_step_batch_spans computes on this stage's blocks."""
        m, caches = self.model, [self.caches[k] for k in keys]
        want = all_logits or m.gives_hidden  # a stage before the last hands on every position
        if not batch or (len(keys) == 1 and not all_logits and m.gives_hidden):  # the batch's lone route
            return [m.forward_step(inputs[0], caches[0], all_logits=want)]
        return m.forward_step_batch_spans(list(inputs), caches, all_logits=want)


class PipelineCache:
    """A sequence's cache in a pipeline: its length here, its layers' K/V in each stage's own cache."""

    _keys = itertools.count(1)

    def __init__(self, model: PipelineModel, capacity: int, max_rewind: int, kv_type: str):
        self.model, self.capacity, self.kv_type = model, capacity, kv_type
        self.key = next(self._keys)
        self._n = 0
        self.nbytes = sum(model._get([s.open.remote(self.key, capacity, max_rewind, kv_type) for s in model.stages]))
        weakref.finalize(self, _close_remote, model.stages, self.key)

    def __len__(self) -> int:
        return self._n

    def _all(self, method: str, *args: Any) -> list:
        return self.model._get([s.call.remote(self.key, method, *args) for s in self.model.stages])

    @property
    def max_rewind(self) -> int:
        return min(self._all("max_rewind"))

    def restore_point(self, length: int) -> int:
        return min(self._all("restore_point", length))

    def rewind(self, n: int) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self._n:
            raise InvalidRequest(f"cannot rewind {shown(n)} tokens from a cache holding {self._n}")
        self._all("rewind", n)
        self._n -= n

    def checkpoint(self) -> None:
        self._all("checkpoint")

    def clear(self) -> None:
        self._all("clear")
        self._n = 0


def _close_remote(stages: list, key: int) -> None:
    for s in stages:
        with contextlib.suppress(Exception):  # Ray already shut down: the actors' caches are gone with them
            s.close.remote(key)


class PipelineModel:
    """A Decoder whose blocks run on K pipeline stages (Ray actors); see the module's doc."""

    caps = Caps(rewind=True, batch=True, workers=True)
    backend = "fast"

    def __init__(self, stages: list, bounds: list[tuple[int, int]], descriptor: Descriptor, gguf: Any,
                 chat_template: str | None, ray: Any):
        self.stages, self.bounds, self.descriptor = stages, bounds, descriptor
        self.gguf, self.default_chat_template, self._ray = gguf, chat_template, ray
        self._tokenizer = None

    def _get(self, refs: Any) -> Any:
        try:
            return self._ray.get(refs)
        except self._ray.exceptions.RayTaskError as exc:  # a stage's own error (e.g. ContextOverflow), re-raised
            cause = exc.as_instanceof_cause()
            raise (cause if isinstance(cause, ArchrunError)
                   else ArchrunError(f"a pipeline stage failed: {exc}")) from None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from archrun.text.tokenizer import Tokenizer

            self._tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        return self._tokenizer

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer.chat_template or self.default_chat_template

    @property
    def causal(self) -> bool:
        return True

    def init_cache(self, max_tokens: int | None = None, max_rewind: int = 64, kv_type: str = "f32") -> PipelineCache:
        """A cache for up to max_tokens tokens: each stage makes the cache of its blocks."""
        n_ctx = self.descriptor.n_ctx
        max_tokens = n_ctx if max_tokens is None else max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int | np.integer) or max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be a positive integer, got {shown(max_tokens)}")
        if max_tokens > n_ctx:
            raise ContextOverflow(f"max_tokens {max_tokens} exceeds the model's context length {n_ctx}")
        if isinstance(max_rewind, bool) or not isinstance(max_rewind, int) or max_rewind < 0:
            raise InvalidRequest(f"max_rewind must be a non-negative integer, got {shown(max_rewind)}")
        return PipelineCache(self, int(max_tokens), max_rewind, kv_type)

    def _check(self, token_ids: Any, cache: Any) -> np.ndarray:
        if not isinstance(cache, PipelineCache) or cache.model is not self:
            raise ModelMismatch("a pipeline runs only on caches its own init_cache() made")
        try:
            ids = np.asarray(token_ids)
        except (ValueError, TypeError, RecursionError):
            ids = np.zeros((0, 0))
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise InvalidRequest("token_ids must be a non-empty 1-D sequence of integers")
        if ids.min() < 0 or ids.max() >= self.descriptor.n_vocab:
            raise InvalidRequest(f"token ids must lie in [0, {self.descriptor.n_vocab})")
        if len(cache) + len(ids) > cache.capacity:
            raise ContextOverflow(f"{len(cache)} cached + {len(ids)} new tokens exceed the cache capacity of "
                                  f"{cache.capacity} tokens")
        return ids.astype(np.int64)

    def _through(self, keys: list[int], inputs: list, all_logits: bool, batch: bool) -> Any:
        """A micro-batch through every stage: a chain of object references (no stage waits for the driver)."""
        ref = inputs
        for s in self.stages:
            ref = s.step.remote(keys, ref, all_logits, batch)
        return ref

    def forward_step(self, token_ids: Sequence[int] | np.ndarray, cache: PipelineCache,
                     all_logits: bool = False) -> np.ndarray:
        """Append token_ids to cache; logits of the last position [vocab] or of all [n, vocab]."""
        ids = self._check(token_ids, cache)
        (logits,) = self._get(self._through([cache.key], [ids], bool(all_logits), False))
        cache._n += len(ids)
        return logits

    def forward_step_batch(self, batch: Sequence[Sequence[int]], caches: Sequence[PipelineCache]) -> list[np.ndarray]:
        """Append each batch[i] to caches[i]; the last-position logits [vocab] of each."""
        return [logits[-1] for logits in self.forward_step_batch_spans(batch, caches)]

    def forward_step_batch_spans(self, batch: Sequence[Sequence[int]], caches: Sequence[PipelineCache],
                                 all_logits: bool = False) -> list[np.ndarray]:
        """forward_step_batch with logits [n_i, vocab] of every position (all_logits) or [1, vocab] of the
        last, per sequence; the sequences go through the stages in micro-batches, one per stage."""
        if isinstance(batch, str | bytes | np.ndarray) or not isinstance(batch, Sequence) or not batch \
                or not isinstance(caches, Sequence) or len(batch) != len(caches):
            raise InvalidRequest("forward_step_batch needs a list of spans and one cache per span (at least one)")
        if len({id(c) for c in caches}) != len(caches):
            raise InvalidRequest("forward_step_batch needs a distinct cache per sequence")
        spans = [self._check(ids, c) for ids, c in zip(batch, caches, strict=True)]
        n_micro = min(len(spans), len(self.stages))
        cuts = np.linspace(0, len(spans), n_micro + 1).round().astype(int)
        refs = [self._through([c.key for c in caches[a:b]], spans[a:b], bool(all_logits), True)
                for a, b in itertools.pairwise(cuts)]
        out = [lg for part in self._get(refs) for lg in part]
        for ids, cache in zip(spans, caches, strict=True):
            cache._n += len(ids)
        return out

    def rest_workers(self) -> None:
        """Nothing to rest here: the stages' workers run in their own processes."""

    def memory(self) -> list[dict[str, int]]:
        """Each stage's resident bytes: before its load, now, and at its peak."""
        return self._get([s.memory.remote() for s in self.stages])

    def close(self) -> None:
        """Stop the stages' actors."""
        for s in self.stages:
            self._ray.kill(s)
        self.stages = []


def load(path: str | os.PathLike, stages: int, load_options: dict[str, Any] | None = None,
         num_cpus: float = 1.0) -> PipelineModel:
    """The model at `path` on `stages` Ray actors (contiguous block ranges of about equal weight bytes).

    Uses the Ray cluster this process has joined (ray.init), else starts a local one. load_options are
    archrun.load's keywords (threads, backend, block_style, hints, lora); num_cpus is what each stage
    reserves on its node. Stages whose blocks would take other kernel paths than one process takes
    (e.g. a model whose blocks fuse in one stage and not in another) are refused (InvalidRequest).
    """
    try:
        import ray
    except ImportError as exc:
        raise ArchrunError(f"pipeline stages need the 'ray' extra (pip install 'archrun[ray]'): {exc}") from None
    from archrun.describe.compile import compile_gguf
    from archrun.io.ggufset import open_gguf

    options = dict(load_options or {})
    if "layers" in options:
        raise InvalidRequest("load_options cannot hold 'layers': the pipeline chooses each stage's blocks")
    path = os.path.abspath(os.fspath(path))
    gguf = open_gguf(path)
    compiled = compile_gguf(gguf, block_style=options.get("block_style"), hints=options.get("hints"))
    d = compiled.descriptor
    if not d.causal:
        raise InvalidRequest(f"{d.architecture} is an encoder: it runs in one process, not in pipeline stages")
    bounds = split_layers(d, {n: t.nbytes for n, t in gguf.tensors.items()}, stages)
    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    actor = ray.remote(num_cpus=num_cpus)(StageWorker)
    handles = [actor.remote(path, b, options) for b in bounds]
    model = PipelineModel(handles, bounds, d, gguf, compiled.chat_template, ray)
    paths = model._get([h.paths.remote() for h in handles])
    if any(p != paths[0] for p in paths):
        model.close()
        raise InvalidRequest(f"{d.architecture}: the stages {bounds} would run their blocks on different kernel "
                             f"paths ({paths}), so their logits would differ from one process's; use fewer stages")
    return model
