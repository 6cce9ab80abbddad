"""A hash layer and a top-k layer of HF's DeepseekV4SparseMoeBlock on random weights, and the archrun
MoeWeights / binder that hand the same weights to `hash_topk` (shared by the tests and the kit's
op driver)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from archrun.descriptor import MoeSpec
from archrun.io.weights import Matrix, MoeWeights

F32 = np.float32
D, F, E, K, V, LIMIT, SCALE = 32, 16, 8, 3, 64, 1.0, 1.5

SPEC = MoeSpec(kind="hash_topk", activation="swiglu_clamp", activation_params=(("limit", LIMIT),), n_expert=E,
               n_expert_used=K, n_ff=F, gating="sqrtsoftplus", weights_norm=True, weights_scale=SCALE,
               router_bias=False, n_shared=1, n_ff_shared=F, params=(("hash", 1.0),))


def hf_block(hash_layer: bool, seed: int = 5):
    """HF's MoE block of layer 0 (hash-routed, a random tid2eid with distinct experts per token) or 1 (top-k)."""
    import torch
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf

    torch.manual_seed(seed)
    cfg = DeepseekV4Config(vocab_size=V, hidden_size=D, moe_intermediate_size=F, n_routed_experts=E,
                           num_experts_per_tok=K, n_shared_experts=1, swiglu_limit=LIMIT,
                           routed_scaling_factor=SCALE, num_hidden_layers=2, mlp_layer_types=["hash_moe", "moe"])
    cfg.intermediate_size = F
    b = hf.DeepseekV4SparseMoeBlock(cfg, 0 if hash_layer else 1).float().eval()
    with torch.no_grad():
        for p in b.parameters():
            p.normal_(0, 0.3)
        if hash_layer:
            gen = torch.Generator().manual_seed(seed)
            b.gate.tid2eid.copy_(torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(V)]))
        else:
            b.gate.e_score_correction_bias.normal_(0, 0.2)
    return b


def _matrix(w, backend: str) -> Matrix:
    w = np.ascontiguousarray(w.detach().numpy(), F32)
    return Matrix(w.view(np.uint8), int(T.F32), w.shape[1], backend)


def weights(b, backend: str) -> MoeWeights:
    gate_up, down, s = b.experts.gate_up_proj.detach(), b.experts.down_proj.detach(), b.shared_experts
    bias = None if b.is_hash else b.gate.e_score_correction_bias.numpy().astype(F32)
    return MoeWeights(gate_inp=_matrix(b.gate.weight, backend), probs_bias=bias,
                      gate=[_matrix(gate_up[e, :F], backend) for e in range(E)],
                      up=[_matrix(gate_up[e, F:], backend) for e in range(E)],
                      down=[_matrix(down[e], backend) for e in range(E)],
                      shared=tuple(_matrix(m.weight, backend) for m in (s.gate_proj, s.up_proj, s.down_proj)))


def binder(b):
    """What the op's bind reads: the descriptor's name of the table role and the file's integer tensor."""
    table = b.gate.tid2eid.numpy() if b.is_hash else None
    name = "blk.0.ffn_gate_tid2eid.weight"
    return SimpleNamespace(d=SimpleNamespace(tensor_name=lambda role, layer: name),
                           gguf=SimpleNamespace(tensors={name: None} if table is not None else {}),
                           integers=lambda role, layer: table.astype(np.int64))


def op(factory, b, backend: str):
    from archrun_deepseek4_ops.gating import sqrtsoftplus, sqrtsoftplus_fast
    from archrun_deepseek4_ops.swiglu import swiglu_clamp, swiglu_clamp_fast

    fast = backend == "fast"
    spec = SPEC if b.is_hash else MoeSpec(**{**{a: getattr(SPEC, a) for a in (
        "kind", "activation", "activation_params", "n_expert", "n_expert_used", "n_ff", "gating", "weights_norm",
        "weights_scale", "n_shared", "n_ff_shared")}, "router_bias": True, "params": (("hash", 0.0),)})
    gating, act = (sqrtsoftplus_fast, swiglu_clamp_fast) if fast else (sqrtsoftplus, swiglu_clamp)
    m = factory(spec, gating(), act(LIMIT))
    m.bind(binder(b), 0)
    return m
