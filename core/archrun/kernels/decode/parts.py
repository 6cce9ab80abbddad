"""The fused decode path's calling conventions: what an op's kernel part looks like.

A fast op joins the one-call-per-layer decode path (archrun.kernels.decode.fusion, kernels.decode.layer) by carrying
a `Part`: a numba function compiled with its slot's signature below, plus the op's scalar
parameters as a float64 array. The layer kernel calls parts through numba first-class function
values, so one compiled layer kernel runs any combination of parts: a part from a third-party
plugin decodes fused exactly like a built-in one, and the core never knows what a part computes.

Conventions (one token; every array float32 and C-contiguous unless noted; `p` is the part's
float64 parameter array):

  norm        fn(p, x[d], w[d], b[d or 0], out[d])        out may be x; b empty when the norm has no bias
  rope        fn(p, v[H * hd], n_head, hd, cos[r], sin[r])  in place; cos/sin from the op's cos_sin(pos)[0]
  attention   fn(p, q[H * hd], k[KV * hd], v[KV * vd], kc[cap, KV, hd], vc[cap, KV, vd],
                 kpos int64[cap or 0], ring, row, pos, out[H * vd], pool int64[], task)
                 stores k/v at cache row `row` (ring slots also kpos[row] = pos), then attends
                 from position pos over the rows it can see. pool: the decode pool's ctrl while a
                 step runs on it (kernels.decode.pool; empty: no pool), task: the id of the op's pool task
                 there (-1: none; see `task` below): a part may split long work into chunks of
                 that task, and its result must not depend on whether it did. A cache of another kv type has its own
                 slot, "attention:<kv type>", the same call with kc/vc of KV_CACHES[kv type]
                 (f16: uint16 float16 bits; q8_0: uint8 ggml q8_0 blocks, hd / 32 * 34 bytes a row);
                 an op offers those parts through `op.fused_for(kv_type)` (archrun.kernels.decode.fusion)
  activation  fn(p, x[n], out[n])                          out may be x; a gated FFN multiplies it by up
  gated       fn(p, gate[n], up[n], out[n])                a gated activation that reads up itself (e.g. a
                 clamped SwiGLU): out = act(gate, up), out may be gate. It fills the activation slot (of a
                 gated FFN only) in place of act(gate) * up; callers run either kind through
                 kernels.decode.layer.activate
  residual    ffn_input fn(p, x[d], a[d], out[d])          what the FFN sub-block reads (before its norm)
              combine   fn(p, x[d], a[d], f[d])            x <- the residual stream after the block
  gating      fn(p, logits[E], probs[E])                    router probabilities of one token
  task        fn(args int64[k], chunk)                       chunk `chunk` of a decode pool job (kernels.decode.pool):
                 an attention op offering `op.pool_task` (a function compiled for this slot) has it
                 registered with the model's pool when the pool is built (archrun.kernels.decode.fusion); its part then
                 receives the task's id and publishes it with kernels.decode.pool.publish_task

Plugin kernels compile with `JIT` (cached, fastmath, nogil), e.g. `@njit(SIGNATURES["norm"], **JIT)`, and
a plugin with kernels calls `kernel_cache(__file__)` (archrun.kernels.kernel_cache, also exported here) at
the top of its kernel package, before its kernel modules are imported: their compiled code is then cached
under a digest of its sources and the core's.
`part(fn, *params)` builds a Part; kernels take `part.value` (see Part); `activation_part(p)` accepts an
activation part of either kind (`is_gated` tells which); `NO_ROPE` is the part of
layers without rotary embedding; `NO_ACTIVATION` the activation slot of a token mixer's block without
FFN (never called); `NO_TASK` the last two arguments of an attention part called outside a pooled step.

A token mixer (slot "mixer") has no part of its own: it brings its layer kernel (`fused_layer`, see
archrun.kernels.decode.fusion and archrun.kernels.decode.layer's `mixer_input` / `mixer_output`).
"""

from __future__ import annotations

import inspect
import warnings

import attrs
import numba
import numpy as np
from numba import njit, types
from numba.core.errors import NumbaExperimentalFeatureWarning

from archrun.kernels._jit import JIT, guard_cache, kernel_cache

# numba calls first-class function values "experimental"; they are the fused path's plug points.
warnings.filterwarnings("ignore", category=NumbaExperimentalFeatureWarning)

VEC = types.Array(types.float32, 1, "C")
PARAMS = types.Array(types.float64, 1, "C")
CACHE = types.Array(types.float32, 3, "C")
# cache arrays [cap, KV, stored] by kv type: float32 values, float16 bits, ggml q8_0 block bytes
KV_CACHES = {"f32": CACHE, "f16": types.Array(types.uint16, 3, "C"), "q8_0": types.Array(types.uint8, 3, "C")}
POSITIONS = types.Array(types.int64, 1, "C")
POOL = types.Array(types.int64, 1, "C")  # the decode pool's ctrl (kernels.decode.pool), empty without a pool

