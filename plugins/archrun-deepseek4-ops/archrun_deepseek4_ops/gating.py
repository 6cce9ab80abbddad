"""DeepSeek-V4's expert scores: sqrt(softplus(logits)) (HF `sqrtsoftplus`, llama.cpp's
LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS, GGUF expert_gating_func 4).

Selection adds the router's bias (`exp_probs_b`) to these scores; the chosen experts' weights are
the unbiased scores, renormalised and scaled (archrun-blocks' top-k MoE does that part). softplus
follows torch and ggml: x itself above 20, else log1p(exp(x)) (float64, rounded to float32).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), x itself above 20, float32."""
    x = np.asarray(x, F32)
    soft = np.log1p(np.exp(np.minimum(x, F32(20.0)).astype(np.float64))).astype(F32)
    return np.where(x > F32(20.0), x, soft)


def sqrtsoftplus():
    """The reference op: probs [n, E] = sqrt(softplus(logits [n, E]))."""

    def probs(logits: np.ndarray) -> np.ndarray:
        return np.sqrt(softplus(logits)).astype(F32)

    return probs


def sqrtsoftplus_fast():
    """The fast op: the reference over a prompt's rows, carrying its kernel part (the MoE kernel routes
    with it inside numba, op by op and in fused decode)."""
    from archrun.kernels.decode.parts import part  # imported on use: loading the plugin compiles no kernel
    from archrun_deepseek4_ops.kernels.gating import sqrtsoftplus_part

    probs = sqrtsoftplus()
    probs.fused = part(sqrtsoftplus_part)
    return probs
