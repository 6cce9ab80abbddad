"""Tokenizer built from a GGUF file's own `tokenizer.*` metadata, matching llama.cpp token for token.

The engines of llama.cpp's vocabulary kinds (llama-vocab.cpp) live here; which `tokenizer.ggml.model`
value builds which engine, and the pre-tokenizers `tokenizer.ggml.pre` names, are plugin data
(`archrun_register_tokenizer_models`, `archrun_register_pre_tokenizers`: `tokenizer_models()`,
`pre_tokenizers()`). The built-in kinds (archrun-blocks registers them):

- ``gpt2``  byte-level BPE. Text is split by the regexes llama.cpp uses for `tokenizer.ggml.pre`
  (its `default` ones, with a warning, when the key is absent), each piece is mapped to GPT-2's
  byte alphabet and merged by rank. HF `tokenizers` is the engine.
- ``gemma4`` BPE over raw UTF-8 with ``▁`` for spaces and ``<0xNN>`` byte fallback.
- ``llama`` SentencePiece-style vocabulary (scores + ``<0xNN>`` byte tokens): spaces become ``▁``
  and adjacent symbols are merged greedily by the score of the merged token (llama.cpp's
  llm_tokenizer_spm), with byte fallback for anything the vocabulary cannot spell.
- ``bert``  WordPiece (llm_tokenizer_wpm): BERT word split, greedy longest-match pieces.
- ``t5``    Unigram (llm_tokenizer_ugm): precompiled-charsmap normalization, Viterbi by score.

Special tokens (control, user-defined, unknown) are cut out of the text before either engine
runs, exactly as llama.cpp's tokenizer_st_partition does: longest token text first, every
occurrence. Control and unknown tokens are only recognised with ``parse_special=True``;
user-defined tokens always are (llama.cpp and HF tokenizers agree on that).

Malformed metadata never degrades into a guess: it raises `TokenizerError` naming the key.
"""

from __future__ import annotations

import bisect
import codecs
import heapq
import math
import re
import unicodedata
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import Keys

from archrun.errors import ArchrunWarning, InvalidRequest, PluginError, TokenizerError, check_flag, shown

# --- token attributes (llama.cpp's llama_token_attr bit flags; GGUF token_type maps onto them) ---

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

_PREFIX = 3  # characters of a special token's text used to pre-filter candidates
MAX_TOKEN_BYTES = 4096  # longest token text accepted; real vocabularies stay below ~300 bytes
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")

# --- what plugins register: pre-tokenizers (archrun_register_pre_tokenizers) and vocabulary kinds
#     (archrun_register_tokenizer_models); the core holds none of them ---

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
    from archrun.registry import collect_named

    return collect_named(checked_plugin_manager(plugins), "archrun_register_pre_tokenizers", "pre-tokenizer",
                         PreTokenizer)


def tokenizer_models(plugins: Any = None) -> Mapping[str, Callable[[TokenizerSource], TokenizerParts]]:
    """`tokenizer.ggml.model` value -> its builder, as the plugins register them (None: the installed
    plugins). A name registered twice is a PluginError naming both plugins."""
    from archrun.plugins import checked_plugin_manager
    from archrun.registry import collect_named

    return collect_named(checked_plugin_manager(plugins), "archrun_register_tokenizer_models", "tokenizer model")


def _supported(table: Mapping[str, Any], what: str) -> str:
    if not table:
        return f"no installed plugin registers {what}: install the vocabulary package"
    return f"supported: {', '.join(sorted(table))}"


# --- special ids: GGUF key per role; text lists llama.cpp uses to find EOT/EOM/FIM/EOG tokens ---

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


# --- metadata access: every read names its key when the value has the wrong type ---


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


# --- vocabulary ---


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


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's reversible byte -> printable character table (byte b -> chars[b])."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


_BYTE_CHARS = _gpt2_byte_chars()
_CHAR_TO_BYTE = {c: b for b, c in enumerate(_BYTE_CHARS)}


# --- special ids, EOG set and llama.cpp's attribute fix-ups ---


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


# --- engines: text fragment (no special tokens inside) -> ids ---


