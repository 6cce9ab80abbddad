"""Small synthetic models with every weight type, and checks that the fused decode path and the op-by-op path
agree."""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType as T

import archrun
from support.gguf_fixtures import random_quant_tensor

QUANT = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.BF16]
ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
D, HEADS, KV, HD, FF = 256, 4, 2, 64, 256  # every n_in a multiple of the K-quant block (256)


def _raw(rng, ggml_type, rows, cols):
    qt = random_quant_tensor(rng, ggml_type, (rows, cols))
    return qt.data.reshape(rows, -1)


def _layer_types(t):
    """Layer 0: one type everywhere (stacked q|k|v and gate|up); layer 1: mixed types (separate products)."""
    i = QUANT.index(t) if t in QUANT else 0
    other = [QUANT[(i + j) % len(QUANT)] for j in (1, 2)]
    return [dict.fromkeys(ROLES, t), dict(zip(ROLES, (t, *other, t, t, other[0], t), strict=True))]


def _model(synth_model, t, **kw):
    rng = np.random.default_rng(int(t))
    shapes = {"attn_q": (HEADS * HD, D), "attn_k": (KV * HD, D), "attn_v": (KV * HD, D),
              "attn_output": (D, HEADS * HD), "ffn_gate": (FF, D), "ffn_up": (FF, D), "ffn_down": (D, FF)}
    overrides, types = {}, {}
    for layer, roles in enumerate(_layer_types(t)):
        for role, rt in roles.items():
            name = f"blk.{layer}.{role}.weight"
            if rt == T.F16:
                overrides[name] = (rng.standard_normal(shapes[role]) * 0.1).astype(np.float16)
            elif rt != T.F32:
                overrides[name], types[name] = _raw(rng, rt, *shapes[role]), int(rt)
    return archrun.load(synth_model(n_embd=D, n_head=HEADS, n_head_kv=KV, head_dim=HD, n_ff=FF,
                                    tensor_overrides=overrides, quant_types=types, **kw))


def _compare_blocks(m, pos=5, seed=0, op_ffn=None):
    """max |fused - op path| / max |op path| over the layers, after `pos` tokens of random context.

    op_ffn(lp): the FFN the op path runs instead of lp.ffn (None: lp.ffn itself).
    """
    rng = np.random.default_rng(seed)
    assert m.fused_blocks is not None
    worst = 0.0
    for i, (lp, fb) in enumerate(zip(m.plan.layers, m.fused_blocks, strict=True)):
        ops, fused = m.init_cache(16), m.init_cache(16)
        context = rng.standard_normal((pos, m.descriptor.n_embd)).astype(np.float32)
        for cache in (ops, fused):
            m.run_block(lp, context, cache.slots[i], 0, m.rope_angles(np.arange(pos)))
        x = rng.standard_normal(m.descriptor.n_embd).astype(np.float32)
        angles = m.rope_angles(np.array([pos]))
        ffn = lp.ffn
        lp.ffn = op_ffn(lp) if op_ffn else ffn
        try:
            ref = m.run_block(lp, x[None].copy(), ops.slots[i], pos, angles)[0]
        finally:
            lp.ffn = ffn
        fb(x, fused.slots[i], pos, angles)
        worst = max(worst, float(np.abs(x - ref).max() / np.abs(ref).max()))
        k_ops = ops.slots[i].k[:pos + 1]  # cached keys: equal up to float32 rounding of the products
        np.testing.assert_allclose(fused.slots[i].k[:pos + 1], k_ops, rtol=0, atol=1e-6 * np.abs(k_ops).max())
    return worst


def decode_paths_agree(m, n_tokens):
    """Token by token, fused decode and the op path (the file loaded with fused=False) agree."""
    op_model = archrun.load(m.gguf.path, backend=m.backend, fused=False)
    assert m.fused_blocks is not None and op_model.fused_blocks is None
    ids = np.random.default_rng(1).integers(0, m.descriptor.n_vocab, n_tokens)
    fused, ops = m.init_cache(32), op_model.init_cache(32)
    for t in ids:
        a = m.forward_step([t], fused)
        b = op_model.forward_step([t], ops)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * float(np.abs(b).max()))
