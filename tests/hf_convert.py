"""Tiny random HF transformers models and their conversion to GGUF, the way llama.cpp converts them.

The converter mirrors llama.cpp's ``convert_hf_to_gguf.py`` (``TextModel.set_gguf_parameters``
and the per-model classes ``LlamaModel``, ``Qwen2Model``, ``Qwen3Model``, ``Qwen3MoeModel``,
``Glm4MoeModel``, ``Gemma3Model``): the same metadata keys under the same conditions, tensor
names from gguf-py's own ``TensorNameMap``, llama's Q/K row permutation, Gemma's ``+1`` on every
``*norm.weight``, experts stacked into 3-D tensors, no ``output.weight`` when the embeddings are
tied, and llama.cpp's tensor type rules (1-D tensors, norms and routers stay F32).

Deliberate additions, each needed for a complete file llama.cpp can load:
- a small byte-level BPE vocabulary (256 byte tokens, real two-byte merges, ``<|bos|>`` and
  ``<|eos|>``), since the tiny models come without a tokenizer and llama.cpp's gpt2 vocab loader
  requires a non-empty merges list;
- gemma3 ``attention.sliding_window_pattern`` (a per-layer bool array) only when the model's
  ``layer_types`` differ from Gemma 3's fixed period of 6, which llama.cpp assumes otherwise;
- glm4moe MTP (nextn) layers: HF's ``Glm4MoeForCausalLM`` does not build them (the checkpoint's
  ``model.layers.<n_layer>.*`` are ignored on load), so ``build_tiny`` attaches a random
  ``transformers.modeling_layers.MtpModel`` and ``convert`` writes it under the checkpoint names
  llama.cpp maps: block ``n_layer + k`` with ``nextn.eh_proj/enorm/hnorm/shared_head_norm`` and,
  as released checkpoints ship them, copies of the embedding (``nextn.embed_tokens``) and of the
  output head (``nextn.shared_head_head``).

Keys llama.cpp's converter writes only when the HF config has the field are written the same way:
``key_length/value_length`` only with ``head_dim`` (not for qwen2), ``rope.dimension_count`` only
for llama and glm4moe, ``vocab_size`` only for llama. Gemma 3 uses ``query_pre_attn_scalar =
head_dim`` so HF's attention scale equals llama.cpp's ``1/sqrt(head_dim)`` (no key carries it).
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

ARCHES = ("qwen3", "qwen3moe", "llama", "qwen2", "glm4moe", "gemma3")
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
N_VOCAB = 288  # 256 byte tokens + 30 merges + bos + eos


@dataclass(frozen=True)
class Family:
    """One supported architecture: its HF classes, GGUF arch and tiny defaults."""

    gguf_arch: gguf.MODEL_ARCH
    model_class: str
    config_class: str
    model_type: str  # HF config.model_type
    defaults: dict[str, Any] = field(default_factory=dict)
    undo_permute: bool = False  # llama: Q/K rows permuted so NORM rope pairs adjacent values
    norm_shift: float = 0.0  # gemma3: HF RMSNorm is x*(1+w), GGUF stores 1+w


_COMMON = {
    "vocab_size": N_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "bos_token_id": N_VOCAB - 2,
    "eos_token_id": N_VOCAB - 1,
    "rope_theta": 10000.0,
}

FAMILIES: dict[str, Family] = {
    "qwen3": Family(
        gguf.MODEL_ARCH.QWEN3, "Qwen3ForCausalLM", "Qwen3Config", "qwen3",
        {**_COMMON, "num_hidden_layers": 3, "head_dim": 32},
    ),
    "qwen3moe": Family(
        gguf.MODEL_ARCH.QWEN3MOE, "Qwen3MoeForCausalLM", "Qwen3MoeConfig", "qwen3_moe",
        {**_COMMON, "num_hidden_layers": 2, "head_dim": 16, "moe_intermediate_size": 32,
         "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True},
    ),
    "llama": Family(
        gguf.MODEL_ARCH.LLAMA, "LlamaForCausalLM", "LlamaConfig", "llama",
        {**_COMMON, "num_hidden_layers": 2}, undo_permute=True,
    ),
    "qwen2": Family(
        gguf.MODEL_ARCH.QWEN2, "Qwen2ForCausalLM", "Qwen2Config", "qwen2",
        {**_COMMON, "num_hidden_layers": 2},
    ),
    "glm4moe": Family(
        gguf.MODEL_ARCH.GLM4_MOE, "Glm4MoeForCausalLM", "Glm4MoeConfig", "glm4_moe",
        {**_COMMON, "num_hidden_layers": 3, "moe_intermediate_size": 16, "n_routed_experts": 8,
         "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
         "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
         "use_qk_norm": False, "attention_bias": True, "partial_rotary_factor": 0.5,
         "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-5},
    ),
    "gemma3": Family(
        gguf.MODEL_ARCH.GEMMA3, "Gemma3ForCausalLM", "Gemma3TextConfig", "gemma3_text",
        {**_COMMON, "num_hidden_layers": 7, "intermediate_size": 48, "head_dim": 16, "query_pre_attn_scalar": 16,
         "sliding_window": 6, "tie_word_embeddings": True, "rope_theta": 1_000_000.0,
         "rope_local_base_freq": 10000.0, "hidden_activation": "gelu_pytorch_tanh"},
        norm_shift=1.0,
    ),
}

ARCH_OF_MODEL_TYPE = {fam.model_type: name for name, fam in FAMILIES.items()}


# --------------------------------------------------------------------------- tiny models


def tiny_config(arch: str, seed: int = 0, **overrides: Any):
    """Return the HF config of a tiny ``arch`` model: the family defaults updated by ``overrides``.

    ``seed`` does not change the config (it only drives the weights in ``build_tiny``); it is
    accepted so configs and models are addressed the same way. ``rope_theta``,
    ``rope_local_base_freq`` (gemma3) and ``partial_rotary_factor`` (glm4moe) are folded into
    transformers' ``rope_parameters``. Attention and experts run the eager reference code.
    """
    import transformers

    del seed
    fam = _family(arch)
    kw = {**fam.defaults, **overrides}
    kw["rope_parameters"] = _rope_parameters(arch, kw)
    kw.update(attn_implementation="eager", experts_implementation="eager")
    if arch == "qwen3moe":  # transformers 5 names it num_local_experts
        kw["num_local_experts"] = kw.pop("num_experts")
    return getattr(transformers, fam.config_class)(**kw)


def _rope_parameters(arch: str, kw: dict[str, Any]) -> dict[str, Any]:
    """Move the flat rope fields of ``kw`` into transformers 5's ``rope_parameters`` dict."""
    theta = kw.pop("rope_theta")
    if arch == "gemma3":
        local = kw.pop("rope_local_base_freq")
        return {
            "full_attention": {"rope_type": "default", "rope_theta": theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
        }
    params = {"rope_type": "default", "rope_theta": theta}
    if "partial_rotary_factor" in kw:
        params["partial_rotary_factor"] = kw.pop("partial_rotary_factor")
    return params


def build_tiny(arch: str, seed: int, **overrides: Any):
    """Build a tiny random float32 HF model, deterministically from ``(arch, seed, overrides)``.

    Returns ``(model, config)`` with the model in eval mode. Every persistent tensor is drawn
    from its own generator seeded by ``(seed, tensor name)``: matrices N(0, gain/sqrt(fan_in)),
    embeddings N(0, 0.25), biases and the router bias N(0, 0.1), norm weights random around 1
    (around 0 for Gemma, whose norms scale by 1+w). A glm4moe model with
    ``num_nextn_predict_layers > 0`` carries its random MTP module as ``model.archrun_mtp``.
    """
    import torch
    import transformers

    config = tiny_config(arch, seed, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, _family(arch).model_class)(config).eval()
    _randomize(model, seed, arch, prefix="")
    if arch == "glm4moe" and config.num_nextn_predict_layers > 0:
        from transformers.modeling_layers import MtpModel

        mtp = MtpModel(model, config.num_nextn_predict_layers).eval()
        _randomize(mtp, seed, arch, prefix="mtp.")
        model.__dict__["archrun_mtp"] = mtp  # plain attribute: not a submodule of the model
    return model, config


def _randomize(module, seed: int, arch: str, prefix: str) -> None:
    """Overwrite every persistent parameter/buffer of ``module`` in place (tied ones once)."""
    import torch

    persistent = set(module.state_dict())
    named = [*module.named_parameters(), *module.named_buffers()]
    with torch.no_grad():
        for name, tensor in named:
            if name not in persistent or (prefix and name.startswith(("embed_tokens", "shared_head"))):
                continue  # MTP shares the trunk's embedding and head
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32((prefix + name).encode()))
            tensor.copy_(_random_like(name, tensor, gen, gemma=arch == "gemma3"))


