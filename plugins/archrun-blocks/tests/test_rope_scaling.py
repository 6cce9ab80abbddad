"""rope_scaling.frequencies equals HF transformers' ROPE_INIT_FUNCTIONS, kind by kind.

HF builds its tables in float32, and archrun builds them in float64. Each case is therefore
checked twice:
  * against HF's own code replayed with float64 substituted for its float32 dtypes. This
    isolates semantics from rounding, so the check can be tight (1e-12 relative);
  * against HF exactly as shipped, to float32 accuracy. This guards against the replay
    hiding a difference.
"""

import math

import numpy as np
import pytest

from archrun.descriptor import RopeSpec
from archrun_blocks import reference
from archrun_blocks.rope_scaling import frequencies, llama3_freq_factors, yarn_correction_range

TIGHT = 1e-12  # float64 replay of HF
F32_RTOL = 3e-6  # HF as shipped: float32 exponent error times ln(base) <= ~14 for base 1e6


class _HF:
    """HF's ROPE_INIT_FUNCTIONS, run as shipped or replayed in float64."""

    def __init__(self, torch, transformers, rope_utils):
        self.torch, self.transformers, self.rope_utils = torch, transformers, rope_utils

        class F64Tensor(torch.Tensor):
            # HF calls .float() on its exponent ramp; widen instead of narrowing.
            def float(self, *args, **kwargs):
                return self.double(*args, **kwargs)

        class Torch64:
            # Stands in for `torch` inside modeling_rope_utils: float32 requests become float64.
            float = torch.float64
            float32 = torch.float64

            def __getattr__(self, name):
                return getattr(torch, name)

            @staticmethod
            def arange(*args, **kwargs):
                return torch.arange(*args, **kwargs).as_subclass(F64Tensor)

        self._torch64 = Torch64()

    def config(self, rope_type, n_rot, base, params, max_pos, head_dim=None):
        # head_dim defaults to n_rot so HF's rotary dim is exactly archrun's n_rot.
        head_dim = head_dim or n_rot
        rope = {"rope_type": rope_type, "rope_theta": base, **params}
        return self.transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                             max_position_embeddings=max_pos, rope_parameters=rope)

    def run(self, rope_type, config, seq_len=None, *, widen):
        """(inv_freq float64 [dim/2], attention factor) from HF, float64-replayed iff widen."""
        fn = self.rope_utils.ROPE_INIT_FUNCTIONS[rope_type]
        saved = self.rope_utils.torch
        if widen:
            self.rope_utils.torch = self._torch64
        try:
            inv, attn = fn(config, None, seq_len=seq_len)
        finally:
            self.rope_utils.torch = saved
        expected = self.torch.float64 if widen else self.torch.float32
        assert inv.dtype == expected, f"HF produced {inv.dtype}, expected {expected}"
        return inv.as_subclass(self.torch.Tensor).detach().cpu().numpy().astype(np.float64), float(attn)

    def assert_matches(self, rope_type, config, ours, seq_len=None):
        inv, attn = ours
        assert inv.dtype == np.float64 and inv.shape == (config.head_dim // 2,)
        hf_inv, hf_attn = self.run(rope_type, config, seq_len, widen=True)
        np.testing.assert_allclose(inv, hf_inv, rtol=TIGHT, atol=0)
        assert attn == pytest.approx(hf_attn, rel=TIGHT, abs=0)
        shipped_inv, shipped_attn = self.run(rope_type, config, seq_len, widen=False)
        np.testing.assert_allclose(inv, shipped_inv, rtol=F32_RTOL, atol=0)
        assert attn == pytest.approx(shipped_attn, rel=TIGHT, abs=0)  # HF computes it in Python floats


@pytest.fixture(scope="module")
def hf():
    # Only the HF comparisons need torch/transformers; the pure-numpy tests run without them.
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    return _HF(torch, transformers, rope_utils)


# -- none / linear -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_rot, base, factor", [(64, 10000.0, 2.0), (128, 500000.0, 8.0), (16, 1e6, 0.5)])
def test_linear_matches_hf(hf, n_rot, base, factor):
    config = hf.config("linear", n_rot, base, {"factor": factor}, 4096)
    hf.assert_matches("linear", config, frequencies("linear", n_rot, base, factor=factor))


@pytest.mark.parametrize("n_rot, base", [(64, 10000.0), (128, 1e6)])
def test_none_is_hf_linear_with_factor_one(hf, n_rot, base):
    config = hf.config("linear", n_rot, base, {"factor": 1.0}, 4096)
    hf.assert_matches("linear", config, frequencies("none", n_rot, base, factor=3.0))  # "none" ignores factor


@pytest.mark.parametrize("scaling, factor", [("none", 1.0), ("linear", 4.0)])
def test_none_and_linear_are_bitwise_reference_rope(scaling, factor):
    # The module must be a drop-in for reference.Rope's existing math, freq_factors included.
    ff = np.linspace(1.0, 3.0, 32)
    spec = RopeSpec(pairing="neox", n_rot=64, freq_base=10000.0, scaling=scaling, scaling_factor=factor)
    inv, attn = frequencies(scaling, 64, 10000.0, factor=factor, freq_factors=ff)
    assert np.array_equal(inv, reference.Rope(spec, ff, neox=True).inv_freq)
    assert attn == 1.0


# -- yarn ----------------------------------------------------------------------------------------------------------

YARN_CASES = [
    # n_rot, base, factor, original ctx, extra HF params
    (64, 10000.0, 4.0, 2048, {}),
    (128, 1e6, 4.0, 32768, {"beta_fast": 32.0, "beta_slow": 1.0}),  # Qwen-style
    (64, 150000.0, 32.0, 4096, {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}),  # gpt-oss-style
    (16, 10000.0, 8.0, 1024, {"beta_fast": 64.0, "beta_slow": 2.0}),
    (16, 10000.0, 4.0, 65536, {}),  # high lands past n_rot/2 - 1: the clamp is n_rot - 1, not n_rot/2 - 1
    (16, 100.0, 4.0, 65536, {}),  # high clamped to n_rot - 1
    (16, 10000.0, 4.0, 128, {}),  # low clamped to 0
    (32, 10000.0, 4.0, 2048, {"beta_fast": 4.0, "beta_slow": 4.0, "truncate": False}),  # zero-width ramp guard
    (64, 10000.0, 40.0, 4096, {"mscale": 0.707, "mscale_all_dim": 0.707}),  # DeepSeek-V2-style
    (64, 10000.0, 40.0, 4096, {"mscale": 1.0, "mscale_all_dim": 0.8}),
    (64, 10000.0, 16.0, 4096, {"attention_factor": 1.5}),
    (32, 10000.0, 1.0, 2048, {}),  # factor 1: frequencies unchanged, magnitude 1
]


@pytest.mark.parametrize("n_rot, base, factor, orig, params", YARN_CASES)
def test_yarn_matches_hf(hf, n_rot, base, factor, orig, params):
    config = hf.config("yarn", n_rot, base, {"factor": factor, "original_max_position_embeddings": orig, **params},
                     int(orig * max(factor, 1.0)))
    ours = frequencies("yarn", n_rot, base, factor=factor, original_context=orig,
                       beta_fast=params.get("beta_fast", 32.0), beta_slow=params.get("beta_slow", 1.0),
                       truncate=params.get("truncate", True), mscale=params.get("mscale"),
                       mscale_all_dim=params.get("mscale_all_dim"), attn_factor=params.get("attention_factor"))
    hf.assert_matches("yarn", config, ours)


def test_yarn_partial_rotary_uses_rotary_dim(hf):
    # HF's dim is head_dim * partial_rotary_factor; that is what archrun calls n_rot.
    params = {"factor": 4.0, "original_max_position_embeddings": 2048, "partial_rotary_factor": 0.5}
    config = hf.config("yarn", 64, 10000.0, params, 8192, head_dim=128)
    inv, attn = frequencies("yarn", 64, 10000.0, factor=4.0, original_context=2048)
    hf_inv, hf_attn = hf.run("yarn", config, widen=True)
    np.testing.assert_allclose(inv, hf_inv, rtol=TIGHT, atol=0)
    assert attn == pytest.approx(hf_attn, rel=TIGHT)


def test_yarn_ramp_shape():
    low, high = yarn_correction_range(64, 10000.0, 2048, 32.0, 1.0)
    inv, attn = frequencies("yarn", 64, 10000.0, factor=4.0, original_context=2048)
    base, _ = frequencies("none", 64, 10000.0)
    np.testing.assert_array_equal(inv[: int(low)], base[: int(low)])  # fast pairs extrapolate
    np.testing.assert_allclose(inv[int(high):], base[int(high):] / 4.0, rtol=1e-15)  # slow pairs interpolate
    assert attn == pytest.approx(0.1 * math.log(4.0) + 1.0, rel=1e-15)


def test_yarn_ext_factor_zero_is_linear_without_magnitude():
    inv, attn = frequencies("yarn", 64, 10000.0, factor=4.0, original_context=2048, ext_factor=0.0)
    lin, _ = frequencies("linear", 64, 10000.0, factor=4.0)
    np.testing.assert_allclose(inv, lin, rtol=1e-15)
    assert attn == 1.0


def test_attn_scale_multiplies_the_default():
    _, plain = frequencies("yarn", 64, 10000.0, factor=4.0, original_context=2048)
    _, scaled = frequencies("yarn", 64, 10000.0, factor=4.0, original_context=2048, attn_scale=1.25)
    assert scaled == pytest.approx(plain * 1.25, rel=1e-15)
    assert frequencies("none", 64, 10000.0, attn_scale=0.5)[1] == 0.5


# -- longrope ------------------------------------------------------------------------------------------------------

_RNG = np.random.default_rng(7)
_SHORT = list(_RNG.uniform(1.0, 1.2, 16))
_LONG = list(_RNG.uniform(1.0, 8.0, 16))


@pytest.mark.parametrize("context", [0, 2048, 4096, 4097, 131072])
@pytest.mark.parametrize("factor, attention", [(32.0, None), (32.0, 1.3), (0.5, None)])
def test_longrope_matches_hf(hf, context, factor, attention):
    params = {"factor": factor, "original_max_position_embeddings": 4096, "short_factor": _SHORT,
              "long_factor": _LONG}
    if attention is not None:
        params["attention_factor"] = attention
    config = hf.config("longrope", 32, 10000.0, params, 131072)
    ours = frequencies("longrope", 32, 10000.0, factor=factor, original_context=4096, context=context,
                       short_factors=_SHORT, long_factors=_LONG, attn_factor=attention)
    hf.assert_matches("longrope", config, ours, seq_len=context or None)


def test_longrope_factor_defaults_like_phi3(hf):
    # With no explicit factor, HF takes max_position_embeddings / original; archrun's caller passes that ratio.
    params = {"original_max_position_embeddings": 4096, "short_factor": _SHORT, "long_factor": _LONG}
    config = hf.config("longrope", 32, 10000.0, params, 131072)
    ours = frequencies("longrope", 32, 10000.0, factor=131072 / 4096, original_context=4096, context=131072,
                       short_factors=_SHORT, long_factors=_LONG)
    hf.assert_matches("longrope", config, ours, seq_len=131072)


def test_longrope_equals_none_with_chosen_factors():
    # What a GGUF loader does: long/short tensors as plain freq_factors, magnitude from rope.scaling.attn_factor.
    inv, attn = frequencies("longrope", 32, 10000.0, factor=32.0, original_context=4096, context=8192,
                            short_factors=_SHORT, long_factors=_LONG)
    gguf_inv, gguf_attn = frequencies("none", 32, 10000.0, freq_factors=_LONG, attn_scale=attn)
    np.testing.assert_array_equal(inv, gguf_inv)
    assert gguf_attn == attn


# -- llama3 --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_rot, base, factor, orig, low, high", [
    (64, 500000.0, 8.0, 8192, 1.0, 4.0),  # Llama 3.1
    (128, 500000.0, 32.0, 8192, 1.0, 4.0),  # Llama 3.2
    (64, 10000.0, 4.0, 2048, 2.0, 8.0),
    (32, 10000.0, 2.0, 256, 1.0, 4.0),  # short context: every band is populated
])
def test_llama3_matches_hf(hf, n_rot, base, factor, orig, low, high):
    params = {"factor": factor, "original_max_position_embeddings": orig, "low_freq_factor": low,
              "high_freq_factor": high}
    config = hf.config("llama3", n_rot, base, params, orig * 16)
    ours = frequencies("llama3", n_rot, base, factor=factor, original_context=orig, low_freq_factor=low,
                       high_freq_factor=high)
    hf.assert_matches("llama3", config, ours)


