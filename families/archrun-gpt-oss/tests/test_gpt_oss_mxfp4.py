"""gpt-oss with MXFP4 experts (how released gpt-oss files store them): the fixture's experts
quantized by gguf-py. The reference backend must equal the same model with those experts
dequantized by gguf-py into float32 (so archrun decodes every MXFP4 block as ggml does); the fast
backend runs them as exact BF16 rows on float32 activations, within float32 summation's rounding."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import quants

import archrun
from archrun.conformance.gguf_edit import rewrite_gguf

GOLDENS = Path(__file__).parent / "goldens"
EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
MXFP4 = gguf.GGMLQuantizationType.MXFP4


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path, np.ndarray]:
    """(MXFP4-expert copy, copy with those experts dequantized to float32, prompt ids)."""
    src = GOLDENS / "gpt_oss_mxfp4_widths.gguf"
    quantized, dequantized = {}, {}
    for t in gguf.GGUFReader(str(src)).tensors:
        if t.name.endswith(EXPERTS):
            w = np.asarray(t.data, dtype=np.float32)           # [E, n_out, n_in]
            raw = quants.quantize(w, MXFP4)                     # [E, n_out, n_in / 32 * 17]
            quantized[t.name] = (raw, MXFP4)
            dequantized[t.name] = quants.dequantize(raw, MXFP4).astype(np.float32)
    out = tmp_path_factory.mktemp("mxfp4")
    q = rewrite_gguf(src, out / "mxfp4.gguf", drop_tensors=EXPERTS, add_tensors=quantized)
    f = rewrite_gguf(src, out / "dequantized.gguf", drop_tensors=EXPERTS, add_tensors=dequantized)
    return q, f, np.load(src.with_suffix(".npz"))["ids"].astype(np.int64)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_mxfp4_experts_decode_as_ggml_does(files):
    q, f, ids = files
    got = archrun.load(q, backend="reference").logits(ids)
    want = archrun.load(f, backend="reference").logits(ids)
    assert _rel(got, want) <= 1e-6


def test_fast_backend_runs_mxfp4_experts(files):
    q, f, ids = files
    model = archrun.load(q, backend="fast")
    want = archrun.load(f, backend="reference").logits(ids)
    cache = model.init_cache(len(ids))
    stepped = np.stack([model.forward_step([int(t)], cache) for t in ids])
    # the experts run as exact BF16 rows on float32 activations, the prompt's and a one-token step's products
    # alike: measured 8.5e-7 and 1.0e-6 against the dequantized file (int8 activations, llama.cpp's route for
    # MXFP4: 1.1e-2)
    assert _rel(model.logits(ids), want) <= 1e-5
    assert _rel(stepped, want) <= 1e-5
