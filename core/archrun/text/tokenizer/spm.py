"""SentencePiece-style vocabularies (`llama`): llama.cpp's llm_tokenizer_spm.

Spaces become ``▁``; adjacent symbols merge greedily by the merged token's score, with byte fallback for
anything the vocabulary cannot spell.
"""

from __future__ import annotations

import heapq

from archrun.errors import TokenizerError


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


def _spm_byte_id(index: dict[str, int], b: int) -> int:
    """llama.cpp byte_to_token for SPM: <0xNN>, else the one-character token for ASCII, else -1."""
    tid = index.get(f"<0x{b:02X}>")
    if tid is None and b < 0x80:
        tid = index.get(chr(b))
    return -1 if tid is None else tid
