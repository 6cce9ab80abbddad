"""What plugins register: pre-tokenizers (`tokenizer.ggml.pre`) and vocabulary kinds (`tokenizer.ggml.model`).

The core holds none of them: `pre_tokenizers()` and `tokenizer_models()` collect what installed plugins
register through archrun_register_pre_tokenizers / archrun_register_tokenizer_models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import Keys

from archrun.errors import TokenizerError
from archrun.text.tokenizer.metadata import _get, _get_bytes, _get_numbers, _get_strings, _read_flag

Splitter = Callable[[str], list[tuple[int, int]]]  # text -> its pieces as [start, end) spans, in order


@dataclass(frozen=True)
class PreTokenizer:
    """What llama.cpp derives from one `tokenizer.ggml.pre` value (llama_vocab::impl::load).

    regexes: applied in order, each splitting every piece so far; an entry is a regex (Oniguruma
    syntax, as HF tokenizers runs it; matches become pieces) or a `Splitter` function for what
    llama.cpp splits by hand instead of by a regex.
    """

    regexes: tuple[str | Splitter, ...]
    clean_spaces: bool = True  # decode drops " ?", " !", ... like clean_up_tokenization_spaces
    ignore_merges: bool = False  # a piece that is itself a token is not merged from characters
    add_bos: bool = False  # default for tokenizer.ggml.add_bos_token
    bos_default: int | None = 11  # llama.cpp's default BOS/EOS id for BPE vocabularies
    spm_style: bool = False  # gemma4: spaces -> ▁, raw UTF-8 with <0xNN> byte fallback (no byte-level
    #                         alphabet), a newline run that is a token stays whole
    force_bos: bool = False  # gemma4: BOS added even when tokenizer.ggml.add_bos_token is false


@dataclass(frozen=True)
class TokenizerParts:
    """What a vocabulary kind's builder returns: the `tokenizer.ggml.pre` name in effect, the engine
    (encode(fragments) -> ids per fragment; bind(ids, attrs) once the special ids are known),
    llama.cpp's default special ids (role -> id) and flags (add_bos, force_bos, add_eos, add_sep,
    clean_spaces, unescape_spaces, add_space_prefix)."""

    pre: str | None
    engine: Any
    defaults: Mapping[str, int | None]
    flags: Mapping[str, bool]


class TokenizerSource:
    """What a vocabulary kind's builder reads: the file's metadata through typed readers that name
    the key when its value is wrong, the token texts, text -> id, and the registered pre-tokenizers."""

    def __init__(self, metadata: Mapping[str, Any], tokens: list[str], index: dict[str, int],
                 plugins: Any = None) -> None:
        self.metadata, self.tokens, self.index, self._plugins = metadata, tokens, index, plugins

    def value(self, key: str, kind: type, default: Any = None) -> Any:
        """metadata[key] checked to be a `kind` (str, int, float or bool), `default` when absent."""
        return _get(self.metadata, key, kind, default)

    def flag(self, key: str, default: bool) -> bool:
        """A bool key, `default` when absent."""
        return _read_flag(self.metadata, key, default)

    def strings(self, key: str) -> list[str] | None:
        """A string array, None when absent."""
        return _get_strings(self.metadata, key)

    def numbers(self, key: str, integer: bool) -> np.ndarray | None:
        """A numeric array with one entry per token (integers only when `integer`), None when absent."""
        return _get_numbers(self.metadata, key, len(self.tokens), integer)

    def raw_bytes(self, key: str) -> bytes | None:
        """An int8/uint8 array as bytes, None when absent."""
        return _get_bytes(self.metadata, key)

    def pre_tokenizer(self, name: str) -> PreTokenizer:
        """The registered pre-tokenizer `name` (a `tokenizer.ggml.pre` value); TokenizerError if none is."""
        table = pre_tokenizers(self._plugins)
        pre = table.get(name)
        if pre is None:
            raise TokenizerError(f"unknown pre-tokenizer {Keys.Tokenizer.PRE} = {name!r} "
                                 f"({_supported(table, 'pre-tokenizers')})")
        return pre


def pre_tokenizers(plugins: Any = None) -> Mapping[str, PreTokenizer]:
    """`tokenizer.ggml.pre` value -> PreTokenizer, as the plugins register them (None: the installed
    plugins). A name registered twice is a PluginError naming both plugins."""
    from archrun.plugins import checked_plugin_manager
    from archrun.plugins.registry import collect_named

    return collect_named(checked_plugin_manager(plugins), "archrun_register_pre_tokenizers", "pre-tokenizer",
                         PreTokenizer)


def tokenizer_models(plugins: Any = None) -> Mapping[str, Callable[[TokenizerSource], TokenizerParts]]:
    """`tokenizer.ggml.model` value -> its builder, as the plugins register them (None: the installed
    plugins). A name registered twice is a PluginError naming both plugins."""
    from archrun.plugins import checked_plugin_manager
    from archrun.plugins.registry import collect_named

    return collect_named(checked_plugin_manager(plugins), "archrun_register_tokenizer_models", "tokenizer model")


def _supported(table: Mapping[str, Any], what: str) -> str:
    if not table:
        return f"no installed plugin registers {what}: install the vocabulary package"
    return f"supported: {', '.join(sorted(table))}"
