"""What the kit cannot know about phimoe: HF's PhimoeRotaryEmbedding divides by the short LongRoPE
factors at every length and scales cos/sin by Phi-3.5-MoE's short_mscale, not by the file's
converter-derived `rope.scaling.attn_factor`; the family states both."""

import warnings
from pathlib import Path

import numpy as np
import pytest

import archrun
from archrun.io.ggufio import GGUFFile

GOLDEN = Path(__file__).parent / "goldens" / "phimoe_4experts_bias.gguf"


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN.with_suffix(".npz")) as z:
        return z["ids"].astype(np.int64), z["logits"]


def _err(hints, golden):
    ids, ref = golden
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = archrun.load(GOLDEN, backend="reference", hints=hints)
    return float(np.abs(model.logits(ids) - ref).max() / np.abs(ref).max())


def test_file_carries_the_converter_magnitude():
    meta = GGUFFile(GOLDEN).metadata
    assert meta["phimoe.rope.scaling.attn_factor"] == pytest.approx((1 + np.log(32) / np.log(4096)) ** 0.5)


@pytest.mark.parametrize("hints", [
    {"rope_attn_scale": float((1 + np.log(32) / np.log(4096)) ** 0.5)},   # the file's magnitude
    {"tensor_names": {}, "ignored_tensors": ()},                           # long factors (context 131072)
])
def test_hf_rope_is_short_factors_and_short_mscale(hints, golden):
    assert _err({}, golden) < 1e-4
    assert _err(hints, golden) > 1e-2
