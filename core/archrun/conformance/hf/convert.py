"""A tiny HF model to the GGUF file llama.cpp's ``convert_hf_to_gguf.py`` writes for it.

``TextModel.set_gguf_parameters`` plus the arch's own keys, tensor names from gguf-py's ``TensorNameMap``,
experts stacked into 3-D tensors, no ``output.weight`` when the embeddings are tied, llama.cpp's tensor
type rules (1-D tensors, norms and routers stay F32), and a small byte-level BPE vocabulary (256 byte
tokens, real two-byte merges, ``<|bos|>`` and ``<|eos|>``): llama.cpp's gpt2 vocab loader requires a
non-empty merges list.
"""

from __future__ import annotations

import copy
import fnmatch
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from archrun.conformance.hf.models import BOS_TOKEN, EOS_TOKEN, HfArch


def convert(
    model,
    path: str | Path,
    arch: HfArch,
    dtype: str = "f32",
    rename_arch: str | None = None,
    *,
    types: Mapping[str, str] | None = None,
    mtp=None,
    mtp_copies: bool = True,
    name: str | None = None,
) -> Path:
    """Convert an in-memory float32 HF causal LM of ``arch`` to a GGUF file at ``path``; return the path.

    ``dtype`` ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1") is the type of every
    tensor llama.cpp would quantize (2-D+ ``.weight`` except routers); ``types`` maps GGUF
    tensor-name globs to a type for those tensors only (e.g. ``{"blk.*.ffn_down*": "q8_0"}``).
    Tensors whose rows do not fit the quant block fall back to F16, as llama.cpp does.
    ``rename_arch`` writes the same content under another ``general.architecture`` (all
    ``<arch>.*`` keys renamed with it). ``mtp`` overrides the MTP module (default
    ``model.archrun_mtp``); ``mtp_copies=False`` leaves out the optional copies of the embedding
    and output head (see ``HfMtp``).
    """
    hp = model.config.to_dict()
    if arch.converter == "llama.cpp":
        path = _convert_llamacpp(model, path, hp, dtype, rename_arch, types, mtp, name, arch.checkpoint_config(hp),
                                 arch.checkpoint_renames, arch.checkpoint_mxfp4)
        return widen_to_f32(path, arch.f32_tensors) if arch.f32_tensors else path
    n_nextn = int(hp.get(arch.mtp.layers_key) or 0) if arch.mtp is not None else 0
    block_count = hp["num_hidden_layers"] + n_nextn
    file_type = _file_type(dtype)
    writer = gguf.GGUFWriter(str(path), rename_arch or arch.name)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name or f"tiny-{arch.name}")
    for method, value in metadata(arch, hp, block_count, file_type).items():
        getattr(writer, method)(value)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _write_tokenizer(writer, hp)
    if n_nextn:
        mtp = mtp if mtp is not None else getattr(model, "archrun_mtp", None)
        if mtp is None:
            raise ValueError(f"{arch.name} with {arch.mtp.layers_key} > 0 needs an MTP module (build_tiny)")
    tensor_map = gguf.get_tensor_name_map(arch.gguf_arch, block_count)
    for hf_name, data in _hf_tensors(model, hp, arch, mtp if n_nextn else None, mtp_copies):
        for hf_name2, data2 in _modify(arch, hp, hf_name, data):
            gguf_name = _map_name(tensor_map, hf_name2)
            _add_tensor(writer, gguf_name, data2, dtype, types)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _convert_llamacpp(model, path, hp, dtype, rename_arch, types, mtp, name, config_extra, renames=None,
                      mxfp4=()) -> Path:
    """``convert`` through llama.cpp's own converter (whole-file dtypes it offers only)."""
    from archrun.conformance import llamacpp

    if rename_arch or types or mtp is not None:
        raise ValueError("llama.cpp's converter takes no rename_arch/types/mtp: convert with archrun's")
    tokens, merges, types_ = vocabulary(hp["vocab_size"])
    vocab = {"tokens": tokens, "merges": merges, "types": types_, "pre": "qwen2",
             "bos": hp.get("bos_token_id") or tokens.index(BOS_TOKEN),
             "eos": _first(hp.get("eos_token_id")) or tokens.index(EOS_TOKEN)}
    return llamacpp.convert(model, path, vocab, outtype=dtype, name=name, config_extra=config_extra,
                            renames=renames, mxfp4=mxfp4)


