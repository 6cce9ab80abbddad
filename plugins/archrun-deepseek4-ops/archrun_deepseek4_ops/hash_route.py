"""DeepSeek-V4's hash routing: the first `hash_layer_count` MoE layers pick their experts by token id.

A frozen table (`blk.N.ffn_gate_tid2eid`, int32 [vocab, k]) names each token's k experts; the router's
scores (sqrt-softplus of its logits) only weight them: the selected scores, renormalised and scaled as
top-k routing does (HF DeepseekV4HashRouter; llama.cpp's build_moe_ffn with the selection given). The
layer has no selection bias.

Not wired into a model yet: archrun's MoE op is called with the hidden states only, and these layers need
each row's token id (see the package's notes in docs/families.md).
"""

from __future__ import annotations

import numpy as np

from archrun.descriptor import MoeSpec
from archrun.errors import ShapeMismatch

F32 = np.float32


class HashTable:
    """tid2eid [vocab, k] checked once: every entry an expert of the layer."""

    def __init__(self, table: np.ndarray, n_expert: int, n_expert_used: int):
        table = np.asarray(table)
        if table.ndim != 2 or table.shape[1] != n_expert_used or table.dtype.kind not in "iu":
            raise ShapeMismatch(f"tid2eid {table.dtype}{list(table.shape)} is not integers [vocab, {n_expert_used}]")
        if table.size and (table.min() < 0 or table.max() >= n_expert):
            raise ShapeMismatch(f"tid2eid names experts outside 0..{n_expert - 1}")
        self.table = table.astype(np.int64)

    def experts(self, token_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.table)):
            raise ShapeMismatch(f"token ids outside the hash table's {len(self.table)} rows")
        return self.table[ids]


def route_by_token(probs: np.ndarray, token_ids: np.ndarray, table: HashTable,
                   spec: MoeSpec) -> tuple[np.ndarray, np.ndarray]:
    """(ids [n, k], weights [n, k]) of rows with scores probs [n, E] and token ids [n]: the table's experts,
    weighted as archrun_blocks.reference.route weights its choice (renorm, scale)."""
    ids = table.experts(token_ids)
    weights = np.take_along_axis(np.asarray(probs, F32), ids, axis=-1)
    if spec.weights_norm:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), F32(6.103515625e-5))
    if spec.weights_scale != 1.0:
        weights = weights * F32(spec.weights_scale)
    return ids, weights.astype(F32)
