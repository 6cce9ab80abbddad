"""archrun: descriptor + weights -> runnable model.

    >>> import archrun
    >>> model = archrun.load("SmolLM2-135M-Instruct.Q4_1.gguf")
    >>> cache = model.init_cache(256)
    >>> logits = model.forward_step(model.tokenizer.encode("Hello"), cache)
"""

from __future__ import annotations

from archrun.errors import (
    ArchrunError,
    ArchrunWarning,
    ChatTemplateError,
    ContextOverflow,
    InvalidRequest,
    MetadataError,
    MissingTensor,
    ModelLoadError,
    ModelMismatch,
    NotGenerative,
    NumericalError,
    PluginError,
    ShapeMismatch,
    SplitSetError,
    TokenizerError,
    UnknownVocabulary,
    UnsupportedArchitecture,
    UnsupportedQuantType,
    VocabularyMismatch,
    WrongBlockStyle,
)

__version__ = "0.1.0"

__all__ = [
    "ArchrunError", "ArchrunWarning", "ChatTemplateError", "ContextOverflow", "InvalidRequest",
    "MetadataError", "MissingTensor", "ModelLoadError", "ModelMismatch", "NumericalError", "PluginError",
    "ShapeMismatch", "SplitSetError", "TokenizerError",
    "UnknownVocabulary", "UnsupportedArchitecture", "UnsupportedQuantType", "VocabularyMismatch", "WrongBlockStyle",
    "load", "Descriptor", "Tokenizer", "generate", "chat", "embed", "NotGenerative",
]

_LAZY = {
    "load": ("archrun.api", "load"),
    "embed": ("archrun.generation.embedding", "embed"),
    "Model": ("archrun.api", "Model"),
    "Descriptor": ("archrun.descriptor", "Descriptor"),
    "Tokenizer": ("archrun.text.tokenizer", "Tokenizer"),
    "generate": ("archrun.generation.generate", "generate"),
    "chat": ("archrun.generation.generate", "chat"),
}


def __getattr__(name: str):
    # Heavy modules (numba kernels, plugins) load on first use, not at import.
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'archrun' has no attribute {name!r}")
