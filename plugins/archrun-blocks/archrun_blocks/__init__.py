"""archrun-blocks: the core vocabulary of archrun (math only; no GGUF key names)."""

from archrun.kernels._jit import guard_cache


def _probe() -> None:
    """A function of this folder: numba's cache locator for it gives this plugin's kernel cache."""


# this plugin's kernels embed the core's (products, the layer kernel's steps): keep their cache in step
guard_cache(_probe)
