"""archrun-gemma3n-ops's tests: archrun's conformance kit (docs/conformance.md) on its ops. Attention
"gemma3n" brings its own projection layout and "gelu_tanh_sparse" its per-layer parameters, so the
fast-op check runs on these specs: Gemma 3n's unscaled scores with a sliding window and without, and the
E2B quantile (sparsity 0.95), a dense layer and a strong cut."""

from archrun.conformance import Conformance
from archrun.descriptor import AttentionSpec


def _spec(heads: int, kv: int, hd: int, window: int = 0) -> AttentionSpec:
    return AttentionSpec(kind="gemma3n", n_head=heads, n_head_kv=kv, head_dim=hd, v_head_dim=hd, scale=1.0,
                         window=window, qk_norm=True, params={"k_eq_v": 0.0})


archrun_conformance = Conformance("gemma3n-ops", op_specs={
    "attention=gemma3n": [_spec(4, 2, 16, window=6), _spec(8, 2, 32), _spec(2, 1, 8, window=3)],
    "activation=gelu_tanh_sparse": [dict(sparse=1.0, std_multiplier=1.6448536), dict(sparse=0.0, std_multiplier=0.0),
                                    dict(sparse=1.0, std_multiplier=-0.5)],
})
