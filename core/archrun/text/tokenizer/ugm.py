"""Unigram (`t5`): llama.cpp's llm_tokenizer_ugm, precompiled-charsmap normalization and Viterbi by score.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from archrun.errors import TokenizerError
from archrun.text.tokenizer.metadata import ATTR_NORMAL, ATTR_UNUSED, ATTR_USER_DEFINED


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
