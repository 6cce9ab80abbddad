"""archrun-gemma4-ops: the vocabulary Gemma 4 text models need beyond archrun-blocks.

attention "gemma4" (its projection layout: each layer kind's own head width and KV heads, keys
reused as values where the file has no attn_v, an unweighted RMS norm on the values, unscaled
scores) and residual "gemma4_scaled" (the sequential block times the layer's learned scalar).
See archrun_gemma4_ops.layout and archrun_gemma4_ops.residual.
"""