def widen_to_f32(path: str | Path, globs: tuple[str, ...]) -> Path:
    """Rewrite the GGUF at ``path`` in place with its quantized tensors matching ``globs`` stored as float32
    (gguf-py's dequantization: exact for every type whose values are float32 numbers, MXFP4 and Q8_0); a file
    left without quantized tensors says so (``general.file_type`` ALL_F32)."""
    from gguf import quants

    from archrun.conformance.gguf_edit import rewrite_gguf

    path = Path(path)
    reader = gguf.GGUFReader(str(path))
    widened = {t.name: quants.dequantize(t.data, t.tensor_type).astype(np.float32) for t in reader.tensors
               if any(fnmatch.fnmatchcase(t.name, g) for g in globs)
               and t.tensor_type not in (gguf.GGMLQuantizationType.F32,)}
    del reader
    if not widened:
        return path
    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.I8, gguf.GGMLQuantizationType.I16,
              gguf.GGMLQuantizationType.I32, gguf.GGMLQuantizationType.I64)
    all_f32 = all(t.name in widened or t.tensor_type in floats for t in gguf.GGUFReader(str(path)).tensors)
    tmp = path.with_name(path.name + ".f32")
    rewrite_gguf(path, tmp, drop_tensors=tuple(widened), add_tensors=widened,
                 add_keys={"general.file_type": int(gguf.LlamaFileType.ALL_F32)} if all_f32 else None)
    tmp.replace(path)
    return path


def _file_type(dtype: str) -> gguf.LlamaFileType:
    names = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0",
             "q4_0": "MOSTLY_Q4_0", "q4_1": "MOSTLY_Q4_1", "q5_0": "MOSTLY_Q5_0", "q5_1": "MOSTLY_Q5_1"}
    if dtype.lower() not in names:
        raise ValueError(f"unsupported dtype {dtype!r}; known: {', '.join(names)}")
    return gguf.LlamaFileType[names[dtype.lower()]]


def metadata(arch: HfArch, hp: Mapping[str, Any], block_count: int, file_type) -> dict[str, Any]:
    """GGUFWriter method name -> value, as llama.cpp's converter sets them for ``arch``.

    Later entries replace earlier ones, as a repeated key does in llama.cpp's writer.
    """
    meta = _common_metadata(hp, block_count, file_type)
    meta.update(arch.metadata(hp))
    return meta


def _common_metadata(hp: Mapping[str, Any], block_count: int, file_type) -> dict[str, Any]:
    """``TextModel.set_gguf_parameters`` for the fields tiny configs carry.

    Keys llama.cpp's converter writes only when the HF config has the field are written the same
    way (e.g. ``key_length``/``value_length`` only with ``head_dim``).
    """
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
    meta.update(_rope_scaling_metadata(rope.get("full_attention", rope)))
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


def _rope_scaling_metadata(rope: Mapping[str, Any]) -> dict[str, Any]:
    """``TextModel.set_gguf_parameters``'s rope scaling keys (linear and yarn; of the full-attention
    layers' rope when the config has one per layer type)."""
    kind, factor = rope.get("rope_type"), rope.get("factor")
    if factor is None or kind not in ("linear", "yarn"):
        return {}
    meta = {"add_rope_scaling_type": gguf.RopeScalingType.LINEAR if kind == "linear" else gguf.RopeScalingType.YARN,
            "add_rope_scaling_factor": factor}
    if kind == "yarn":
        meta["add_rope_scaling_orig_ctx_len"] = rope["original_max_position_embeddings"]
        for field, method in (("beta_fast", "add_rope_scaling_yarn_beta_fast"),
                              ("beta_slow", "add_rope_scaling_yarn_beta_slow")):
            if rope.get(field) is not None:
                meta[method] = rope[field]
    return meta


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
    writer.add_tokenizer_pre("qwen2")  # a byte-level pre-tokenizer llama.cpp knows (not the arch)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(hp.get("bos_token_id") or tokens.index(BOS_TOKEN))
    writer.add_eos_token_id(_first(hp.get("eos_token_id")) or tokens.index(EOS_TOKEN))
    writer.add_add_bos_token(False)


def _first(value):
    return value[0] if isinstance(value, list) else value


def _hf_tensors(model, hp: Mapping[str, Any], arch: HfArch, mtp, mtp_copies: bool) -> Iterator[tuple[str, Any]]:
    """(checkpoint name, float32 torch tensor) as a safetensors checkpoint of ``model`` holds them."""
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and hp.get("tie_word_embeddings"):
            continue  # tied checkpoints carry no lm_head
        yield name, tensor.detach().float()
    if mtp is not None:
        yield from arch.mtp.checkpoint_tensors(model, hp, mtp, mtp_copies)


def _modify(arch: HfArch, hp: Mapping[str, Any], name: str, data) -> Iterator[tuple[str, Any]]:
    """``modify_tensors``: split fused experts, then the arch's renames, Q/K permutation, norm shift."""
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
    for old, new in arch.tensor_renames.items():
        if name.endswith(old):
            name = name.removesuffix(old) + new
    if arch.permute_qk and name.endswith(("q_proj.weight", "q_proj.bias")):
        data = permute_qk(data, hp["num_attention_heads"])
    if arch.permute_qk and name.endswith(("k_proj.weight", "k_proj.bias")):
        data = permute_qk(data, hp["num_key_value_heads"])
    if arch.norm_shift and name.endswith("norm.weight"):
        data = data + arch.norm_shift
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
