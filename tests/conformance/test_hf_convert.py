"""The tiny-HF kit (archrun.conformance.hf): converter rules, recorder, the families' fixture sets.

Architecture-specific expectations live with each family (families/<pkg>/tests). Here the
converter runs on synthetic ``HfArch`` descriptions defined in this file. The default run needs
only numpy and gguf-py; tests marked ``live`` build HF models with torch + transformers and skip
when those are not installed.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import gguf
import numpy as np
import pytest

from archrun.conformance import hf

FAMILIES = Path(__file__).resolve().parents[2] / "families"
SPECS = sorted(FAMILIES.glob("*/tests/hf_arch.py"))

# Synthetic architectures: HF classes under a GGUF name, each exercising some fix-ups.
DENSE = hf.HfArch("qwen3", "qwen3", "Qwen3ForCausalLM", "Qwen3Config",
                  defaults={"num_hidden_layers": 2, "head_dim": 16})
PERMUTED = hf.HfArch("llama", "llama", "LlamaForCausalLM", "LlamaConfig", defaults={"num_hidden_layers": 2},
                     permute_qk=True, norm_shift=1.0, norm_init=(0.0, 0.3))
MOE = hf.HfArch(
    "glm4moe", "glm4_moe", "Glm4MoeForCausalLM", "Glm4MoeConfig",
    defaults={"num_hidden_layers": 3, "moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
              "partial_rotary_factor": 0.5, "num_nextn_predict_layers": 0},
    tensor_renames={"e_score_correction_bias": "e_score_correction.bias"},
)


def _live():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


# ------------------------------------------------------------------ the families' fixture sets


def test_every_family_describes_its_fixtures():
    assert SPECS, "no families/*/tests/hf_arch.py"
    seen: dict[str, Path] = {}
    for path in SPECS:
        spec = hf.load_module(path)
        assert spec.ARCHES and spec.FIXTURES, path
        assert all(isinstance(a, hf.HfArch) for a in spec.ARCHES), path
        # archrun's converter names tensors through the installed gguf-py; llama.cpp's converter brings
        # its own gguf-py, which may know architectures (deepseek32) the installed one does not
        assert all(a.gguf_arch for a in spec.ARCHES if a.converter == "archrun"), path
        for fixture in spec.FIXTURES:
            assert isinstance(fixture, hf.TinyFixture)
            assert fixture.arch in {a.name for a in spec.ARCHES} | {a.model_type for a in spec.ARCHES}, fixture
            assert fixture.name not in seen, f"{fixture.name} in {path} and {seen[fixture.name]}"
            seen[fixture.name] = path
            assert (path.parent / "goldens" / f"{fixture.name}.gguf").exists(), fixture.name
        assert (path.parent / "goldens" / "record.py").exists(), path


def test_load_module_keeps_same_named_helpers_apart():
    modules = [hf.load_module(p) for p in SPECS]
    assert len({m.__name__ for m in modules}) == len(SPECS)
    assert hf.load_module(SPECS[0]) is modules[0]


# ----------------------------------------------------------------------------- no torch


def test_permute_qk_turns_neox_rope_into_norm_rope():
    """HF rotate_half rope on rows == adjacent-pair (NORM) rope on llama.cpp-permuted rows."""
    rng = np.random.default_rng(0)
    n_head, hd, pos = 3, 8, 5.0
    q = rng.standard_normal(n_head * hd).astype(np.float32)
    theta = pos * 10000.0 ** (-np.arange(0, hd, 2) / hd)  # (hd/2,)
    cos, sin = np.cos(theta), np.sin(theta)
    heads = q.reshape(n_head, hd)
    x1, x2 = heads[:, : hd // 2], heads[:, hd // 2 :]
    neox = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=1).reshape(-1)
    p = hf.permute_qk(q, n_head).reshape(n_head, hd // 2, 2)
    a, b = p[..., 0], p[..., 1]
    norm = np.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(-1)
    np.testing.assert_allclose(norm, hf.permute_qk(neox, n_head), rtol=1e-6, atol=1e-6)


def test_vocabulary_is_a_consistent_bpe():
    tokens, merges, types = hf.vocabulary(hf.N_VOCAB)
    assert len(tokens) == len(set(tokens)) == len(types) == hf.N_VOCAB
    for merge in merges:
        a, b = merge.split(" ")
        assert a in tokens and b in tokens and a + b in tokens
    assert tokens[-2:] == [hf.BOS_TOKEN, hf.EOS_TOKEN] and types[-2:] == [3, 3]
    assert tokens[ord(" ")] == "Ġ" and tokens[ord("a")] == "a"


@pytest.mark.parametrize(
    ("name", "n_dims", "dtype", "types", "expected"),
    [
        ("blk.0.attn_norm.weight", 1, "q8_0", None, "F32"),
        ("blk.0.attn_q_norm.weight", 1, "f16", None, "F32"),
        ("blk.1.ffn_gate_inp.weight", 2, "q8_0", None, "F32"),
        ("blk.1.exp_probs_b.bias", 1, "f16", None, "F32"),
        ("blk.0.attn_q.bias", 1, "f16", None, "F32"),
        ("blk.0.attn_q.weight", 2, "f16", None, "F16"),
        ("blk.1.ffn_down_exps.weight", 3, "f32", {"blk.*.ffn_down*": "q8_0"}, "Q8_0"),
        ("token_embd.weight", 2, "q4_0", None, "Q4_0"),
    ],
)
def test_tensor_type_rules(name, n_dims, dtype, types, expected):
    assert hf.tensor_type(name, n_dims, dtype, types) == expected


def test_unknown_gguf_architecture_is_refused():
    with pytest.raises(ValueError, match="no-such-arch"):
        _ = attrs.evolve(DENSE, name="no-such-arch").gguf_arch


# --------------------------------------------------------------------------------- live


@pytest.mark.live
def test_build_tiny_is_deterministic():
    _live()
    a, _ = hf.build_tiny(DENSE, 3)
    b, _ = hf.build_tiny(DENSE, 3, rms_norm_eps=1e-5)  # the config does not move the weights
    c, _ = hf.build_tiny(DENSE, 4)
    for name, tensor in a.state_dict().items():
        assert (tensor == b.state_dict()[name]).all(), name
    assert not (a.state_dict()["model.embed_tokens.weight"] == c.state_dict()["model.embed_tokens.weight"]).any()


@pytest.mark.live
def test_permutation_and_norm_shift(tmp_path):
    """Q/K rows permuted by their own head counts, V untouched, norms stored + shift (drawn around 0)."""
    _live()
    model, _ = hf.build_tiny(PERMUTED, 1)
    got = hf.gguf_tensors(hf.convert(model, tmp_path / "p.gguf", PERMUTED))
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    attn = "model.layers.0.self_attn"
    np.testing.assert_array_equal(got["blk.0.attn_q.weight"], hf.permute_qk(sd[f"{attn}.q_proj.weight"], 4))
    np.testing.assert_array_equal(got["blk.0.attn_k.weight"], hf.permute_qk(sd[f"{attn}.k_proj.weight"], 2))
    np.testing.assert_array_equal(got["blk.0.attn_v.weight"], sd[f"{attn}.v_proj.weight"])
    norm = sd["model.layers.1.input_layernorm.weight"]
    assert abs(float(norm.mean())) < 0.3 and np.abs(norm).max() > 0.05
    np.testing.assert_allclose(got["blk.1.attn_norm.weight"], norm + 1)
    assert "output.weight" in got


@pytest.mark.live
def test_experts_are_split_and_renames_applied(tmp_path):
    _live()
    model, cfg = hf.build_tiny(MOE, 1, tie_word_embeddings=True)
    got = hf.gguf_tensors(hf.convert(model, tmp_path / "m.gguf", MOE))
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    gate_up, n_ff = sd["model.layers.1.mlp.experts.gate_up_proj"], cfg.moe_intermediate_size
    np.testing.assert_array_equal(got["blk.1.ffn_gate_exps.weight"], gate_up[:, :n_ff])
    np.testing.assert_array_equal(got["blk.1.ffn_up_exps.weight"], gate_up[:, n_ff:])
    np.testing.assert_array_equal(got["blk.1.ffn_down_exps.weight"], sd["model.layers.1.mlp.experts.down_proj"])
    np.testing.assert_array_equal(got["blk.1.exp_probs_b.bias"], sd["model.layers.1.mlp.gate.e_score_correction_bias"])
    assert "output.weight" not in got  # tied


@pytest.mark.live
def test_output_types_rename_and_quantized_overrides(tmp_path):
    _live()
    model, _ = hf.build_tiny(MOE, 2, tie_word_embeddings=True)
    path = hf.convert(model, tmp_path / "q.gguf", MOE, dtype="f16", rename_arch="tinyarch",
                      types={"blk.*.ffn_*_exps.weight": "q8_0"})
    reader = gguf.GGUFReader(path)
    kv, types = hf.gguf_kv(reader), {t.name: t.tensor_type.name for t in reader.tensors}
    assert kv["general.architecture"] == "tinyarch" and kv["tinyarch.block_count"] == 3
    assert not any(k.startswith("glm4moe.") for k in kv)
    assert kv["general.file_type"] == gguf.LlamaFileType.MOSTLY_F16
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.2.ffn_gate_inp.weight"] == "F32"
    assert types["blk.0.attn_q.weight"] == "F16" and types["token_embd.weight"] == "F16"
    assert types["blk.2.ffn_gate_exps.weight"] == "Q8_0"
    assert types["blk.2.ffn_down_exps.weight"] == "F16"  # rows of 16 do not fit Q8_0 blocks of 32


@pytest.mark.live
def test_mtp_layers_need_an_mtp_module(tmp_path):
    _live()
    with_mtp = attrs.evolve(MOE, mtp=hf.HfMtp("num_nextn_predict_layers", lambda *args: iter(())))
    model, _ = hf.build_tiny(MOE, 1, num_nextn_predict_layers=1)  # MOE attaches no MTP module
    with pytest.raises(ValueError, match="needs an MTP module"):
        hf.convert(model, tmp_path / "x.gguf", with_mtp)


@pytest.mark.live
def test_recorder_writes_goldens_the_checks_accept(tmp_path, capsys):
    """record_main -> check_golden_files, check_gguf_layout, check_fixture and check_live pass."""
    _live()
    fixture = hf.TinyFixture("dense_tied", "qwen3", 5, {"tie_word_embeddings": True})
    hf.record_main([DENSE], [fixture], tmp_path, argv=[])
    assert "recorded dense_tied.npz" in capsys.readouterr().out
    hf.check_golden_files(tmp_path, [DENSE], [fixture])
    cfg = hf.load_golden(tmp_path / "dense_tied.npz")["config"]
    hf.check_gguf_layout(tmp_path / "dense_tied.gguf", hf.llama_cpp_tensors(cfg, qk_norm=True),
                         hf.llama_cpp_keys("qwen3", cfg))
    hf.check_fixture(tmp_path / "dense_tied.gguf")
    (tmp_path / "rebuilt").mkdir()
    hf.check_live(tmp_path, [DENSE], fixture, tmp_path / "rebuilt")
    with pytest.raises(AssertionError, match="differ"):
        hf.check_golden_files(tmp_path, [DENSE], [attrs.evolve(fixture, name="other")])