class BpeEngine:
    """Byte-level BPE through HF tokenizers: Split(regex) per llama.cpp regex, ByteLevel, BPE by rank.

    With an SPM-style pre-tokenizer (gemma4) spaces become ▁, pieces stay raw UTF-8 and a character
    the vocabulary lacks is spelled with <0xNN> byte tokens; a newline run that is itself a token
    is taken whole (llama.cpp's llm_tokenizer_bpe_session, GEMMA4 branch).
    """

    def __init__(self, index: dict[str, int], merges: list[str], pre: PreTokenizer) -> None:
        from tokenizers import Regex, models, pre_tokenizers
        from tokenizers import Tokenizer as HfTokenizer

        # bytes the vocabulary cannot spell are dropped, as llama.cpp drops them (SmolLM2 lacks 21),
        # but only after merging: until then they separate their neighbours, so HF BPE emits them as
        # a sentinel unknown token (never a merge partner) that encode() removes
        pairs = _parse_merges(merges)
        self._unk = _unk_sentinel(index, pre)
        vocab = index if self._unk is None else {**index, self._unk[0]: self._unk[1]}
        try:
            model = models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre.ignore_merges,
                               byte_fallback=pre.spm_style, unk_token=self._unk and self._unk[0])
        except BaseException as exc:  # a bare Exception naming the token, or a Rust panic (below)
            _reraise_interrupts(exc)
            bad = _bad_merge(pairs, index) or "merges rejected"  # (HF panics when a merge's result is no token)
            raise TokenizerError(f"{Keys.Tokenizer.MERGES}: {bad} ({type(exc).__name__}: {exc})") from None
        hf = HfTokenizer(model)
        splits = [pre_tokenizers.PreTokenizer.custom(_CustomSplit(rx)) if callable(rx)
                  else pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in pre.regexes]
        if not pre.spm_style:
            splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        hf.pre_tokenizer = pre_tokenizers.Sequence(splits)
        self._hf = hf
        self._index = index if pre.spm_style else None

    def bind(self, ids: dict[str, int | None], attrs: list[int]) -> None:
        """Special ids are known (nothing to do for BPE)."""

    def encode(self, fragments: list[str]) -> list[list[int]]:
        """ids for each fragment."""
        try:
            if self._index is not None:
                out = [self._encode_spm_style(text) for text in fragments]
            else:
                out = [self._hf.encode(text, add_special_tokens=False).ids for text in fragments]
        except BaseException as exc:
            _reraise_interrupts(exc)
            raise TokenizerError(f"the BPE vocabulary cannot encode this text: {type(exc).__name__}: {exc}") from None
        if self._unk is not None:
            out = [[t for t in ids if t != self._unk[1]] for ids in out]
        return out

    def _encode_spm_style(self, text: str) -> list[int]:
        """gemma4: spaces -> ▁; a newline run that is a token is emitted whole, the rest is merged."""
        text = text.replace(" ", "\u2581")
        if "\n" not in text:
            return self._hf.encode(text, add_special_tokens=False).ids
        out: list[int] = []
        for piece in _LINES.findall(text):
            tid = self._index.get(piece) if piece[0] == "\n" else None
            out.extend((tid,) if tid is not None else self._hf.encode(piece, add_special_tokens=False).ids)
        return out


_LINES = re.compile(r"[^\n]+|\n+")


class _CustomSplit:
    """HF custom pre-tokenizer for the "regexes" llama.cpp runs through hand-written splitters
    (unicode.cpp): `spans(text)` gives the [start, end) pieces of each piece so far."""

    def __init__(self, spans: Any) -> None:
        self._spans = spans

    def pre_tokenize(self, pretok: Any) -> None:
        pretok.split(self._split)

    def _split(self, _: int, piece: Any) -> list[Any]:
        text = str(piece)
        return [piece[a:b] for a, b in self._spans(text)] if text else [piece]


def _unk_sentinel(index: dict[str, int], pre: PreTokenizer) -> tuple[str, int] | None:
    """(text, id) of an extra unknown token for HF BPE when the vocabulary cannot spell every byte
    (a byte-level character, or a <0xNN> token for SPM-style vocabularies); None when it can."""
    units = (f"<0x{b:02X}>" for b in range(256)) if pre.spm_style else _BYTE_CHARS
    if all(u in index for u in units):
        return None
    text = "\x00archrun-unknown"
    while text in index:
        text += "\x00"
    return text, len(index)


def _reraise_interrupts(exc: BaseException) -> None:
    """Re-raise what must not become a TokenizerError. Everything else HF tokenizers raises is
    the vocabulary's fault, including a Rust panic: pyo3's PanicException derives from
    BaseException, so `except Exception` would let it through."""
    if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit | MemoryError):
        raise exc


def _parse_merges(merges: list[str]) -> list[tuple[str, str]]:
    """'left right' strings -> (left, right); the cut is the first space after position 0 (llama.cpp)."""
    pairs = [m.partition(" ")[::2] for m in merges]
    if all(map(all, pairs)):
        return pairs
    for i, merge in enumerate(merges):
        if all(pairs[i]):
            continue
        cut = merge.find(" ", 1)
        if cut < 0 or cut == len(merge) - 1:
            raise TokenizerError(f"merge {i} {merge[:40]!r} is not of the form 'left right'")
        pairs[i] = (merge[:cut], merge[cut + 1:])
    return pairs


def _bad_merge(pairs: list[tuple[str, str]], index: dict[str, int]) -> str | None:
    """Describe the first merge whose halves or result are not tokens, None when every one is
    (slow; only after a failure)."""
    for i, (left, right) in enumerate(pairs):
        for part in (left, right, left + right):
            if part not in index:
                return f"merge {i} {left + ' ' + right:.40}: {part[:40]!r} is not a token"
    return None


