"""gpt-oss with MXFP4 experts (how released gpt-oss files store them): the fixture's experts
quantized by gguf-py. The reference backend must equal the same model with those experts
dequantized by gguf-py into float32 (so archrun decodes every MXFP4 block as ggml does); the fast
backend runs them exactly as Q8_0 blocks on its integer kernels, within the decode path's rounding."""

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
    # the experts run as exact Q8_0 blocks; both the prompt's products (the int8 GEMM) and a one-token
    # step quantize their activations to int8 blocks, as llama.cpp does (measured 1.1e-2 here, against
    # the float32 products of the dequantized file)
    assert _rel(model.logits(ids), want) <= 2e-2
    assert _rel(stepped, want) <= 2e-2
