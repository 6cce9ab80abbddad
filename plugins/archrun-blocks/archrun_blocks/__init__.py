"""archrun-blocks: the core vocabulary of archrun (math only; no GGUF key names)."""

from archrun.kernels import kernel_cache

# first: this plugin's kernels embed the core's (products, the layer kernel's steps), so their compiled
# code is cached under a digest of both packages' kernel sources (archrun.kernels._jit)
kernel_cache(__file__)
