"""Typed errors: every error archrun raises on bad input derives from ArchrunError."""

from __future__ import annotations

import reprlib

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 60, 60


def shown(value: object, limit: int = 100) -> str:
    """A caller's value as error messages quote it: repr bounded in depth and length, and never
    failing (a 100,000-deep or self-referencing list, an object whose repr raises)."""
    try:
        text = _REPR.repr(value)
    except Exception:  # noqa: BLE001 - any failing __repr__
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


class ArchrunError(Exception):
    """Base of every error archrun raises because of bad input or an unsupported model."""


class ModelLoadError(ArchrunError):
    """The GGUF container is damaged or hostile (truncated, bad magic, bad offsets, ...)."""


class MetadataError(ModelLoadError):
    """A metadata key is missing, has the wrong type, or holds an impossible value."""


class UnsupportedArchitecture(ArchrunError):
    """The file's architecture cannot be described (no family plugin and no generic layout)."""


class UnknownVocabulary(ArchrunError):
    """A descriptor names a (slot, value) that no installed plugin provides."""


class MissingTensor(ModelLoadError):
    """A tensor the descriptor requires is absent from the file."""


class SplitSetError(ModelLoadError):
    """The parts of a split GGUF do not make one model: a part missing, a part of another set, a tensor
    count that disagrees with split.tensors.count, a tensor in two parts."""


class AdapterError(ModelLoadError):
    """A LoRA adapter file is not one archrun can apply: not an adapter, not LoRA, a half of a pair missing."""


class AdapterMismatch(AdapterError):
    """A LoRA adapter does not fit the model: another architecture, a tensor the model lacks, another shape."""


class UnexpectedTensor(ModelLoadError):
    """The file holds tensors the model's plan does not use (it would run without them: wrong)."""


class ShapeMismatch(ModelLoadError):
    """A tensor's shape contradicts the metadata."""


class UnsupportedQuantType(ArchrunError):
    """A tensor uses a ggml quantization type archrun cannot execute."""


class WrongBlockStyle(ArchrunError):
    """An entry point of one block style was called on a model of the other style."""


class NotGenerative(ArchrunError):
    """The model cannot generate: an encoder (bidirectional attention) embeds text (archrun.embed) but has
    no next-token distribution to sample from."""


class ContextOverflow(ArchrunError):
    """The tokens do not fit the cache / context window."""


class TokenizerError(ArchrunError):
    """The tokenizer metadata is malformed or unsupported, or ids are out of range."""


class ChatTemplateError(ArchrunError):
    """A chat template is missing, unsafe, too expensive, or raised while rendering."""


class InvalidRequest(ArchrunError):
    """Generation options or inputs are out of range (temperature NaN, bad ids, ...)."""


class KvTypeUnsupported(InvalidRequest):
    """init_cache asked for a kv type (KV cache row format) that a layer's op cannot store."""


class ModelMismatch(InvalidRequest):
    """A per-sequence object (a cache, a generation request, a drafter's or a grammar's state) was made by
    another model than the one it was given to, or its internals were replaced after it was made."""


class VocabularyMismatch(InvalidRequest):
    """A draft model's vocabulary differs from its target's (speculative decoding refuses the pair)."""


class PluginError(ArchrunError):
    """A plugin registered something inconsistent (duplicate vocabulary entry, bad op)."""


class NumericalError(ArchrunError):
    """The model computed NaN logits (weights that overflow float32 activations): nothing to sample."""


class BadTrace(InvalidRequest):
    """A trace file (archrun.conformance.trace_format) is unreadable, or does not fit the model or the
    other trace it is compared with (other token ids, other shapes)."""


class NotRecovered(ArchrunError):
    """The recovery loop found no combination of conventions that makes a model match its reference;
    the message names the first op whose output no installed vocabulary reproduces."""


class ArchrunWarning(UserWarning):
    """Warnings about assumptions archrun made (generic architecture, unused keys)."""


def check_flag(name: str, value: object) -> bool:
    """A True/False option (numpy bools too) as a bool; anything else is InvalidRequest (an object whose
    truth value raises, an array, a string)."""
    import numpy as np

    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise InvalidRequest(f"{name} must be True or False, got {shown(value)}")


def check_count(name: str, value: object, lo: int = 0) -> int:
    """An integer option >= lo (numpy integers too) as an int; anything else is InvalidRequest."""
    import numpy as np

    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidRequest(f"{name} must be an integer >= {lo}, got {shown(value)}")
    if value < lo:
        raise InvalidRequest(f"{name} must be an integer >= {lo}, got {int(value)}")
    return int(value)
