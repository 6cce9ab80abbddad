"""DeepSeek-V4's attention as an attention op (attention="deepseek4"): its projection layout, its cache
slot and the op over the three layer kinds (HF DeepseekV4Attention; llama.cpp src/models/deepseek4.cpp).

Per layer, shapes n tokens, H heads of width hd (the last r rotary), d width, G output groups of rank R,
from the layer's normed input h [n, d] (the layout's qkv):

    q  = unweighted_rms_per_head(q_b(rms(q_a h, attn_q_a_norm)))      [n, H, hd]
    kv = rms(attn_kv h, attn_kv_a_norm)                                [n, hd]   the one K/V head (K = V)

The op ropes q and kv on their trailing r dims (pairs (2i, 2i + 1)) itself: the model's rope table must
rotate nothing (rope pairing "none"). Sliding-only layers (compress ratio 0) rope with `rope.freq_base`,
plain; compressed layers with `attention.compress_rope_freq_base` and the file's YaRN (`rope.scaling.*`)
at magnitude 1 (HF pins V4's YaRN attention factor to 1; llama.cpp divides ggml's YaRN magnitude out).

    keys of query t: the kv rows of positions t - window + 1 .. t, then (compressed layers) the
    compressed entries w < (t + 1) // m it sees (CSA: only those among its indexer's top k)
    a = softmax(q . keys / sqrt(hd), with the head's sink logit) . keys, its trailing r dims rotated
        back at t (the values carry their key's rope)
    out = attn_output_b(concat_g(attn_output_a_g a_g))                a_g: heads g H/G .. (g+1) H/G - 1

Compressed entries (archrun_deepseek4_ops.compressor): entry w pools window w's m tokens (HCA,
attn_compressor_kv/gate of hd rows) or, CSA (2 hd rows), window w - 1's first halves beside window w's
second halves; softmax over the slots per channel of gate + attn_compressor_ape[j], rms with
attn_compressor_norm, rope at position w m. CSA's lightning indexer pools its own entries (indexer_compressor_*,
width Di) over the same windows, scores them for query t with its heads' queries (indexer.attn_q_b of
the normed q LoRA, roped at t) weighted by indexer.proj h / sqrt(Hi) (archrun_mla.indexer) and keeps the
top `attention.indexer.top_k`.

The layout's qkv returns (q, kv, kv) and, for compressed layers, side inputs: the compressor's kv and
gate projections [n, c] (c = hd or 2 hd), and for CSA the indexer compressor's [n, 2 Di] each, the
indexer query [n, Hi Di] (before rope) and head weights [n, Hi].

The cache slot (`V4Slot`) keeps a ring of the last `max(window, m or 2 m) + max_rewind` positions' rows
(the K/V row and the compressor's projections, gate plus position bias) and every emitted entry. An entry
is a function of its window's rows only, written when the window closes: truncating the cache to any
length within the ring's reach leaves exactly the rows and entries a cache that never went past it holds
(entries of windows that close later are recomputed when they close again). So the slot rewinds like a
sliding-window ring (`max_rewind`), with no state copies.

HF and llama.cpp compute the same attention; where they differ: llama.cpp loads compression ratios 0, 4
(CSA) and 128 (HCA) only, HF any (archrun: any, CSA told by the compressor's width); llama.cpp multiplies
the indexer's queries and keys, and q and K/V when its K cache is quantized, by a Hadamard rotation
(orthogonal: the same scores up to rounding), scales the indexer's head weights once by 1 / sqrt(Di Hi)
where HF scales the ReLU'd dots by 1 / sqrt(Di) and the weights by 1 / sqrt(Hi) (equal up to rounding),
and rewinds the compressors' partial windows from per-sequence state copies where archrun recomputes
from its ring.
Entries tied at the indexer's k-th place (exact zeros after the ReLU) each picks in its own order
(torch.topk, ggml_top_k); archrun takes the earlier ones (archrun_mla.indexer.top_keys).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from archrun.descriptor import NO_ROPE
from archrun.errors import InvalidRequest, MetadataError
from archrun_deepseek4_ops.mhc import unweighted_rms
from archrun_deepseek4_ops.v4_attention import rope_trailing

F32 = np.float32
QUERY_BLOCK_BUDGET = 1 << 22  # floats of one [H, rows, keys] block of scores


# -- layout -------------------------------------------------------------------------------------------


def _key(meta: Any, name: str, kind: type, default: Any = ...) -> Any:
    """meta.get, with a MetadataError (not a KeyError) for a key archrun's gguf-py does not name."""
    try:
        return meta.get(name, kind, default) if default is not ... else meta.get(name, kind)
    except KeyError:
        if default is not ...:
            return default
        raise MetadataError(f"DeepSeek-V4 attention needs the metadata key {name!r}, which archrun's gguf-py "
                            "does not name") from None


