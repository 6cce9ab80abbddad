"""archrun-recurrent's numba kernels (cached under a digest of their sources: archrun.kernels.kernel_cache;
every layer kernel's block tail embeds archrun-blocks' mixture kernel, so its code is in the digest too)."""

import archrun_blocks
from archrun.kernels import kernel_cache

kernel_cache(__file__, embeds=(archrun_blocks,))
