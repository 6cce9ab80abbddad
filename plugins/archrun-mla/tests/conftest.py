"""archrun-mla's tests: archrun's conformance kit (docs/conformance.md) on its op. MLA's layout states
its own heads (one shared [k_pe | latent] key head) and parameters, so the fast-op check runs on these
specs: kv_lora_rank c, rope dims r, a key row of r + c values whose last c are the value."""

import math

from archrun.conformance import Conformance
from archrun.descriptor import AttentionSpec


def _spec(heads: int, rope: int, lora: int, nope: int, softcap: float = 0.0, kind: str = "mla") -> AttentionSpec:
    params = {"kv_lora_rank": lora, "qk_rope": rope, "qk_nope": nope, "v_head_dim": lora, "q_lora_rank": 0,
              "legacy_kv_b": 0}
    return AttentionSpec(kind=kind, n_head=heads, n_head_kv=1, head_dim=rope + lora, v_head_dim=lora,
                         scale=1 / math.sqrt(nope + rope), softcap=softcap, params=params)


archrun_conformance = Conformance("mla", op_specs={
    "attention=mla": [_spec(3, 4, 10, 6), _spec(16, 64, 128, 32), _spec(5, 8, 24, 8, softcap=4.0), _spec(1, 2, 7, 3)],
    # the same attention, its latent norms' epsilon fixed by the layout (Kimi Linear)
    "attention=mla_fixed_lora_eps": [_spec(3, 4, 10, 6, kind="mla_fixed_lora_eps"),
                                     _spec(5, 8, 24, 8, softcap=4.0, kind="mla_fixed_lora_eps")]})