def _stated_ratio(meta: Any, layer: int) -> int | None:
    """Layer's entry of `attention.compress_ratios` (llama.cpp: one per layer, MTP layers' after the trunk's),
    None when the file states none."""
    ask = getattr(meta, "per_layer", None)
    try:
        if ask is None or not meta.has("attention.compress_ratios"):
            return None
        n = meta.get("block_count", int) + meta.get("nextn_predict_layers", int, 0)
        for count in (n, meta.get("block_count", int)):
            try:
                return ask("attention.compress_ratios", count)[layer]
            except MetadataError:
                continue
    except KeyError:  # a key archrun's gguf-py does not name and the family did not declare
        return None
    raise MetadataError("attention.compress_ratios must hold one ratio per layer")


class V4Layout:
    """describe: V4's geometry from its keys and tensors; bind: the projections (q, the K/V head, the
    compressors' and indexer's side inputs) and the grouped low-rank output."""

    def describe(self, ctx: Any) -> dict[str, Any]:
        """AttentionSpec fields of layer ctx.layer (see archrun.vocab.AttentionLayout)."""
        m, t, i, d, n_head = ctx.meta, ctx.tensors, ctx.layer, ctx.n_embd, ctx.n_head
        kv_shape = t.shape("attn_kv", i)
        if len(kv_shape) != 2 or kv_shape[0] != d:
            raise MetadataError(f"layer {i}: attn_kv has shape {tuple(kv_shape)}, expected ({d}, head width)")
        hd = int(kv_shape[1])
        rope = _key(m, "rope.dimension_count", int)
        q_lora = _key(m, "attention.q_lora_rank", int, 0) or int(t.shape("attn_q_a", i)[1])
        window = _key(m, "attention.sliding_window", int)
        if rope < 2 or rope % 2 or rope > hd or window < 1 or q_lora < 1:
            raise MetadataError(f"layer {i}: DeepSeek-V4 attention geometry is impossible: head width {hd}, "
                                f"rope dims {rope}, q LoRA rank {q_lora}, sliding window {window}")
        t.expect("attn_q_a", i, (d, q_lora))
        t.expect("attn_q_a_norm", i, (q_lora,))
        t.expect("attn_q_b", i, (q_lora, n_head * hd))
        t.expect("attn_kv_a_norm", i, (hd,))
        t.expect("attn_sinks", i, (n_head,))
        o_a = t.shape("attn_output_a", i)
        groups = (n_head * hd) // int(o_a[0]) if len(o_a) == 2 and o_a[0] else 0
        if not groups or groups * int(o_a[0]) != n_head * hd or n_head % groups or o_a[1] % groups:
            raise MetadataError(f"layer {i}: attn_output_a has shape {tuple(o_a)}: no whole number of output "
                                f"groups of {n_head} heads of width {hd}")
        rank = int(o_a[1]) // groups
        t.expect("attn_output_b", i, (groups * rank, d))
        for name, derived in (("attention.output_group_count", groups), ("attention.output_lora_rank", rank)):
            stated = _key(m, name, int, None)
            if stated is not None and stated != derived:
                raise MetadataError(f"layer {i}: {name} = {stated}, but attn_output_a {tuple(o_a)} holds {derived}")
        params = {"q_lora_rank": q_lora, "rope_dim": rope, "window": window, "o_groups": groups,
                  "o_lora_rank": rank, "ratio": 0, "overlap": 0, "rope_base": _key(m, "rope.freq_base", float,
                                                                                      10000.0)}
        if t.has("attn_compressor_kv", i):
            params.update(self._compressor(m, t, i, d, hd, rope, q_lora))
        stated = _stated_ratio(m, i)
        if stated is not None and stated != params["ratio"]:
            raise MetadataError(f"layer {i}: attention.compress_ratios states {stated}, but the layer's compressor "
                                f"tensors give {params['ratio']} (0: none)")
        return dict(n_head_kv=1, head_dim=hd, v_head_dim=hd, scale=1.0 / math.sqrt(hd), params=params)

    @staticmethod
    def _compressor(m: Any, t: Any, i: int, d: int, hd: int, rope: int, q_lora: int) -> dict[str, float]:
        """The compressed layer's parameters: its ratio, overlap, compress rope and (CSA) indexer."""
        ape = t.shape("attn_compressor_ape", i)
        width = int(t.shape("attn_compressor_kv", i)[1])
        if len(ape) != 2 or width not in (hd, 2 * hd) or ape[0] != width or ape[1] < 1:
            raise MetadataError(f"layer {i}: the compressor's kv projection {width} wide and position bias "
                                f"{tuple(ape)} do not fit heads of width {hd} (hd or 2 hd, [width, ratio])")
        ratio, overlap = int(ape[1]), width == 2 * hd
        t.expect("attn_compressor_gate", i, (d, width))
        t.expect("attn_compressor_norm", i, (hd,))
        p: dict[str, float] = {"ratio": ratio, "overlap": int(overlap),
                               "rope_base": _key(m, "attention.compress_rope_freq_base", float)}
        if _key(m, "rope.scaling.type", str, "none") == "yarn":
            factor = _key(m, "rope.scaling.factor", float, 1.0)
            p.update(yarn_factor=factor,
                     original_context=_key(m, "rope.scaling.original_context_length", int, 0)
                     or _key(m, "context_length", int),
                     beta_fast=_key(m, "rope.scaling.yarn_beta_fast", float, 32.0),
                     beta_slow=_key(m, "rope.scaling.yarn_beta_slow", float, 1.0))
        if overlap:  # CSA: the lightning indexer
            heads = _key(m, "attention.indexer.head_count", int)
            di = _key(m, "attention.indexer.key_length", int)
            top_k = _key(m, "attention.indexer.top_k", int)
            if min(heads, top_k) < 1 or di < rope:
                raise MetadataError(f"layer {i}: indexer geometry is impossible: {heads} heads of width {di} "
                                    f"(rope dims {rope}), top_k {top_k}")
            t.expect("indexer.attn_q_b", i, (q_lora, heads * di))
            t.expect("indexer.proj", i, (d, heads))
            t.expect("indexer_compressor_kv", i, (d, 2 * di))
            t.expect("indexer_compressor_gate", i, (d, 2 * di))
            t.expect("indexer_compressor_ape", i, (2 * di, ratio))
            t.expect("indexer_compressor_norm", i, (di,))
            p.update(index_heads=heads, index_width=di, index_top_k=top_k)
        return p

    def bind(self, b: Any, spec: Any, i: int) -> tuple[Any, Any]:
        """(qkv, o) of layer i."""
        p = {name: value for name, value in spec.params}
        eps = float(b.d.norm_eps)
        norm = b.op("norm", "rms", eps)
        side = []
        if p["ratio"]:
            side.append(b.projections(("attn_compressor_kv", "attn_compressor_gate"), i))
            if p["overlap"]:
                side.append(b.projections(("indexer_compressor_kv", "indexer_compressor_gate"), i))
        index_q = (b.matrix("indexer.attn_q_b", i), b.matrix("indexer.proj", i)) if p.get("index_heads") else None
        qkv = V4Qkv(b.matrix("attn_q_a", i), b.vector("attn_q_a_norm", i), b.matrix("attn_q_b", i),
                    b.matrix("attn_kv", i), b.vector("attn_kv_a_norm", i), norm, eps, spec.n_head, side, index_q)
        o_a = b.matrix("attn_output_a", i, lazy=True)  # split into its groups' rows, never used whole
        return qkv, V4Output(_group_rows(o_a, int(p["o_groups"]), b.backend), b.matrix("attn_output_b", i))