class SpmEngine:
    """llama.cpp's llm_tokenizer_spm: greedy bigram merges by token score, byte fallback."""

    def __init__(self, index: dict[str, int], scores: list[float]) -> None:
        self._index = index
        self._scores = scores
        self._byte_ids = [_spm_byte_id(index, b) for b in range(256)]

    def bind(self, ids: dict[str, int | None], attrs: list[int]) -> None:
        """Special ids are known (nothing to do for SPM: unknown text is spelled in bytes)."""

    def encode(self, fragments: list[str]) -> list[list[int]]:
        """ids for each fragment (spaces must already be escaped to ▁)."""
        return [self._encode_one(text) for text in fragments]

    def _encode_one(self, text: str) -> list[int]:
        n = len(text)
        # symbols are contiguous runs text[start[i] : start[i] + size[i]], linked by prev/next
        start, size = list(range(n)), [1] * n
        prev, nxt = list(range(-1, n - 1)), [*range(1, n), -1]
        heap: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)
        for i in range(1, n):
            self._push(heap, text, start, size, i - 1, i)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue  # stale: one side was merged since this bigram was queued
            size[left] += size[right]
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            self._push(heap, text, start, size, prev[left], left)
            self._push(heap, text, start, size, left, nxt[left])
        return self._emit(text, start, size, nxt)

    def _push(self, heap: list, text: str, start: list[int], size: list[int], left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        length = size[left] + size[right]
        tid = self._index.get(text[start[left]:start[left] + length])
        if tid is not None:
            heapq.heappush(heap, (-self._scores[tid], left, right, length))

    def _emit(self, text: str, start: list[int], size: list[int], nxt: list[int]) -> list[int]:
        out: list[int] = []
        i = 0 if text else -1
        while i != -1:
            piece = text[start[i]:start[i] + size[i]]
            tid = self._index.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._byte_token(b) for b in piece.encode("utf-8"))
            i = nxt[i]
        return out

    def _byte_token(self, b: int) -> int:
        tid = self._byte_ids[b]
        if tid < 0:
            raise TokenizerError(f"the vocabulary has no byte token <0x{b:02X}> to spell this text")
        return tid


class WpmEngine:
    """llama.cpp's llm_tokenizer_wpm: BERT-style word split (_wpm_words), then each word, prefixed
    with ▁, is spelled greedily by the longest matching token; a word that cannot be spelled
    completely becomes one unknown token."""

    def __init__(self, index: dict[str, int], tokens: list[str], lowercase: bool, strip_accents: bool) -> None:
        self._index = index
        self._lengths = sorted({len(t) for t in tokens}, reverse=True)  # candidate match lengths
        self._lowercase = lowercase
        self._strip_accents = strip_accents
        self._unk: int | None = None

    def bind(self, ids: dict[str, int | None], attrs: list[int]) -> None:
        """Remember the unknown-token id (llama.cpp default 100, or the file's)."""
        self._unk = ids["unk"]

    def encode(self, fragments: list[str]) -> list[list[int]]:
        """ids for each fragment."""
        return [[t for word in _wpm_words(text, self._lowercase, self._strip_accents)
                 for t in self._spell("\u2581" + word)] for text in fragments]

    def _spell(self, word: str) -> list[int]:
        ids: list[int] = []
        i, n = 0, len(word)
        while i < n:
            match = next(((k, t) for k in self._lengths if k <= n - i
                          if (t := self._index.get(word[i:i + k])) is not None), None)
            if match is None:
                if self._unk is None:
                    raise TokenizerError("the WPM vocabulary has no unknown token to stand for an unspellable word")
                return [self._unk]
            ids.append(match[1])
            i += match[0]
        return ids


WHITESPACE = frozenset(map(chr, [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                                  0x2028, 0x2029, 0x202F, 0x205F, 0x3000]))
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # llama.cpp's (and HF's) list


def _wpm_words(text: str, lowercase: bool, strip_accents: bool) -> list[str]:
    """llama.cpp's llm_tokenizer_wpm_session::preprocess: whitespace separates words; NUL, U+FFFD and
    control/format characters vanish; accents go (first character of the NFD form, marks dropped)
    when strip_accents; punctuation, ASCII symbols and CJK ideographs are words of their own."""
    words: list[str] = []
    word: list[str] = []
    for ch in text:
        if strip_accents:
            ch = _nfd_first(ch)
        if ch in WHITESPACE:
            if word:
                words.append("".join(word))
                word = []
            continue
        cat = unicodedata.category(ch)
        if ch in "\0\ufffd" or cat in ("Cc", "Cf", "Co", "Cs") or (strip_accents and cat[0] == "M"):
            continue
        out = _simple_lower(ch) if lowercase else ch
        if cat[0] == "P" or (cat[0] == "S" and ord(ch) < 0x7F) or _is_cjk(ord(ch)):
            if word:
                words.append("".join(word))
                word = []
            words.append(out)
        else:
            word.append(out)
    if word:
        words.append("".join(word))
    return words


