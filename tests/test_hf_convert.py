"""The tiny HF->GGUF fixtures: files well formed, shapes in ggml order, goldens reproducible.

The default run needs only numpy and gguf-py (it reads tests/goldens/tiny/). Tests marked
``live`` rebuild the models with torch + transformers and skip when those are not installed.
Expected tensor sets and shapes follow llama.cpp's loaders (src/models/<arch>.cpp).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

TESTS_DIR = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    """Import a helper module from a file path once (tests/ is not a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


hf_convert = _load("hf_convert", TESTS_DIR / "hf_convert.py")
record_tiny = _load("record_tiny", TESTS_DIR / "goldens" / "record_tiny.py")

TINY = record_tiny.OUT_DIR
NAMES = [entry[0] for entry in record_tiny.FIXTURES]


def _golden(name: str) -> dict:
    with np.load(TINY / f"{name}.npz", allow_pickle=False) as z:
        out = {k: z[k] for k in z.files}
    for key in ("config_json", "fixture_json", "versions_json"):
        out[key.removesuffix("_json")] = json.loads(str(out.pop(key)))
    return out


def _reader(name: str) -> gguf.GGUFReader:
    return gguf.GGUFReader(TINY / f"{name}.gguf")


def _kv(reader: gguf.GGUFReader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _live():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


# ------------------------------------------------------------------ expected file content


def _head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def expected_tensors(arch: str, cfg: dict) -> dict[str, list[int]]:
    """GGUF tensor name -> ggml shape (ne, fastest first) that llama.cpp loads for ``cfg``."""
    n_embd, n_vocab = cfg["hidden_size"], cfg["vocab_size"]
    out = {"token_embd.weight": [n_embd, n_vocab], "output_norm.weight": [n_embd]}
    if not cfg["tie_word_embeddings"]:
        out["output.weight"] = [n_embd, n_vocab]
    n_layer = cfg["num_hidden_layers"]
    n_nextn = cfg.get("num_nextn_predict_layers", 0) if arch == "glm4moe" else 0
    for il in range(n_layer + n_nextn):
        out.update(_attention_tensors(arch, cfg, f"blk.{il}"))
        out.update(_ffn_tensors(arch, cfg, il, f"blk.{il}"))
        if il >= n_layer:
            out.update(_nextn_tensors(cfg, f"blk.{il}.nextn"))
    return out


def _attention_tensors(arch: str, cfg: dict, p: str) -> dict[str, list[int]]:
    n_embd, hd = cfg["hidden_size"], _head_dim(cfg)
    n_q, n_kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {f"{p}.attn_norm.weight": [n_embd], f"{p}.attn_q.weight": [n_embd, n_q],
           f"{p}.attn_k.weight": [n_embd, n_kv], f"{p}.attn_v.weight": [n_embd, n_kv],
           f"{p}.attn_output.weight": [n_q, n_embd]}
    if arch == "qwen2" or cfg.get("attention_bias"):
        out.update({f"{p}.attn_q.bias": [n_q], f"{p}.attn_k.bias": [n_kv], f"{p}.attn_v.bias": [n_kv]})
    if arch in ("qwen3", "qwen3moe", "gemma3") or cfg.get("use_qk_norm"):
        out.update({f"{p}.attn_q_norm.weight": [hd], f"{p}.attn_k_norm.weight": [hd]})
    if arch == "gemma3":
        out.update({f"{p}.post_attention_norm.weight": [n_embd], f"{p}.post_ffw_norm.weight": [n_embd]})
    return out


def _ffn_tensors(arch: str, cfg: dict, il: int, p: str) -> dict[str, list[int]]:
    n_embd = cfg["hidden_size"]
    norm = "post_attention_norm" if arch == "glm4moe" else "ffn_norm"  # glm: the pre-FFN norm
    out = {f"{p}.{norm}.weight": [n_embd]}
    moe = arch == "qwen3moe" or (arch == "glm4moe" and il >= cfg["first_k_dense_replace"])
    if not moe:
        n_ff = cfg["intermediate_size"]
        out.update({f"{p}.ffn_gate.weight": [n_embd, n_ff], f"{p}.ffn_up.weight": [n_embd, n_ff],
                    f"{p}.ffn_down.weight": [n_ff, n_embd]})
        return out
    n_exp = cfg.get("num_local_experts") or cfg["n_routed_experts"]
    n_ff = cfg["moe_intermediate_size"]
    out.update({f"{p}.ffn_gate_inp.weight": [n_embd, n_exp],
                f"{p}.ffn_gate_exps.weight": [n_embd, n_ff, n_exp],
                f"{p}.ffn_up_exps.weight": [n_embd, n_ff, n_exp],
                f"{p}.ffn_down_exps.weight": [n_ff, n_embd, n_exp]})
    if arch == "glm4moe":
        n_sh = n_ff * cfg["n_shared_experts"]
        out.update({f"{p}.exp_probs_b.bias": [n_exp], f"{p}.ffn_gate_shexp.weight": [n_embd, n_sh],
                    f"{p}.ffn_up_shexp.weight": [n_embd, n_sh], f"{p}.ffn_down_shexp.weight": [n_sh, n_embd]})
    return out


def _nextn_tensors(cfg: dict, p: str) -> dict[str, list[int]]:
    n_embd, n_vocab = cfg["hidden_size"], cfg["vocab_size"]
    return {f"{p}.eh_proj.weight": [2 * n_embd, n_embd], f"{p}.enorm.weight": [n_embd],
            f"{p}.hnorm.weight": [n_embd], f"{p}.shared_head_norm.weight": [n_embd],
            f"{p}.embed_tokens.weight": [n_embd, n_vocab], f"{p}.shared_head_head.weight": [n_embd, n_vocab]}


def expected_keys(arch: str, cfg: dict) -> dict[str, object]:
    """Metadata llama.cpp's converter writes for ``cfg`` (values as GGUFReader returns them)."""
    rope = cfg["rope_parameters"]
    n_nextn = cfg.get("num_nextn_predict_layers", 0) if arch == "glm4moe" else 0
    keys = {"block_count": cfg["num_hidden_layers"] + n_nextn,
            "context_length": cfg["max_position_embeddings"], "embedding_length": cfg["hidden_size"],
            "feed_forward_length": cfg["intermediate_size"],
            "attention.head_count": cfg["num_attention_heads"],
            "attention.head_count_kv": cfg["num_key_value_heads"],
            "attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"],
            "rope.freq_base": rope.get("full_attention", rope)["rope_theta"]}
    if cfg.get("head_dim") is not None:
        keys["attention.key_length"] = keys["attention.value_length"] = cfg["head_dim"]
    keys.update(_ARCH_KEYS[arch](cfg))
    return {f"{arch}.{k}": v for k, v in keys.items()}


def _glm4moe_keys(cfg: dict) -> dict[str, object]:
    return {"rope.dimension_count": int(_head_dim(cfg) * cfg["rope_parameters"]["partial_rotary_factor"]),
            "expert_count": cfg["n_routed_experts"], "expert_used_count": cfg["num_experts_per_tok"],
            "expert_feed_forward_length": cfg["moe_intermediate_size"],
            "expert_shared_count": cfg["n_shared_experts"],
            "leading_dense_block_count": cfg["first_k_dense_replace"],
            "expert_group_count": cfg["n_group"], "expert_group_used_count": cfg["topk_group"],
            "expert_gating_func": 2, "expert_weights_scale": cfg["routed_scaling_factor"],
            "expert_weights_norm": cfg["norm_topk_prob"],
            "nextn_predict_layers": cfg["num_nextn_predict_layers"]}


def _gemma3_keys(cfg: dict) -> dict[str, object]:
    keys = {"attention.sliding_window": cfg["sliding_window"],
            "rope.freq_base_swa": cfg["rope_parameters"]["sliding_attention"]["rope_theta"]}
    if cfg["final_logit_softcapping"]:
        keys["final_logit_softcapping"] = cfg["final_logit_softcapping"]
    return keys


_ARCH_KEYS = {
    "qwen3": lambda cfg: {},
    "qwen2": lambda cfg: {},
    "llama": lambda cfg: {"vocab_size": cfg["vocab_size"], "rope.dimension_count": _head_dim(cfg)},
    "qwen3moe": lambda cfg: {"expert_count": cfg["num_local_experts"],
                             "expert_used_count": cfg["num_experts_per_tok"],
                             "expert_feed_forward_length": cfg["moe_intermediate_size"]},
    "glm4moe": _glm4moe_keys,
    "gemma3": _gemma3_keys,
}


# ------------------------------------------------------------------------- stored files


def test_fixture_list_covers_the_brief():
    archs = [entry[1] for entry in record_tiny.FIXTURES]
    counts = {arch: archs.count(arch) for arch in hf_convert.ARCHES}
    assert counts["qwen3"] >= 3 and counts["qwen3moe"] >= 2 and counts["glm4moe"] >= 4
    assert counts["gemma3"] >= 2 and counts["llama"] >= 1 and counts["qwen2"] >= 1
    assert len(set(NAMES)) == len(NAMES)


def test_stored_files_exist_and_are_small():
    total = 0
    for name in NAMES:
        golden = _golden(name)
        path = TINY / golden["fixture"]["gguf"]
        assert path.stat().st_size < record_tiny.MAX_GGUF_BYTES
        assert hashlib.sha256(path.read_bytes()).hexdigest() == golden["fixture"]["gguf_sha256"]
        total += path.stat().st_size + (TINY / f"{name}.npz").stat().st_size
    assert total < record_tiny.MAX_TOTAL_BYTES


@pytest.mark.parametrize("name", NAMES)
def test_golden_arrays(name):
    golden = _golden(name)
    _, arch, seed, overrides = record_tiny.fixture(name)
    assert golden["fixture"] == {**golden["fixture"], "arch": arch, "seed": seed,
                                 "overrides": json.loads(json.dumps(overrides))}
    cfg, ids, logits = golden["config"], golden["ids"], golden["logits"]
    assert ids.dtype == np.int32 and ids.shape == (record_tiny.N_TOKENS,) and ids.max() < cfg["vocab_size"]
    assert logits.dtype == np.float32 and logits.shape == (len(ids), cfg["vocab_size"])
    assert np.isfinite(logits).all() and logits.std() > 0.5  # not trivially near zero
    assert {"torch", "transformers", "gguf"} <= set(golden["versions"])
    has_mtp = arch == "glm4moe" and cfg["num_nextn_predict_layers"] > 0
    assert ("mtp_logits" in golden) == has_mtp
    if has_mtp:
        assert golden["mtp_logits"].shape == (len(ids) - 1, cfg["vocab_size"])


@pytest.mark.parametrize("name", NAMES)
def test_gguf_tensors_and_shapes(name):
    golden, reader = _golden(name), _reader(name)
    arch = golden["fixture"]["arch"]
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    assert shapes == expected_tensors(arch, golden["config"])
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)


