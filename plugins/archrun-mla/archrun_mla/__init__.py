"""archrun-mla: multi-head latent attention (MLA) as an attention op with its own projection layout.

Registers attention="mla" (archrun_mla.plugin). The layout (archrun_mla.layout) reads the MLA
keys and tensors of a file and binds the absorbed projections; the attention op
(archrun_mla.attention) caches only the compressed latent and the shared rotary key per token.
attention="mla_dsa" is DeepSeek-V3.2's sparse attention on top (archrun_mla.dsa): each query attends
over the top-k keys the lightning indexer (archrun_mla.indexer) scores best. On the fast backend both
decode fused: one kernel call per layer (archrun_mla.fused, archrun_mla.kernels).
"""
