"""The two block styles, vocabulary of slot "block_style": decoder classes over the interpreter.

`FusedDecoder` runs one-token steps as one fused kernel call per layer (archrun.kernels.decode.fusion) and carries the
batched entries; `HostReferenceDecoder` carries `host_step`. Each refuses the other's entries with
WrongBlockStyle and says what it carries in `caps`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np

from archrun.decoder import Caps
from archrun.errors import (
    InvalidRequest,
    WrongBlockStyle,
    check_flag,
)
from archrun.io.ggufio import GGUFFile
from archrun.kernels.decode.fusion import ROWS_MAX, DecodeSteps
from archrun.kernels.decode.pool import NO_POOL
from archrun.run.cache import KvCache
from archrun.run.interpreter import HostStep, Interpreter, per_span
from archrun.run.plan import Plan


class FusedDecoder(Interpreter):
    """The fast decoder shape: one-token steps run each layer as one fused kernel call
    (archrun.kernels.decode.fusion) when every op of the model can; batched decode entries; refuses host_step."""

    caps = Caps(batch=True, workers=True)

    def __init__(self, plan: Plan, gguf: GGUFFile, tokenizer_factory: Callable[[], Any] | None = None,
                 chat_template: str | None = None):
        super().__init__(plan, gguf, tokenizer_factory, chat_template)
        self._decode = DecodeSteps(plan)
        # None: some layer runs op by op (reference backend, or an op without a kernel description), or the
        # residual stream is a stream op's (Plan.stream), which the fused layer kernel does not carry
        self.fused_blocks = self._decode.blocks if plan.stream is None else None

    def _forward(self, ids: np.ndarray, cache: KvCache, all_logits: bool) -> tuple[np.ndarray, np.ndarray]:
        if 1 < len(ids) <= ROWS_MAX and self._span_rows(cache):
            # a short span (a verification of drafted tokens, a short prompt or chunk): the multi-row kernel,
            # so every position has the bits of its one-token step
            logits, hidden, _ = self._rows_pass([ids], [cache], all_logits)
            return logits, hidden
        if len(ids) != 1 or self.fused_blocks is None:
            self._decode.rest()  # a prefill's BLAS threads need the cores
            return super()._forward(ids, cache, all_logits)
        start = len(cache)
        x = np.ascontiguousarray(self.embed(ids, start)[0])
        angles = self.rope_angles(np.array([start]))
        blocks = self._decode.blocks_for(cache.kv_type)  # resolved once per kv type, then a dict hit
        if blocks is None:  # an op without a fused part for this kv type: op by op
            return super()._forward(ids, cache, all_logits)
        with self._decode.running() as par:  # the worker pool, when there is one, for this step
            for fb, slot in zip(blocks, cache.slots, strict=True):
                fb(x, slot, start, angles, par)
            cache.advance(1)
            hidden = self._final_norm(x[None, :])
            logits = self._head_rows(hidden, par)
        return self.finish_logits(logits), hidden

    def step_paths(self) -> tuple:
        """(fused one-token steps, the multi-row kernel, every block dense, rows per product pass)."""
        blocks = self.fused_blocks
        return (type(self).__name__, blocks is not None, self._decode.rows_ready,
                blocks is not None and all(fb.dense for fb in blocks), self._rows_per_pass[0])

    def _head_rows(self, hidden: np.ndarray, par: tuple) -> np.ndarray:
        """The output product of a fused step's rows (through the pool); a stage before the last gives the
        hidden states back."""
        return hidden if self.gives_hidden else self._decode.head(hidden, par)

    def rest_workers(self) -> None:
        """Send the decode worker pool's threads to sleep now, instead of ~3 ms after the last step (a
        caller about to run Python work between steps, e.g. a server sampling and streaming for many
        sequences, gives their core to its other threads). The next step wakes them; a no-op without a pool."""
        self._decode.rest()

    def forward_step_batch(self, batch: Sequence[Sequence[int]], caches: Sequence[KvCache]) -> list[np.ndarray]:
        """Append each batch[i] (one token or a span of several) to caches[i], all in one pass.

        Every weight product runs once on the rows of all sequences together (each weight is
        read once per step, not once per sequence); attention runs per sequence, each at its
        own position in its own cache. Returns the last-position logits [vocab] of each.

        Where the model decodes fused, the rows of spans of up to ROWS_MAX tokens (decode steps,
        verification of drafted tokens) go through the dense layers' multi-row kernel
        (kernels.decode.layer.decode_rows): every position's logits are bit-identical to one-token
        forward_step calls on the same cache. Layers whose FFN op brings its own layer kernel (a
        mixture of experts) run op by op on the rows inside that pass, and so do models with a
        token mixer or ops without kernel parts, and longer spans (prompt chunks: the prefill's
        int8 GEMM is faster there); those agree with one-token steps within the prefill path's rounding.
        A batch of one sequence is forward_step itself (what generate and chat compute).
        """
        return [logits[-1] for logits in self.forward_step_batch_spans(batch, caches)]

    def forward_step_batch_spans(self, batch: Sequence[Sequence[int]], caches: Sequence[KvCache],
                                 all_logits: bool = False) -> list[np.ndarray]:
        """forward_step_batch returning, per sequence, logits [n_i, vocab] of every position of
        its span (all_logits) or [1, vocab] of the last (what verification of drafted tokens and
        chunked prefill of several requests need)."""
        all_logits = check_flag("all_logits", all_logits)
        for name, value in (("batch", batch), ("caches", caches)):
            if isinstance(value, str | bytes | bytearray | np.ndarray) or not isinstance(value, Sequence):
                raise InvalidRequest(f"forward_step_batch's {name} must be a list, got {type(value).__name__}")
        if len(batch) != len(caches) or not batch:
            raise InvalidRequest("forward_step_batch needs one cache per sequence (and at least one)")
        if len({id(c) for c in caches}) != len(caches):
            raise InvalidRequest("forward_step_batch needs a distinct cache per sequence")
        spans = [self._check_ids(ids) for ids in batch]
        for ids, cache in zip(spans, caches, strict=True):
            self._check_cache(cache)
            cache.check_room(len(ids))
        out: list[np.ndarray] = [np.empty(0)] * len(spans)
        # one sequence asking for its last position only (one token, or a prompt chunk): forward_step's own
        # path, so a lone request computes exactly what generate/chat compute on the same cache (a prompt chunk
        # takes the prefill GEMM there); spans whose every position is wanted (verification) take the rows kernel
        lone = len(spans) == 1 and (len(spans[0]) == 1 or not all_logits)
        short = [i for i, (ids, c) in enumerate(zip(spans, caches, strict=True))
                 if not lone and len(ids) <= ROWS_MAX and self._rows_blocks(c) is not None]
        rest = [i for i in range(len(spans)) if i not in set(short)]
        kinds = [getattr(c, "kv_type", "f32") for c in caches]
        for kind in dict.fromkeys(kinds[i] for i in short):  # one pass per cache type
            same = [i for i in short if kinds[i] == kind]
            for group in _group_rows([len(spans[i]) for i in same], ROWS_MAX):
                idx = [same[g] for g in group]
                logits = self._forward_rows([spans[i] for i in idx], [caches[i] for i in idx], all_logits)
                for i, lg in zip(idx, logits, strict=True):
                    out[i] = lg
        if len(rest) == 1:  # one sequence: its own (fused, for one token) path
            i = rest[0]
            logits = self.forward_step(spans[i], caches[i], all_logits=all_logits)
            out[i] = logits if all_logits else logits[None, :]
        elif rest:
            self._decode.rest()  # the multi-row products' BLAS threads need the cores
            for group in _group_rows([len(spans[i]) for i in rest], self._rows_per_pass[0]):
                idx = [rest[g] for g in group]
                logits = self._forward_spans([spans[i] for i in idx], [caches[i] for i in idx], all_logits)
                for i, lg in zip(idx, logits, strict=True):
                    out[i] = lg
        return out

    def _rows_blocks(self, cache: KvCache) -> list | None:
        """The fused blocks that run a batch's rows on `cache`'s layers through the multi-row kernel (those of
        its kv type), or None when its rows take the op-by-op path (no dense fused layer, or an op without a
        part for that kv type)."""
        if not self._decode.rows_ready or self.plan.stream is not None:
            return None
        blocks = self._decode.blocks_for(getattr(cache, "kv_type", "f32"))
        return blocks if blocks is not None and any(fb.dense for fb in blocks) else None

    def _span_rows(self, cache: KvCache) -> bool:
        """Whether a span on `cache` takes the multi-row kernel with every row its one-token step's bits: every
        layer dense and fused (an FFN op with its own layer kernel runs op by op on rows)."""
        blocks = self._rows_blocks(cache)
        return blocks is not None and all(fb.dense for fb in blocks)

    def _forward_rows(self, spans: list[np.ndarray], caches: Sequence[KvCache], all_logits: bool) -> list[np.ndarray]:
        """Spans of several sequences (at most ROWS_MAX rows) through the fused layers' multi-row kernel;
        logits per span as forward_step_batch_spans returns them (each row = its one-token step, bitwise).
        A layer whose FFN op brings its own layer kernel runs op by op on the rows (without the pool)."""
        logits, _, ends = self._rows_pass(spans, caches, all_logits)
        if all_logits:
            return np.split(logits, ends[:-1])
        return [logits[i:i + 1] for i in range(len(spans))]

    def _rows_pass(self, spans: list[np.ndarray], caches: Sequence[KvCache],
                   all_logits: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """_forward_rows' pass: (logits and normed hidden states of every row, or of each span's last, and the
        row bounds of the spans)."""
        p = self.plan
        blocks = self._rows_blocks(caches[0])
        dense = all(fb.dense for fb in blocks)
        starts = [len(c) for c in caches]
        lengths = [len(ids) for ids in spans]
        ends = np.cumsum(lengths)                                             # row bounds of each span
        x = np.ascontiguousarray(np.concatenate([self.embed(ids, st) for ids, st in zip(spans, starts, strict=True)]),
                                 dtype=np.float32)                            # [N, d]
        pos = np.concatenate([np.arange(st, st + n, dtype=np.int64) for st, n in zip(starts, lengths, strict=True)])
        seq = np.repeat(np.arange(len(spans), dtype=np.int64), lengths)
        tokens = None if self.takes_hidden else np.concatenate(spans)  # for an FFN op that reads token ids
        angles = self.rope_angles(pos)
        slots = self._decode.slot_lists(list(caches), blocks)
        if not dense:
            self._decode.rest()  # the op-by-op layers' threads need the cores
        with self._decode.running(len(x)) if dense else nullcontext(NO_POOL) as par:  # the pool, sized for the rows
            for li, (lp, fb) in enumerate(zip(p.layers, blocks, strict=True)):
                if fb.dense:
                    fb.rows(x, slots, li, seq, pos, angles, par)
                else:  # a layer with its own kernel (an FFN op's, a token mixer's): op by op on the rows
                    op = lp.mixer if lp.mixer is not None else lp.attention
                    run = per_span(op, [c.slots[li] for c in caches], starts, ends)
                    x = np.ascontiguousarray(self._block(lp, x, angles, run, ids=tokens), dtype=np.float32)
            for n, cache in zip(lengths, caches, strict=True):
                cache.advance(n)
            rows = np.arange(len(x)) if all_logits else ends - 1
            hidden = self._final_norm(x[rows])
            logits = self.finish_logits(self._head_rows(hidden, par))
        return logits, hidden, ends

    @functools.cached_property
    def _rows_per_pass(self) -> tuple[int, int]:
        """(blocks, head): most rows a product of the blocks' / the output head's weights takes on the
        weight-reading integer paths (unbounded for the GEMM's types). Past it a product dequantizes
        tiles of the whole matrix first, which pays off for a prefill but not for a batch of decode
        steps, so batches are cut there."""
        if self.plan.binder.backend != "fast":
            return (1 << 30, 1 << 30)
        from archrun.kernels.matmul.qmatrix import rows_per_pass

        def limit(names: list[str]) -> int:
            types = {self.gguf.tensors[n].ggml_type for n in names if n in self.gguf.tensors}
            return min([rows_per_pass(t) for t in types] or [1 << 30])

        bound = sorted(self.plan.binder.bound)
        if self.plan.span is not None:  # a pipeline stage cuts where the whole model does: every block's types
            blocks = tuple(f"blk.{i}." for i in range(self.descriptor.n_layer))
            bound = sorted(n for n in self.gguf.tensors if n.startswith(blocks))
        head = self.descriptor.tensor_name("token_embd" if self.descriptor.tied_output else "output")
        return limit([n for n in bound if n.startswith("blk.")]), limit([head])

    def _forward_spans(self, spans: list[np.ndarray], caches: Sequence[KvCache], all_logits: bool) -> list[np.ndarray]:
        starts = [len(c) for c in caches]
        ends = np.cumsum([len(ids) for ids in spans])                       # row bounds of each span
        x = np.concatenate([self.embed(ids, st) for ids, st in zip(spans, starts, strict=True)])  # [N, d]
        angles = self.rope_angles(np.concatenate([np.arange(st, st + len(ids))
                                                  for ids, st in zip(spans, starts, strict=True)]))

        def block(li: int, lp: Any, h: np.ndarray, sub: str | None = None, ids: np.ndarray | None = None) -> np.ndarray:
            slots = [c.slots[li] for c in caches]
            beside = None
            if lp.mixer is not None:
                run = per_span(lp.mixer, slots, starts, ends)
            elif lp.parallel is not None:
                run = per_span(lp.attention, [s.attention for s in slots], starts, ends)
                beside = per_span(lp.parallel.mix, [s.mixer for s in slots], starts, ends)
            else:
                run = per_span(lp.attention, slots, starts, ends)
            return self._block(lp, h, angles, run, beside, sub, ids)

        x = self._through_blocks(x, np.concatenate(spans), block)
        for ids, cache in zip(spans, caches, strict=True):
            cache.advance(len(ids))
        rows = np.arange(len(x)) if all_logits else ends - 1
        hidden = self._final_norm(x[rows])
        k = self._rows_per_pass[1]
        parts = range(0, len(hidden), k) if len(hidden) <= 4 * k else [0]
        logits = np.concatenate([self.head(hidden[i:i + k] if len(parts) > 1 else hidden) for i in parts])
        if all_logits:
            return np.split(logits, ends[:-1])
        return [logits[i:i + 1] for i in range(len(spans))]

    def host_step(self, *args: Any, **kwargs: Any) -> HostStep:
        raise WrongBlockStyle("host_step belongs to block style 'host_reference'; this model is 'fused' "
                              "(load with block_style='host_reference' to audit it)")


class HostReferenceDecoder(Interpreter):
    """The auditable host-side float32 shape: host_step; refuses the fused batched entries."""

    caps = Caps(host_step=True)

    def host_step(self, token_ids: Sequence[int] | np.ndarray, cache: KvCache, mtp_cache: Any = None) -> HostStep:
        """Append token_ids; return all-position logits and the trunk's final hidden states.

        mtp_cache is the nullable seam for a family-side multi-token-prediction cache: when
        given, `mtp_cache.advance(token_ids, hidden)` is called after the trunk step so the
        family's MTP block stays in step. The trunk never reads it.
        """
        ids = self._check_ids(token_ids)
        self._check_cache(cache)
        if mtp_cache is not None and not callable(getattr(mtp_cache, "advance", None)):
            raise InvalidRequest(f"mtp_cache must be an MTP head's cache (with advance(ids, hidden)), got "
                                 f"{type(mtp_cache).__name__}")
        cache.check_room(len(ids))
        logits, hidden = self._forward(ids, cache, True)
        if mtp_cache is not None:
            mtp_cache.advance(ids, hidden)
        return HostStep(logits, hidden)

    def forward_step_batch(self, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        raise WrongBlockStyle("forward_step_batch belongs to block style 'fused'; this model is 'host_reference'")

    def forward_step_batch_spans(self, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        raise WrongBlockStyle("forward_step_batch_spans belongs to block style 'fused'; "
                              "this model is 'host_reference'")


def _group_rows(lengths: list[int], limit: int) -> list[list[int]]:
    """Indices of spans grouped so each group's rows stay within `limit`; longer spans go together
    into one group of their own (their products take the many-row path anyway)."""
    groups: list[list[int]] = []
    rows = limit
    long = [i for i, n in enumerate(lengths) if n > limit]
    for i, n in enumerate(lengths):
        if n > limit:
            continue
        if rows + n > limit:
            groups.append([])
            rows = 0
        groups[-1].append(i)
        rows += n
    return groups + ([long] if long else [])


def fused_style() -> type[Interpreter]:
    """block_style factory: the fused decoder class."""
    return FusedDecoder


def host_reference_style() -> type[Interpreter]:
    """block_style factory: the host_reference decoder class."""
    return HostReferenceDecoder
