"""LoRA adapters in GGUF (llama.cpp's ``convert_lora_to_gguf.py``), merged into a model at load.

An adapter file says ``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``
and ``general.architecture`` (the base model's); its tensors come in pairs named after the base
tensor they change: ``<name>.lora_a`` (ggml ne [n_in, rank], or [n_in, rank, E] per expert) and
``<name>.lora_b`` (ne [rank, n_out(, E)]). As in llama.cpp, the change of ``W`` (numpy [n_out, n_in])
is ``scale * B @ A`` with ``scale = user_scale * alpha / rank`` (``user_scale`` alone when alpha is
0). ``token_embd.weight``'s pair is stored flipped (A [n_vocab, rank], B [n_embd, rank]): its change
is ``A @ B.T``.

Merging: each adapted tensor is dequantized to float32, every adapter's change added in float32,
and the result kept as an F32 tensor; the model then binds it like any F32 weight. Requantizing
to the base type would add that type's rounding error to every adapted weight (for Q4 types far
more than the adapter's own change to many of them) and make the result depend on archrun's
quantizer; float32 keeps the merged weight exact to float32 rounding, at 4 bytes per adapted
weight. Tensors no adapter touches keep their quantized encoding and the fast kernels.

``AdaptedFile`` wraps the base model file (a GGUFFile or GGUFSet) and answers like it: the binder
and the compiler see the merged tensors as F32 tensors of the same shapes.
"""

from __future__ import annotations

import math
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from archrun.errors import AdapterError, AdapterMismatch, InvalidRequest, MissingTensor, shown
from archrun.io.ggufio import TensorInfo

__all__ = ["AdaptedFile", "LoraAdapter", "apply_adapters", "open_adapter", "parse_lora_arg"]

_F32 = 0  # GGMLQuantizationType.F32
_TOKEN_EMBD = "token_embd.weight"


class LoraAdapter:
    """A validated LoRA adapter file: alpha, architecture and the (A, B) pair of each base tensor."""

    def __init__(self, path: str | os.PathLike) -> None:
        from archrun.io.ggufset import open_gguf

        self.file = open_gguf(path)
        self.path = self.file.path
        try:
            self._validate()
        except BaseException:
            self.file.close()
            raise

    def _validate(self) -> None:
        meta, name = self.file.metadata, self.path.name
        kind = meta.get("general.type")
        if kind != "adapter":
            raise AdapterError(f"{name} is not an adapter: general.type is {shown(kind)}, expected 'adapter'")
        if meta.get("adapter.type") != "lora":
            raise AdapterError(f"{name}: adapter.type is {shown(meta.get('adapter.type'))}; archrun applies "
                               "'lora' adapters only")
        alpha = meta.get("adapter.lora.alpha", 0.0)
        if isinstance(alpha, bool) or not isinstance(alpha, int | float | np.number) or not math.isfinite(alpha):
            raise AdapterError(f"{name}: adapter.lora.alpha = {shown(alpha)} is not a finite number")
        self.alpha = float(alpha)
        self.architecture = meta.get("general.architecture")
        self.pairs = _pairs(self.file.tensors, name)

    def scale(self, target: str, user_scale: float) -> float:
        """The factor of B @ A for `target`: user_scale * alpha / rank (user_scale when alpha is 0)."""
        rank = self.file.tensors[target + ".lora_b"].shape[0]
        return user_scale * self.alpha / rank if self.alpha else user_scale

    def delta(self, target: str, user_scale: float) -> np.ndarray:
        """float32 change of the base tensor `target` (numpy order), already scaled."""
        a = self.file.dequantize(target + ".lora_a")
        b = self.file.dequantize(target + ".lora_b")
        s = np.float32(self.scale(target, user_scale))
        if target == _TOKEN_EMBD:  # flipped pair: A [n_vocab, rank], B [n_embd, rank]
            return (a @ b.T) * s
        return np.matmul(b, a) * s  # [(E,) n_out, rank] @ [(E,) rank, n_in]

    def check_fits(self, base: Any) -> None:
        """AdapterMismatch unless every pair changes a tensor of `base` (a model file) of the right shape."""
        arch = base.metadata.get("general.architecture")
        if self.architecture != arch:
            raise AdapterMismatch(f"{self.path.name} is an adapter for {shown(self.architecture)} models; "
                                  f"the model is {shown(arch)}")
        for target in self.pairs:
            if target not in base.tensors:
                raise AdapterMismatch(f"{self.path.name} changes tensor {target!r}, which the model does not "
                                      "have (an adapter of another model?)")
            want = _pair_shape(self.file.tensors, target)
            have = base.tensors[target].np_shape
            if want != have:
                raise AdapterMismatch(f"{self.path.name}: the change of {target!r} is {want}, the model's tensor "
                                      f"is {have} (an adapter of another model?)")

    def close(self) -> None:
        self.file.close()


