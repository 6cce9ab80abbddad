"""What a family declares for the tiny-HF kit (``HfArch``, ``HfMtp``, ``TinyFixture``) and the deterministic
random float32 HF models built from it (``build_tiny``). torch and transformers are imported only by the
functions that need them.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import gguf

BOS_TOKEN = "<|bos|>"


EOS_TOKEN = "<|eos|>"


N_VOCAB = 288  # 256 byte tokens + 30 merges + bos + eos


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
    the converted file, stay as built. ``finish_weights(model, seed)``: sets, in place and
    deterministically, what the random draw cannot (an integer table such as a token -> expert map,
    weights on a quantization grid with ``hf.mxfp4.round_to_mxfp4``), before ``eval_model``.
    ``checkpoint_mxfp4`` (regexes over the saved, renamed tensor names): the matrices written in the
    MXFP4 layout released checkpoints use (``<name>.weight`` codes and ``<name>.scale`` exponents,
    ``hf.mxfp4``) for a converter that reads only that layout; their values must lie on the grid.
    ``f32_tensors`` (globs of GGUF tensor names): tensors llama.cpp's converter writes quantized (e.g.
    MXFP4 experts) that the fixture stores as float32 instead, value for value (every value of those
    types is a float32), so both backends can be held to HF's float32 logits; the converter's own types
    stay checkable by requantizing (gguf-py) and comparing.
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
    finish_weights: Callable[[Any, int], None] | None = None
    checkpoint_mxfp4: tuple[str, ...] = ()
    f32_tensors: tuple[str, ...] = ()

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
    if arch.finish_weights is not None:
        arch.finish_weights(model, seed)
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
