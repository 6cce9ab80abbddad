"""bitnet beyond the standard battery: the activation quantization against hand-derived values and
transformers' own quantizer, and each convention the family states seen by its fixtures (the kit flips
only conventions it has a partner for; `rms_act8` and `final_norm` are the family's own)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.conformance import hf
from archrun_blocks.act_quant import quantize_rows_int8, rms_act8

GOLDENS = Path(__file__).parent / "goldens"


def test_rows_quantize_to_int8_by_their_absmax():
    y = np.array([[1.0, -0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    s = 127.0  # row 0: max |y| = 1; row 1 all zero: 1 / max(0, 1e-5)
    want = np.array([[127, -64, 32, 0]], np.float32) / s   # -63.5 and 31.75 round to -64 (even) and 32
    np.testing.assert_array_equal(quantize_rows_int8(y)[:1], want)
    np.testing.assert_array_equal(quantize_rows_int8(y)[1], 0.0)


def test_the_norm_equals_transformers_rmsnorm_then_actquant():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.integrations.bitnet import ActQuant
    from transformers.models.bitnet.modeling_bitnet import BitNetRMSNorm

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((16, 48)) * 3).astype(np.float32)
    w = (1 + 0.2 * rng.standard_normal(48)).astype(np.float32)
    norm = BitNetRMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(w))
        torch.compiler.set_stance("force_eager")  # the eager code is the reference (hf_arch.py)
        want = ActQuant.apply(norm(torch.from_numpy(x))).numpy()
    got = rms_act8(1e-5)(x, w)
    # the same levels (a row's scale may differ by float32 rounding of its norm), but where that rounding
    # puts a value on the other side of a .5 step: one step apart
    close = np.isclose(got, want, rtol=1e-5, atol=0)
    step = np.abs(want).max(-1, keepdims=True) / 127
    assert close.mean() > 0.99 and np.all(np.abs(got - want) <= 1.01 * step)


@pytest.mark.parametrize("hints", [{"norm": "rms"}, {"final_norm": "rms_act8"}, {"activation": "silu"}],
                         ids=["no_activation_quantization", "quantized_final_norm", "silu"])
def test_the_fixtures_see_each_stated_convention(hints):
    golden = hf.load_golden(GOLDENS / "bitnet_2b4t.npz")
    ids = golden["ids"].astype(np.int64)
    model = archrun.load(GOLDENS / "bitnet_2b4t.gguf", backend="reference", hints=hints)
    assert hf.rel_err(model.logits(ids), golden["logits"]) > 10 * hf.TOLERANCE


def test_sub_layer_norms_are_found_by_presence():
    layers = archrun.load(GOLDENS / "bitnet_3layer_kv2.gguf", backend="reference").descriptor.layers
    assert all(ly.attn_sub_norm and ly.ffn_sub_norm for ly in layers)
