"""Gemma 4's assistant as a speculative-decoding drafter (`gemma4-assistant:PATH`): what its files say and
how it follows its target. The math is archrun-gemma4-ops' (archrun_gemma4_ops.assistant).

A `gemma4-assistant` GGUF (llama.cpp's converter, `Gemma4AssistantModel`) holds a small Gemma 4 text model
without keys or values of its own: `embedding_length` d, `embedding_length_out` the target's width B,
`nextn.pre_projection` [2 B -> d], `nextn.post_projection` [d -> B], per layer `attn_norm`, `attn_q`,
`attn_q_norm`, `attn_output`, `post_attention_norm`, `ffn_norm`, `ffn_gate`/`ffn_up`/`ffn_down`,
`post_ffw_norm`, `layer_output_scale`; the layer kinds (`attention.sliding_window_pattern`), both head
widths (`key_length`, `key_length_swa`), both ropes (`rope.freq_base[_swa]`, `rope.dimension_count[_swa]`,
`rope_freqs` on the full layers), `output_norm` and the tied head `token_embd`.

The drafter reads the target's trunk: every target step goes through `forward_step_hidden`, the drafter
keeps the final hidden states of the last positions (rewinds included) and, when asked, reads the keys and
values of the target's last sliding and last full layer computing their own from the target's cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from archrun.errors import (
    InvalidRequest,
    MetadataError,
    MissingTensor,
    ModelLoadError,
    ModelMismatch,
    ShapeMismatch,
    UnsupportedArchitecture,
    VocabularyMismatch,
    WrongBlockStyle,
)
from archrun.generation.speculative import MAX_DRAFT, Draft, Drafter, DraftSampler
from archrun.io.ggufio import GGUFFile
from archrun.io.weights import Matrix
from archrun_gemma4_ops import assistant as math

ARCH = "gemma4-assistant"
F32 = np.float32


def load_weights(path: str | Path, backend: str = "reference") -> tuple[math.AssistantWeights, list[str] | None]:
    """The assistant's weights from a `gemma4-assistant` GGUF (module docstring), as Matrix products on
    `backend`, and the file's token texts (None when it lists none). UnsupportedArchitecture for another
    architecture; MetadataError, MissingTensor or ShapeMismatch for an incomplete or inconsistent file;
    ModelLoadError for one that cannot be read."""
    g = GGUFFile(path)
    arch = g.metadata.get("general.architecture")
    if arch != ARCH:
        raise UnsupportedArchitecture(f"{Path(path).name} is a {arch!r} file, not a Gemma 4 assistant ({ARCH!r})")

    def key(name: str, kind=int, default=None):
        value = g.metadata.get(f"{ARCH}.{name}", default)
        if value is None:
            raise MetadataError(f"{Path(path).name} has no {ARCH}.{name}")
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise MetadataError(f"{ARCH}.{name} = {value!r} is not a {kind.__name__}") from None

    def info(name: str):
        if name not in g.tensors:
            raise MissingTensor(f"{Path(path).name} has no tensor {name!r}")
        return g.tensors[name]

    def matrix(name: str, n_in: int, n_out: int) -> Matrix:
        if info(name).np_shape != (n_out, n_in):
            raise ShapeMismatch(f"tensor {name!r} has shape {info(name).np_shape}, the assistant needs {(n_out, n_in)}")
        # lazy: the fast kernels prepare it on its first product, after the target was checked
        return Matrix(g.raw_rows(name), info(name).ggml_type, n_in, backend, name=name, lazy=True)

    def vector(name: str, n: int) -> np.ndarray:
        v = g.dequantize(info(name).name).astype(F32).reshape(-1)
        if v.shape != (n,):
            raise ShapeMismatch(f"tensor {name!r} has {v.size} values, the assistant needs {n}")
        return v

    d, b = key("embedding_length"), key("embedding_length_out")
    n_layer, eps = key("block_count"), key("attention.layer_norm_rms_epsilon", float)
    n_head, window = key("attention.head_count"), key("attention.sliding_window")
    n_ff = key("feed_forward_length")
    pattern = g.metadata.get(f"{ARCH}.attention.sliding_window_pattern")
    if pattern is None or np.ndim(pattern) != 1 or len(pattern) != n_layer:
        raise MetadataError(f"{ARCH}.attention.sliding_window_pattern must hold a flag per layer ({n_layer})")
    n_vocab = info("token_embd.weight").np_shape[0]
    if min(d, b, n_layer, n_head, window, n_ff, n_vocab) < 1:
        raise MetadataError(f"{Path(path).name}: widths, counts and the window must be positive")
    freq_factors = vector("rope_freqs.weight", key("rope.dimension_count") // 2) if "rope_freqs.weight" in g.tensors \
        else None
    ropes = {True: math.make_rope(key("rope.dimension_count_swa"), key("rope.freq_base_swa", float), None),
             False: math.make_rope(key("rope.dimension_count"), key("rope.freq_base", float), freq_factors)}
    widths = {True: key("attention.key_length_swa"), False: key("attention.key_length")}
    layers = []
    for i in range(n_layer):
        sliding, hd = bool(pattern[i]), widths[bool(pattern[i])]
        if ropes[sliding].n_rot > hd or ropes[sliding].n_rot % 2:
            raise MetadataError(f"layer {i}: rope width {ropes[sliding].n_rot} does not fit head width {hd}")
        p = f"blk.{i}."
        scale = vector(p + "layer_output_scale.weight", 1)
        layers.append(math.AssistantLayer(
            sliding=sliding, n_head=n_head, head_dim=hd, attn_norm=vector(p + "attn_norm.weight", d),
            q=matrix(p + "attn_q.weight", d, n_head * hd), q_norm=vector(p + "attn_q_norm.weight", hd),
            o=matrix(p + "attn_output.weight", n_head * hd, d),
            post_attn_norm=vector(p + "post_attention_norm.weight", d), ffn_norm=vector(p + "ffn_norm.weight", d),
            gate=matrix(p + "ffn_gate.weight", d, n_ff), up=matrix(p + "ffn_up.weight", d, n_ff),
            down=matrix(p + "ffn_down.weight", n_ff, d), post_ffn_norm=vector(p + "post_ffw_norm.weight", d),
            scale=float(scale[0]), rope=ropes[sliding]))
    return math.AssistantWeights(
        n_embd=d, n_backbone=b, n_vocab=n_vocab, window=window, eps=eps,
        pre=matrix("nextn.pre_projection.weight", 2 * b, d), post=matrix("nextn.post_projection.weight", d, b),
        head=matrix("token_embd.weight", d, n_vocab), output_norm=vector("output_norm.weight", d),
        layers=tuple(layers)), g.metadata.get("tokenizer.ggml.tokens")


def source_layers(model: Any) -> dict[bool, int]:
    """{sliding: layer} of the target: its last sliding and last full layer computing their own keys and
    values (those an assistant layer of that kind reads; HF kv_sharing_modes' "store" layers)."""
    found: dict[bool, int] = {}
    for i, layer in enumerate(model.descriptor.layers):
        att = layer.attention
        if att.kind == "gemma4" and dict(att.params).get("kv_source", -1.0) < 0:
            found[att.window > 0] = i
    return found


class AssistantDrafter(Drafter):
    """Drafts argmax chains with a Gemma 4 assistant on its gemma4 target (`gemma4-assistant:PATH`).

    Refuses (ModelMismatch) a target that is not gemma4, whose width is not the assistant's
    `embedding_length_out`, or whose layer kinds or head widths are not the assistant's; VocabularyMismatch
    when the vocabularies differ (size, or token texts where both files list them); WrongBlockStyle for a
    model without `forward_step_hidden`.
    """

    name = "gemma4-assistant"
    follows_trunk = True

    def __init__(self, model: Any, path: str | Path):
        self.weights, tokens = load_weights(path, getattr(model, "backend", "reference"))
        self.model, self.path = model, Path(path)
        self.sources = check_target(model, self.weights, tokens)
        self.cache: Any = None
        self._hist = np.zeros((max(64, 2 * MAX_DRAFT + 2) + 1, self.weights.n_backbone), F32)
        self._n = 0

    def start(self, model: Any, capacity: int) -> None:
        mine, theirs = getattr(self.model, "cache_owner", None), getattr(model, "cache_owner", None)
        if model is not self.model and (mine is None or theirs is None or mine != theirs):
            raise ModelMismatch(f"this gemma4-assistant drafter reads the trunk of "
                                f"{mine.describe() if mine else 'another model'}, not of "
                                f"{theirs.describe() if theirs else type(model).__name__}: make one for this model")
        self.reset()

    def fork(self) -> AssistantDrafter:
        twin = AssistantDrafter.__new__(AssistantDrafter)
        twin.weights, twin.model, twin.path, twin.sources = self.weights, self.model, self.path, self.sources
        twin.cache, twin._hist, twin._n = None, np.zeros_like(self._hist), 0
        return twin

    def step(self, model: Any, cache: Any, ids: np.ndarray, all_logits: bool) -> np.ndarray:
        step = model.forward_step_hidden(ids, cache)     # logits [n, vocab], hidden [n, B]
        self.cache = cache
        size, hidden = len(self._hist), np.asarray(step.hidden, F32)
        keep = hidden[-size:]
        first = self._n + len(hidden) - len(keep)
        self._hist[np.arange(first, first + len(keep)) % size] = keep
        self._n += len(hidden)
        return step.logits if all_logits else step.logits[-1:]

    def rewind(self, n: int) -> None:
        if n > len(self._hist) - 1 or n > self._n:
            raise InvalidRequest(f"cannot rewind {n} tokens: this drafter keeps {len(self._hist) - 1} hidden states")
        self._n -= n

    def reset(self) -> None:
        self._n, self.cache = 0, None

    def propose(self, history: Sequence[int], k: int, sampler: DraftSampler) -> Draft:
        if k < 1 or self._n == 0 or self.cache is None:
            return Draft()
        if len(history) != self._n + 1 or len(self.cache) != self._n:
            raise InvalidRequest(f"the drafter followed {self._n} target tokens, but the history holds "
                                 f"{len(history)} and the cache {len(self.cache)}")
        _, tokens = self.draft(int(history[-1]), k)
        return Draft(tuple(tokens))

    def draft(self, token: int, k: int) -> tuple[np.ndarray, list[int]]:
        """(logits [k, vocab], argmax chain [k]) of k draft steps after the target's last step, the first
        fed `token` (the one after the last the target has seen)."""
        n_vocab = self.model.descriptor.n_vocab
        if not isinstance(token, int | np.integer) or isinstance(token, bool) or not 0 <= token < n_vocab:
            raise InvalidRequest(f"token must be an integer id in [0, {n_vocab}), got {token!r}")
        if self._n == 0 or self.cache is None:
            raise InvalidRequest("the assistant drafts after a target step (step) has been seen")
        hidden = self._hist[(self._n - 1) % len(self._hist)].copy()
        kv = {sliding: self._rows(layer, sliding) for sliding, layer in self.sources.items()}
        return math.draft_chain(self.weights, self.model.embed, int(token), hidden, kv, self._n, k)

    def _rows(self, layer: int, sliding: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The target's cached rows layer `layer` holds for positions the assistant attends (float32)."""
        slot, n = self.cache.slots[layer], self._n
        if hasattr(slot, "gather"):                     # a sliding layer's ring: rows by position
            k, v, pos = slot.gather(n)
        elif hasattr(slot, "rows"):
            k, v = slot.rows(n)
            pos = np.arange(n)
        else:
            raise ModelMismatch(f"layer {layer}'s cache slot ({type(slot).__name__}) exposes no rows to read")
        first = math.sliding_rows(n, self.weights.window) if sliding else 0
        sel = pos >= first
        if int(sel.sum()) != n - first:
            raise InvalidRequest(f"the target's cache of layer {layer} no longer holds positions {first}..{n - 1} "
                                 "the assistant attends (make its cache with a larger max_rewind)")
        if len(pos) == n and (pos == np.arange(n)).all():    # rows in position order: views, no copy
            return k[first:], v[first:], pos[first:]
        return k[sel], v[sel], pos[sel]


def check_target(model: Any, w: math.AssistantWeights, tokens: Sequence[str] | None) -> dict[bool, int]:
    """The target's source layer of each kind the assistant uses; a typed error when they do not pair."""
    d = model.descriptor
    if d.architecture != "gemma4":
        raise ModelMismatch(f"a Gemma 4 assistant drafts for a gemma4 model, not for {d.architecture!r}")
    if not callable(getattr(model, "forward_step_hidden", None)):
        raise WrongBlockStyle("the gemma4-assistant drafter reads the target's hidden states "
                              "(forward_step_hidden); this model has no such entry")
    if d.n_embd != w.n_backbone:
        raise ModelMismatch(f"the assistant was made for a target of width {w.n_backbone} "
                            f"(embedding_length_out), this gemma4 model's is {d.n_embd}")
    if d.n_vocab != w.n_vocab:
        raise VocabularyMismatch(f"the assistant's vocabulary has {w.n_vocab} tokens, the target's {d.n_vocab}")
    theirs = getattr(getattr(model, "gguf", None), "metadata", {}).get("tokenizer.ggml.tokens")
    if tokens is not None and theirs is not None and list(tokens) != list(theirs):
        first = next(i for i, (a, b) in enumerate(zip(tokens, theirs, strict=False)) if a != b) \
            if len(tokens) == len(theirs) else min(len(tokens), len(theirs))
        raise VocabularyMismatch(f"the assistant's and the target's vocabularies differ (from token {first})")
    sources = source_layers(model)
    for layer in w.layers:
        kind = "sliding" if layer.sliding else "full"
        if layer.sliding not in sources:
            raise ModelMismatch(f"the assistant has {kind} layers; the target has no {kind} layer computing keys")
        spec = d.layers[sources[layer.sliding]].attention
        if spec.head_dim != layer.head_dim or layer.n_head % spec.n_head_kv:
            raise ModelMismatch(f"the assistant's {kind} layers have {layer.n_head} heads of width {layer.head_dim}; "
                                f"the target's keys there are {spec.n_head_kv} heads of width {spec.head_dim}")
    return {s: sources[s] for s in {layer.sliding for layer in w.layers}}


def assistant_drafter(model: Any, arg: str | None) -> AssistantDrafter:
    """Drafter factory for "gemma4-assistant:PATH" (PATH: the assistant's GGUF file)."""
    if not arg:
        raise InvalidRequest("gemma4-assistant takes the assistant's GGUF file: gemma4-assistant:PATH")
    try:
        return AssistantDrafter(model, arg)
    except ModelLoadError:
        raise
    except OSError as e:
        raise ModelLoadError(f"cannot read {arg}: {e}") from None