def _pairs(tensors: dict[str, TensorInfo], name: str) -> tuple[str, ...]:
    """The base tensors the adapter changes, each with both halves of matching rank."""
    targets: dict[str, set[str]] = {}
    for t in tensors:
        base, dot, half = t.rpartition(".")
        if not dot or half not in ("lora_a", "lora_b"):
            raise AdapterError(f"{name}: tensor {t!r} is not a LoRA half (*.lora_a / *.lora_b); archrun does not "
                               "apply adapters that replace tensors (e.g. norms)")
        targets.setdefault(base, set()).add(half)
    for base, halves in targets.items():
        if halves != {"lora_a", "lora_b"}:
            missing = ({"lora_a", "lora_b"} - halves).pop()
            raise AdapterError(f"{name}: {base}.{missing} is missing (a LoRA pair needs both halves)")
        _pair_shape(tensors, base, name)
    if not targets:
        raise AdapterError(f"{name} holds no LoRA tensors")
    return tuple(targets)


def _pair_shape(tensors: dict[str, TensorInfo], base: str, name: str = "") -> tuple[int, ...]:
    """The numpy shape of B @ A for one pair (AdapterError when its halves' ranks or experts disagree)."""
    a, b = tensors[base + ".lora_a"].shape, tensors[base + ".lora_b"].shape  # ggml ne order
    if base == _TOKEN_EMBD:  # A ne [rank, n_vocab], B ne [rank, n_embd]
        if len(a) != 2 or len(b) != 2 or a[0] != b[0]:
            raise AdapterError(f"{name}: {base}'s LoRA halves {a} and {b} do not share a rank")
        return (a[1], b[1])
    if len(a) != len(b) or len(a) not in (2, 3) or a[1] != b[0] or a[2:] != b[2:]:
        raise AdapterError(f"{name}: {base}'s LoRA halves (ne {a} and {b}) do not make a product: lora_a must be "
                           "[n_in, rank(, experts)] and lora_b [rank, n_out(, experts)]")
    return (*a[2:], b[1], a[0])