def _random_like(name: str, tensor, gen, gemma: bool):
    """A random tensor for parameter ``name`` (see ``build_tiny`` for the distributions)."""
    import torch

    noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
    if name.endswith("norm.weight"):
        return 0.3 * noise if gemma else 1.0 + 0.25 * noise
    if name.endswith(("bias", "e_score_correction_bias")):
        return 0.1 * noise
    if "embed_tokens" in name:
        return 0.25 * noise  # tied heads then give logits of std ~2
    gain = 2.0 if name.startswith("lm_head") or name.endswith("mlp.gate.weight") else 1.0
    return noise * (gain / tensor.shape[-1] ** 0.5)  # fan_in is the last torch dim


def _family(arch: str) -> Family:
    if arch not in FAMILIES:
        raise ValueError(f"unknown tiny arch {arch!r}; known: {', '.join(ARCHES)}")
    return FAMILIES[arch]


# --------------------------------------------------------------------------- conversion


def convert(
    model,
    path: str | Path,
    arch: str | None = None,
    dtype: str = "f32",
    rename_arch: str | None = None,
    *,
    types: Mapping[str, str] | None = None,
    mtp=None,
    mtp_copies: bool = True,
    name: str | None = None,
) -> Path:
    """Convert an in-memory float32 HF causal LM to a GGUF file at ``path``; return the path.

    ``arch`` defaults to the one matching ``model.config.model_type``. ``dtype`` ("f32", "f16",
    "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1") is the type of every tensor llama.cpp would
    quantize (2-D+ ``.weight`` except routers); ``types`` maps GGUF tensor-name globs to a type
    for those tensors only (e.g. ``{"blk.*.ffn_down*": "q8_0"}``). Tensors whose rows do not fit
    the quant block fall back to F16, as llama.cpp does. ``rename_arch`` writes the same content
    under another ``general.architecture`` (all ``<arch>.*`` keys renamed with it). ``mtp``
    overrides the glm4moe MTP module (default ``model.archrun_mtp``); ``mtp_copies=False`` leaves
    out the optional ``nextn.embed_tokens``/``nextn.shared_head_head`` copies.
    """
    arch = arch or ARCH_OF_MODEL_TYPE[model.config.model_type]
    fam = _family(arch)
    hp = model.config.to_dict()
    n_nextn = _nextn_layers(arch, hp)
    block_count = hp["num_hidden_layers"] + n_nextn
    file_type = _file_type(dtype)
    writer = gguf.GGUFWriter(str(path), rename_arch or gguf.MODEL_ARCH_NAMES[fam.gguf_arch])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name or f"tiny-{arch}")
    for method, value in metadata(arch, hp, block_count, file_type).items():
        getattr(writer, method)(value)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _write_tokenizer(writer, hp)
    if n_nextn:
        mtp = mtp if mtp is not None else getattr(model, "archrun_mtp", None)
        if mtp is None:
            raise ValueError("glm4moe with num_nextn_predict_layers > 0 needs an MTP module (build_tiny)")
    tensor_map = gguf.get_tensor_name_map(fam.gguf_arch, block_count)
    for hf_name, data in _hf_tensors(model, hp, mtp if n_nextn else None, mtp_copies):
        for hf_name2, data2 in _modify(fam, hp, hf_name, data):
            gguf_name = _map_name(tensor_map, hf_name2)
            _add_tensor(writer, gguf_name, data2, dtype, types)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _nextn_layers(arch: str, hp: Mapping[str, Any]) -> int:
    return int(hp.get("num_nextn_predict_layers") or 0) if arch == "glm4moe" else 0


