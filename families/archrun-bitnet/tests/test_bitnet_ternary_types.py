"""BitNet files whose projections are stored in the ternary types TQ1_0 / TQ2_0 (llama.cpp's
`llama-quantize ... TQ1_0`): archrun dequantizes them as gguf-py's reference does (no kernel yet: the
fast backend multiplies their float32 copy), so a file with ternary matrices computes exactly what the
same file with those matrices stored as float32 does."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import quants

import archrun
from archrun.conformance import hf
from archrun.conformance.gguf_edit import rewrite_gguf

GOLDEN = Path(__file__).parent / "goldens" / "bitnet_3layer_kv2.gguf"  # ffn_down rows of 256: a TQ block


@pytest.fixture(scope="module", params=["TQ1_0", "TQ2_0"])
def pair(request, tmp_path_factory):
    """(the fixture with every ffn_down in the ternary type, the same with those values as float32)."""
    qtype = gguf.GGMLQuantizationType[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    downs = {t.name: np.array(t.data, np.float32) for t in gguf.GGUFReader(str(GOLDEN)).tensors
             if t.name.endswith("ffn_down.weight")}
    packed = {name: quants.quantize(w, qtype) for name, w in downs.items()}
    ternary = rewrite_gguf(GOLDEN, tmp / "ternary.gguf", drop_tensors=list(downs),
                           add_tensors={name: (raw, int(qtype)) for name, raw in packed.items()})
    values = rewrite_gguf(GOLDEN, tmp / "values.gguf", drop_tensors=list(downs),
                          add_tensors={name: quants.dequantize(raw, qtype) for name, raw in packed.items()})
    return ternary, values


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_ternary_matrices_compute_their_values(pair, backend):
    ternary, values = pair
    ids = hf.load_golden(GOLDEN.with_suffix(".npz"))["ids"].astype(np.int64)
    got = archrun.load(ternary, backend=backend).logits(ids)
    want = archrun.load(values, backend="reference").logits(ids)
    assert hf.rel_err(got, want) <= 1e-6
