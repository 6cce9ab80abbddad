"""archrun-gemma3n-ops' numba kernels (cached under a digest of their sources: archrun.kernels.kernel_cache)."""

import archrun_blocks
from archrun.kernels import kernel_cache

kernel_cache(__file__, embeds=(archrun_blocks,))
