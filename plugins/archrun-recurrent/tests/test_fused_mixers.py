"""Token mixers decode fused (their ops' layer kernels: `shortconv`, `mamba2`, `mamba`, `gated_deltanet` and
`gated_deltanet_tiled`, `kda`; each with a dense FFN or a mixture of experts), and so do gated attention layers
(`gated_causal`, `gated_causal_gate_proj`) and layers whose Mamba2 mixer runs beside the attention (`mamba2`'s
`fused_beside`: Falcon-H1), with the bits of the op-by-op path: on
copies of the families' tiny fixtures whose block matrices are Q8_0 (the fused and the op-by-op product kernels
of a quantized type compute one token alike; float32 products differ in rounding, numpy's BLAS against the
decode kernel), a mixer layer's fused step gives the op-by-op block's output and state bit for bit."""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pytest

import archrun
from archrun.conformance.fused_steps import check_fused_steps
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.kernels.decode.fusion import MixerBlock

FAMILIES = Path(__file__).resolve().parents[3] / "families"
# fixture -> its family package: LFM2 (short convolutions and attention; LFM2-MoE: a mixture of experts after the
# first layer), Mamba2 (mixers only, no FFN), Granite-4.0-style hybrids (Mamba2 and attention, a dense FFN or a
# mixture of experts with a shared expert), Mamba (no FFN; Falcon-Mamba's weightless dt/B/C norms), Jamba (Mamba
# and attention, dense FFNs and mixtures of experts), Qwen3-Next (gated DeltaNet with ssm_ba and gated attention, a
# mixture of experts in every layer), Qwen3.5 (tiled value heads, split beta/alpha; a dense FFN, or a mixture of
# experts), Kimi Linear (KDA and latent attention, dense FFNs then a mixture of experts)
FIXTURES = {"lfm2_ccac": "lfm2", "lfm2_accc_l2": "lfm2", "lfm2_acca_l4": "lfm2", "lfm2moe_ccac": "lfm2",
            "mamba2_g2_k3_tied": "mamba2", "mamba2_g4_hd32": "mamba2", "granitehybrid_mmam_dense": "granitehybrid",
            "granitehybrid_amm_moe": "granitehybrid", "mamba_k3_n24": "mamba", "falcon_mamba_k4": "mamba",
            "jamba_mmam_moe2": "jamba", "jamba_ammm_k3": "jamba", "jamba_mmam_dt32": "jamba",
            "qwen3next_dddA": "qwen3next", "qwen3next_dAdA_k3": "qwen3next", "qwen35_dddA": "qwen35",
            "qwen35moe_ddAd": "qwen35", "kimi_linear_mkkm_k3": "kimi-linear", "kimi_linear_dk32": "kimi-linear"}
# gated attention layers (the layer kernel gated_attention_layer): the gate per head in the query projection
# (Qwen3-Next), or a projection of its own (AFMoE: all heads, sliding windows, per-head Q/K norms, sandwich norms,
# a dense FFN or a mixture of experts with a shared expert and selection bias)
# (AFMoE built with experts 32 wide, so their matrices take Q8_0 blocks: the family's fixtures' are 16 wide)
GATED = {"qwen3next_dAdA_k3": "qwen3next", "afmoe_sssg_moe32": "afmoe", "afmoe_mha_top3_moe32": "afmoe"}
# Mamba2 beside the attention in every layer (Falcon-H1: one group, or two with the gated norm)
BESIDE = {"falcon_h1_g1": "falcon-h1", "falcon_h1_g2_norm": "falcon-h1"}
# built here from the family's HF arch (hf_arch.py; llama.cpp's converter): fixture -> (arch name, seed, config).
# Kimi Linear with KDA heads 32 wide: its rank-dk decay and gate projections (ssm_f_b, ssm_g_b) take Q8_0 blocks;
# Jamba with dt rank 32 (ssm_dt in Q8_0) and a mixture of experts in every layer
BUILT = {"kimi_linear_dk32": ("KIMI_LINEAR", 3, {"linear_head_dim": 32}),
         "jamba_mmam_dt32": ("JAMBA", 3, {"mamba_dt_rank": 32, "expert_layer_period": 1, "expert_layer_offset": 0}),
         "afmoe_sssg_moe32": ("AFMOE", 1, {"moe_intermediate_size": 32}),
         "afmoe_mha_top3_moe32": ("AFMOE", 2, {"moe_intermediate_size": 32, "num_experts_per_tok": 3,
                                               "num_key_value_heads": 4, "num_shared_experts": 2})}
