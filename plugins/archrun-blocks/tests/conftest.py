"""archrun-blocks' tests: archrun's conformance kit (docs/conformance.md) on every op it registers
(registration; each fast op = its reference on random, ragged and extreme inputs, op by op and through
its kernel part). The models using the ops are the families'."""

from archrun.conformance import Conformance

# exp overflows for x < -88.7: the silu kernel part, compiled with fastmath (no infinities assumed),
# returns NaN there where x / (1 + exp(-x)) is -0; a gate that negative is rare but not impossible
_SILU_OVERFLOW = "silu's kernel part returns NaN below x = -88.7 (exp overflows under fastmath; the reference: -0)"

archrun_conformance = Conformance("blocks", op_deviations={
    "activation=silu": {"*extreme values*": _SILU_OVERFLOW},
    "moe=topk": {"*activation=silu*huge x*": _SILU_OVERFLOW},
})
