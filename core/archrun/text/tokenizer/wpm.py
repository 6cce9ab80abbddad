"""WordPiece (`bert`): llama.cpp's llm_tokenizer_wpm, BERT's word split and greedy longest-match pieces.
"""

from __future__ import annotations

import unicodedata

from archrun.errors import TokenizerError


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
