"""MLA layers decode fused (the fast op's `fused_layer`: one kernel call per layer, dense FFN or mixture of
experts) with the bits of the op-by-op path. On copies of archrun-deepseek2's tiny fixtures whose widths are
made multiples of 32 (the q LoRA, the value heads, the experts: new random weights there) and whose block
matrices are Q8_0 (the fused and the op-by-op product kernels of a quantized type compute one token alike;
float32 products differ in rounding, numpy's BLAS against the decode kernel), each layer's fused step gives
the op-by-op block's output and latent cache row bit for bit, on one thread and on two."""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pytest

import archrun
from archrun.conformance.fused_steps import check_decode_bits, check_fused_steps
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.kernels.decode.fusion import FusedBlock

GOLDENS = Path(__file__).resolve().parents[3] / "families" / "archrun-deepseek2" / "tests" / "goldens"
Q_LORA, V_HEAD, EXPERT_FF = 32, 16, 32
# tensor -> its new numpy shape from the old one (n_head h, widths as the fixture has them)
RESHAPED = {
    "attn_q_a": lambda s: (Q_LORA, s[1]), "attn_q_a_norm": lambda s: (Q_LORA,), "attn_q_b": lambda s: (s[0], Q_LORA),
    "attn_v_b": lambda s: (s[0], V_HEAD, s[2]), "attn_output": lambda s: (s[0], s[1] // 12 * V_HEAD),
    "ffn_gate_exps": lambda s: (s[0], EXPERT_FF, s[2]), "ffn_up_exps": lambda s: (s[0], EXPERT_FF, s[2]),
    "ffn_down_exps": lambda s: (s[0], s[1], EXPERT_FF), "ffn_gate_shexp": lambda s: (EXPERT_FF, s[1]),
    "ffn_up_shexp": lambda s: (EXPERT_FF, s[1]), "ffn_down_shexp": lambda s: (s[0], EXPERT_FF)}
QUANTIZED = ("attn_q", "attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
             "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
             "ffn_gate_inp")


def _role(name: str) -> str:
    return name.split(".")[2] if name.startswith("blk.") else ""


def _widened_q8_0(src: Path, dst: Path) -> Path:
    """src with 32-multiple widths (new random weights where a width changes) and Q8_0 block matrices."""
    import gguf

    r = gguf.GGUFReader(str(src))
    rng = np.random.default_rng(11)
    arch = r.fields["general.architecture"].contents()
    tensors = {}
    for t in r.tensors:
        role, a = _role(t.name), np.asarray(t.data, np.float32)
        if role in RESHAPED:
            shape = RESHAPED[role](a.shape)
            a = (rng.normal(1.0, 0.1, shape) if role.endswith("norm") else rng.normal(0, 0.15, shape))
            a = a.astype(np.float32)
        if role in QUANTIZED or t.name in ("output.weight", "token_embd.weight"):
            q8 = gguf.GGMLQuantizationType.Q8_0
            tensors[t.name] = (gguf.quants.quantize(a, q8), q8)
        elif role in RESHAPED:
            tensors[t.name] = a
    keys = {f"{arch}.attention.value_length_mla": V_HEAD, f"{arch}.expert_feed_forward_length": EXPERT_FF}
    if f"{arch}.attention.q_lora_rank" in r.fields and any(_role(t.name) == "attn_q_a" for t in r.tensors):
        keys[f"{arch}.attention.q_lora_rank"] = Q_LORA
    return rewrite_gguf(src, dst, drop_tensors=tuple(tensors), add_tensors=tensors, add_keys=keys)


@pytest.fixture(scope="module", params=["deepseek3_qlora", "deepseek2_lite_softmax"])
def model(request, tmp_path_factory):
    """The fast model of a widened Q8_0 copy of the fixture: a dense first layer, then MoE layers (shared
    experts), with (deepseek3_qlora) and without (deepseek2_lite_softmax) a q LoRA."""
    path = _widened_q8_0(GOLDENS / f"{request.param}.gguf", tmp_path_factory.mktemp("mla") / f"{request.param}.gguf")
    return archrun.load(path), path


def test_mla_layers_decode_one_call_per_layer(model):
    model, _ = model
    assert model.fused_blocks is not None
    assert all(type(fb) is FusedBlock and not fb.dense for fb in model.fused_blocks)
    assert archrun.load(GOLDENS / "deepseek2_lite_softmax.gguf", backend="reference").fused_blocks is None


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_mla_layer_has_the_op_paths_bits(model, threads):
    """Each layer's fused step against the op-by-op block on the same input and cache: the same output and
    the same cached [k_pe | latent] rows, bit for bit."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    model, _ = model
    check_fused_steps(model, np.testing.assert_array_equal,
                      lambda f, o: np.testing.assert_array_equal(f.k, o.k), threads)


def test_fused_decode_is_the_op_by_op_decode(model):
    """Whole models token by token, fused against op by op (every layer and the head: the same bits)."""
    model, path = model
    check_decode_bits(model, path, 8)
