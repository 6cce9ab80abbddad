"""archrun-gemma4-ops' fused decode members against the op-by-op path: the residual's kernel parts (the
layer scalar in the combine, the FFN reading the unscaled stream: the same float32 bits as numpy's), the
slots the layer kernel reads (a layer reusing keys reads its source's), and the layers fused_layer declines.
The layer kernel's bits are checked on whole models in families/archrun-gemma4/tests/test_fused_gemma4.py."""

from __future__ import annotations

import numpy as np
import pytest

from archrun.descriptor import AttentionSpec
from archrun.errors import InvalidRequest, ShapeMismatch
from archrun.kernels.decode.parts import usable
from archrun_blocks import reference
from archrun_gemma4_ops.attention import SharedSlot, gemma4_fast
from archrun_gemma4_ops.fused import slot_arrays
from archrun_gemma4_ops.residual import ScaledSequential, scaled_fast

F32 = np.float32
RNG = np.random.default_rng(12)


class _Names:
    @staticmethod
    def tensor_name(role: str, layer: int) -> str:
        return f"blk.{layer}.{role}.weight"


class _Binder:
    """What the residual's bind reads: the file's tensor names and the layer's layer_output_scale."""

    def __init__(self, scalar: np.ndarray | None):
        self.d, self.scalar = _Names(), scalar
        self.gguf = type("G", (), {"tensors": {} if scalar is None else {"blk.3.layer_output_scale.weight": 0}})()

    def vector(self, role: str, layer: int) -> np.ndarray:
        return self.scalar


def _rows(n: int = 37) -> tuple[np.ndarray, ...]:
    x, a, f = (RNG.standard_normal(n).astype(F32) * F32(3) for _ in range(3))
    return x, a, f


@pytest.mark.parametrize("scale", [1.0, 0.5])
@pytest.mark.parametrize("scalar", [None, 0.6170686, -1.25])
def test_residual_parts_have_the_combines_bits(scale, scalar):
    """The fused parts compute ffn_input and combine (times the layer scalar) with numpy's float32 bits; both
    carry the same parameters (the layer kernel hands the FFN input's to both)."""
    op = scaled_fast(scale)
    op.bind(_Binder(None if scalar is None else np.array([scalar], F32)), 3)
    assert op.layer_scalar == F32(1.0 if scalar is None else scalar)
    assert usable(op.fused, "residual") and usable(op.fused_input, "residual")
    np.testing.assert_array_equal(op.fused.params, op.fused_input.params)
    x, a, f = _rows()
    g = np.empty_like(x)
    op.fused_input.fn(op.fused_input.params, x, a, g)
    np.testing.assert_array_equal(g, op.ffn_input(x, a))
    want = op.combine(x, a, f)
    np.testing.assert_array_equal(want, ScaledSequential.combine(op, x, a, f))
    op.fused.fn(op.fused.params, x, a, f)
    np.testing.assert_array_equal(x, want)


def test_residual_refuses_a_scalar_of_several_values():
    with pytest.raises(ShapeMismatch, match="one value"):
        scaled_fast().bind(_Binder(np.ones(2, F32)), 3)


def _spec(window=0, source=-1):
    return AttentionSpec(kind="gemma4", n_head=4, n_head_kv=2, head_dim=8, v_head_dim=8, scale=1.0, window=window,
                         params={"k_eq_v": 0.0, "kv_source": float(source)})


@pytest.mark.parametrize("window", [0, 3])
def test_slot_arrays_of_own_and_shared_slots(window):
    op = gemma4_fast(_spec(window))
    slot = op.new_slot(40, max_rewind=2)
    ring = isinstance(slot, reference.RingKvSlot)
    assert ring == bool(window)
    k, v, pos, is_ring = slot_arrays(slot)
    assert k is slot.k and v is slot.v and is_ring == ring
    assert (pos is slot.pos) if ring else pos.shape == (0,)
    shared = slot_arrays(SharedSlot(slot))  # a layer reusing keys reads its source's rows
    assert shared[0] is k and shared[1] is v and shared[3] == ring
    with pytest.raises(InvalidRequest, match="no source slot"):
        slot_arrays(SharedSlot(None))


def test_fused_layer_declines_another_layouts_projections():
    """Projections another layout bound: op by op (None), before any kernel is built (a mixture of experts:
    families/archrun-gemma4/tests/test_fused_gemma4.py, on a model's real projections)."""
    op = gemma4_fast(_spec())
    assert callable(op.fused_layer) and op.slot_arrays is slot_arrays
    assert op.fused_layer(object(), object(), None, None) is None
