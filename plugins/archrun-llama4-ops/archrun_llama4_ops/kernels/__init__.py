"""archrun-llama4-ops' numba kernels (cached under a digest of their sources: archrun.kernels.kernel_cache).

They call archrun-blocks' kernels (the one-token attention, the cache row codec, the MoE routing), so
archrun-blocks' kernel sources join the digest."""

import archrun_blocks
from archrun.kernels import kernel_cache

kernel_cache(__file__, embeds=(archrun_blocks,))