def _file_type(dtype: str) -> gguf.LlamaFileType:
    names = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0",
             "q4_0": "MOSTLY_Q4_0", "q4_1": "MOSTLY_Q4_1", "q5_0": "MOSTLY_Q5_0", "q5_1": "MOSTLY_Q5_1"}
    if dtype.lower() not in names:
        raise ValueError(f"unsupported dtype {dtype!r}; known: {', '.join(names)}")
    return gguf.LlamaFileType[names[dtype.lower()]]


# ------------------------------------------------------------------- metadata (set_gguf_parameters)


def metadata(arch: str, hp: Mapping[str, Any], block_count: int, file_type) -> dict[str, Any]:
    """GGUFWriter method name -> value, as llama.cpp's converter sets them for ``arch``.

    Later entries replace earlier ones, as a repeated key does in llama.cpp's writer.
    """
    meta = _common_metadata(hp, block_count, file_type)
    meta.update(_ARCH_METADATA[arch](hp))
    return meta


def _common_metadata(hp: Mapping[str, Any], block_count: int, file_type) -> dict[str, Any]:
    """``TextModel.set_gguf_parameters`` for the fields tiny configs carry."""
    rope = hp.get("rope_parameters") or {}
    meta: dict[str, Any] = {
        "add_block_count": block_count,
        "add_context_length": hp["max_position_embeddings"],
        "add_embedding_length": hp["hidden_size"],
        "add_feed_forward_length": hp["intermediate_size"],
        "add_head_count": hp["num_attention_heads"],
        "add_head_count_kv": hp["num_key_value_heads"],
        "add_rope_freq_base": rope.get("full_attention", rope)["rope_theta"],
    }
    if "sliding_attention" in rope:
        meta["add_rope_freq_base_swa"] = rope["sliding_attention"]["rope_theta"]
    meta["add_layer_norm_rms_eps"] = hp["rms_norm_eps"]
    n_expert = hp.get("num_local_experts") or hp.get("n_routed_experts")
    if n_expert is not None:
        meta["add_expert_count"] = n_expert
    if hp.get("num_experts_per_tok") is not None:
        meta["add_expert_used_count"] = hp["num_experts_per_tok"]
    if hp.get("n_group") is not None:
        meta["add_expert_group_count"] = hp["n_group"]
        meta["add_expert_group_used_count"] = hp["topk_group"]
    if hp.get("head_dim") is not None:
        meta["add_key_length"] = hp["head_dim"]
        meta["add_value_length"] = hp["head_dim"]
    meta["add_file_type"] = file_type
    return meta