def _group_rows(o_a: Any, groups: int, backend: str) -> list[Any]:
    """attn_output_a's G blocks of R rows, each a Matrix over its group's H hd / G inputs (views)."""
    from archrun.io.weights import Matrix

    rows = o_a.raw_rows
    rank = o_a.n_out // groups
    return [Matrix(rows[g * rank:(g + 1) * rank], o_a.ggml_type, o_a.n_in, backend, None, f"{o_a.name}[{g}]")
            for g in range(groups)]


class V4Qkv:
    """h [n, d] -> (q [n, H hd], kv [n, hd], kv, *side): side the compressed layer's projections."""

    def __init__(self, q_a: Any, q_a_norm: np.ndarray, q_b: Any, kv: Any, kv_norm: np.ndarray, norm: Any,
                 eps: float, n_head: int, side: list, index_q: tuple | None):
        self.q_a, self.q_a_norm, self.q_b, self.kv, self.kv_norm = q_a, q_a_norm, q_b, kv, kv_norm
        self.norm, self.eps, self.n_head, self.side, self.index_q = norm, eps, n_head, side, index_q

    def __call__(self, h: np.ndarray) -> tuple[np.ndarray, ...]:
        n = len(h)
        r_q = self.norm(self.q_a(h), self.q_a_norm)
        q = unweighted_rms(self.q_b(r_q).reshape(n, self.n_head, -1), self.eps).reshape(n, -1)
        kv = self.norm(self.kv(h), self.kv_norm)
        out = [q.astype(F32, copy=False), kv, kv]
        for proj in self.side:
            out += [np.ascontiguousarray(x, F32) for x in proj(h)]
        if self.index_q is not None:
            q_b, proj = self.index_q
            w = proj(h)
            out += [q_b(r_q), w * F32(1.0 / math.sqrt(w.shape[1]))]
        return tuple(out)


