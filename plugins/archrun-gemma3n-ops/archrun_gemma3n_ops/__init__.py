"""archrun-gemma3n-ops: the vocabulary Gemma 3n text models need beyond archrun-blocks and archrun-gemma4-ops.

stream "altup" (AltUp's parallel residual streams and the per-layer inputs, archrun_gemma3n_ops.altup),
residual "gemma3n_laurel" (LAuReL's low-rank branch joining the attention, archrun_gemma3n_ops.laurel),
activation "gelu_tanh_sparse" (GeGLU whose gate is cut at a Gaussian quantile first,
archrun_gemma3n_ops.sparsity) and attention "gemma3n" (archrun-gemma4-ops' attention and KV sharing with one
head width for both layer kinds, archrun_gemma3n_ops.layout).
"""
