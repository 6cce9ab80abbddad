"""A gated activation part (archrun.kernels.decode.parts.SIGNATURES["gated"]: fn(p, gate, up, out), it reads up
itself) in the dense layer kernel: the fused block calls it in place of act(gate) * up and gives the op-by-op
block's bits; a dense FFN without up keeps the op-by-op path for it; `layer.activate` runs either kind.

The part here is the test's own (out = gate * (min(up, c) + 1), hand-derived), run op by op over rows in
Python, so the check needs no vocabulary plugin's op; the model is a synthetic Q8_0 llama (the fused and the
op-by-op product kernels of a quantized type compute one token alike)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T
from numba import njit
from support.fused import _model

from archrun.conformance.fused_steps import check_fused_steps
from archrun.contracts import OpCapabilities
from archrun.kernels.decode import fusion, layer
from archrun.kernels.decode.parts import JIT, SIGNATURES, activation_part, is_gated, part

F32 = np.float32


@njit(SIGNATURES["gated"], **JIT)
def _clamped_glu(p, gate, up, out):
    """out = gate * (min(up, p[0]) + 1): not act(gate) * up, so only a gated part can say it."""
    c = F32(p[0])
    for i in range(gate.shape[0]):
        u = c if up[i] > c else up[i]
        out[i] = gate[i] * (u + F32(1.0))


@njit(SIGNATURES["activation"], **JIT)
def _double(p, x, out):
    for i in range(x.shape[0]):
        out[i] = x[i] + x[i]


def _gated_op(limit: float):
    """An activation op whose op-by-op call runs the part over rows."""
    p = part(_clamped_glu, limit)

    def act(gate: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        g, u = (np.ascontiguousarray(a, dtype=F32).reshape(-1, a.shape[-1]) for a in (gate, up))
        out = np.empty_like(g)
        for i in range(g.shape[0]):
            p.fn(p.params, g[i], u[i], out[i])
        return out.reshape(np.shape(gate))

    act.fused = p
    return act


def test_activate_runs_either_kind_of_part():
    @njit
    def run(f, p, gate, up, out, gated):
        layer.activate(f, p, gate, up, out, gated)

    rng = np.random.default_rng(2)
    gate, up = rng.standard_normal(37).astype(F32), (rng.standard_normal(37) * 4).astype(F32)
    out = np.full(37, np.nan, F32)
    glu, dbl = part(_clamped_glu, 1.5), part(_double)
    assert is_gated(glu) and not is_gated(dbl) and activation_part(glu) is glu and activation_part(dbl) is dbl
    run(glu.value, glu.params, gate, up, out, True)
    np.testing.assert_array_equal(out, gate * (np.minimum(up, F32(1.5)) + F32(1.0)))
    run(dbl.value, dbl.params, gate, up, out, True)
    np.testing.assert_array_equal(out, (gate + gate) * up)
    run(dbl.value, dbl.params, gate, up, out, False)
    np.testing.assert_array_equal(out, gate + gate)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_gated_part_fuses_a_dense_layer_with_the_op_paths_bits(synth_model, threads):
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    m = _model(synth_model, T.Q8_0, n_layer=2)
    binder = m.plan.binder
    for lp in m.plan.layers:
        assert lp.ffn.gated
        lp.ffn.act = _gated_op(0.5)
        binder._declared[id(lp.ffn.act)] = (lp.ffn.act, OpCapabilities(fused=True))  # as if bound by the binder
    m.fused_blocks = fusion.fuse_layers(m.plan)
    assert m.fused_blocks is not None and all(fb.dense for fb in m.fused_blocks)
    check_fused_steps(m, np.testing.assert_array_equal, lambda f, o: np.testing.assert_array_equal(f.k, o.k),
                      threads)


def test_a_gated_part_needs_a_gated_ffn():
    class Ffn:  # the fields dense_activation reads of a DenseFfn
        def __init__(self, act, gated):
            self.act, self.gated = act, gated

    caps = OpCapabilities(fused=True)
    glu, plain = _gated_op(1.0), _gated_op(1.0)
    assert fusion.dense_activation(Ffn(glu, True), caps) is glu.fused
    assert fusion.dense_activation(Ffn(plain, False), caps) is None  # no up to give it: op by op
    assert fusion.dense_activation(Ffn(glu, True), OpCapabilities()) is None  # undeclared
