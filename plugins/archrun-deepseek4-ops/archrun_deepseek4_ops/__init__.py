"""archrun-deepseek4-ops: the vocabulary DeepSeek-V4 needs beyond archrun-blocks and archrun-mla.

gating "sqrtsoftplus" (expert scores sqrt(softplus(logits)), GGUF expert_gating_func 4,
archrun_deepseek4_ops.gating) and activation "swiglu_clamp" (SwiGLU with the gate clamped from above and
the up projection both ways by the file's per-layer limit, archrun_deepseek4_ops.swiglu).

attention "deepseek4" (archrun_deepseek4_ops.attention; its fast op on
archrun_deepseek4_ops.kernels.v4_attention): V4's attention on its three layer kinds, told apart by their
tensors (sliding-only; CSA: `attn_compressor_*` of 2 hd rows and the lightning indexer; HCA:
`attn_compressor_*` of hd rows; the ratio m is the width of `attn_compressor_ape`). Its layout (`V4Layout`)
reads `rope.dimension_count`, `attention.q_lora_rank`, `attention.sliding_window`, `rope.freq_base`, for
compressed layers `attention.compress_rope_freq_base` and the `rope.scaling.*` YaRN keys, for CSA
`attention.indexer.head_count/key_length/top_k` (and checks `attention.compress_ratios`,
`attention.output_group_count/output_lora_rank` against the tensors when stated), and binds the roles
`attn_q_a`, `attn_q_a_norm`, `attn_q_b`, `attn_kv`, `attn_kv_a_norm`, `attn_sinks`, `attn_output_a`,
`attn_output_b`, `attn_compressor_kv/gate/ape/norm`, `indexer.attn_q_b`, `indexer.proj`,
`indexer_compressor_kv/gate/ape/norm` (llama.cpp's gguf-py names). The op ropes everything itself (the layer's
rope table must be "none") and declares `binds`. Its slot keeps a ring of recent rows and the compressed
entries (hd / m floats a token) and rewinds like a sliding-window ring (`max_rewind`); see docs/plugins.md.

stream "mhc" (archrun_deepseek4_ops.mhc_stream on archrun_deepseek4_ops.mhc's math and numba kernels):
manifold-constrained hyper-connections, N residual streams mixed around every attention and FFN branch
(Sinkhorn-projected mixing) and the trunk's final collapse; its layout reads `hyper_connection.count`,
`.sinkhorn_iterations`, `.epsilon` and binds `hc_attn_*`, `hc_ffn_*`, `output_hc_*`.
moe "hash_topk" (archrun_deepseek4_ops.hash_moe, on archrun_deepseek4_ops.hash_route's routing): the file's
first `hash_layer_count` layers pick each row's experts by its token id through their `ffn_gate_tid2eid`
table, the others are archrun-blocks' top-k; it declares `token_ids` (called moe(x, weights, ids)) and
`binds`. archrun_deepseek4_ops.v4_attention and
archrun_deepseek4_ops.compressor hold the whole-prompt reference math the op was built from (sliding
attention; HCA/CSA entries and CSA's indexer selection).
"""