# Mamba's dt projection takes R < 32 inputs in these fixtures: it stays F16, whose one-row product differs in
# its last bits between the op path's matmul and the decode kernel's product group; there the fused layer agrees
# with the op path to float rounding (every other float step is shared)
# (and Kimi Linear's KDA decay and gate projections take dk < 32 inputs in its family's fixtures: F16 too)
ROUNDED = {"falcon_mamba_k4", "mamba_k3_n24", "jamba_mmam_moe2", "jamba_ammm_k3", "kimi_linear_mkkm_k3"}
# a batch of these runs every layer op by op on its rows, the latent attention layers' op path rounding apart from
# their fused kernel (the mixer layers keep their bits)
BATCH_ROUNDED = ROUNDED | {"kimi_linear_dk32"}
MATRICES = ("shortconv.in_proj", "shortconv.out_proj", "ssm_in", "ssm_x", "ssm_dt", "ssm_out", "attn_q", "attn_k",
            "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_qkv", "attn_gate", "ssm_ba", "ssm_beta",
            "ssm_alpha", "ssm_f_a", "ssm_f_b", "ssm_g_a", "ssm_g_b")


def fixture(name: str, built: Path | None = None) -> Path:
    """The family's fixture file, or one BUILT into the folder `built`."""
    tests = FAMILIES / f"archrun-{({**FIXTURES, **GATED, **BESIDE})[name]}" / "tests"
    if name not in BUILT:
        return tests / "goldens" / f"{name}.gguf"
    from archrun.conformance import hf

    arch, seed, config = BUILT[name]
    spec = getattr(hf.load_module(tests / "hf_arch.py"), arch)
    model, _ = hf.build_tiny(spec, seed, **config)
    return hf.convert(model, built / f"{name}.gguf", spec, "f32", name=name.replace("_", "-"))


def _quantized(name: str) -> bool:
    return name in ("output.weight", "token_embd.weight") or any(f".{m}.weight" in name for m in MATRICES)


def _q8_0_copy(src: Path, dst: Path) -> Path:
    """src with the block matrices and the embeddings / output head in Q8_0 (gguf-py's quantizer), F16 where
    their rows are too short for Q8_0 blocks (the decode kernels of both compute one token alike too)."""
    import gguf

    r = gguf.GGUFReader(str(src))
    q8 = gguf.GGMLQuantizationType.Q8_0
    wanted = [t for t in r.tensors if len(t.shape) == 2 and _quantized(t.name)]
    quantized = {t.name: (gguf.quants.quantize(np.asarray(t.data, np.float32), q8), q8) if t.shape[0] % 32 == 0
                 else np.asarray(t.data, np.float16) for t in wanted}  # rows too short for Q8_0 blocks: F16
    return rewrite_gguf(src, dst, drop_tensors=tuple(quantized), add_tensors=quantized)


@pytest.fixture(scope="module", params=sorted(FIXTURES))
def q8_0(request, tmp_path_factory) -> tuple:
    """(fused, op-by-op) models of a Q8_0 copy of the fixture."""
    src = fixture(request.param, tmp_path_factory.mktemp("built"))
    path = _q8_0_copy(src, tmp_path_factory.mktemp("q8") / f"{request.param}.gguf")
    return archrun.load(path), archrun.load(path, fused=False), request.param in ROUNDED, request.param


def _states(cache) -> list[np.ndarray]:
    return [a.copy() for slot in cache.slots if hasattr(slot, "state") for a in slot.state.values()]


def test_mixer_layers_decode_one_call_per_layer(q8_0):
    fused, ops, _, _ = q8_0
    mixers = [lp.mixer is not None for lp in fused.plan.layers]
    assert fused.fused_blocks is not None and ops.fused_blocks is None and any(mixers)
    assert [isinstance(fb, MixerBlock) for fb in fused.fused_blocks] == mixers
    assert archrun.load(fixture("lfm2_ccac"), backend="reference").fused_blocks is None


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_mixer_layer_has_the_op_paths_bits(q8_0, threads):
    """Each mixer layer's fused step (MixerBlock) against the op-by-op block on the same input and
    state: the same output and the same new state, bit for bit."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    m, _, rounded, _ = q8_0
    same = (lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)) if rounded else \
        np.testing.assert_array_equal

    def same_state(f, o):
        for k, state in o.state.items():
            same(f.state[k], state)
        assert f.n == o.n

    check_fused_steps(m, same, same_state, threads, select=lambda fb: isinstance(fb, MixerBlock))


def test_fused_and_op_by_op_decode_agree(q8_0):
    """Whole models token by token (the attention layers' fused kernel and the head round apart from the op
    path's: float rounding, not bits)."""
    models = q8_0[:2]
    ids = np.random.default_rng(6).integers(0, models[0].descriptor.n_vocab, 10)
    caches = [model.init_cache(16) for model in models]
    for t in ids:
        a, b = (model.forward_step([t], cache) for model, cache in zip(models, caches, strict=True))
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(np.abs(b).max()))


