"""The Tokenizer: a file's vocabulary kind and pre-tokenizer built into one encoder/decoder.

Special tokens (control, user-defined, unknown) are cut out of the text before the engine runs, exactly
as llama.cpp's tokenizer_st_partition does: longest token text first, every occurrence. Control and
unknown tokens are only recognised with ``parse_special=True``; user-defined tokens always are
(llama.cpp and HF tokenizers agree on that).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from gguf.constants import Keys

from archrun.errors import InvalidRequest, PluginError, TokenizerError, check_flag, shown
from archrun.text.tokenizer.bpe import _CHAR_TO_BYTE, BpeEngine
from archrun.text.tokenizer.kinds import TokenizerParts, TokenizerSource, _supported, tokenizer_models
from archrun.text.tokenizer.metadata import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    _check_unicode,
    _eog_set,
    _find_role_tokens,
    _get,
    _read_attrs,
    _read_flag,
    _read_special_ids,
    _read_tokens,
    _Specials,
    _token_index,
)
from archrun.text.tokenizer.spm import SpmEngine

_PREFIX = 3  # characters of a special token's text used to pre-filter candidates


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
        from archrun.io.ggufset import open_gguf

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


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp detokenize's clean_spaces passes: ' ?'->'?', " ' "->"'", " 's"->"'s", ..."""
    text = re.sub(rb" ([?!.,])", rb"\1", text)
    text = text.replace(b" ' ", b"'")
    return re.sub(rb" '(s|m|re|ve)", rb"'\1", text)
