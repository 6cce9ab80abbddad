"""archrun-mla's numba kernels (cached under a digest of their sources: archrun.kernels.kernel_cache)."""

from archrun.kernels import kernel_cache

kernel_cache(__file__, embeds=("archrun_blocks",))