def _nfd_first(ch: str) -> str:
    """First code point of the NFD form (llama.cpp's unicode_cpts_normalize_nfd table)."""
    return unicodedata.normalize("NFD", ch)[0] if ord(ch) >= 0xC0 else ch


def _simple_lower(ch: str) -> str:
    """UnicodeData's simple lowercase mapping (one code point; U+0130 -> 'i')."""
    low = ch.lower()
    return low[0] if low else ch


def _is_cjk(cpt: int) -> bool:
    """CJK ideographs, which WPM makes words of their own."""
    return any(a <= cpt <= b for a, b in _CJK_RANGES)


class UgmEngine:
    """llama.cpp's llm_tokenizer_ugm (T5-style unigram): the precompiled charsmap normalizes the
    text (spaces -> ▁, a prefix ▁, runs of spaces merged as the file asks), then Viterbi over the
    UTF-8 bytes picks the tokenization with the highest sum of token scores (user-defined tokens
    score 0); a character no token covers costs min(score) - 10 as the unknown token, and runs of
    unknown tokens collapse into one."""

    def __init__(self, tokens: list[str], scores: list[float], charsmap: bytes | None, add_space_prefix: bool,
                 merge_spaces: bool) -> None:
        self._texts = tokens
        self._scores = scores
        self._charsmap = _Charsmap(charsmap) if charsmap else None
        self._prefix_space = add_space_prefix
        self._merge_spaces = merge_spaces
        self._tokens: dict[bytes, int] = {}
        self._lengths: dict[bytes, list[int]] = {}  # first two bytes (one for 1-byte tokens) -> lengths
        self._user: set[int] = set()
        self._user_sorted: list[bytes] = []  # user-defined token texts, sorted (prefix search)
        self._user_max = 0
        self._unk: int | None = None
        self._unk_score = 0.0

    def bind(self, ids: dict[str, int | None], attrs: list[int]) -> None:
        """Build the token matcher from the final token attributes (normal, user-defined, unused)."""
        texts = self._texts
        keep = ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_UNUSED
        self._tokens = {texts[i].encode("utf-8"): i for i, a in enumerate(attrs) if a & keep}
        heads: dict[bytes, set[int]] = {}
        for text in self._tokens:
            heads.setdefault(text[:2], set()).add(len(text))
        self._lengths = {head: sorted(lengths) for head, lengths in heads.items()}
        self._user = {i for i, a in enumerate(attrs) if a & ATTR_USER_DEFINED}
        self._user_sorted = sorted(texts[i].encode("utf-8") for i in self._user)
        self._user_max = max(map(len, self._user_sorted), default=0)
        normal = [self._scores[i] for i, a in enumerate(attrs) if a & ATTR_NORMAL]
        min_score = np.float32(min(normal)) if normal else np.float32(np.finfo(np.float32).max)
        self._unk_score = float(min_score - np.float32(10.0))  # float arithmetic, as llama.cpp
        self._unk = ids["unk"]

    def encode(self, fragments: list[str]) -> list[list[int]]:
        """ids for each fragment."""
        return [self._viterbi(self._normalize(text.encode("utf-8"))) for text in fragments]

    def _normalize(self, text: bytes) -> bytes:
        """llm_tokenizer_ugm_session::normalize: charsmap replacements, then the space rules."""
        out = bytearray()
        non_ws = prepended = False
        pos = 0
        while pos < len(text):
            piece, consumed = self._normalize_prefix(text, pos)
            for c in piece:
                if c != 0x20:
                    if not non_ws:
                        non_ws = True
                        if (self._prefix_space and not prepended) or self._merge_spaces:
                            out += _SPACE
                            prepended = True
                    out.append(c)
                else:
                    non_ws = False
                    if not self._merge_spaces:
                        out += _SPACE
            pos += consumed
        return bytes(out)

    def _normalize_prefix(self, text: bytes, pos: int) -> tuple[bytes, int]:
        """(replacement, bytes consumed) for the text at `pos`: a user-defined token prefix stays,
        else the charsmap's longest match, else one UTF-8 character unchanged."""
        if self._user_sorted:
            k = self._user_prefix_len(text, pos)
            if k:
                return text[pos:pos + k], k
        if self._charsmap is not None:
            match = self._charsmap.longest(text, pos)
            if match is not None:
                return match
        n = _utf8_len(text[pos])
        return text[pos:pos + n], n

    def _user_prefix_len(self, text: bytes, pos: int) -> int:
        """llama.cpp's naive_trie::get_longest_prefix over the user-defined tokens: the length of the
        longest start of text[pos:] that begins *some* user-defined token (not necessarily a whole
        one). In sorted order, the best match is a neighbour of the text's insertion point."""
        query = text[pos:pos + self._user_max]
        i = bisect.bisect_left(self._user_sorted, query)
        return max((_common_prefix_len(query, self._user_sorted[j]) for j in (i - 1, i)
                    if 0 <= j < len(self._user_sorted)), default=0)

    def _viterbi(self, text: bytes) -> list[int]:
        n = len(text)
        if n == 0:
            return []
        best: list[tuple[float, int, int]] = [(-math.inf, -1, 0)] * (n + 1)  # (score, token, start)
        best[0] = (0.0, -1, 0)
        pos = 0
        while pos < n:
            step = min(_utf8_len(text[pos]), n - pos)
            base, covered = best[pos][0], False
            for k in self._candidate_lengths(text, pos):
                tid = self._tokens.get(text[pos:pos + k])
                if tid is None:
                    continue
                covered |= k == step
                score = base + (0.0 if tid in self._user else self._scores[tid])
                if score > best[pos + k][0]:
                    best[pos + k] = (score, tid, pos)
            if not covered and base + self._unk_score > best[pos + step][0]:
                best[pos + step] = (base + self._unk_score, -1, pos)
            pos += step
        return self._backtrack(best, n)

    def _candidate_lengths(self, text: bytes, pos: int) -> list[int]:
        """Lengths of the tokens that could start at `pos` (by their first one or two bytes)."""
        room = len(text) - pos
        short = self._lengths.get(text[pos:pos + 1], [])
        if room == 1:
            return short
        longer = self._lengths.get(text[pos:pos + 2])
        return short + longer[:bisect.bisect_right(longer, room)] if longer else short

    def _backtrack(self, best: list[tuple[float, int, int]], end: int) -> list[int]:
        out: list[int] = []
        prev_unknown = False
        while True:
            _, tid, start = best[end]
            if tid < 0:
                if self._unk is None:
                    raise TokenizerError("the UGM vocabulary has no unknown token to stand for this text")
                tid = self._unk
            unknown = tid == self._unk
            if not (prev_unknown and unknown):
                out.append(tid)
            if start == 0:
                break
            prev_unknown, end = unknown, start
        out.reverse()
        return out


