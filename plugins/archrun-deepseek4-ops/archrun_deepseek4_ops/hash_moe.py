"""The MoE op `hash_topk`: archrun-blocks' top-k mixture whose hash layers route by token id.

The file's `hash_layer_count` (a key the family declares) makes its first layers hash layers (DeepSeek-V4's):
each holds a token -> experts table (`blk.N.ffn_gate_tid2eid`, integers [vocab, k]; the role
`ffn_gate_tid2eid`, which the family declares too), read at load (MissingTensor without it), and row r
runs the k experts table[token_id[r]], weighted by the router's scores of those experts (the gating op on
`ffn_gate_inp`), renormalised and scaled as top-k routing weights its choice
(hash_route; HF DeepseekV4HashRouter, llama.cpp's build_moe_ffn given the
selection), plus the shared experts. The other layers are archrun-blocks' `topk` itself (a table there is
a tensor the plan does not use: the load fails). `HashLayout` reads the count at compile time
(MoeSpec.params "hash": 1 for a hash layer).

The op declares `token_ids` (archrun.contracts: it is called moe(x, weights, ids) with each row's token
id) and `binds` (it reads its layer's table at load): so its layers have no fused layer kernel and a
model using it decodes op by op. Reference and fast factories: the fast one runs the top-k layers on
archrun-blocks' fast mixture and the hash layers' experts on the model's fast products.
"""

from __future__ import annotations

import numpy as np

from archrun.descriptor import MoeSpec
from archrun.errors import MetadataError, ShapeMismatch

F32 = np.float32
TABLE = "ffn_gate_tid2eid"
KEY = "hash_layer_count"


class HashLayout:
    """{"params": {"hash": 1 or 0}}: whether the layer is one of the file's first `hash_layer_count` (an
    archrun.vocab.MoeLayout); a hash layer's table is checked to be [k, vocab] (ggml order)."""

    def describe(self, ctx) -> dict:
        try:
            count = ctx.meta.get(KEY, int, 0)
        except KeyError:  # a key archrun's gguf-py does not name and the family did not declare
            raise MetadataError(f"moe 'hash_topk' reads {KEY!r}: the family declares it "
                                "(FamilyHints.metadata_keys)") from None
        n_block = ctx.meta.get("block_count", int)
        if not 0 <= count <= n_block:
            raise MetadataError(f"{KEY} = {count} is outside [0, {n_block}]")
        hashed = ctx.layer < count
        if hashed:
            shape = tuple(ctx.tensors.shape(TABLE, ctx.layer))
            k = ctx.meta.get("expert_used_count", int)
            if len(shape) != 2 or shape[0] != k:
                raise ShapeMismatch(f"layer {ctx.layer}: {TABLE} has shape {shape}, expected ({k}, n_vocab)")
        return {"params": {"hash": float(hashed)}}


class HashTopK:
    """moe(x [n, d], weights, ids [n]) -> [n, d]: the layer's table routes by ids, else `topk`."""

    def __init__(self, spec: MoeSpec, gating, act, topk):
        self.spec, self.gating, self.act, self.topk = spec, gating, act, topk
        self.table = None

    def bind(self, binder, layer: int) -> None:
        from archrun_deepseek4_ops.hash_route import HashTable

        if dict(self.spec.params).get("hash"):
            self.table = HashTable(binder.integers(TABLE, layer), self.spec.n_expert, self.spec.n_expert_used)

    def __call__(self, x: np.ndarray, w, ids: np.ndarray) -> np.ndarray:
        if self.table is None:
            return self.topk(x, w)
        from archrun_blocks.reference import shared_experts
        from archrun_deepseek4_ops.hash_route import route_by_token

        experts, weights = route_by_token(self.gating(w.gate_inp(x)), ids, self.table, self.spec)
        out = np.zeros_like(x)
        for e in np.unique(experts):
            rows, slot = np.nonzero(experts == e)
            xe = x[rows]
            out[rows] += weights[rows, slot][:, None] * w.down[e](self.act(w.gate[e](xe), w.up[e](xe)))
        if w.shared is not None:
            out += shared_experts(x, w, self.act)
        return out


def hash_topk(spec: MoeSpec, gating, act) -> HashTopK:
    """The reference op (archrun-blocks' reference top-k for the layers without a table)."""
    from archrun_blocks import reference

    return HashTopK(spec, gating, act, reference.moe_topk(spec, gating, act))


def hash_topk_fast(spec: MoeSpec, gating, act) -> HashTopK:
    """The fast op: archrun-blocks' fast top-k mixture for the layers without a table."""
    from archrun_blocks import fast

    return HashTopK(spec, gating, act, fast.moe_topk(spec, gating, act))
