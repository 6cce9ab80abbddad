"""xIELU (Apertus's FFN activation, arXiv 2411.13010) with its learned per-layer parameters.

The file stores each layer's raw parameters as gguf-py's unprefixed keys `xielu.alpha_n`,
`xielu.alpha_p`, `xielu.beta`, `xielu.eps` (one value per layer; llama.cpp's converter takes them
from HF's `act_fn.*` tensors). With a_p = softplus(alpha_p) and a_n = beta + softplus(alpha_n)
(HF XIELUActivation, llama.cpp ggml_xielu):

    xielu(x) = a_p x^2 + beta x                          for x > 0
             = (expm1(min(x, eps)) - x) a_n + beta x      otherwise

`XieluLayout` reads the layer's parameters at compile time (archrun.vocab.ActivationLayout); the
reference op here and the fast op (archrun_blocks.xielu_part, its kernel part) take them as keywords.
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32
KEYS = {"alpha_n": "xielu.alpha_n", "alpha_p": "xielu.alpha_p", "beta": "xielu.beta", "eps": "xielu.eps"}
#: HF XIELUActivation's initial values (a_p = 0.8, a_n = 0.8, beta 0.5, eps -1e-6) as raw parameters:
#: the ops' defaults (a model's layers always pass the file's values)
INIT = {"alpha_n": math.log(math.expm1(0.8 - 0.5)), "alpha_p": math.log(math.expm1(0.8)), "beta": 0.5, "eps": -1e-6}


def softplus(x: float) -> float:
    """log(1 + e^x), x itself above 20 (torch's and ggml's threshold), rounded to float32."""
    return float(F32(x if x > 20.0 else math.log1p(math.exp(x))))


def effective(alpha_n: float, alpha_p: float, beta: float, eps: float) -> tuple[float, float, float, float]:
    """(a_n, a_p, beta, eps) as the formula uses them, in float32, from the raw stored parameters."""
    return (float(F32(F32(beta) + F32(softplus(alpha_n)))), softplus(alpha_p), float(F32(beta)), float(F32(eps)))


class XieluLayout:
    """The layer's xIELU parameters from the file: {"params": {alpha_n, alpha_p, beta, eps}}."""

    def describe(self, ctx) -> dict:
        n = ctx.meta.get("block_count", int)
        return {"params": {name: ctx.meta.per_layer_floats(key, n)[ctx.layer] for name, key in KEYS.items()}}


def xielu(alpha_n: float = INIT["alpha_n"], alpha_p: float = INIT["alpha_p"], beta: float = INIT["beta"],
          eps: float = INIT["eps"]):
    """The reference op: act(x, up=None) = xielu(x) (* up when given), float32."""
    a_n, a_p, b, e = (F32(v) for v in effective(alpha_n, alpha_p, beta, eps))

    def act(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        x = np.asarray(x, dtype=F32)
        neg = (np.expm1(np.minimum(x, e)) - x) * a_n + b * x
        y = np.where(x > F32(0.0), a_p * x * x + b * x, neg).astype(F32)
        return y if up is None else y * up

    return act