_SPACE = "\u2581".encode()


def _common_prefix_len(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _utf8_len(lead: int) -> int:
    """Length of a UTF-8 sequence from its first byte (llama.cpp's unicode_len_utf8)."""
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]


class _Charsmap:
    """SentencePiece's precompiled charsmap: a XOR-compressed double array (XCDA) of UTF-8 prefixes
    whose leaves index NUL-terminated replacement strings (llama.cpp's xcda_array_view)."""

    def __init__(self, blob: bytes) -> None:
        key = "tokenizer.ggml.precompiled_charsmap"
        if len(blob) < 4:
            raise TokenizerError(f"{key} is too small for its header")
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):
            raise TokenizerError(f"{key}: its XCDA blob ({size} bytes) does not fit in {len(blob)} bytes")
        self._array = np.frombuffer(blob[4:4 + size - size % 4], dtype="<u4").tolist()
        self._replacements = blob[4 + size:]

    def _node(self, i: int) -> int:
        if i >= len(self._array):
            raise TokenizerError("tokenizer.ggml.precompiled_charsmap: index out of its XCDA array")
        return self._array[i]

    def _base(self, i: int) -> int:
        node = self._node(i)
        return (node >> 10) << ((node & (1 << 9)) >> 6)

    def longest(self, text: bytes, pos: int) -> tuple[bytes, int] | None:
        """(replacement, bytes consumed) of the longest prefix of text[pos:] the map knows, or None."""
        length = value = 0
        node = self._base(0)
        for p in range(pos, len(text)):
            c = text[p]
            if c == 0:
                break
            node ^= c
            packed = self._node(node)
            if packed & ((1 << 31) | 0xFF) != c:
                break
            node ^= self._base(node)
            if (packed >> 8) & 1:
                length, value = p - pos + 1, self._node(node) & ((1 << 31) - 1)
        if not length:
            return None
        end = self._replacements.find(b"\0", value)
        if value >= len(self._replacements) or end < 0:
            raise TokenizerError("tokenizer.ggml.precompiled_charsmap: replacement index out of bounds")
        return self._replacements[value:end], length


def _spm_byte_id(index: dict[str, int], b: int) -> int:
    """llama.cpp byte_to_token for SPM: <0xNN>, else the one-character token for ASCII, else -1."""
    tid = index.get(f"<0x{b:02X}>")
    if tid is None and b < 0x80:
        tid = index.get(chr(b))
    return -1 if tid is None else tid


