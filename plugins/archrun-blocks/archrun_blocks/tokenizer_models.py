"""The vocabulary kinds of llama.cpp (llama-vocab.cpp), by `tokenizer.ggml.model` value.

Each builder reads what its kind needs from the file (archrun.text.tokenizer.TokenizerSource) and
returns the engine with llama.cpp's default special ids and flags (archrun.text.tokenizer.TokenizerParts).
Registered through `archrun_register_tokenizer_models` (archrun_blocks.plugin).
"""

from __future__ import annotations

import warnings

import numpy as np
from gguf.constants import Keys

from archrun.errors import ArchrunWarning, TokenizerError
from archrun.text.tokenizer import BpeEngine, SpmEngine, TokenizerParts, TokenizerSource, UgmEngine, WpmEngine

# BertNormalizer options of WPM vocabularies (llama.cpp's keys; gguf-py's constants lack them)
KEY_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
KEY_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"


def bpe(src: TokenizerSource, pre_name: str | None = None) -> TokenizerParts:
    """tokenizer.ggml.model = gpt2: byte-level BPE with the pre-tokenizer the file names; without a
    `tokenizer.ggml.pre` key llama.cpp falls back to its `default` regexes and warns, so do we."""
    if pre_name is None:
        pre_name = src.value(Keys.Tokenizer.PRE, str)
    if pre_name is None:
        warnings.warn(f"{Keys.Tokenizer.PRE} is missing: using llama.cpp's 'default' pre-tokenizer "
                      "(generation quality may be degraded; consider regenerating the file)",
                      ArchrunWarning, stacklevel=5)
        pre_name = "default"
    pre = src.pre_tokenizer(pre_name)
    merges = src.strings(Keys.Tokenizer.MERGES)
    if merges is None:
        raise TokenizerError(f"{Keys.Tokenizer.MERGES} is missing")
    engine = BpeEngine(src.index, merges, pre)
    flags = {"add_bos": pre.add_bos, "force_bos": pre.force_bos, "clean_spaces": pre.clean_spaces,
             "unescape_spaces": pre.spm_style, "add_space_prefix": src.flag(Keys.Tokenizer.ADD_PREFIX, False)}
    return TokenizerParts(pre_name, engine, {"bos": pre.bos_default, "eos": 11}, flags)


def gemma4(src: TokenizerSource) -> TokenizerParts:
    """tokenizer.ggml.model = gemma4: BPE with the gemma4 pre-tokenizer whatever `pre` says, and no
    default special ids (llama.cpp reads them all from the file)."""
    parts = bpe(src, pre_name="gemma4")
    return TokenizerParts(parts.pre, parts.engine, {}, parts.flags)


def wpm(src: TokenizerSource) -> TokenizerParts:
    """tokenizer.ggml.model = bert: WordPiece (llama.cpp's llm_tokenizer_wpm); encode wraps the
    text in CLS (the BOS id) ... SEP when add_special."""
    lowercase = src.flag(KEY_LOWERCASE, True)
    strip_accents = src.flag(KEY_STRIP_ACCENTS, lowercase)
    engine = WpmEngine(src.index, src.tokens, lowercase=lowercase, strip_accents=strip_accents)
    defaults = {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103}
    flags = {"add_bos": True, "force_bos": True, "add_sep": True, "clean_spaces": True,
             "unescape_spaces": True, "add_space_prefix": src.flag(Keys.Tokenizer.ADD_PREFIX, False)}
    return TokenizerParts(src.value(Keys.Tokenizer.PRE, str), engine, defaults, flags)


def spm(src: TokenizerSource) -> TokenizerParts:
    """tokenizer.ggml.model = llama: SentencePiece-style merges by score (llm_tokenizer_spm)."""
    scores = src.numbers(Keys.Tokenizer.SCORES, integer=False)
    if scores is None:
        raise TokenizerError(f"{Keys.Tokenizer.SCORES} is missing (required by the 'llama' tokenizer)")
    engine = SpmEngine(src.index, scores.astype(np.float32).tolist())
    flags = {"add_bos": True, "force_bos": False, "clean_spaces": False, "unescape_spaces": True,
             "add_space_prefix": src.flag(Keys.Tokenizer.ADD_PREFIX, True)}
    return TokenizerParts(src.value(Keys.Tokenizer.PRE, str), engine, {"bos": 1, "eos": 2, "unk": 0}, flags)


def ugm(src: TokenizerSource) -> TokenizerParts:
    """tokenizer.ggml.model = t5: unigram (llama.cpp's llm_tokenizer_ugm) with the file's
    precompiled charsmap; scores default to 0 like llama.cpp's."""
    scores = src.numbers(Keys.Tokenizer.SCORES, integer=False)
    scores = [0.0] * len(src.tokens) if scores is None else scores.astype(np.float32).tolist()
    charsmap = src.raw_bytes(Keys.Tokenizer.PRECOMPILED_CHARSMAP)
    add_space_prefix = src.flag(Keys.Tokenizer.ADD_PREFIX, False)
    merge_spaces = src.flag(Keys.Tokenizer.REMOVE_EXTRA_WS, False)
    engine = UgmEngine(src.tokens, scores, charsmap, add_space_prefix, merge_spaces)
    flags = {"add_bos": False, "force_bos": False, "add_eos": True, "clean_spaces": False,
             "unescape_spaces": True, "add_space_prefix": add_space_prefix}
    return TokenizerParts(src.value(Keys.Tokenizer.PRE, str), engine, {"eos": 1, "unk": 2, "pad": 0}, flags)


# tokenizer.ggml.model -> builder
TOKENIZER_MODELS = {"gpt2": bpe, "llama": spm, "bert": wpm, "gemma4": gemma4, "t5": ugm}
