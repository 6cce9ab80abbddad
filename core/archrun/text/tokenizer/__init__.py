"""Tokenizer built from a GGUF file's own `tokenizer.*` metadata, matching llama.cpp token for token.

The engines of llama.cpp's vocabulary kinds (llama-vocab.cpp) live in this package, one file each
(bpe, spm, wpm, ugm); which `tokenizer.ggml.model` value builds which engine, and the pre-tokenizers
`tokenizer.ggml.pre` names, are plugin data (kinds: `tokenizer_models()`, `pre_tokenizers()`). The
built-in kinds (archrun-blocks registers them): ``gpt2`` and ``gemma4`` (BPE), ``llama`` (SentencePiece
scores), ``bert`` (WordPiece), ``t5`` (Unigram).
"""

from archrun.text.tokenizer.bpe import BpeEngine
from archrun.text.tokenizer.kinds import (
    PreTokenizer,
    Splitter,
    TokenizerParts,
    TokenizerSource,
    pre_tokenizers,
    tokenizer_models,
)
from archrun.text.tokenizer.spm import SpmEngine
from archrun.text.tokenizer.tokenizer import IncrementalDecoder, Tokenizer
from archrun.text.tokenizer.ugm import UgmEngine
from archrun.text.tokenizer.wpm import WHITESPACE, WpmEngine

__all__ = ["WHITESPACE", "BpeEngine", "IncrementalDecoder", "PreTokenizer", "SpmEngine", "Splitter", "Tokenizer",
           "TokenizerParts", "TokenizerSource", "UgmEngine", "WpmEngine", "pre_tokenizers", "tokenizer_models"]