@pytest.mark.parametrize("name", NAMES)
def test_gguf_metadata(name):
    golden, kv = _golden(name), _kv(_reader(name))
    arch, cfg = golden["fixture"]["arch"], golden["config"]
    assert kv["general.architecture"] == arch
    for key, value in expected_keys(arch, cfg).items():
        assert kv[key] == pytest.approx(value), key
    assert kv["general.file_type"] == gguf.LlamaFileType.ALL_F32
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "qwen2"
    assert len(kv["tokenizer.ggml.tokens"]) == cfg["vocab_size"] == len(kv["tokenizer.ggml.token_type"])
    assert kv["tokenizer.ggml.merges"]
    assert kv["tokenizer.ggml.bos_token_id"] == cfg["bos_token_id"]
    assert kv["tokenizer.ggml.eos_token_id"] == cfg["eos_token_id"]


def test_gemma3_pattern_key_only_when_not_period_6():
    for name, arch, *_ in record_tiny.FIXTURES:
        if arch != "gemma3":
            continue
        cfg, kv = _golden(name)["config"], _kv(_reader(name))
        key = "gemma3.attention.sliding_window_pattern"
        default = [(i + 1) % 6 != 0 for i in range(cfg["num_hidden_layers"])]
        is_swa = [t == "sliding_attention" for t in cfg["layer_types"]]
        assert (key in kv) == (is_swa != default)
        if key in kv:
            assert [bool(v) for v in kv[key]] == is_swa
        assert is_swa.count(False) >= 1 and is_swa.count(True) >= 1  # both layer kinds appear


