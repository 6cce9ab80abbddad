"""What a family's tests assert on its goldens: ``check_fixture`` / ``check_golden_files`` /
``check_gguf_layout`` / ``check_live``, and the expected llama.cpp keys and tensors of a file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from archrun.conformance.hf.convert import config_json, convert
from archrun.conformance.hf.goldens import load_golden
from archrun.conformance.hf.models import HfArch, TinyFixture, build_tiny
from archrun.conformance.hf.record import (
    MAX_GGUF_BYTES,
    MAX_TOTAL_BYTES,
    _sha256,
    _total_bytes,
    arch_of,
    fixture_ids,
    hf_logits,
    hf_mtp_logits,
)
from archrun.conformance.limits import N_TOKENS

BACKENDS = ("reference", "fast")


def check_golden_files(goldens: str | Path, arches: Sequence[HfArch], fixtures: Sequence[TinyFixture]) -> None:
    """Assert a family's goldens folder holds exactly ``fixtures``, as ``record`` writes them.

    Checks file sizes, sha256s, the stored fixture entry, array dtypes and shapes (MTP logits
    exactly when the arch has MTP layers), and the GGUF's generic content (architecture, F32
    tensors, the tiny tokenizer).
    """
    goldens = Path(goldens)
    names = [f.name for f in fixtures]
    assert len(set(names)) == len(names), "duplicate fixture names"
    assert sorted(p.stem for p in goldens.glob("*.gguf")) == sorted(names), "goldens and fixture list differ"
    assert _total_bytes(goldens) < MAX_TOTAL_BYTES
    for fixture in fixtures:
        _check_golden(goldens, arch_of(arches, fixture), fixture)


FIXTURE_TYPES = frozenset({gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.I8, gguf.GGMLQuantizationType.I16,
                           gguf.GGMLQuantizationType.I32, gguf.GGMLQuantizationType.I64})


def _check_golden(goldens: Path, arch: HfArch, fixture: TinyFixture) -> None:
    name = fixture.name
    golden = load_golden(goldens / f"{name}.npz")
    stored = golden["fixture"]
    path = goldens / stored["gguf"]
    assert path.stat().st_size < MAX_GGUF_BYTES, name
    assert _sha256(path) == stored["gguf_sha256"], f"{name}: GGUF differs from the one recorded"
    assert (stored["name"], stored["arch"], stored["seed"]) == (name, arch.name, fixture.seed), name
    assert stored["overrides"] == json.loads(json.dumps(dict(fixture.overrides))), name
    cfg, ids, logits = golden["config"], golden["ids"], golden["logits"]
    assert ids.dtype == np.int32 and ids.shape == (N_TOKENS,) and ids.max() < cfg["vocab_size"], name
    assert logits.dtype == np.float32 and logits.shape == (len(ids), cfg["vocab_size"]), name
    assert np.isfinite(logits).all() and logits.std() > 0.5, name  # not trivially near zero
    assert {"torch", "transformers", "gguf"} <= set(golden["versions"]), name
    has_mtp = arch.mtp is not None and cfg.get(arch.mtp.layers_key, 0) > 0
    assert ("mtp_logits" in golden) == has_mtp, name
    if has_mtp:
        assert golden["mtp_logits"].shape == (len(ids) - 1, cfg["vocab_size"]), name
    reader = gguf.GGUFReader(path)
    kv = gguf_kv(reader)
    assert kv["general.architecture"] == arch.name, name
    # float32 throughout; integer tables (e.g. a token -> experts map) are data, not weights
    assert all(t.tensor_type in FIXTURE_TYPES for t in reader.tensors), name
    # (llama.cpp's converter writes no file type for some architectures, e.g. gptneox)
    assert kv.get("general.file_type", gguf.LlamaFileType.ALL_F32) == gguf.LlamaFileType.ALL_F32, name
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "qwen2", name
    assert len(kv["tokenizer.ggml.tokens"]) == cfg["vocab_size"] == len(kv["tokenizer.ggml.token_type"]), name
    assert kv["tokenizer.ggml.merges"], name
    assert kv["tokenizer.ggml.bos_token_id"] == cfg["bos_token_id"], name
    assert kv["tokenizer.ggml.eos_token_id"] == cfg["eos_token_id"], name


def gguf_kv(reader: gguf.GGUFReader) -> dict[str, Any]:
    """The metadata of a GGUF file, without the ``GGUF.*`` header fields."""
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def gguf_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """Tensor name -> data of a GGUF file (ggml order)."""
    return {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}


def head_dim(cfg: Mapping[str, Any]) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def llama_cpp_keys(arch: str, cfg: Mapping[str, Any], n_nextn: int = 0, **extra: Any) -> dict[str, Any]:
    """The ``<arch>.*`` keys llama.cpp's converter writes for any ``cfg``, updated by the ``extra`` keys.

    ``extra`` uses the key names after ``<arch>.`` (e.g. ``rope.dimension_count``); pass them as
    ``**{"rope.dimension_count": 16}``. Values as GGUFReader returns them.
    """
    rope = cfg["rope_parameters"]
    keys = {"block_count": cfg["num_hidden_layers"] + n_nextn,
            "context_length": cfg["max_position_embeddings"], "embedding_length": cfg["hidden_size"],
            "feed_forward_length": cfg["intermediate_size"],
            "attention.head_count": cfg["num_attention_heads"],
            "attention.head_count_kv": cfg["num_key_value_heads"],
            "attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"],
            "rope.freq_base": rope.get("full_attention", rope)["rope_theta"]}
    if cfg.get("head_dim") is not None:
        keys["attention.key_length"] = keys["attention.value_length"] = cfg["head_dim"]
    keys.update(extra)
    return {f"{arch}.{k}": v for k, v in keys.items()}


def llama_cpp_tensors(
    cfg: Mapping[str, Any],
    *,
    qkv_bias: bool = False,
    qk_norm: bool = False,
    sandwich_norms: bool = False,
    ffn_norm: str = "ffn_norm",
    moe_layers: Sequence[int] = (),
    n_expert: int = 0,
    n_ff_expert: int = 0,
    n_ff_shared: int = 0,
    router_bias: bool = False,
    n_nextn: int = 0,
) -> dict[str, list[int]]:
    """GGUF tensor name -> ggml shape (ne, fastest first) that a llama.cpp loader expects for ``cfg``.

    The options name what an architecture's loader (llama.cpp ``src/models/<arch>.cpp``) adds to
    a dense pre-norm transformer: Q/K/V biases, per-head Q/K norms, post-attention/post-FFN norms,
    the pre-FFN norm's name, expert stacks on ``moe_layers`` (with ``n_ff_shared`` > 0 shared
    experts, ``router_bias`` a selection bias), and ``n_nextn`` MTP blocks after the trunk.
    """
    n_embd, n_vocab = cfg["hidden_size"], cfg["vocab_size"]
    hd = head_dim(cfg)
    n_q, n_kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {"token_embd.weight": [n_embd, n_vocab], "output_norm.weight": [n_embd]}
    if not cfg["tie_word_embeddings"]:
        out["output.weight"] = [n_embd, n_vocab]
    n_layer = cfg["num_hidden_layers"]
    for il in range(n_layer + n_nextn):
        p = f"blk.{il}"
        out.update({f"{p}.attn_norm.weight": [n_embd], f"{p}.attn_q.weight": [n_embd, n_q],
                    f"{p}.attn_k.weight": [n_embd, n_kv], f"{p}.attn_v.weight": [n_embd, n_kv],
                    f"{p}.attn_output.weight": [n_q, n_embd], f"{p}.{ffn_norm}.weight": [n_embd]})
        if qkv_bias:
            out.update({f"{p}.attn_q.bias": [n_q], f"{p}.attn_k.bias": [n_kv], f"{p}.attn_v.bias": [n_kv]})
        if qk_norm:
            out.update({f"{p}.attn_q_norm.weight": [hd], f"{p}.attn_k_norm.weight": [hd]})
        if sandwich_norms:
            out.update({f"{p}.post_attention_norm.weight": [n_embd], f"{p}.post_ffw_norm.weight": [n_embd]})
        if il not in moe_layers:
            n_ff = cfg["intermediate_size"]
            out.update({f"{p}.ffn_gate.weight": [n_embd, n_ff], f"{p}.ffn_up.weight": [n_embd, n_ff],
                        f"{p}.ffn_down.weight": [n_ff, n_embd]})
        else:
            out.update({f"{p}.ffn_gate_inp.weight": [n_embd, n_expert],
                        f"{p}.ffn_gate_exps.weight": [n_embd, n_ff_expert, n_expert],
                        f"{p}.ffn_up_exps.weight": [n_embd, n_ff_expert, n_expert],
                        f"{p}.ffn_down_exps.weight": [n_ff_expert, n_embd, n_expert]})
            if router_bias:
                out[f"{p}.exp_probs_b.bias"] = [n_expert]
            if n_ff_shared:
                out.update({f"{p}.ffn_gate_shexp.weight": [n_embd, n_ff_shared],
                            f"{p}.ffn_up_shexp.weight": [n_embd, n_ff_shared],
                            f"{p}.ffn_down_shexp.weight": [n_ff_shared, n_embd]})
        if il >= n_layer:
            q = f"{p}.nextn"
            out.update({f"{q}.eh_proj.weight": [2 * n_embd, n_embd], f"{q}.enorm.weight": [n_embd],
                        f"{q}.hnorm.weight": [n_embd], f"{q}.shared_head_norm.weight": [n_embd],
                        f"{q}.embed_tokens.weight": [n_embd, n_vocab],
                        f"{q}.shared_head_head.weight": [n_embd, n_vocab]})
    return out


def check_gguf_layout(gguf_path: str | Path, tensors: Mapping[str, list[int]], keys: Mapping[str, Any]) -> None:
    """Assert the GGUF holds exactly ``tensors`` (ggml shapes) and at least ``keys`` (approx. values)."""
    import pytest

    reader = gguf.GGUFReader(gguf_path)
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    assert shapes == dict(tensors)
    kv = gguf_kv(reader)
    for key, value in keys.items():
        assert key in kv, key
        assert kv[key] == pytest.approx(value), key


def check_live(goldens: str | Path, arches: Sequence[HfArch], fixture: TinyFixture, tmp_path: str | Path) -> None:
    """Rebuild ``fixture`` with torch + transformers; assert it reproduces the stored goldens.

    Same config (fields both have), ids, HF logits (and MTP logits) within 1e-4, and a
    re-converted GGUF with the same keys and tensors within 1e-6. Skips the calling test when
    torch or transformers is not installed.
    """
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    goldens, arch = Path(goldens), arch_of(arches, fixture)
    golden = load_golden(goldens / f"{fixture.name}.npz")
    model, config = build_tiny(arch, fixture.seed, **fixture.overrides)
    fresh = json.loads(config_json(config))
    shared = (set(fresh) & set(golden["config"])) - {"transformers_version"}
    assert {k: fresh[k] for k in shared} == {k: golden["config"][k] for k in shared}
    np.testing.assert_array_equal(fixture_ids(fixture.name, config.vocab_size), golden["ids"])
    logits, hidden = hf_logits(model, golden["ids"])
    np.testing.assert_allclose(logits, golden["logits"], rtol=0, atol=1e-4)
    if "mtp_logits" in golden:
        mtp = hf_mtp_logits(model, golden["ids"], hidden)
        np.testing.assert_allclose(mtp, golden["mtp_logits"], rtol=0, atol=1e-4)
    path = convert(model, Path(tmp_path) / f"{fixture.name}.gguf", arch, name=f"tiny-{fixture.name}")
    fresh_reader, stored_reader = gguf.GGUFReader(path), gguf.GGUFReader(goldens / f"{fixture.name}.gguf")
    assert gguf_kv(fresh_reader).keys() == gguf_kv(stored_reader).keys()
    stored_tensors = {t.name: t for t in stored_reader.tensors}
    assert {t.name for t in fresh_reader.tensors} == stored_tensors.keys()
    for t in fresh_reader.tensors:
        np.testing.assert_allclose(t.data, stored_tensors[t.name].data, rtol=0, atol=1e-6, err_msg=t.name)
