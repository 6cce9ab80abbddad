"""Byte-level BPE (`gpt2`) and BPE over raw UTF-8 (`gemma4`): llama.cpp's llm_tokenizer_bpe.

Text is split by the pre-tokenizer's regexes or splitters, each piece is mapped to GPT-2's byte alphabet
(or kept as UTF-8 with byte fallback) and merged by rank; HF `tokenizers` is the engine.
"""

from __future__ import annotations

import re
from typing import Any

from gguf.constants import Keys

from archrun.errors import TokenizerError
from archrun.text.tokenizer.kinds import PreTokenizer


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
