"""Tiny random HF transformers models, their GGUF conversion and their goldens, for any family.

A family package describes each architecture it converts as an ``HfArch`` (HF classes, tiny
defaults, metadata writer, tensor fix-ups, MTP mapping) and its fixtures as ``TinyFixture``
entries, both in ``<package>/tests/hf_arch.py``; this module does the rest:

- ``build_tiny(arch, seed, **overrides)``: a deterministic random float32 HF model;
- ``convert(model, path, arch)``: the GGUF file llama.cpp's ``convert_hf_to_gguf.py`` writes for
  it (``TextModel.set_gguf_parameters`` plus the arch's own keys, tensor names from gguf-py's
  ``TensorNameMap``, experts stacked into 3-D tensors, no ``output.weight`` when the embeddings
  are tied, llama.cpp's tensor type rules: 1-D tensors, norms and routers stay F32);
- ``record_main(arches, fixtures, out_dir)``: the family's ``tests/goldens/record.py``: HF
  float32 logits for every fixture (and MTP logits when the arch has an MTP head), the
  converted GGUF, optionally llama.cpp's logits on it (``llamacpp_check.json``);
- ``check_fixture`` / ``check_golden_files`` / ``check_gguf_layout`` / ``check_live``: what the
  family's tests assert on those files.

Deliberate additions, each needed for a complete file llama.cpp can load: a small byte-level
BPE vocabulary (256 byte tokens, real two-byte merges, ``<|bos|>`` and ``<|eos|>``), since tiny
models come without a tokenizer and llama.cpp's gpt2 vocab loader requires a non-empty merges
list. HF builds no MTP layers (a checkpoint's ``model.layers.<n_layer>.*`` are ignored on load),
so for an arch with an ``HfMtp`` ``build_tiny`` attaches a random
``transformers.modeling_layers.MtpModel`` and ``convert`` writes it under the checkpoint names the
arch's ``HfMtp.checkpoint_tensors`` gives.

torch and transformers are imported only by the functions that need them. Nothing here runs an
archrun model except the ``check_*`` helpers that compare one with the goldens.
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import hashlib
import importlib.util
import json
import platform
import re
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np

from archrun.conformance import chains
from archrun.conformance.limits import N_TOKENS, TOLERANCE

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
N_VOCAB = 288  # 256 byte tokens + 30 merges + bos + eos
MAX_GGUF_BYTES = 1_000_000  # per fixture
MAX_TOTAL_BYTES = 10_000_000  # per goldens folder
BACKENDS = ("reference", "fast")

#: Every tiny model starts from these (then its arch's ``defaults``, then the fixture's overrides).
TINY_DEFAULTS: dict[str, Any] = {
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


def _no_metadata(hp: Mapping[str, Any]) -> dict[str, Any]:
    return {}


@attrs.frozen
class HfMtp:
    """A multi-token-prediction head: HF builds none, so ``build_tiny`` attaches an ``MtpModel``.

    ``layers_key``: the HF config field counting MTP layers (none attached when it is 0).
    ``checkpoint_tensors(model, hp, mtp, copies)``: yields ``(checkpoint name, float32 tensor)``
    for the MTP module's weights as released checkpoints name them (``copies``: also the optional
    copies of the embedding / output head those checkpoints carry).
    """

    layers_key: str
    checkpoint_tensors: Callable[..., Iterator[tuple[str, Any]]]


@attrs.frozen
class HfArch:
    """How llama.cpp's converter treats one HF architecture.

    ``name`` is the GGUF ``general.architecture`` (a gguf-py ``MODEL_ARCH_NAMES`` value);
    ``model_type``/``model_class``/``config_class`` the HF side. ``defaults`` update
    ``TINY_DEFAULTS`` for this arch's tiny models. ``metadata(hp)`` returns the arch's
    ``GGUFWriter`` method -> value entries, applied after the common ones (a repeated method
    replaces the common value in place, as a repeated key does in llama.cpp's writer).
    ``config_renames`` renames config kwargs after the defaults are merged (transformers field
    names that differ from the flat names fixtures use); ``rope_parameters(kw)`` pops the flat
    rope fields from ``kw`` and returns transformers 5's ``rope_parameters`` (default: one
    ``default`` rope with ``rope_theta`` and, when given, ``partial_rotary_factor``).
    Tensor fix-ups, in ``modify_tensors`` order: ``tensor_renames`` (checkpoint-name suffixes),
    ``permute_qk`` (llama.cpp's Q/K row permutation, for NORM rope), ``norm_shift`` (added to
    every ``*norm.weight``: 1.0 for HF RMSNorms computing x*(1+w), whose GGUF stores 1+w).
    ``norm_init`` = (center, scale) of the random norm weights; ``scalar_init`` maps parameter-name
    suffixes to the (center, scale) of other tensors drawn that way (e.g. a learned per-layer
    multiplier, which a fan-in draw would make any sign). ``mtp``: see ``HfMtp``.
    ``converter``: "archrun" converts with ``convert``'s own statement of llama.cpp's rules
    (metadata and tensor fix-ups above); "llama.cpp" runs llama.cpp's ``convert_hf_to_gguf.py``
    itself (``archrun.conformance.llamacpp``), and the fields above only shape the HF model.
    ``llamacpp_keys``: metadata (key without the ``<arch>.`` prefix -> value) llama.cpp needs and
    its converter does not write, or a function of the fixture's HF config returning them; the
    llama.cpp cross-check runs on a copy with them added (and records them), never the fixture
    itself. ``checkpoint_config(hp)``: fields released checkpoints' config.json carry that
    transformers no longer writes (e.g. GPT-NeoX's ``rotary_pct``), added to the config the
    converter reads; a field given as None is removed from it (one transformers writes and released
    checkpoints do not carry). ``checkpoint_renames`` (regex -> replacement): tensor names transformers'
    save gets wrong for released checkpoints (its reverse weight mapping renames too much), put
    back before llama.cpp's converter reads them. ``eval_model(model)``: turns the built model, in
    place, into what released checkpoints run in eval mode when transformers loads them with a
    quantization config (e.g. BitNet's linears swapped for its quantizing ones); the weights, and so
    the converted file, stay as built.
    """

    name: str
    model_type: str
    model_class: str
    config_class: str
    defaults: Mapping[str, Any] = attrs.field(factory=dict)
    metadata: Callable[[Mapping[str, Any]], dict[str, Any]] = _no_metadata
    config_renames: Mapping[str, str] = attrs.field(factory=dict)
    rope_parameters: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    tensor_renames: Mapping[str, str] = attrs.field(factory=dict)
    permute_qk: bool = False
    norm_shift: float = 0.0
    norm_init: tuple[float, float] = (1.0, 0.25)
    scalar_init: Mapping[str, tuple[float, float]] = attrs.field(factory=dict)
    mtp: HfMtp | None = None
    converter: str = "archrun"
    llamacpp_keys: Mapping[str, Any] | Callable[[Mapping[str, Any]], Mapping[str, Any]] = attrs.field(factory=dict)
    checkpoint_config: Callable[[Mapping[str, Any]], dict[str, Any]] = _no_metadata
    checkpoint_renames: Mapping[str, str] = attrs.field(factory=dict)
    eval_model: Callable[[Any], None] | None = None

    @property
    def gguf_arch(self) -> gguf.MODEL_ARCH:
        for arch, name in gguf.MODEL_ARCH_NAMES.items():
            if name == self.name:
                return arch
        raise ValueError(f"gguf-py knows no architecture {self.name!r}")


@attrs.frozen
class TinyFixture:
    """One recorded fixture: the model ``build_tiny(<arch named arch>, seed, **overrides)``.

    ``arch`` names an ``HfArch`` of the fixture list by HF model type or GGUF architecture name.
    ``llama_cpp``: why llama.cpp cannot run this fixture (e.g. its loader refuses the file's bias
    tensors), so HF is its only reference; empty when it can (the llama.cpp cross-check is required).
    """

    name: str
    arch: str
    seed: int
    overrides: Mapping[str, Any] = attrs.field(factory=dict)
    llama_cpp: str = ""


def load_module(path: str | Path):
    """Import a helper module (e.g. a family's ``tests/hf_arch.py``) from its file, once.

    Its module name is derived from the path's last three parts, so same-named helpers of
    several packages do not collide in ``sys.modules``.
    """
    path = Path(path).resolve()
    name = re.sub(r"\W", "_", "_".join(path.with_suffix("").parts[-3:]))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


# --------------------------------------------------------------------------- tiny models


def tiny_config(arch: HfArch, seed: int = 0, **overrides: Any):
    """Return the HF config of a tiny ``arch`` model: the defaults updated by ``overrides``.

    ``seed`` does not change the config (it only drives the weights in ``build_tiny``); it is
    accepted so configs and models are addressed the same way. The flat rope fields are folded
    into transformers' ``rope_parameters``. Attention and experts run the eager reference code.
    """
    import transformers

    del seed
    kw = {**TINY_DEFAULTS, **arch.defaults, **overrides}
    kw["rope_parameters"] = (arch.rope_parameters or default_rope_parameters)(kw)
    kw.update(attn_implementation="eager", experts_implementation="eager")
    for old, new in arch.config_renames.items():
        if old in kw:
            kw[new] = kw.pop(old)
    return getattr(transformers, arch.config_class)(**kw)


def default_rope_parameters(kw: dict[str, Any]) -> dict[str, Any]:
    """Move ``rope_theta`` (and ``partial_rotary_factor``) of ``kw`` into one rope dict."""
    params = {"rope_type": "default", "rope_theta": kw.pop("rope_theta")}
    if "partial_rotary_factor" in kw:
        params["partial_rotary_factor"] = kw.pop("partial_rotary_factor")
    return params


def build_tiny(arch: HfArch, seed: int, **overrides: Any):
    """Build a tiny random float32 HF model, deterministically from ``(arch, seed, overrides)``.

    Returns ``(model, config)`` with the model in eval mode. Every persistent tensor is drawn
    from its own generator seeded by ``(seed, tensor name)``: matrices N(0, gain/sqrt(fan_in)),
    embeddings N(0, 0.25), biases and router biases N(0, 0.1), norm weights
    ``center + scale * N(0, 1)`` (``arch.norm_init``). An arch with an MTP head and a nonzero
    MTP layer count carries its random ``MtpModel`` as ``model.archrun_mtp``.
    """
    import torch
    import transformers

    config = tiny_config(arch, seed, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, arch.model_class)(config).eval()
    _randomize(model, seed, arch, prefix="")
    if arch.eval_model is not None:
        arch.eval_model(model)
    n_mtp = getattr(config, arch.mtp.layers_key, 0) if arch.mtp is not None else 0
    if n_mtp > 0:
        from transformers.modeling_layers import MtpModel

        mtp = MtpModel(model, n_mtp).eval()
        _randomize(mtp, seed, arch, prefix="mtp.")
        model.__dict__["archrun_mtp"] = mtp  # plain attribute: not a submodule of the model
    return model, config


def _randomize(module, seed: int, arch: HfArch, prefix: str) -> None:
    """Overwrite every persistent parameter/buffer of ``module`` in place (tied ones once)."""
    import torch

    persistent = set(module.state_dict())
    named = [*module.named_parameters(), *module.named_buffers()]
    with torch.no_grad():
        for name, tensor in named:
            if name not in persistent or (prefix and name.startswith(("embed_tokens", "shared_head"))):
                continue  # MTP shares the trunk's embedding and head
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32((prefix + name).encode()))
            scalar = next((v for k, v in arch.scalar_init.items() if name.endswith(k)), None)
            tensor.copy_(_random_like(name, tensor, gen, scalar or arch.norm_init, scalar=scalar is not None))


def _random_like(name: str, tensor, gen, norm_init: tuple[float, float], scalar: bool = False):
    """A random tensor for parameter ``name`` (see ``build_tiny`` for the distributions)."""
    import torch

    noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
    # 1-D .weight: a norm (GPT-2's ln_*)
    if scalar or name.endswith("norm.weight") or (tensor.dim() == 1 and name.endswith(".weight")):
        center, scale = norm_init
        return center + scale * noise if center else scale * noise
    if name.endswith("bias"):
        return 0.1 * noise
    if "embed_tokens" in name:
        return 0.25 * noise  # tied heads then give logits of std ~2
    gain = 2.0 if name.startswith("lm_head") or name.endswith("mlp.gate.weight") else 1.0
    return noise * (gain / tensor.shape[-1] ** 0.5)  # fan_in is the last torch dim


# --------------------------------------------------------------------------- conversion


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
        return _convert_llamacpp(model, path, hp, dtype, rename_arch, types, mtp, name, arch.checkpoint_config(hp),
                                 arch.checkpoint_renames)
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


def _convert_llamacpp(model, path, hp, dtype, rename_arch, types, mtp, name, config_extra, renames=None) -> Path:
    """``convert`` through llama.cpp's own converter (whole-file dtypes it offers only)."""
    from archrun.conformance import llamacpp

    if rename_arch or types or mtp is not None:
        raise ValueError("llama.cpp's converter takes no rename_arch/types/mtp: convert with archrun's")
    tokens, merges, types_ = vocabulary(hp["vocab_size"])
    vocab = {"tokens": tokens, "merges": merges, "types": types_, "pre": "qwen2",
             "bos": hp.get("bos_token_id") or tokens.index(BOS_TOKEN),
             "eos": _first(hp.get("eos_token_id")) or tokens.index(EOS_TOKEN)}
    return llamacpp.convert(model, path, vocab, outtype=dtype, name=name, config_extra=config_extra,
                            renames=renames)


def _file_type(dtype: str) -> gguf.LlamaFileType:
    names = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0",
             "q4_0": "MOSTLY_Q4_0", "q4_1": "MOSTLY_Q4_1", "q5_0": "MOSTLY_Q5_0", "q5_1": "MOSTLY_Q5_1"}
    if dtype.lower() not in names:
        raise ValueError(f"unsupported dtype {dtype!r}; known: {', '.join(names)}")
    return gguf.LlamaFileType[names[dtype.lower()]]


# ------------------------------------------------------------------- metadata (set_gguf_parameters)


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
    writer.add_tokenizer_pre("qwen2")  # a byte-level pre-tokenizer llama.cpp knows (not the arch)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(hp.get("bos_token_id") or tokens.index(BOS_TOKEN))
    writer.add_eos_token_id(_first(hp.get("eos_token_id")) or tokens.index(EOS_TOKEN))
    writer.add_add_bos_token(False)


def _first(value):
    return value[0] if isinstance(value, list) else value


# ------------------------------------------------------------------------------- tensors


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


# ------------------------------------------------------------------------------- recording


def fixture_ids(name: str, n_vocab: int) -> np.ndarray:
    """The fixed random token sequence (N_TOKENS ids, specials excluded) of fixture ``name``."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.integers(0, n_vocab - 2, size=N_TOKENS).astype(np.int32)


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": _dist_version("gguf", gguf),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }


def _dist_version(dist: str, module) -> str:
    from importlib.metadata import version

    return getattr(module, "__version__", None) or version(dist)


def hf_logits(model, ids: np.ndarray):
    """(logits [n, vocab], final hidden states [n, n_embd]) of the HF model, float32."""
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(ids.astype(np.int64))[None], output_hidden_states=True)
    return out.logits[0].float().numpy(), out.hidden_states[-1]


def hf_mtp_logits(model, ids: np.ndarray, hidden) -> np.ndarray:
    """MTP layer-0 logits [n-1, vocab] of ``model.archrun_mtp``.

    Row j is HF ``MtpModel`` layer 0 fed the embedding of ``ids[j+1]`` at position ``j+1`` and
    the trunk's final hidden state at position ``j`` (after the output norm, as transformers'
    MTPCandidateGenerator and llama.cpp's ``h_nextn`` both use it); it predicts ``ids[j+2]``.
    Attention inside the MTP block sees MTP rows 0..j only.
    """
    import torch

    mtp = model.archrun_mtp
    ids_t = torch.from_numpy(ids.astype(np.int64))[None]
    positions = torch.arange(1, len(ids))[None]
    with torch.no_grad():
        h = mtp.forward_layer(0, hidden[:, :-1], positions, None, input_ids=ids_t[:, 1:])
        return mtp._project_to_logits(h)[0].float().numpy()


def arch_of(arches: Sequence[HfArch], fixture: TinyFixture) -> HfArch:
    """The HfArch a fixture names: by HF model type first (several HF types may convert to one
    GGUF architecture, e.g. mistral to llama), else by GGUF architecture name."""
    for key in ("model_type", "name"):
        for arch in arches:
            if getattr(arch, key) == fixture.arch:
                return arch
    raise KeyError(f"fixture {fixture.name!r}: no HfArch named {fixture.arch!r}")


def record(arch: HfArch, fixture: TinyFixture, out_dir: Path, vers: dict[str, str]) -> Path:
    """Build, run and convert one fixture; write its .gguf and .npz into ``out_dir``; return the .npz path.

    ``<name>.gguf``: the converted model, all tensors F32. ``<name>.npz``: ``ids`` int32 [n];
    ``logits`` float32 [n, n_vocab] (HF, every position); with an MTP head ``mtp_logits`` float32
    [n-1, n_vocab] (``hf_mtp_logits``); ``config_json`` (HF config dict), ``fixture_json``
    (name/arch/seed/overrides, gguf file name and sha256), ``versions_json``.
    """
    name = fixture.name
    model, config = build_tiny(arch, fixture.seed, **fixture.overrides)
    ids = fixture_ids(name, config.vocab_size)
    logits, hidden = hf_logits(model, ids)
    arrays = {"ids": ids, "logits": logits}
    if getattr(model, "archrun_mtp", None) is not None:
        arrays["mtp_logits"] = hf_mtp_logits(model, ids, hidden)
    cfg_json = config_json(config)  # before converting: saving the model adds fields to its config
    gguf_path = convert(model, out_dir / f"{name}.gguf", arch, name=f"tiny-{name}")
    size = gguf_path.stat().st_size
    if size > MAX_GGUF_BYTES:
        raise SystemExit(f"{gguf_path.name} is {size} bytes (> {MAX_GGUF_BYTES}): shrink the fixture")
    meta = {"name": name, "arch": arch.name, "seed": fixture.seed, "overrides": dict(fixture.overrides),
            "n_tokens": N_TOKENS, "gguf": gguf_path.name, "gguf_sha256": _sha256(gguf_path)}
    out = out_dir / f"{name}.npz"
    np.savez_compressed(out, **arrays, config_json=np.array(cfg_json),
                        fixture_json=np.array(json.dumps(meta, sort_keys=True)),
                        versions_json=np.array(json.dumps(vers, sort_keys=True)))
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def llamacpp_check(arches: Sequence[HfArch], fixtures: Sequence[TinyFixture], out_dir: Path) -> dict[str, dict]:
    """Run each stored GGUF through llama.cpp (F32 KV cache) and compare its logits with the stored HF ones."""
    import tempfile

    import llama_cpp

    from archrun.conformance.gguf_edit import rewrite_gguf

    report = {}
    tmp = Path(tempfile.mkdtemp())
    for fixture in fixtures:
        name, arch = fixture.name, arch_of(arches, fixture)
        if fixture.llama_cpp:
            print(f"{name:32s} not run in llama.cpp: {fixture.llama_cpp}")
            continue
        golden = np.load(out_dir / f"{name}.npz")
        ids = golden["ids"].tolist()
        path = out_dir / f"{name}.gguf"
        added = arch.llamacpp_keys
        if callable(added):
            added = added(json.loads(str(golden["config_json"])))
        if added:
            path = rewrite_gguf(path, tmp / path.name, add_keys={f"{arch.name}.{k}": v for k, v in added.items()})
        llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=64, n_threads=2,
                              n_batch=64, type_k=0, type_v=0, verbose=False)  # F32 KV cache
        llm.eval(ids)
        scores = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
        diff = float(np.abs(scores - golden["logits"]).max())
        agree = scores.argmax(-1) == golden["logits"].argmax(-1)
        argmax = float(agree.mean())
        report[name] = {"max_abs_diff": diff, "argmax_agreement": argmax,
                        "argmax_mismatch_positions": np.flatnonzero(~agree).tolist(),
                        "gguf_sha256": _sha256(out_dir / f"{name}.gguf")}
        if added:
            report[name]["keys_added_for_llama_cpp"] = dict(added)
        print(f"{name:32s} max|llama.cpp-HF| = {diff:.3e}  argmax agreement {argmax:.3f}")
        del llm
    report["_versions"] = {"llama_cpp_python": llama_cpp.__version__}
    return report


def record_main(arches: Sequence[HfArch], fixtures: Sequence[TinyFixture], out_dir: str | Path,
                argv: list[str] | None = None) -> None:
    """Command line of a family's ``tests/goldens/record.py``: record ``fixtures`` into ``out_dir``.

    ``--only NAME ...`` records some fixtures (and their greedy chains, ``archrun.conformance.chains``);
    ``--chains`` only the greedy chains of the stored fixtures; ``--llamacpp-check`` (in a venv with
    llama-cpp-python) writes ``llamacpp_check.json``: max |llama.cpp - HF| logits per fixture.
    """
    parser = argparse.ArgumentParser(description="Record HF goldens of tiny fixtures: " + str(out_dir))
    parser.add_argument("--only", nargs="*", help="fixture names (default: all)")
    parser.add_argument("--llamacpp-check", action="store_true", help="compare stored GGUFs in llama.cpp")
    parser.add_argument("--chains", action="store_true", help="record only the greedy chains of HF float32 "
                        "(greedy_chains.json) for the stored fixtures")
    args = parser.parse_args(argv)
    out_dir = Path(out_dir)
    by_name = {f.name: f for f in fixtures}
    entries = [by_name[n] for n in args.only] if args.only else list(fixtures)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.llamacpp_check:
        report = llamacpp_check(arches, entries, out_dir)
        (out_dir / "llamacpp_check.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        return
    if args.chains:
        print("wrote", record_chains(arches, entries, out_dir))
        return
    import torch

    torch.set_num_threads(2)
    vers = versions()
    for fixture in entries:
        print("recorded", record(arch_of(arches, fixture), fixture, out_dir, vers).name)
    print("wrote", record_chains(arches, entries, out_dir))  # the greedy chains of the new files
    total = _total_bytes(out_dir)
    if total > MAX_TOTAL_BYTES:
        raise SystemExit(f"{out_dir} holds {total} bytes (> {MAX_TOTAL_BYTES})")
    print(f"total {total} bytes")


def package_root(entry_point: str) -> Path:
    """The source folder of the installed plugin package whose archrun entry point is ``entry_point``
    (its ``tests/`` lives there in a source or editable install); InvalidRequest when not installed."""
    import importlib.util
    from importlib.metadata import entry_points

    from archrun.errors import InvalidRequest

    eps = {ep.name: ep for ep in entry_points(group="archrun")}
    if entry_point not in eps:
        raise InvalidRequest(f"no installed archrun plugin {entry_point!r} (installed: {', '.join(sorted(eps))})")
    module = eps[entry_point].value.split(":")[0].split(".")[0]
    spec = importlib.util.find_spec(module)
    origin = Path(spec.origin if spec and spec.origin else "")
    return origin.parent.parent  # <package root>/<module>/__init__.py


def package_fixture_specs(entry_point: str) -> list[Path]:
    """The fixture declarations (``tests/**/hf_arch.py``) of the installed plugin package whose
    archrun entry point is ``entry_point``; InvalidRequest when it is not installed or declares none."""
    from archrun.errors import InvalidRequest

    root = package_root(entry_point)
    found = sorted((root / "tests").rglob("hf_arch.py")) if (root / "tests").is_dir() else []
    if not found:
        raise InvalidRequest(f"plugin {entry_point!r} ({root}) declares no fixtures: no tests/**/hf_arch.py "
                             "with ARCHES and FIXTURES (see docs/conformance.md)")
    return found


def record_package(entry_point: str, argv: list[str] | None = None) -> None:
    """``archrun conformance record PACKAGE``: record (or ``--llamacpp-check``) every fixture a plugin
    package declares into the ``goldens/`` folder beside each of its ``hf_arch.py`` files."""
    for spec_path in package_fixture_specs(entry_point):
        spec = load_module(spec_path)
        print(f"{entry_point}: {spec_path}")
        record_main(spec.ARCHES, spec.FIXTURES, spec_path.parent / "goldens", argv)


def record_chains(arches: Sequence[Any], fixtures: Sequence[Any], goldens: Path) -> Path:
    """Greedy chains of HF float32 for ``fixtures`` (rebuilt with ``build_tiny``) into ``goldens``.

    Refuses (InvalidRequest, nothing written) when a rebuilt model does not reproduce the recorded HF
    logits (the chain would come from another model than the file's) or archrun's logits on the file
    are off HF's (``check_fixture``)."""
    import torch

    from archrun.errors import InvalidRequest

    torch.set_num_threads(2)
    goldens = Path(goldens)
    vers = {**versions(), "reference": "HF transformers float32 (model(ids).logits, no cache)"}
    entries = {}
    for fixture in fixtures:
        name = fixture.name
        gguf_path = goldens / f"{name}.gguf"
        golden = load_golden(gguf_path.with_suffix(".npz"))
        model, _ = build_tiny(arch_of(arches, fixture), fixture.seed, **fixture.overrides)
        model.eval()
        logits, _ = hf_logits(model, golden["ids"])
        err = float(np.abs(logits - golden["logits"]).max())
        problems = []
        if err > 1e-4:
            problems.append(f"the rebuilt HF model is {err:.2e} from the recorded HF logits")
        if _sha256(gguf_path) != golden["fixture"]["gguf_sha256"]:
            problems.append("the GGUF is not the recorded one")
        try:
            check_fixture(gguf_path, "reference")
        except AssertionError as e:
            problems.append(f"archrun is off HF ({e})")
        if problems:
            raise InvalidRequest(f"not recording the greedy chain of {name}: {'; '.join(problems)}")
        chain = chains.reference_chain(chains.hf_step(model), golden["ids"][:chains.N_PROMPT].tolist())
        entries[chains.key("hf", name)] = {**chain, "input_sha256": _sha256(gguf_path), "reference": "HF",
                                           "versions": vers}
        print(f"chain {name}: {chain['tokens']}")
    return chains.write(goldens, entries, vers)


def record_here(record_py: str | Path) -> None:
    """A family's ``tests/goldens/record.py``: ``record_main`` for the fixtures of ``../hf_arch.py``
    into the script's folder (``--only NAME ...``, ``--llamacpp-check``)."""
    here = Path(record_py).resolve().parent
    spec = load_module(here.parent / "hf_arch.py")
    record_main(spec.ARCHES, spec.FIXTURES, here)


def _total_bytes(out_dir: Path) -> int:
    return sum(p.stat().st_size for p in out_dir.iterdir() if p.suffix in (".gguf", ".npz", ".json"))


# ------------------------------------------------------------------------------- checks


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| relative to max |ref|."""
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def load_golden(npz: str | Path) -> dict[str, Any]:
    """The arrays of a fixture's .npz, with ``config``/``fixture``/``versions`` decoded from JSON."""
    with np.load(npz, allow_pickle=False) as z:
        out = {k: z[k] for k in z.files}
    for key in ("config_json", "fixture_json", "versions_json"):
        out[key.removesuffix("_json")] = json.loads(str(out.pop(key)))
    return out


def check_fixture(gguf_path: str | Path, backend: str = "reference", tolerance: float = TOLERANCE) -> None:
    """Assert archrun's logits on a fixture match its HF goldens (the .npz beside it).

    Both the whole sequence in one call and token by token through the KV cache, within
    ``tolerance`` of max |logit|.
    """
    import archrun

    gguf_path = Path(gguf_path)
    with np.load(gguf_path.with_suffix(".npz")) as z:
        ids, ref = z["ids"].astype(np.int64), z["logits"]
    assert len(ids) >= 24, f"{gguf_path.name}: only {len(ids)} golden tokens"
    model = archrun.load(gguf_path, backend=backend)
    err = rel_err(model.logits(ids), ref)
    assert err <= tolerance, f"{gguf_path.name} ({backend}): prompt logits off by {err:.2e} of max |logit|"
    cache = model.init_cache(len(ids))
    steps = np.stack([model.forward_step([t], cache) for t in ids])
    err = rel_err(steps, ref)
    assert err <= tolerance, f"{gguf_path.name} ({backend}): cached step logits off by {err:.2e} of max |logit|"


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
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors), name
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