class V4Output:
    """a [n, H hd] (de-roped) -> each group's low rank [n, G R] -> attn_output_b -> [n, d]."""

    def __init__(self, groups: list[Any], o_b: Any):
        self.groups, self.o_b = groups, o_b

    def __call__(self, a: np.ndarray) -> np.ndarray:
        parts = np.split(np.ascontiguousarray(a, F32), len(self.groups), axis=1)
        low = np.concatenate([m(np.ascontiguousarray(x)) for m, x in zip(self.groups, parts, strict=True)], axis=1)
        return self.o_b(low)


# -- rope ---------------------------------------------------------------------------------------------


class TrailingRope:
    """Rotation of the trailing r dims, pairs (2i, 2i + 1): frequencies inv [r/2] (float64)."""

    def __init__(self, inv_freq: np.ndarray):
        self.inv = np.asarray(inv_freq, np.float64)

    def angles(self, pos: np.ndarray) -> np.ndarray:
        return np.outer(np.asarray(pos, np.float64), self.inv)

    @classmethod
    def of(cls, p: dict[str, float]) -> TrailingRope:
        """The layer's table from its params: plain at rope_base, or YaRN (magnitude 1) when stated."""
        from archrun_blocks.rope_scaling import frequencies

        r = int(p["rope_dim"])
        if p.get("yarn_factor", 1.0) > 1.0:
            inv, _ = frequencies("yarn", r, p["rope_base"], factor=p["yarn_factor"],
                                 original_context=int(p["original_context"]), beta_fast=p["beta_fast"],
                                 beta_slow=p["beta_slow"], attn_factor=1.0)
        else:
            inv, _ = frequencies("none", r, p["rope_base"])
        return cls(inv)


# -- cache --------------------------------------------------------------------------------------------