def test_fused_steps_rewind_like_op_steps(q8_0):
    """A fused step keeps its state in the slot's ring: rewinding over fused steps restores it exactly."""
    fused, _, _, _ = q8_0
    ids = np.random.default_rng(4).integers(0, fused.descriptor.n_vocab, 8)
    cache = fused.init_cache(16)
    fused.forward_step(ids[:2], cache)
    for t in ids[2:5]:
        fused.forward_step([t], cache)
    kept = _states(cache)
    want = fused.forward_step(ids[5:6], cache)
    fused.forward_step(ids[6:7], cache)
    cache.rewind(2)
    assert all(np.array_equal(x, y) for x, y in zip(_states(cache), kept, strict=True))
    np.testing.assert_array_equal(fused.forward_step(ids[5:6], cache), want)


def test_a_batch_row_has_its_single_steps_bits(q8_0):
    """In a batch the mixer layers run op by op on the rows, the attention layers (if any) through the rows kernel:
    each sequence's logits are its fused one-token step's."""
    fused, _, _, name = q8_0
    rounded = name in BATCH_ROUNDED
    ids = np.random.default_rng(5).integers(0, fused.descriptor.n_vocab, 6)
    single, batched = [], [fused.init_cache(16) for _ in range(2)]
    for j, cache in enumerate(batched):
        alone = fused.init_cache(16)
        for c in (alone, cache):
            fused.forward_step(ids[j:j + 3], c)
        single.append(fused.forward_step(ids[5 - j:6 - j], alone))
    got = fused.forward_step_batch([ids[5:6], ids[4:5]], batched)
    for g, w in zip(got, single, strict=True):
        if rounded:  # the op path on the rows rounds apart (BATCH_ROUNDED)
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * float(np.abs(w).max()))
        else:
            np.testing.assert_array_equal(g, w)


@pytest.fixture(scope="module", params=sorted(GATED))
def gated(request, tmp_path_factory) -> tuple:
    """(fused, op-by-op) models of a Q8_0 copy of a fixture with gated attention layers, and its path."""
    src = fixture(request.param, tmp_path_factory.mktemp("built"))
    path = _q8_0_copy(src, tmp_path_factory.mktemp("q8") / f"{request.param}.gguf")
    return archrun.load(path), archrun.load(path, fused=False), path


def _gated_layer(fb) -> bool:
    from archrun_recurrent.kernels.gated_attention_layer import gated_attention_layer

    return getattr(fb, "_kernel", None) is gated_attention_layer


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_gated_attention_layer_has_the_op_paths_bits(gated, threads):
    """Each gated attention layer's fused step against the op-by-op block on the same input and cached rows:
    the same output and the same cache, bit for bit."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    m = gated[0]
    assert m.fused_blocks is not None and any(_gated_layer(fb) for fb in m.fused_blocks)

    def same_rows(f, o):
        np.testing.assert_array_equal(f.k, o.k)
        np.testing.assert_array_equal(f.v, o.v)

    check_fused_steps(m, np.testing.assert_array_equal, same_rows, threads, select=_gated_layer)


@pytest.fixture(scope="module", params=sorted(BESIDE))
def beside(request, tmp_path_factory) -> tuple:
    """The fused model of a Q8_0 copy of a fixture whose mixers run beside the attention, and its path."""
    path = _q8_0_copy(fixture(request.param), tmp_path_factory.mktemp("q8") / f"{request.param}.gguf")
    return archrun.load(path), path


@pytest.mark.parametrize("threads", [1, 2])
def test_a_mixer_beside_the_attention_has_the_op_paths_bits(beside, threads):
    """Each layer's fused step (BesideBlock: attention + Mamba2 on the same normed input) against the op-by-op
    block on the same input, cached rows and state: the same output, rows and state, bit for bit."""
    from archrun.kernels.decode.fusion import BesideBlock

    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs at most {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    m = beside[0]
    assert m.fused_blocks is not None and all(isinstance(fb, BesideBlock) for fb in m.fused_blocks)

    def same_slot(f, o):
        np.testing.assert_array_equal(f.attention.k, o.attention.k)
        np.testing.assert_array_equal(f.attention.v, o.attention.v)
        for k, state in o.mixer.state.items():
            np.testing.assert_array_equal(f.mixer.state[k], state)

    check_fused_steps(m, np.testing.assert_array_equal, same_slot, threads)


def test_a_model_with_mixers_beside_decodes_the_op_paths_bits(beside):
    """The whole model token by token, fused against op by op: the same logits, bit for bit."""
    from archrun.conformance.fused_steps import check_decode_bits

    check_decode_bits(*beside, 10)