def test_llama3_equals_none_with_rope_freqs_tensor():
    # llama.cpp ships llama3 as a rope_freqs tensor of divisors; both routes must agree.
    kw = {"factor": 8.0, "original_context": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    divisors = llama3_freq_factors(64, 500000.0, **kw)
    assert divisors[0] == 1.0 and divisors[-1] == 8.0
    inv, attn = frequencies("llama3", 64, 500000.0, **kw)
    gguf_inv, _ = frequencies("none", 64, 500000.0, freq_factors=divisors)
    np.testing.assert_array_equal(inv, gguf_inv)
    assert attn == 1.0


# -- bad parameters ------------------------------------------------------------------------------------------------

_LR = {"original_context": 4096, "short_factors": [1.0] * 16, "long_factors": [2.0] * 16}


@pytest.mark.parametrize("kind, n_rot, kwargs, message", [
    ("dynamic", 32, {}, "unknown rope scaling"),
    ("linear", 31, {}, "positive even integer"),
    ("linear", 32, {"factor": 0.0}, "factor must be a finite number > 0"),
    ("linear", 32, {"factor": -2.0}, "factor must be a finite number > 0"),
    ("yarn", 32, {"factor": 0.0, "original_context": 2048}, "factor must be a finite number > 0"),
    ("llama3", 32, {"factor": -1.0, "original_context": 2048}, "factor must be a finite number > 0"),
    ("linear", 32, {"factor": math.inf}, "factor must be a finite number > 0"),
    ("yarn", 32, {"factor": 4.0}, "'yarn' needs original_context > 0"),
    ("longrope", 32, {"factor": 4.0, "short_factors": [1.0] * 16, "long_factors": [1.0] * 16},
     "'longrope' needs original_context > 0"),
    ("llama3", 32, {"factor": 8.0}, "'llama3' needs original_context > 0"),
    ("longrope", 32, {**_LR, "long_factors": [2.0] * 15}, r"long_factors must have length n_rot/2 = 16"),
    ("longrope", 32, {**_LR, "short_factors": [1.0] * 32}, r"short_factors must have length n_rot/2 = 16"),
    ("longrope", 32, {**_LR, "short_factors": None}, "needs both short_factors and long_factors"),
    ("longrope", 32, {**_LR, "long_factors": [0.0] * 16}, "long_factors must be finite and > 0"),
    ("longrope", 32, {**_LR, "freq_factors": [1.0] * 16}, "not freq_factors as well"),
    ("linear", 32, {"long_factors": [1.0] * 16}, "only apply to 'longrope'"),
    ("none", 32, {"freq_factors": [1.0] * 8}, r"freq_factors must have length n_rot/2 = 16"),
    ("yarn", 32, {"original_context": 2048, "beta_fast": 1.0, "beta_slow": 32.0}, "beta_fast >= beta_slow"),
    ("yarn", 32, {"original_context": 2048, "beta_slow": 0.0}, "beta_slow must be a finite number > 0"),
    ("yarn", 32, {"original_context": 2048, "ext_factor": 1.5}, "ext_factor must be in"),
    ("yarn", 32, {"original_context": 2048, "attn_factor": 0.0}, "attn_factor must be a finite number > 0"),
    ("linear", 32, {"attn_factor": 1.2}, "has no attention factor"),
    ("llama3", 32, {"original_context": 2048, "low_freq_factor": 4.0, "high_freq_factor": 4.0},
     "high_freq_factor > low_freq_factor"),
    ("none", 32, {"context": -1}, "contexts must be >= 0"),
])
def test_bad_parameters_raise(kind, n_rot, kwargs, message):
    with pytest.raises(ValueError, match=message):
        frequencies(kind, n_rot, 10000.0, **kwargs)


def test_yarn_rejects_base_one():
    with pytest.raises(ValueError, match="freq_base > 1"):
        frequencies("yarn", 32, 1.0, factor=4.0, original_context=2048)
