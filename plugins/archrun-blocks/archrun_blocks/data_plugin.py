"""Registers archrun's built-in data: pre-tokenizers, vocabulary kinds, layer patterns.

The hooks are re-exported by archrun_blocks.plugin, the package's entry point.
"""

from __future__ import annotations

from archrun.hookspecs import hookimpl
from archrun_blocks.layer_patterns import LAYER_PATTERNS
from archrun_blocks.pretokenizers import pre_tokenizer_table
from archrun_blocks.tokenizer_models import TOKENIZER_MODELS


@hookimpl
def archrun_register_pre_tokenizers(register) -> None:
    for name, pre in pre_tokenizer_table().items():
        register(name, pre)


@hookimpl
def archrun_register_tokenizer_models(register) -> None:
    for name, build in TOKENIZER_MODELS.items():
        register(name, build)


@hookimpl
def archrun_register_layer_patterns(register) -> None:
    for name, pattern in LAYER_PATTERNS.items():
        register(name, pattern)