def _llama_metadata(hp: Mapping[str, Any]) -> dict[str, Any]:
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    return {"add_vocab_size": hp["vocab_size"], "add_rope_dimension_count": head_dim}


def _qwen_moe_metadata(hp: Mapping[str, Any]) -> dict[str, Any]:
    return {"add_expert_feed_forward_length": hp["moe_intermediate_size"]}


def _glm4moe_metadata(hp: Mapping[str, Any]) -> dict[str, Any]:
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    factor = hp["rope_parameters"].get("partial_rotary_factor", 0.5)
    meta = {
        "add_rope_dimension_count": int(head_dim * factor),
        "add_expert_count": hp["n_routed_experts"],
        "add_expert_feed_forward_length": hp["moe_intermediate_size"],
        "add_expert_shared_count": hp["n_shared_experts"],
        "add_leading_dense_block_count": hp["first_k_dense_replace"],
        "add_expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
        "add_expert_weights_scale": hp["routed_scaling_factor"],
        "add_expert_weights_norm": hp["norm_topk_prob"],
    }
    if hp.get("num_nextn_predict_layers") is not None:
        meta["add_nextn_predict_layers"] = hp["num_nextn_predict_layers"]
    return meta


def _gemma3_metadata(hp: Mapping[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "add_key_length": hp["head_dim"],
        "add_value_length": hp["head_dim"],
    }
    if hp.get("final_logit_softcapping"):
        meta["add_final_logit_softcapping"] = hp["final_logit_softcapping"]
    meta["add_sliding_window"] = hp["sliding_window"]
    default_types = [
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(hp["num_hidden_layers"])
    ]
    if hp["layer_types"] != default_types:  # llama.cpp assumes period 6 unless told (see module doc)
        meta["add_sliding_window_pattern"] = [t == "sliding_attention" for t in hp["layer_types"]]
    return meta


_ARCH_METADATA = {
    "qwen3": lambda hp: {},
    "qwen2": lambda hp: {},
    "llama": _llama_metadata,
    "qwen3moe": _qwen_moe_metadata,
    "glm4moe": _glm4moe_metadata,
    "gemma3": _gemma3_metadata,
}


# ------------------------------------------------------------------------------- tokenizer


def vocabulary(n_vocab: int) -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types) of the tiny byte-level BPE vocabulary with ``n_vocab`` tokens.

    Ids 0..255 are GPT-2's byte-to-unicode symbols in byte order, then two-symbol merges, then
    ``<|bos|>`` and ``<|eos|>`` (control tokens) as the last two ids.
    """
    byte_syms = _bytes_to_unicode()
    n_merges = n_vocab - 256 - 2
    if n_merges < 1:
        raise ValueError(f"tiny vocabulary needs at least 259 tokens, got {n_vocab}")
    merges = _merge_pairs()[:n_merges]
    if len(merges) < n_merges:
        raise ValueError(f"tiny vocabulary supports at most {256 + len(_merge_pairs()) + 2} tokens")
    tokens = byte_syms + [a + b for a, b in merges] + [BOS_TOKEN, EOS_TOKEN]
    types = [int(gguf.TokenType.NORMAL)] * (n_vocab - 2) + [int(gguf.TokenType.CONTROL)] * 2
    return tokens, [f"{a} {b}" for a, b in merges], types


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-in for each byte value 0..255, indexed by byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _merge_pairs() -> list[tuple[str, str]]:
    """Deterministic two-symbol merges: 'Ġ'+letter first, then common letter bigrams."""
    space = [("Ġ", c) for c in "tawsobcmfpdhilnegry"]
    letters = "theainorsl"
    pairs = [(a, b) for a in letters for b in letters if a != b]
    return space + pairs


def _write_tokenizer(writer: gguf.GGUFWriter, hp: Mapping[str, Any]) -> None:
    tokens, merges, types = vocabulary(hp["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(hp.get("bos_token_id") or tokens.index(BOS_TOKEN))
    writer.add_eos_token_id(_first(hp.get("eos_token_id")) or tokens.index(EOS_TOKEN))
    writer.add_add_bos_token(False)


def _first(value):
    return value[0] if isinstance(value, list) else value


# ------------------------------------------------------------------------------- tensors


def _hf_tensors(model, hp: Mapping[str, Any], mtp, mtp_copies: bool) -> Iterator[tuple[str, Any]]:
    """(checkpoint name, float32 torch tensor) as a safetensors checkpoint of ``model`` holds them."""
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and hp.get("tie_word_embeddings"):
            continue  # tied checkpoints carry no lm_head
        yield name, tensor.detach().float()
    if mtp is not None:
        yield from _mtp_tensors(model, hp, mtp, mtp_copies)


def _mtp_tensors(model, hp: Mapping[str, Any], mtp, mtp_copies: bool) -> Iterator[tuple[str, Any]]:
    """MtpModel weights under GLM-4.5 checkpoint names ``model.layers.<n_layer + k>.*``."""
    n_layer = hp["num_hidden_layers"]
    rename = {"post_norm.": "shared_head.norm.", "mtp_block.": ""}
    for name, tensor in mtp.state_dict().items():
        m = re.match(r"layers\.(\d+)\.(.*)", name)
        if m is None:
            continue  # embed_tokens / shared_head: the trunk's own, copied below
        rest = m.group(2)
        for old, new in rename.items():
            rest = rest.replace(old, new, 1) if rest.startswith(old) else rest
        yield f"model.layers.{n_layer + int(m.group(1))}.{rest}", tensor.detach().float()
    if mtp_copies:
        head = model.get_output_embeddings().weight
        for k in range(hp["num_nextn_predict_layers"]):
            bid = n_layer + k
            yield f"model.layers.{bid}.embed_tokens.weight", model.get_input_embeddings().weight.detach().float()
            yield f"model.layers.{bid}.shared_head.head.weight", head.detach().float()


def _modify(fam: Family, hp: Mapping[str, Any], name: str, data) -> Iterator[tuple[str, Any]]:
    """``modify_tensors``: split fused experts, llama Q/K permutation, Gemma norm shift."""
    if name.endswith("mlp.experts.gate_up_proj"):
        # (n_expert, 2*n_ff, n_embd): gate rows first -> ggml {n_embd, n_ff, n_expert} each
        n_ff = data.shape[-2] // 2
        base = name.removesuffix(".gate_up_proj")
        yield f"{base}.gate_proj.weight", data[..., :n_ff, :].contiguous()
        yield f"{base}.up_proj.weight", data[..., n_ff:, :].contiguous()
        return
    if name.endswith("mlp.experts.down_proj"):
        yield f"{name}.weight", data  # (n_expert, n_embd, n_ff) -> {n_ff, n_embd, n_expert}
        return
    if name.endswith("e_score_correction_bias"):
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
    if fam.undo_permute and name.endswith(("q_proj.weight", "q_proj.bias")):
        data = permute_qk(data, hp["num_attention_heads"])
    if fam.undo_permute and name.endswith(("k_proj.weight", "k_proj.bias")):
        data = permute_qk(data, hp["num_key_value_heads"])
    if fam.norm_shift and name.endswith("norm.weight"):
        data = data + fam.norm_shift
    yield name, data


def permute_qk(weights, n_head: int):
    """llama.cpp ``LlamaModel.permute``: per head, interleave the two rotary halves of the rows.

    HF rotates (x[i], x[i + d/2]); after this row order, GGUF's NORM rope rotates (x[2i], x[2i+1])
    of the same values. Works on a weight (rows, n_embd) or a bias (rows,).
    """
    rows = weights.shape[0]
    return (
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _map_name(tensor_map: gguf.TensorNameMap, hf_name: str) -> str:
    new = tensor_map.get_name(key=hf_name, try_suffixes=(".weight", ".bias"))
    if new is None:
        raise ValueError(f"cannot map tensor {hf_name!r}")
    return new


# llama.cpp keeps these in F32 whatever the output type (prepare_tensors)
_F32_ALWAYS = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")


def tensor_type(gguf_name: str, n_dims: int, dtype: str, types: Mapping[str, str] | None) -> str:
    """The GGML type name llama.cpp's rules give tensor ``gguf_name`` for output type ``dtype``."""
    if n_dims <= 1 or gguf_name.endswith("_norm.weight") or gguf_name.endswith(_F32_ALWAYS):
        return "F32"
    if not gguf_name.endswith(".weight"):
        return "F32"
    for pattern, qtype in (types or {}).items():
        if fnmatch.fnmatchcase(gguf_name, pattern):
            return qtype.upper()
    return dtype.upper()


def _add_tensor(writer, gguf_name: str, data, dtype: str, types) -> None:
    array = data.numpy().astype(np.float32)
    qname = tensor_type(gguf_name, array.ndim, dtype, types)
    qtype = gguf.GGMLQuantizationType[qname]
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(gguf_name, array)
        return
    try:
        raw = gguf.quants.quantize(array, qtype)
    except NotImplementedError as exc:
        raise ValueError(f"gguf-py cannot quantize {gguf_name} to {qname}") from exc
    except gguf.QuantError:  # rows not a multiple of the block: llama.cpp falls back to F16
        qtype = gguf.GGMLQuantizationType.F16
        raw = gguf.quants.quantize(array, qtype)
    writer.add_tensor(gguf_name, raw, raw_dtype=qtype)


def config_json(config) -> str:
    """The config as llama.cpp would read it from config.json (sorted keys, JSON)."""
    return json.dumps(copy.deepcopy(config.to_dict()), sort_keys=True, default=str)
