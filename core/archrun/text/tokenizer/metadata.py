"""A GGUF file's `tokenizer.*` metadata read and checked: tokens, attributes, special ids, flags.

Malformed metadata never degrades into a guess: it raises `TokenizerError` naming the key.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import Keys

from archrun.errors import ArchrunWarning, TokenizerError

ATTR_UNDEFINED = 0


ATTR_UNKNOWN = 1 << 0


ATTR_UNUSED = 1 << 1


ATTR_NORMAL = 1 << 2


ATTR_CONTROL = 1 << 3


ATTR_USER_DEFINED = 1 << 4


ATTR_BYTE = 1 << 5


# GGUF tokenizer.ggml.token_type value (gguf.constants.TokenType; 0 = undefined) -> attribute flag
_TYPE_TO_ATTR = np.array(
    [ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE],
    dtype=np.int64,
)


MAX_TOKEN_BYTES = 4096  # longest token text accepted; real vocabularies stay below ~300 bytes


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


_ID_KEYS: dict[str, tuple[str, ...]] = {
    "bos": (Keys.Tokenizer.BOS_ID,),
    "eos": (Keys.Tokenizer.EOS_ID,),
    "eot": (Keys.Tokenizer.EOT_ID,),
    "eom": (Keys.Tokenizer.EOM_ID,),
    "unk": (Keys.Tokenizer.UNK_ID,),
    "sep": (Keys.Tokenizer.SEP_ID,),
    "pad": (Keys.Tokenizer.PAD_ID,),
    "mask": (Keys.Tokenizer.MASK_ID,),
    "fim_pre": (Keys.Tokenizer.FIM_PRE_ID, Keys.Tokenizer.PREFIX_ID),
    "fim_suf": (Keys.Tokenizer.FIM_SUF_ID, Keys.Tokenizer.SUFFIX_ID),
    "fim_mid": (Keys.Tokenizer.FIM_MID_ID, Keys.Tokenizer.MIDDLE_ID),
    "fim_pad": (Keys.Tokenizer.FIM_PAD_ID,),
    "fim_rep": (Keys.Tokenizer.FIM_REP_ID,),
    "fim_sep": (Keys.Tokenizer.FIM_SEP_ID,),
}


# role -> token texts that mark it when the file has no id for it (first match in this order wins)
_ROLE_TEXTS: dict[str, tuple[str, ...]] = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}


# texts llama.cpp always treats as end-of-generation (and forces to control type)
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})


def _get(meta: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """meta[key] checked to be a `kind` (a bool is never accepted as an int, nor an int as a bool)."""
    if key not in meta:
        return default
    value = meta[key]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise TokenizerError(f"{key} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _get_strings(meta: Mapping[str, Any], key: str) -> list[str] | None:
    """A string array (list[str]) or None when absent."""
    if key not in meta:
        return None
    value = meta[key]
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TokenizerError(f"{key} must be an array of strings, got {type(value).__name__}")
    if not set(map(type, value)) <= {str}:  # C-speed check first; locate the culprit only on failure
        i, item = next((i, x) for i, x in enumerate(value) if not isinstance(x, str))
        raise TokenizerError(f"{key}[{i}] must be a string, got {type(item).__name__}")
    return list(value)


def _get_numbers(meta: Mapping[str, Any], key: str, n: int, integer: bool) -> np.ndarray | None:
    """A numeric array of exactly `n` elements (integers only when `integer`), or None when absent."""
    if key not in meta:
        return None
    value = meta[key]
    if isinstance(value, str | bytes) or not isinstance(value, np.ndarray | Sequence):
        raise TokenizerError(f"{key} must be a numeric array, got {type(value).__name__}")
    arr = np.asarray(value)
    ok_kinds = "iu" if integer else "iuf"
    if arr.ndim != 1 or arr.dtype.kind not in ok_kinds:
        what = "integer" if integer else "numeric"
        raise TokenizerError(f"{key} must be a 1-D {what} array, got dtype {arr.dtype} shape {arr.shape}")
    if len(arr) != n:
        raise TokenizerError(f"{key} has {len(arr)} entries but the vocabulary has {n} tokens")
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise TokenizerError(f"{key} contains NaN or infinite values")
    return arr


def _get_bytes(meta: Mapping[str, Any], key: str) -> bytes | None:
    """An int8/uint8 array as bytes, or None when absent."""
    if key not in meta:
        return None
    value = meta[key]
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) or not isinstance(value, np.ndarray | Sequence):
        raise TokenizerError(f"{key} must be a byte array, got {type(value).__name__}")
    arr = np.asarray(value)
    if arr.ndim != 1 or (arr.dtype not in (np.int8, np.uint8) and
                         not (arr.dtype.kind in "iu" and arr.size and arr.min() >= -128 and arr.max() <= 255)):
        raise TokenizerError(f"{key} must be a 1-D int8/uint8 array, got dtype {arr.dtype} shape {arr.shape}")
    return (arr.astype(np.int64) & 0xFF).astype(np.uint8).tobytes()


def _read_tokens(meta: Mapping[str, Any]) -> list[str]:
    """tokenizer.ggml.tokens, validated: non-empty, unique, bounded length (empty texts renamed)."""
    tokens = _get_strings(meta, Keys.Tokenizer.LIST)
    if not tokens:
        raise TokenizerError(f"{Keys.Tokenizer.LIST} is missing or empty")
    _check_unicode("".join(tokens), what=Keys.Tokenizer.LIST)
    if min(map(len, tokens)) > 0 and max(map(len, tokens)) <= MAX_TOKEN_BYTES // 4:
        return tokens  # fast path: nothing empty, nothing that could be too long
    for i, text in enumerate(tokens):
        if not text:
            # llama.cpp renames empty tokens the same way so they stay addressable
            warnings.warn(f"empty token at index {i}, renamed [EMPTY_{i}]", ArchrunWarning, stacklevel=3)
            tokens[i] = f"[EMPTY_{i}]"
        elif len(text) > MAX_TOKEN_BYTES // 4 and len(text.encode("utf-8")) > MAX_TOKEN_BYTES:
            size = len(text.encode("utf-8"))
            raise TokenizerError(f"token {i} is {size} bytes long (limit {MAX_TOKEN_BYTES})")
    return tokens


def _token_index(tokens: list[str]) -> dict[str, int]:
    """text -> id; duplicate texts are an error (llama.cpp asserts on them)."""
    index = {text: i for i, text in enumerate(tokens)}
    if len(index) != len(tokens):
        seen: set[str] = set()
        for i, text in enumerate(tokens):
            if text in seen:
                raise TokenizerError(f"token {i} {text[:40]!r} duplicates an earlier token")
            seen.add(text)
    return index


def _read_attrs(meta: Mapping[str, Any], tokens: list[str]) -> list[int]:
    """Per-token attribute flags from tokenizer.ggml.token_type (all normal when absent)."""
    types = _get_numbers(meta, Keys.Tokenizer.TOKEN_TYPE, len(tokens), integer=True)
    if types is None:
        return [ATTR_NORMAL] * len(tokens)
    bad = np.nonzero((types < 0) | (types >= len(_TYPE_TO_ATTR)))[0]
    if len(bad):
        key = Keys.Tokenizer.TOKEN_TYPE
        raise TokenizerError(f"{key}[{bad[0]}] = {types[bad[0]]} is not a token type (0..6)")
    attrs = _TYPE_TO_ATTR[types.astype(np.int64)]
    for i in np.nonzero(attrs == ATTR_BYTE)[0].tolist():
        if not _BYTE_TOKEN.fullmatch(tokens[i]):
            raise TokenizerError(f"byte token {i} is {tokens[i][:40]!r}, expected the form <0xNN>")
    return attrs.tolist()


@dataclass
class _Specials:
    ids: dict[str, int | None]
    eog: frozenset[int]


def _read_special_ids(meta: Mapping[str, Any], defaults: dict[str, int | None], n_vocab: int) -> dict:
    """Role -> id: the file's key if present (must be in range), else llama.cpp's default if in range."""
    ids: dict[str, int | None] = {}
    for role, keys in _ID_KEYS.items():
        default = defaults.get(role)
        ids[role] = default if default is not None and 0 <= default < n_vocab else None
        for key in keys:
            value = _get(meta, key, int)
            if value is None:
                continue
            if not 0 <= value < n_vocab:
                raise TokenizerError(f"{key} = {value} is outside the vocabulary (0..{n_vocab - 1})")
            ids[role] = value
            break
    return ids


def _find_role_tokens(ids: dict, index: dict[str, int], attrs: list[int]) -> None:
    """Fill unset eot/eom/fim roles from well-known token texts; such tokens become control tokens."""
    for role, texts in _ROLE_TEXTS.items():
        if ids[role] is not None:
            continue
        for text in texts:
            tid = index.get(text)
            if tid is not None:
                ids[role] = tid
                attrs[tid] |= ATTR_CONTROL
                break


def _eog_set(ids: dict, index: dict[str, int], attrs: list[int], tokens: list[str]) -> frozenset[int]:
    """End-of-generation ids the way llama.cpp collects them (FIM pad/rep/sep, EOG texts, eos/eot/eom)."""
    eog = {ids[r] for r in ("fim_pad", "fim_rep", "fim_sep") if ids[r] is not None}
    for text in _EOG_TEXTS:
        tid = index.get(text)
        if tid is not None:
            eog.add(tid)
            attrs[tid] |= ATTR_CONTROL
    for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss markup
        if text in index:
            attrs[index[text]] = ATTR_USER_DEFINED
    eog.update(ids[r] for r in ("eos", "eot", "eom") if ids[r] is not None)
    texts = {tokens[t]: t for t in eog}
    if "<|end|>" in texts and ({"<|return|>", "<|call|>"} <= texts.keys() or
                               {"<|calls|>", "<|flush|>"} <= texts.keys()):
        eog.discard(texts["<|end|>"])  # harmony / solar-open: <|end|> ends a message, not generation
        attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = ATTR_NORMAL
    return frozenset(eog)


def _read_flag(meta: Mapping[str, Any], key: str, default: bool) -> bool:
    return _get(meta, key, bool, default)


def _check_unicode(text: str, what: str = "text") -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TokenizerError(f"{what} is not valid Unicode: lone surrogate at position {exc.start}") from None
