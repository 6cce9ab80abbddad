"""archrun-deepseek4-ops: the vocabulary DeepSeek-V4 needs beyond archrun-blocks and archrun-mla.

gating "sqrtsoftplus" (expert scores sqrt(softplus(logits)), GGUF expert_gating_func 4,
archrun_deepseek4_ops.gating) and activation "swiglu_clamp" (SwiGLU with the gate clamped from above and
the up projection both ways by the file's per-layer limit, archrun_deepseek4_ops.swiglu).

archrun_deepseek4_ops.mhc holds the math of manifold-constrained hyper-connections (N residual streams mixed
around every attention and FFN sub-layer, Sinkhorn-projected mixing, the trunk's final collapse) with its
numba kernels, and archrun_deepseek4_ops.mhc_stream the stream op built on it (the blocks' attention and FFN
branches called one at a time); it is not registered yet: the gguf-py archrun pins names neither V4's
hyper-connection tensors nor its keys. archrun_deepseek4_ops.hash_route routes the first layers' tokens by
their id (the frozen tid2eid table), for when the MoE op is handed each row's token id.
archrun_deepseek4_ops.v4_attention is the reference math of V4's attention on its sliding-only layers (q LoRA
with a per-head unweighted norm, one shared K/V head, rope on the trailing dims undone on the output, sinks,
a sliding window, the grouped low-rank output), not yet an op; archrun_deepseek4_ops.compressor the HCA
and CSA compressors' entries (gated pooling of closed, for CSA overlapping, windows, roped at the window's
start), which entries each query sees, and CSA's lightning-indexer selection (on archrun-mla's scorer).
"""
