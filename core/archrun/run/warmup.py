"""`archrun warmup`: compile kernels into the kernel cache before anything needs them.

A process that finds its kernels in the cache loads each in ~30-50 ms; one that does not compiles
them (minutes for a model's fused decode path on a cold cache). Warming ahead of time fills the
cache once, for every later process (a server's workers, a test run's workers, a container image):

- `warm_plugins()`: every installed plugin's fast ops (the kernels their modules compile at import);
- `warm_types(types)`: the product kernels (decode dots, prefill GEMM) of weight types;
- `warm_models(paths, kv_types)`: each model loaded on the fast backend (its ops, fused blocks and head:
  one prefill and one decode step), then a decode step and a two-sequence batch step on a cache of
  each kv type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gguf.constants import GGMLQuantizationType

from archrun.errors import InvalidRequest, shown

Progress = Callable[[str, int, int], None] | None


def weight_types(spec: str | None) -> list[int]:
    """The ggml types of "Q4_K,F16" (names as gguf-py spells them), "all" (every type the kernels run) or
    None / "" (none); an unknown or unsupported name is an InvalidRequest."""
    from archrun.kernels.matmul.qmatrix import SUPPORTED_TYPES

    if not spec:
        return []
    if spec == "all":
        return sorted(SUPPORTED_TYPES)
    types = []
    for name in spec.split(","):
        t = GGMLQuantizationType.__members__.get(name.strip().upper())
        if t is None or int(t) not in SUPPORTED_TYPES:
            known = ", ".join(sorted(GGMLQuantizationType(x).name for x in SUPPORTED_TYPES))
            raise InvalidRequest(f"unknown weight type {shown(name)}; the kernels run {known}")
        types.append(int(t))
    return types


def warm_plugins(plugins: Any = None) -> None:
    """Import every installed plugin's fast ops: the kernels their modules compile at import."""
    from archrun.plugins import make_plugin_manager
    from archrun.vocab import Lazy, build_vocabulary

    for entry in build_vocabulary(plugins if plugins is not None else make_plugin_manager()):
        if isinstance(entry.op.fast, Lazy):
            entry.op.fast.resolve()


def warm_types(types: Iterable[int], progress: Progress = None) -> None:
    """Compile (or load) the product kernels of these weight types."""
    from archrun.kernels.matmul.warmup import warm_up

    warm_up(types, progress)


def warm_models(paths: Sequence[str], kv_types: Sequence[str] = ("f32",), progress: Progress = None) -> None:
    """Load each model on the fast backend (which compiles its kernels: one prefill, one decode step), then
    run a decode step and a batch of two sequences on a cache of each kv type."""
    from archrun.api import load

    for path in paths:
        model = load(path, progress=progress)
        if not model.causal:
            continue
        for kv_type in kv_types:
            _steps(model, kv_type)


def _steps(model: Any, kv_type: str) -> None:
    n = min(4, model.descriptor.n_ctx)
    if n < 3:
        return
    caches = [model.init_cache(n, kv_type=kv_type) for _ in range(2)]
    model.forward_step([0], caches[0])
    if model.caps.batch:
        model.forward_step_batch_spans([[0], [0, 0]], caches)