# --- the tokenizer ---


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary, identical to llama.cpp's tokenizer.

    Build with `Tokenizer.from_metadata(metadata)` or `Tokenizer.from_gguf(path)`.
    """

    def __init__(self, *, model: str, pre: str | None, tokens: list[str], attrs: list[int],
                 engine: BpeEngine | SpmEngine, specials: _Specials, flags: dict[str, bool],
                 chat_template: str | None) -> None:
        self.model = model
        self.pre = pre
        self._tokens = tokens
        self._attrs = attrs
        self._engine = engine
        self._ids = specials.ids
        self.eog_ids: frozenset[int] = specials.eog
        self.add_bos: bool = flags["add_bos"]
        self.add_eos: bool = flags["add_eos"]
        self.add_space_prefix: bool = flags["add_space_prefix"]
        self._clean_spaces = flags["clean_spaces"]
        self._unescape_spaces = flags["unescape_spaces"]  # normal tokens spell spaces as ▁
        self._add_sep = flags.get("add_sep", False)  # WPM: add_special ends the ids with SEP
        self.chat_template = chat_template
        self._pieces: list[bytes | None] = [None] * len(tokens)
        # (id, text, first _PREFIX characters) of special tokens, longest text first
        every = _special_order(tokens, attrs, ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)
        self._special_all = [(t, tokens[t], tokens[t][:_PREFIX]) for t in every]
        self._special_user = [s for s in self._special_all if not attrs[s[0]] & (ATTR_CONTROL | ATTR_UNKNOWN)]

    # -- construction --

    @classmethod
    def from_gguf(cls, path: Any, plugins: Any = None) -> Tokenizer:
        """Tokenizer of the GGUF file at `path` (read through archrun's validating reader); `plugins`
        as in `from_metadata`."""
        from archrun.ggufset import open_gguf

        gguf = open_gguf(path)
        try:
            return cls.from_metadata(gguf.metadata, plugins)
        finally:
            gguf.close()

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], plugins: Any = None) -> Tokenizer:
        """Tokenizer from GGUF metadata (key -> str/int/float/bool, list[str], or numpy array).

        The vocabulary kinds (`tokenizer.ggml.model`) and pre-tokenizers (`tokenizer.ggml.pre`) are
        those the plugins of `plugins` (a plugin manager; None: the installed plugins) register.
        Raises TokenizerError when a `tokenizer.*` key is missing, mistyped or inconsistent, or
        names a kind or pre-tokenizer no plugin registers.
        """
        model = _get(metadata, Keys.Tokenizer.MODEL, str)
        if model is None:
            raise TokenizerError(f"{Keys.Tokenizer.MODEL} is missing")
        builders = tokenizer_models(plugins)
        build = builders.get(model)
        if build is None:
            raise TokenizerError(f"unsupported tokenizer model {model!r} "
                                 f"({_supported(builders, 'vocabulary kinds')})")
        tokens = _read_tokens(metadata)
        index = _token_index(tokens)
        attrs = _read_attrs(metadata, tokens)
        parts = build(TokenizerSource(metadata, tokens, index, plugins))
        if not isinstance(parts, TokenizerParts):
            raise PluginError(f"the {model!r} vocabulary builder returned {type(parts).__name__}, not TokenizerParts")
        pre_name, engine, defaults, flags = parts.pre, parts.engine, parts.defaults, dict(parts.flags)
        ids = _read_special_ids(metadata, defaults, len(tokens))
        _find_role_tokens(ids, index, attrs)
        eog = _eog_set(ids, index, attrs, tokens)
        engine.bind(ids, attrs)  # after llama.cpp's attribute fix-ups, as its init_tokenizer
        # llama.cpp always adds BOS for gemma4 and CLS ... SEP for WPM, whatever the file says
        flags["add_bos"] = _read_flag(metadata, Keys.Tokenizer.ADD_BOS, flags["add_bos"]) or flags["force_bos"]
        flags["add_eos"] = _read_flag(metadata, Keys.Tokenizer.ADD_EOS, flags.get("add_eos", False))
        for role in ("bos", "eos"):
            if flags[f"add_{role}"] and ids[role] is None:
                raise TokenizerError(f"tokenizer.ggml.add_{role}_token is true but there is no {role} id")
        if flags.get("add_sep") and ids["sep"] is None:
            raise TokenizerError(f"a {model!r} vocabulary needs a separator id ({Keys.Tokenizer.SEP_ID})")
        template = _get(metadata, Keys.Tokenizer.CHAT_TEMPLATE, str)
        return cls(model=model, pre=pre_name, tokens=tokens, attrs=attrs, engine=engine,
                   specials=_Specials(ids, eog), flags=flags, chat_template=template)

    # -- properties --

    @property
    def n_vocab(self) -> int:
        """Number of tokens in the vocabulary."""
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence id (None when the vocabulary has none)."""
        return self._ids["bos"]

    @property
    def eos_id(self) -> int | None:
        """End-of-sequence id."""
        return self._ids["eos"]

    @property
    def eot_id(self) -> int | None:
        """End-of-turn id (e.g. <|im_end|>, <end_of_turn>)."""
        return self._ids["eot"]

    @property
    def eom_id(self) -> int | None:
        """End-of-message id (<|eom_id|>)."""
        return self._ids["eom"]

    @property
    def pad_id(self) -> int | None:
        """Padding id."""
        return self._ids["pad"]

    @property
    def unk_id(self) -> int | None:
        """Unknown-token id."""
        return self._ids["unk"]

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry of `token_id` as stored in the file (byte-level/▁ form)."""
        return self._tokens[self._check_id(token_id)]

    def is_control(self, token_id: int) -> bool:
        """True for control tokens (<|im_end|>, <bos>, ...): decode(skip_special=True) drops them."""
        return bool(self._attrs[self._check_id(token_id)] & ATTR_CONTROL)

    # -- encode --

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False,
               plain_spans: Sequence[tuple[int, int]] = ()) -> list[int]:
        """Token ids of `text`, as llama_tokenize(text, add_special, parse_special) returns them.

        add_special adds BOS/EOS where the vocabulary asks for them; parse_special turns control
        token texts (e.g. "<|im_end|>") into their ids instead of spelling them out, except inside
        `plain_spans` (character ranges [start, end) of `text`, e.g. user content in a chat).
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        add_special, parse_special = check_flag("add_special", add_special), check_flag("parse_special", parse_special)
        plain_spans = _spans(plain_spans)
        _check_unicode(text)
        parts = self._partition(text, parse_special, plain_spans)
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self._ids["bos"])
        raw = [p for p in parts if isinstance(p, str)]
        if isinstance(self._engine, SpmEngine):
            raw = self._spm_prepare(parts)
        encoded = iter(self._engine.encode(raw) if raw else [])
        for part in parts:
            out.extend(next(encoded) if isinstance(part, str) else (part,))
        if add_special and self._add_sep:
            out.append(self._ids["sep"])
        if add_special and self.add_eos:
            out.append(self._ids["eos"])
        return out

    def _spm_prepare(self, parts: list[str | int]) -> list[str]:
        """SPM fragments: a space prefix after a special token (or at the start), spaces -> ▁."""
        raw, prev_special = [], True
        for part in parts:
            if isinstance(part, str):
                prefix = " " if self.add_space_prefix and prev_special else ""
                raw.append((prefix + part).replace(" ", "\u2581"))
            prev_special = not isinstance(part, str)
        return raw

    def _partition(self, text: str, parse_special: bool,
                   plain_spans: Sequence[tuple[int, int]]) -> list[str | int]:
        """Split text into raw fragments and special-token ids (llama.cpp tokenizer_st_partition):
        each special text, longest first, is cut out of every fragment it occurs in."""
        parts: list[tuple[int, int] | int] = [(0, len(text))] if text else []  # (start, end) = raw text
        candidates = self._special_all if parse_special else self._special_user
        present = _ngrams(text, _PREFIX) if len(text) * _PREFIX < len(candidates) else None
        for tid, needle, prefix in candidates:
            if (present is not None and prefix not in present) or needle not in text:
                continue
            protected = plain_spans if self._attrs[tid] & (ATTR_CONTROL | ATTR_UNKNOWN) else ()
            split: list[tuple[int, int] | int] = []
            for part in parts:
                if isinstance(part, int):
                    split.append(part)
                else:
                    split.extend(_cut(text, part, needle, tid, protected))
            parts = split
        return [p if isinstance(p, int) else text[p[0]:p[1]] for p in parts]

    # -- decode --

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """The bytes one token stands for (llama_token_to_piece); control tokens render their text
        only when `special`."""
        tid = self._check_id(token_id)
        if not check_flag("special", special) and self._attrs[tid] & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        piece = self._pieces[tid]
        if piece is None:
            piece = self._pieces[tid] = self._make_piece(tid)
        return piece

    def _make_piece(self, tid: int) -> bytes:
        attr, text = self._attrs[tid], self._tokens[tid]
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if attr & ATTR_NORMAL:
            if self._unescape_spaces:
                return text.replace("\u2581", " ").encode("utf-8")
            # byte-level alphabet back to bytes; a character outside it stands for itself
            return b"".join(bytes((_CHAR_TO_BYTE[c],)) if c in _CHAR_TO_BYTE else c.encode("utf-8")
                            for c in text)
        if attr & ATTR_BYTE:
            return bytes((int(text[3:5], 16),))
        return b""  # unused / undefined tokens print nothing

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 (a multi-byte character cut off) becomes U+FFFD.

        skip_special drops control tokens (and a leading BOS / trailing EOS the vocabulary adds).
        """
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """Raw bytes of `ids`: llama_detokenize(remove_special=skip_special, unparse_special=not skip_special)."""
        scalar_array = isinstance(ids, np.ndarray) and ids.ndim == 0
        if isinstance(ids, str | bytes | bytearray) or not isinstance(ids, Iterable) or scalar_array:
            raise TokenizerError(f"decode expects a sequence of token ids, got {type(ids).__name__}")
        skip_special = check_flag("skip_special", skip_special)
        try:
            ids = [self._check_id(t) for t in ids]
        except TokenizerError:
            raise
        except Exception as exc:  # an iterable that fails while read
            raise TokenizerError(f"decode could not read the token ids: {type(exc).__name__}: {exc}"[:300]) from None
        remove_space = self.add_space_prefix
        if skip_special and self.add_bos and ids and ids[0] == self._ids["bos"]:
            remove_space = False
            ids = ids[1:]
        if skip_special and self.add_eos and ids and ids[-1] == self._ids["eos"]:
            ids = ids[:-1]
        pieces = [self.token_to_piece(t, special=not skip_special) for t in ids]
        if remove_space and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        out = b"".join(pieces)
        return _clean_spaces(out) if self._clean_spaces else out

    def incremental(self, skip_special: bool = False) -> IncrementalDecoder:
        """A streaming decoder: push ids one by one, get back only complete UTF-8 text."""
        return IncrementalDecoder(self, check_flag("skip_special", skip_special))

    def _check_id(self, token_id: Any) -> int:
        if isinstance(token_id, bool) or not isinstance(token_id, int | np.integer):
            raise TokenizerError(f"token id must be an integer, got {type(token_id).__name__}")
        tid = int(token_id)
        if not 0 <= tid < len(self._tokens):
            raise TokenizerError(f"token id {tid} is outside the vocabulary (0..{len(self._tokens) - 1})")
        return tid

    def __repr__(self) -> str:
        return f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab})"


class IncrementalDecoder:
    """Streaming detokenizer: `push(id)` returns the newly completed text, never half a character."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._special = not skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Feed one id; returns the text that became complete (possibly "")."""
        return self._utf8.decode(self._tok.token_to_piece(token_id, special=self._special))

    def flush(self) -> str:
        """End of stream: bytes still pending (an unfinished character) come out as U+FFFD."""
        return self._utf8.decode(b"", final=True)