class V4Slot:
    """One layer's cache: a ring of `size` rows indexed by position % size (pos: the position each row
    holds, -1 empty) with the K/V row `kv` [size, hd] and, compressed layers, the compressor's projections
    `ckv`/`cgate` [size, c] (gate plus position bias) and CSA's indexer's `ikv`/`igate` [size, 2 Di]; the
    emitted entries `entries` [capacity // m, hd] and `index_entries` [capacity // m, Di], float32 views of
    flat byte arrays of ceil(4 capacity hd / m) bytes, so their bytes grow by 4 hd / m a token.

    `max_rewind`: how many of the last tokens a rewind may forget (None: the ring holds every position)."""

    def __init__(self, capacity: int, max_rewind: int, hd: int, ratio: int, width: int, index_width: int,
                 window: int):
        reach = max(window, 2 * ratio if width == 2 * hd else ratio)
        self.size = min(capacity, reach + max_rewind)
        self.max_rewind = None if self.size >= capacity else max_rewind
        self.pos = np.full(self.size, -1, np.int64)
        self.kv = np.zeros((self.size, hd), F32)
        if ratio:
            self.ckv = np.zeros((self.size, width), F32)
            self.cgate = np.zeros((self.size, width), F32)
            self._entries = np.zeros(-(-capacity * hd * 4 // ratio), np.uint8)
            self.entries = self._entries[:capacity // ratio * hd * 4].view(F32).reshape(-1, hd)
        if index_width:
            self.ikv = np.zeros((self.size, 2 * index_width), F32)
            self.igate = np.zeros((self.size, 2 * index_width), F32)
            self._index_entries = np.zeros(-(-capacity * index_width * 4 // ratio), np.uint8)
            self.index_entries = self._index_entries[:capacity // ratio * index_width * 4].view(F32).reshape(
                -1, index_width)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for name, a in vars(self).items()
                   if isinstance(a, np.ndarray) and name not in ("entries", "index_entries"))

    def check(self, start: int, first: int) -> None:
        """InvalidRequest unless the ring holds positions first..start-1 (a step at `start` reads them)."""
        want = np.arange(max(0, first), start)
        if not np.array_equal(self.pos[want % self.size], want):
            raise InvalidRequest(f"this cache cannot continue at position {start}: it does not hold positions "
                                 f"{max(0, first)}..{start - 1} (rewound past its reach, or not the cache these "
                                 "tokens follow)")

    def rows(self, name: str, first: int, start: int) -> np.ndarray:
        """Array `name`'s rows of positions first..start-1, in order (after `check`)."""
        return getattr(self, name)[np.arange(first, start) % self.size]

    def write(self, start: int, rows: dict[str, np.ndarray]) -> None:
        """Store positions start.. (only the last `size` of them can matter later)."""
        n = len(next(iter(rows.values())))
        first = max(0, n - self.size)
        pos = np.arange(start + first, start + n)
        at = pos % self.size
        for name, values in rows.items():
            getattr(self, name)[at] = values[first:]
        self.pos[at] = pos


# -- the op -------------------------------------------------------------------------------------------


def pool(kv: np.ndarray, gate: np.ndarray, norm: np.ndarray, eps: float, rope: TrailingRope,
         first: np.ndarray) -> np.ndarray:
    """Entries [W, c] from windows' slots kv, gate [W, slots, c] (gate with its position bias; -inf:
    an empty slot): softmax over the slots per channel, weighted sum, rms with `norm`, rope at the
    windows' first positions `first` [W]."""
    e = np.exp(gate - gate.max(axis=1, keepdims=True))
    pooled = (kv * (e / e.sum(axis=1, keepdims=True))).sum(axis=1)
    return rope_trailing(unweighted_rms(pooled, eps) * norm, rope.angles(first))


def windows(src_kv: np.ndarray, src_gate: np.ndarray, base: int, ws: np.ndarray, ratio: int,
            overlap: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The slots [W, m or 2 m, c'] of windows ws from rows src_* [T, c] of positions base.. : window w's
    m rows, or (overlap) window w - 1's first halves (empty for w = 0: kv 0, gate -inf) beside window
    w's second halves; and each window's first non-empty slot [W]."""
    cols = np.arange(ratio)
    cur = (ws[:, None] * ratio + cols[None, :]) - base                           # [W, m]
    if not overlap:
        return src_kv[cur], src_gate[cur], np.zeros(len(ws), np.int64)
    half = src_kv.shape[1] // 2
    prev = cur - ratio
    ok = (ws > 0)[:, None, None]
    prev = np.maximum(prev, 0)
    kv = np.concatenate([np.where(ok, src_kv[prev, :half], F32(0)), src_kv[cur, half:]], axis=1)
    gate = np.concatenate([np.where(ok, src_gate[prev, :half], F32(-np.inf)), src_gate[cur, half:]], axis=1)
    return kv, gate, np.where(ws > 0, 0, ratio).astype(np.int64)


class V4Attention:
    """DeepSeek-V4's attention over its slot: q [n, H, hd], k = v [n, 1, hd] (before rope), side inputs
    as the layout gives them -> [n, H, hd] (de-roped)."""

    def __init__(self, spec: Any):
        p = {name: value for name, value in spec.params}
        self.spec, self.p = spec, p
        self.hd, self.r = spec.head_dim, int(p["rope_dim"])
        self.window, self.ratio, self.overlap = int(p["window"]), int(p["ratio"]), bool(p["overlap"])
        self.index_heads, self.index_width = int(p.get("index_heads", 0)), int(p.get("index_width", 0))
        self.top_k = int(p.get("index_top_k", 0))
        if spec.n_head_kv != 1 or spec.v_head_dim != self.hd or spec.window not in (0, self.window):
            raise MetadataError(f"attention 'deepseek4' has one K/V head of width {self.hd} and window "
                                f"{self.window}; the layer states {spec.n_head_kv} heads, value width "
                                f"{spec.v_head_dim}, window {spec.window}")
        self.rope = TrailingRope.of(p)
        self.eps = 1e-6
        self.sinks = np.zeros(spec.n_head, F32)
        self.norm = self.ape = self.index_norm = self.index_ape = None

    def bind(self, b: Any, layer: int) -> None:
        """The layer's sinks, compressor position biases and norms; the model's rope table must be none."""
        table = b.d.rope_tables[self.spec.rope]
        if table.pairing != NO_ROPE:
            raise MetadataError(f"layer {layer}: attention 'deepseek4' ropes its own trailing dims; the model's "
                                f"rope table must rotate nothing (pairing {table.pairing!r})")
        self.eps = float(b.d.norm_eps)
        self.sinks = b.vector("attn_sinks", layer)
        if self.ratio:
            self.ape, self.norm = b.table("attn_compressor_ape", layer), b.vector("attn_compressor_norm", layer)
        if self.index_heads:
            self.index_ape = b.table("indexer_compressor_ape", layer)
            self.index_norm = b.vector("indexer_compressor_norm", layer)

    def new_slot(self, capacity: int, max_rewind: int = 64) -> V4Slot:
        width = self.hd * (2 if self.overlap else 1) if self.ratio else 0
        return V4Slot(capacity, max_rewind, self.hd, self.ratio, width, self.index_width, self.window)

    def __call__(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, slot: V4Slot, start: int,
                 *side: np.ndarray) -> np.ndarray:
        n, end = len(q), start + len(q)
        pos = np.arange(start, end)
        ang = self.rope.angles(pos)
        q = self._rope(np.asarray(q, F32), pos, ang, 1.0)
        kv = self._rope(np.asarray(k, F32).reshape(n, 1, self.hd), pos, ang, 1.0)[:, 0]
        rows = {"kv": kv}
        if self.ratio:
            at = pos % self.ratio
            rows.update(ckv=side[0], cgate=side[1] + self.ape[at])
            if self.index_heads:
                rows.update(ikv=side[2], igate=side[3] + self.index_ape[at])
        base = max(0, start - self.window + 1)                      # the oldest row a query of this step reads
        closes = bool(self.ratio) and end // self.ratio > start // self.ratio
        first = max(0, (start // self.ratio - (1 if self.overlap else 0)) * self.ratio) if closes else start
        slot.check(start, min(base, first))
        n_seen = end // self.ratio if self.ratio else 0
        chosen = None
        if closes:  # the compressor's rows of the windows closing in this step: from the ring, then the new ones
            src = {name: np.concatenate([slot.rows(name, first, start), x]) for name, x in rows.items() if name != "kv"}
            self._emit(slot, src, first, start, end)
        if self.index_heads and n_seen:
            chosen = self._select(slot, side[4], side[5], pos, ang, n_seen)
        keys = np.concatenate([slot.rows("kv", base, start), kv])
        slot.write(start, rows)
        out = self._attend(q, keys, base, pos, slot.entries[:n_seen] if n_seen else None, chosen)
        return self._rope(out, pos, ang, -1.0)

    def _rope(self, x: np.ndarray, pos: np.ndarray, ang: np.ndarray, sign: float) -> np.ndarray:
        """x [n, k, hd] with its trailing r dims rotated by sign * the layer's angles at pos."""
        return rope_trailing(x, ang, sign)

    def _pool(self, kv: np.ndarray, gate: np.ndarray, first_slot: np.ndarray, norm: np.ndarray,
              first: np.ndarray) -> np.ndarray:
        return pool(kv, gate, norm, self.eps, self.rope, first)

    def _scores(self, iq: np.ndarray, w: np.ndarray, keys: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """[n, T] indexer scores, -inf past each query's visible entries."""
        from archrun_mla.indexer import index_scores

        return index_scores(iq, w, keys, (pos + 1) // self.ratio - 1)

    def _emit(self, slot: V4Slot, src: dict, base: int, start: int, end: int) -> None:
        """Pool the windows that close at positions start..end-1 into the slot's entries."""
        m = self.ratio
        ws = np.arange(start // m, end // m)
        if not len(ws):
            return
        first = ws * m
        kv, gate, lo = windows(src["ckv"], src["cgate"], base, ws, m, self.overlap)
        slot.entries[ws] = self._pool(kv, gate, lo, self.norm, first)
        if self.index_heads:
            kv, gate, lo = windows(src["ikv"], src["igate"], base, ws, m, True)
            slot.index_entries[ws] = self._pool(kv, gate, lo, self.index_norm, first)

    def _select(self, slot: V4Slot, index_q: np.ndarray, index_w: np.ndarray, pos: np.ndarray, ang: np.ndarray,
                n_seen: int) -> np.ndarray:
        """[n, n_seen] bool: the entries each query attends to (visible and among its indexer's top k)."""
        from archrun_mla.indexer import top_keys

        seen = np.arange(n_seen)[None, :] < ((pos + 1) // self.ratio)[:, None]
        if n_seen <= self.top_k:
            return seen
        iq = self._rope(np.asarray(index_q, F32).reshape(len(pos), self.index_heads, self.index_width), pos, ang, 1.0)
        scores = self._scores(iq, np.asarray(index_w, F32), slot.index_entries[:n_seen], pos)
        chosen = np.zeros_like(seen)
        np.put_along_axis(chosen, top_keys(scores, self.top_k), True, axis=1)
        return chosen & seen

    def _attend(self, q: np.ndarray, kv: np.ndarray, base: int, pos: np.ndarray, entries: np.ndarray | None,
                chosen: np.ndarray | None) -> np.ndarray:
        """Softmax attention with sinks of q [n, H, hd] over each query's window of rows kv (positions
        base..) and its visible (chosen) entries -> [n, H, hd]."""
        n, n_head = len(q), self.spec.n_head
        n_ent = 0 if entries is None else len(entries)
        rows = max(1, QUERY_BLOCK_BUDGET // max(1, n_head * (self.window + n_ent)))
        out = np.empty((n, n_head, self.hd), F32)
        scale, sinks = F32(self.spec.scale), self.sinks.astype(F32)[:, None, None]
        for a in range(0, n, rows):
            b = min(n, a + rows)
            lo = max(base, int(pos[a]) - self.window + 1)
            keys = kv[lo - base:int(pos[b - 1]) + 1 - base]                            # positions lo..pos[b-1]
            dist = pos[a:b, None] - np.arange(lo, lo + len(keys))[None, :]
            mask = (dist >= 0) & (dist < self.window)
            if n_ent:
                seen = np.arange(n_ent)[None, :] < ((pos[a:b] + 1) // self.ratio)[:, None]
                keys = np.concatenate([keys, entries])
                mask = np.concatenate([mask, seen if chosen is None else chosen[a:b]], axis=1)
            scores = np.einsum("qhd,kd->hqk", q[a:b], keys) * scale
            scores = np.where(mask[None], scores, F32(-np.inf))
            top = np.maximum(scores.max(axis=-1, keepdims=True), sinks)
            e = np.exp(scores - top)
            probs = e / (e.sum(axis=-1, keepdims=True) + np.exp(sinks - top))
            out[a:b] = np.einsum("hqk,kd->qhd", probs, keys)
        return out


def v4_reference(spec: Any) -> V4Attention:
    """The float32 numpy reference."""
    return V4Attention(spec)


class FastV4Attention(V4Attention):
    """V4Attention on numba kernels (archrun_deepseek4_ops.kernels.v4_attention): rope, the windows' pooling,
    the indexer's scores and the attention, each row from its own inputs in a fixed order, so a token's
    bits are the same decoded alone, in a span or in a batch. Runs op by op (no fused layer kernel)."""

    def __init__(self, spec: Any):
        super().__init__(spec)
        from archrun_deepseek4_ops.kernels import v4_attention as k  # imported on use: loading compiles nothing

        self.k = k

    def _rope(self, x: np.ndarray, pos: np.ndarray, ang: np.ndarray, sign: float) -> np.ndarray:
        out = np.empty(x.shape, F32)
        self.k.rope_rows(np.ascontiguousarray(x, F32), pos.astype(np.int64), self.rope.inv, float(sign), out)
        return out

    def _pool(self, kv: np.ndarray, gate: np.ndarray, first_slot: np.ndarray, norm: np.ndarray,
              first: np.ndarray) -> np.ndarray:
        out = np.empty((len(kv), kv.shape[2]), F32)
        self.k.pool_windows(np.ascontiguousarray(kv, F32), np.ascontiguousarray(gate, F32), first_slot,
                            np.ascontiguousarray(norm, F32), F32(self.eps), self.rope.inv, first.astype(np.int64), out)
        return out

    def _scores(self, iq: np.ndarray, w: np.ndarray, keys: np.ndarray, pos: np.ndarray) -> np.ndarray:
        n_vis = ((pos + 1) // self.ratio).astype(np.int64)
        out = np.full((len(pos), len(keys)), -np.inf, F32)
        self.k.index_scores_rows(np.ascontiguousarray(iq, F32), np.ascontiguousarray(w, F32),
                                 np.ascontiguousarray(keys, F32), n_vis, F32(1.0 / math.sqrt(iq.shape[2])), out)
        return out

    def _attend(self, q: np.ndarray, kv: np.ndarray, base: int, pos: np.ndarray, entries: np.ndarray | None,
                chosen: np.ndarray | None) -> np.ndarray:
        n = len(q)
        out = np.empty((n, self.spec.n_head, self.hd), F32)
        if entries is None:
            entries, sel, n_sel = np.zeros((0, self.hd), F32), np.zeros((n, 0), np.int64), np.zeros(n, np.int64)
        elif chosen is None:
            sel, n_sel = np.zeros((n, 0), np.int64), ((pos + 1) // self.ratio).astype(np.int64)
        else:
            n_sel = chosen.sum(axis=1).astype(np.int64)
            sel = np.zeros((n, max(1, int(n_sel.max()))), np.int64)
            for a in range(n):
                picked = np.nonzero(chosen[a])[0]
                sel[a, :len(picked)] = picked
        self.k.attend_rows(np.ascontiguousarray(q, F32), np.ascontiguousarray(kv, F32), int(base),
                           pos.astype(np.int64), self.window, np.ascontiguousarray(entries, F32), sel, n_sel,
                           self.sinks.astype(F32), F32(self.spec.scale), out)
        return out


def v4_fast(spec: Any) -> V4Attention:
    """The same op on numba kernels (see FastV4Attention)."""
    return FastV4Attention(spec)
