"""archrun-gemma4-ops' numba kernels (cached under a digest of their sources: archrun.kernels.kernel_cache;
the layer kernel embeds archrun-blocks' attention part, so archrun-blocks' sources are in the digest too)."""

import archrun_blocks
from archrun.kernels import kernel_cache

kernel_cache(__file__, embeds=(archrun_blocks,))