__all__ = ["JIT", "NO_ACTIVATION", "NO_ROPE", "NO_TASK", "SIGNATURES", "Part", "activation_part", "compiled_for",
           "guard_cache", "is_gated", "kernel_cache", "part", "usable"]

SIGNATURES = {
    "norm": types.void(PARAMS, VEC, VEC, VEC, VEC),
    "rope": types.void(PARAMS, VEC, types.int64, types.int64, VEC, VEC),
    "attention": types.void(PARAMS, VEC, VEC, VEC, CACHE, CACHE, POSITIONS, types.boolean, types.int64,
                            types.int64, VEC, POOL, types.int64),
    **{f"attention:{t}": types.void(PARAMS, VEC, VEC, VEC, c, c, POSITIONS, types.boolean, types.int64,
                                    types.int64, VEC, POOL, types.int64) for t, c in KV_CACHES.items() if t != "f32"},
    "activation": types.void(PARAMS, VEC, VEC),
    "gated": types.void(PARAMS, VEC, VEC, VEC),
    "residual": types.void(PARAMS, VEC, VEC, VEC),
    "gating": types.void(PARAMS, VEC, VEC),
    "task": types.void(POOL, types.int64),
}


@attrs.frozen
class Part:
    """An op's kernel part: `fn` compiled with SIGNATURES[slot], and its parameters (float64 [k]).

    Kernels receive the function as a first-class function value: numba types a 1-tuple of a
    function compiled for one signature that way (`value` = (fn,), called `f[0](...)`), so one
    compiled caller serves every part and its cache key is the same in every process (a bare
    function argument would be typed as that very function: a new compile per process). Turning
    a function into such a value costs ~0.1 ms, so it happens once: inside a typed list built at
    load (the layer kernel's arguments), or in `handle`, a typed list [(fn,)] built on first use,
    which an op passes to its op-by-op kernels on every call (called `h[0][0](...)`, ~3 us a call).
    """

    fn: object = attrs.field(eq=False)
    params: np.ndarray = attrs.field(eq=False)
    _handle: list = attrs.field(factory=list, init=False, eq=False, repr=False)  # holds the built handle

    @property
    def value(self) -> tuple:
        """(fn,): the part as a first-class function value, for a typed list built once."""
        return (self.fn,)

    @property
    def handle(self) -> object:
        """A numba typed list [(fn,)] (built once): the part as a kernel argument for every call."""
        if not self._handle:
            from archrun.kernels.decode.lists import typed_list

            self._handle.append(typed_list([self.value]))
        return self._handle[0]


def part(fn: object, *params: float) -> Part:
    """A Part of `fn` with scalar parameters `params` (stored as a float64 array)."""
    return Part(fn, np.array(params if params else (0.0,), dtype=np.float64))


def compiled_for(fn: object, slot: str) -> bool:
    """Whether fn is a numba function compiled for `slot`'s signature (what the layer kernel can call)."""
    if numba.config.DISABLE_JIT:  # pure-Python kernels: any function with the convention's arity runs
        return callable(fn) and _arity(fn) in (None, len(SIGNATURES[slot].args))
    sigs = getattr(fn, "signatures", None)
    return sigs is not None and SIGNATURES[slot].args in [tuple(s) for s in sigs]


def _arity(fn: object) -> int | None:
    """The number of parameters of a Python function (None when it has no signature to read)."""
    try:
        return len(inspect.signature(getattr(fn, "py_func", fn)).parameters)
    except (TypeError, ValueError):
        return None


def usable(p: object, slot: str) -> Part | None:
    """p when it is a Part compiled for `slot`'s signature (what the layer kernel can call), else None."""
    if not isinstance(p, Part) or not compiled_for(p.fn, slot):
        return None
    return p


def activation_part(p: object) -> Part | None:
    """p when it is a Part for the activation slot: compiled for SIGNATURES["activation"] or ["gated"]."""
    return usable(p, "activation") or usable(p, "gated")


def is_gated(p: Part) -> bool:
    """Whether the activation part p is a gated one (`fn(p, gate, up, out)`: it reads up itself)."""
    return usable(p, "gated") is not None


@njit(SIGNATURES["rope"], **JIT)
def _no_rope(p, v, n_head, hd, cos, sin):
    """Layers without rotary embedding (NoPE): nothing to rotate."""


NO_ROPE = part(_no_rope)


@njit(SIGNATURES["activation"], **JIT)
def _no_activation(p, x, out):
    """The activation slot of a token mixer's block without FFN: the kernel never calls it."""


NO_ACTIVATION = part(_no_activation)
# the (pool, task) arguments of an attention part called outside a pooled step (op by op, tests)
NO_TASK = (np.zeros(0, np.int64), np.int64(-1))
