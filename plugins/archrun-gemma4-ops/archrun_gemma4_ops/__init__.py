"""archrun-gemma4-ops: the vocabulary Gemma 4 text models need beyond archrun-blocks.

attention "gemma4" (its projection layout: each layer kind's own head width and KV heads, keys
reused as values where the file has no attn_v, an unweighted RMS norm on the values, unscaled
scores) and residual "gemma4_scaled" (the sequential block times the layer's learned scalar).
See archrun_gemma4_ops.layout and archrun_gemma4_ops.residual. On the fast backend a one-stream
model's layers decode fused, one kernel call per layer (archrun_gemma4_ops.fused,
kernels.gemma4_layer); per-layer inputs (stream "gemma4_ple") and mixture blocks ("gemma4_moe")
run op by op.
"""
