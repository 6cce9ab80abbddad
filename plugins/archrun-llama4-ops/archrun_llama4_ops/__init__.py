"""archrun-llama4-ops: the vocabulary Llama 4 text models need beyond archrun-blocks.

attention "llama4" (chunked local attention with L2-normalised q/k on the rotary layers, global
attention with temperature-tuned queries on the NoPE layers) and moe "topk_input_weighted" (each
selected expert reads its input scaled by the routing weight). See archrun_llama4_ops.ops (the numpy
references) and archrun_llama4_ops.fast (the fast ops on the numba kernels of archrun_llama4_ops.kernels,
which decode fused: the attention's kernel part in the core's layer kernel, the mixture's own layer kernel).
"""