def test_norm_weights_are_random():
    """qwen3 q/k norms are not all ones; Gemma norms are stored as 1 + w with w not all zero."""
    for name, arch, *_ in record_tiny.FIXTURES:
        if arch not in ("qwen3", "gemma3"):
            continue
        norms = {t.name: np.asarray(t.data) for t in _reader(name).tensors if "norm" in t.name}
        for tname, w in norms.items():
            assert np.abs(w - 1.0).max() > 0.05 and abs(float(w.mean()) - 1.0) < 0.3, (name, tname)


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
    p = hf_convert.permute_qk(q, n_head).reshape(n_head, hd // 2, 2)
    a, b = p[..., 0], p[..., 1]
    norm = np.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(-1)
    np.testing.assert_allclose(norm, hf_convert.permute_qk(neox, n_head), rtol=1e-6, atol=1e-6)


def test_vocabulary_is_a_consistent_bpe():
    tokens, merges, types = hf_convert.vocabulary(hf_convert.N_VOCAB)
    assert len(tokens) == len(set(tokens)) == len(types) == hf_convert.N_VOCAB
    for merge in merges:
        a, b = merge.split(" ")
        assert a in tokens and b in tokens and a + b in tokens
    assert tokens[-2:] == [hf_convert.BOS_TOKEN, hf_convert.EOS_TOKEN] and types[-2:] == [3, 3]
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
    assert hf_convert.tensor_type(name, n_dims, dtype, types) == expected


# --------------------------------------------------------------------------------- live


@pytest.mark.live
@pytest.mark.parametrize("name", NAMES)
def test_goldens_match_live_hf(name):
    _live()
    golden = _golden(name)
    _, arch, seed, overrides = record_tiny.fixture(name)
    model, config = hf_convert.build_tiny(arch, seed, **overrides)
    fresh = json.loads(hf_convert.config_json(config))
    shared = (set(fresh) & set(golden["config"])) - {"transformers_version"}
    assert {k: fresh[k] for k in shared} == {k: golden["config"][k] for k in shared}
    np.testing.assert_array_equal(record_tiny.fixture_ids(name, config.vocab_size), golden["ids"])
    logits, hidden = record_tiny.hf_logits(model, golden["ids"])
    np.testing.assert_allclose(logits, golden["logits"], rtol=0, atol=1e-4)
    if "mtp_logits" in golden:
        mtp = record_tiny.hf_mtp_logits(model, golden["ids"], hidden)
        np.testing.assert_allclose(mtp, golden["mtp_logits"], rtol=0, atol=1e-4)


@pytest.mark.live
@pytest.mark.parametrize("name", NAMES)
def test_rebuilt_gguf_matches_stored(name, tmp_path):
    _live()
    _, arch, seed, overrides = record_tiny.fixture(name)
    model, _ = hf_convert.build_tiny(arch, seed, **overrides)
    path = hf_convert.convert(model, tmp_path / "x.gguf", arch, name=f"tiny-{name}")
    fresh, stored = gguf.GGUFReader(path), _reader(name)
    assert _kv(fresh).keys() == _kv(stored).keys()
    stored_tensors = {t.name: t for t in stored.tensors}
    for t in fresh.tensors:
        np.testing.assert_allclose(t.data, stored_tensors[t.name].data, rtol=0, atol=1e-6, err_msg=t.name)


@pytest.mark.live
def test_converted_weights_follow_llama_cpp_transforms(tmp_path):
    """Spot checks against the HF state: Q/K permutation, Gemma +1, expert split, router bias, MTP."""
    _live()
    llama, _ = hf_convert.build_tiny("llama", 1)
    got = _tensors(hf_convert.convert(llama, tmp_path / "l.gguf"))
    sd = {k: v.numpy() for k, v in llama.state_dict().items()}
    np.testing.assert_array_equal(got["blk.0.attn_k.weight"],
                                  hf_convert.permute_qk(sd["model.layers.0.self_attn.k_proj.weight"], 2))
    np.testing.assert_array_equal(got["blk.0.attn_v.weight"], sd["model.layers.0.self_attn.v_proj.weight"])
    gemma, _ = hf_convert.build_tiny("gemma3", 1)
    got = _tensors(hf_convert.convert(gemma, tmp_path / "g.gguf"))
    sd = {k: v.numpy() for k, v in gemma.state_dict().items()}
    np.testing.assert_allclose(got["blk.2.attn_q_norm.weight"], sd["model.layers.2.self_attn.q_norm.weight"] + 1)
    assert "output.weight" not in got
    glm, cfg = hf_convert.build_tiny("glm4moe", 1)
    got = _tensors(hf_convert.convert(glm, tmp_path / "m.gguf"))
    sd = {k: v.numpy() for k, v in glm.state_dict().items()}
    gate_up, n_ff = sd["model.layers.1.mlp.experts.gate_up_proj"], cfg.moe_intermediate_size
    np.testing.assert_array_equal(got["blk.1.ffn_gate_exps.weight"], gate_up[:, :n_ff])
    np.testing.assert_array_equal(got["blk.1.ffn_up_exps.weight"], gate_up[:, n_ff:])
    np.testing.assert_array_equal(got["blk.1.exp_probs_b.bias"], sd["model.layers.1.mlp.gate.e_score_correction_bias"])
    mtp = {k: v.numpy() for k, v in glm.archrun_mtp.state_dict().items()}
    np.testing.assert_array_equal(got["blk.3.nextn.eh_proj.weight"], mtp["layers.0.eh_proj.weight"])
    np.testing.assert_array_equal(got["blk.3.nextn.shared_head_norm.weight"], mtp["layers.0.post_norm.weight"])
    np.testing.assert_array_equal(got["blk.3.attn_q.weight"], mtp["layers.0.mtp_block.self_attn.q_proj.weight"])


def _tensors(path) -> dict[str, np.ndarray]:
    return {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}


@pytest.mark.live
def test_output_types_rename_and_quantized_overrides(tmp_path):
    _live()
    model, _ = hf_convert.build_tiny("glm4moe", 2, tie_word_embeddings=True)
    path = hf_convert.convert(model, tmp_path / "q.gguf", dtype="f16", rename_arch="tinyarch",
                              types={"blk.*.ffn_*_exps.weight": "q8_0"}, mtp_copies=False)
    reader = gguf.GGUFReader(path)
    kv, types = _kv(reader), {t.name: t.tensor_type.name for t in reader.tensors}
    assert kv["general.architecture"] == "tinyarch" and kv["tinyarch.block_count"] == 4
    assert not any(k.startswith("glm4moe.") for k in kv)
    assert kv["general.file_type"] == gguf.LlamaFileType.MOSTLY_F16
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.2.ffn_gate_inp.weight"] == "F32"
    assert types["blk.0.attn_q.weight"] == "F16" and types["token_embd.weight"] == "F16"
    assert types["blk.2.ffn_gate_exps.weight"] == "Q8_0"
    assert types["blk.2.ffn_down_exps.weight"] == "F16"  # rows of 16 do not fit Q8_0 blocks of 32
    assert "blk.3.nextn.embed_tokens.weight" not in types and "blk.3.nextn.eh_proj.weight" in types