# --- helpers ---


def _special_order(tokens: list[str], attrs: list[int], mask: int) -> list[int]:
    """Ids whose attributes intersect `mask`, longest text first (llama.cpp cache_special_tokens)."""
    ids = np.nonzero(np.asarray(attrs) & mask)[0].tolist()
    return sorted(ids, key=lambda i: -len(tokens[i].encode("utf-8")))


def _spans(spans: Any) -> list[tuple[int, int]]:
    """plain_spans as [(start, end), ...]: None means none; anything but pairs of integers is InvalidRequest."""
    if spans is None:
        return []
    if isinstance(spans, np.ndarray) and spans.ndim:
        spans = spans.tolist()
    if isinstance(spans, str | bytes | bytearray | Mapping) or not isinstance(spans, Sequence):
        raise InvalidRequest(f"plain_spans must be a sequence of (start, end) character ranges, got {shown(spans)}")
    out = []
    for span in spans:
        if isinstance(span, str | bytes) or not isinstance(span, Sequence) or len(span) != 2 or not all(
                isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_) for x in span):
            raise InvalidRequest(f"plain_spans must hold (start, end) pairs of integers, got {shown(span)}")
        out.append((int(span[0]), int(span[1])))
    return out


def _cut(text: str, span: tuple[int, int], needle: str, tid: int,
         protected: Sequence[tuple[int, int]]) -> list[tuple[int, int] | int]:
    """Occurrences of `needle` in text[span] -> [fragment, tid, fragment, ...]; occurrences that
    overlap a protected range stay text."""
    start, end = span
    out: list[tuple[int, int] | int] = []
    pos = search = start
    while (hit := text.find(needle, search, end)) >= 0:
        stop = hit + len(needle)
        if any(a < stop and hit < b for a, b in protected):
            search = hit + 1
            continue
        if hit > pos:
            out.append((pos, hit))
        out.append(tid)
        pos = search = stop
    if pos < end:
        out.append((pos, end))
    return out


def _ngrams(text: str, n: int) -> set[str]:
    """Every substring of 1..n characters (a cheap pre-filter for special-token search)."""
    return {text[i:i + k] for k in range(1, n + 1) for i in range(len(text) - k + 1)}


def _check_unicode(text: str, what: str = "text") -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TokenizerError(f"{what} is not valid Unicode: lone surrogate at position {exc.start}") from None


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp detokenize's clean_spaces passes: ' ?'->'?', " ' "->"'", " 's"->"'s", ..."""
    text = re.sub(rb" ([?!.,])", rb"\1", text)
    text = text.replace(b" ' ", b"'")
    return re.sub(rb" '(s|m|re|ve)", rb"'\1", text)
