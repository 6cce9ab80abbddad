"""archrun-gemma4-ops's tests: archrun's conformance kit (docs/conformance.md) on its ops. Attention
"gemma4" brings its own projection layout, so the fast-op check runs on these specs: Gemma 4's
unscaled scores, both layer kinds' widths (sliding windows on the narrow heads), one global KV head."""

from archrun.conformance import Conformance
from archrun.descriptor import AttentionSpec


def _spec(heads: int, kv: int, hd: int, window: int = 0, k_eq_v: bool = False) -> AttentionSpec:
    return AttentionSpec(kind="gemma4", n_head=heads, n_head_kv=kv, head_dim=hd, v_head_dim=hd, scale=1.0,
                         window=window, qk_norm=True, params={"k_eq_v": float(k_eq_v)})


archrun_conformance = Conformance("gemma4-ops", op_specs={"attention=gemma4": [
    _spec(4, 2, 16, window=6), _spec(4, 1, 32, k_eq_v=True), _spec(8, 8, 64, window=5), _spec(2, 1, 8)]})
