"""archrun-mla's tests: archrun's conformance kit (docs/conformance.md) on its op. MLA's layout states
its own heads (one shared [k_pe | latent] key head) and parameters, so the fast-op check runs on these
specs: kv_lora_rank c, rope dims r, a key row of r + c values whose last c are the value."""

import math

import numpy as np

from archrun.conformance import Conformance
from archrun.conformance.ops import close
from archrun.descriptor import AttentionSpec, RopeSpec


def _spec(heads: int, rope: int, lora: int, nope: int, softcap: float = 0.0, kind: str = "mla") -> AttentionSpec:
    params = {"kv_lora_rank": lora, "qk_rope": rope, "qk_nope": nope, "v_head_dim": lora, "q_lora_rank": 0,
              "legacy_kv_b": 0}
    return AttentionSpec(kind=kind, n_head=heads, n_head_kv=1, head_dim=rope + lora, v_head_dim=lora,
                         scale=1 / math.sqrt(nope + rope), softcap=softcap, params=params)


def _dsa_spec(heads: int, rope: int, lora: int, index_heads: int, index_width: int, top_k: int) -> AttentionSpec:
    spec = _spec(heads, rope, lora, 6, kind="mla_dsa")
    return AttentionSpec(kind="mla_dsa", n_head=heads, n_head_kv=1, head_dim=rope + lora, v_head_dim=lora,
                         scale=spec.scale, params={**dict(spec.params), "q_lora_rank": 8, "index_heads": index_heads,
                                                   "index_width": index_width, "index_top_k": top_k})


def drive_dsa(label: str, reference, fast) -> None:
    """The sparse attention's cases: its calls take the indexer's query, key and weights after start, and
    its indexer rope is bound at load (here: NEOX on base 10000). A prompt, token by token and chunks across
    the top-k boundary, on a selecting and a dense (top-k past the prompt) spec."""
    from archrun_blocks import reference as blocks

    n = 14
    for spec in (_dsa_spec(3, 4, 10, 4, 8, 5), _dsa_spec(2, 8, 16, 2, 16, 32)):
        rope = int(spec.param("qk_rope"))
        hi, di = int(spec.param("index_heads")), int(spec.param("index_width"))
        rng = np.random.default_rng(rope)
        x = [rng.normal(0, 1, shape).astype(np.float32) for shape in
             ((n, spec.n_head, spec.head_dim), (n, 1, spec.head_dim), (n, hi * di), (n, di), (n, hi))]
        for what, spans in (("prompt", [slice(0, n)]), ("token by token", [slice(i, i + 1) for i in range(n)]),
                            ("chunks", [slice(0, 3), slice(3, 9), slice(9, n)])):
            outs = []
            for factory in (fast, reference):
                op = factory(spec)
                op.index_rope = blocks.rope_neox(RopeSpec(pairing="neox", n_rot=rope, freq_base=10000.0))
                slot = op.new_slot(n)
                outs.append(np.concatenate([op(x[0][s], x[1][s], None, slot, s.start, x[2][s], x[3][s], x[4][s])
                                            for s in spans]))
            close(label, f"{what} heads={spec.n_head} top_k={int(spec.param('index_top_k'))}", *outs)


archrun_conformance = Conformance("mla", op_drivers={"attention=mla_dsa": drive_dsa}, op_specs={
    "attention=mla": [_spec(3, 4, 10, 6), _spec(16, 64, 128, 32), _spec(5, 8, 24, 8, softcap=4.0), _spec(1, 2, 7, 3)],
    # the same attention, its latent norms' epsilon fixed by the layout (Kimi Linear)
    "attention=mla_fixed_lora_eps": [_spec(3, 4, 10, 6, kind="mla_fixed_lora_eps"),
                                     _spec(5, 8, 24, 8, softcap=4.0, kind="mla_fixed_lora_eps")]})