class AdaptedFile:
    """A model file with adapters merged: the adapted tensors read as F32, the others from the base."""

    def __init__(self, base: Any, adapters: Sequence[tuple[LoraAdapter, float]]) -> None:
        self.base, self.adapters = base, tuple(adapters)
        self.path, self.metadata, self.value_types = base.path, base.metadata, base.value_types
        self._merged: dict[str, np.ndarray] = {}
        self._targets = frozenset(t for a, _ in self.adapters for t in a.pairs)
        self.tensors = dict(base.tensors)
        for target in sorted(self._targets):
            info = base.tensors[target]
            self.tensors[target] = TensorInfo(name=target, shape=info.shape, ggml_type=_F32, offset=0,
                                              nbytes=4 * math.prod(info.shape))

    @property
    def adapted(self) -> frozenset[str]:
        """Names of the tensors the adapters change."""
        return self._targets

    @property
    def paths(self) -> tuple[pathlib.Path, ...]:
        return (*self.base.paths, *(a.path for a, _ in self.adapters))

    @property
    def parts(self) -> tuple:
        return getattr(self.base, "parts", (self.base,))

    def identity(self) -> tuple:
        """The base's identity, each adapter's and its scale: caches of another merge are not this model's."""
        return (self.base.identity(), *((a.file.identity(), s) for a, s in self.adapters))

    def merged(self, name: str) -> np.ndarray:
        """float32 numpy-shaped weight `name`: the base's plus every adapter's change (computed once)."""
        if name not in self._merged:
            w = self.base.dequantize(name)
            for adapter, scale in self.adapters:
                if name in adapter.pairs:
                    w += adapter.delta(name, scale)
            if not np.isfinite(w).all():
                raise AdapterError(f"merging the adapters into {name!r} gives non-finite weights")
            self._merged[name] = w
        return self._merged[name]

    def raw(self, name: str) -> np.ndarray:
        if self._adapted(name):
            return self.merged(name).reshape(-1).view(np.uint8)
        return self.base.raw(name)

    def raw_rows(self, name: str) -> np.ndarray:
        if self._adapted(name):
            w = self.merged(name)
            return w.reshape(-1, w.shape[-1]).view(np.uint8)
        return self.base.raw_rows(name)

    def dequantize(self, name: str) -> np.ndarray:
        return self.merged(name).copy() if self._adapted(name) else self.base.dequantize(name)

    def check_finite(self, name: str) -> None:
        if self._adapted(name):
            self.merged(name)
        else:
            self.base.check_finite(name)

    def _adapted(self, name: str) -> bool:
        if name not in self.tensors:
            raise MissingTensor(f"tensor {name!r} is not in {self.path.name}")
        return name in self._targets

    def check_intact(self) -> None:
        self.base.check_intact()

    def release_pages(self) -> None:
        self.base.release_pages()

    def close(self) -> None:
        self.base.close()
        for adapter, _ in self.adapters:
            adapter.close()

    def __enter__(self) -> AdaptedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_adapter(path: str | os.PathLike) -> LoraAdapter:
    """Open and validate a LoRA adapter file (AdapterError when it is not one)."""
    return LoraAdapter(path)


def apply_adapters(base: Any, lora: Any, lora_scale: float = 1.0) -> Any:
    """`base` with the adapters of `lora` merged (AdaptedFile), or `base` itself when `lora` is empty.

    lora: a path, or a sequence of paths and (path, scale) pairs; a path without its own scale uses
    lora_scale. Every adapter is validated against the base before any weight is merged.
    """
    specs = _adapter_specs(lora, lora_scale)
    if not specs:
        return base
    adapters: list[tuple[LoraAdapter, float]] = []
    try:
        for path, scale in specs:
            adapter = open_adapter(path)
            adapters.append((adapter, scale))
            adapter.check_fits(base)
    except BaseException:
        for adapter, _ in adapters:
            adapter.close()
        raise
    return AdaptedFile(base, adapters)


def _adapter_specs(lora: Any, lora_scale: Any) -> list[tuple[Any, float]]:
    if isinstance(lora_scale, bool) or not isinstance(lora_scale, int | float | np.number) \
            or not math.isfinite(lora_scale):
        raise InvalidRequest(f"lora_scale must be a finite number, got {shown(lora_scale)}")
    if lora is None:
        return []
    items = [lora] if isinstance(lora, str | os.PathLike) else lora
    if not isinstance(items, list | tuple):
        raise InvalidRequest(f"lora must be a path or a list of paths / (path, scale) pairs, got {shown(lora)}")
    specs = []
    for item in items:
        path, scale = item if isinstance(item, tuple) and len(item) == 2 else (item, lora_scale)
        if not isinstance(path, str | os.PathLike):
            raise InvalidRequest(f"a LoRA adapter must be given by its path, got {shown(item)}")
        if isinstance(scale, bool) or not isinstance(scale, int | float | np.number) or not math.isfinite(scale):
            raise InvalidRequest(f"the scale of LoRA adapter {shown(path)} must be a finite number, got {shown(scale)}")
        specs.append((path, float(scale)))
    return specs


def parse_lora_arg(text: str) -> tuple[str, float]:
    """A CLI `--lora PATH[:SCALE]` -> (path, scale); a path that itself holds ':' needs the scale."""
    path, sep, scale = text.rpartition(":")
    if sep:
        try:
            return path, float(scale)
        except ValueError:
            pass
    return text, 1.0
