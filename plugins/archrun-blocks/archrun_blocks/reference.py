"""Reference (numpy float32, readable) implementations of the core vocabulary.

Every factory here follows the slot contract documented in archrun.vocab. These are the
oracles the fast kernels are tested against, and what `backend="reference"` runs.
"""

from __future__ import annotations

import math

import numpy as np

from archrun.descriptor import AttentionSpec, MoeSpec, RopeSpec
from archrun.errors import MetadataError
from archrun_blocks import rope_scaling

F32 = np.float32


# -- norms -----------------------------------------------------------------------------------


def rms_norm(eps: float, offset: float = 0.0):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * (w + offset) (+ b), over the last axis."""

    def norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        ms = np.mean(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=F32)
        y = (x / np.sqrt(ms + F32(eps))) * (w + F32(offset) if offset else w)
        return y if b is None else y + b

    return norm


def layer_norm(eps: float, offset: float = 0.0):
    """LayerNorm: (x - mean(x)) / sqrt(var(x) + eps) * (w + offset) (+ b), over the last axis."""

    def norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        x64 = x.astype(np.float64)
        mean = x64.mean(axis=-1, keepdims=True)
        var = np.square(x64 - mean).mean(axis=-1, keepdims=True)
        y = ((x64 - mean) / np.sqrt(var + eps)).astype(F32) * (w + F32(offset) if offset else w)
        return y if b is None else y + b

    return norm


def rms_norm_1p(eps: float):
    """RMSNorm with unit-offset weights (x normed * (1 + w)): files that store w - 1."""
    return rms_norm(eps, 1.0)


def layer_norm_1p(eps: float):
    """LayerNorm with unit-offset weights ("LayerNorm1p", e.g. Nemotron)."""
    return layer_norm(eps, 1.0)


# -- rope ------------------------------------------------------------------------------------


class Rope:
    """Rotary embedding on the first n_rot dims of each head; pairing fixed at bind time.

    Frequencies and the cos/sin magnitude follow the spec's scaling (archrun_blocks.rope_scaling).
    """

    def __init__(self, spec: RopeSpec, freq_factors: np.ndarray | None, neox: bool,
                 long_factors: np.ndarray | None = None, short_factors: np.ndarray | None = None):
        try:
            self.inv_freq, self.magnitude = rope_scaling.frequencies(
                spec.scaling, spec.n_rot, spec.freq_base, factor=spec.scaling_factor,
                original_context=spec.original_context, context=spec.context, beta_fast=spec.beta_fast,
                beta_slow=spec.beta_slow, ext_factor=spec.ext_factor, attn_factor=spec.attn_factor,
                attn_scale=spec.attn_scale, short_factors=short_factors, long_factors=long_factors,
                freq_factors=freq_factors, truncate=spec.truncate)
        except ValueError as e:
            raise MetadataError(f"rope table: {e}") from None
        self.n_rot = spec.n_rot
        self.neox = neox

    def cos_sin(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin), each [n, n_rot/2], for integer positions pos[n] (times the scaling's magnitude)."""
        angles = np.asarray(pos, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        if self.magnitude != 1.0:
            return (np.cos(angles) * self.magnitude).astype(F32), (np.sin(angles) * self.magnitude).astype(F32)
        return np.cos(angles).astype(F32), np.sin(angles).astype(F32)

    def __call__(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        # x [n, H, hd]; cos/sin broadcast over heads as [n, 1, n_rot/2]
        c, s = cos[:, None, :], sin[:, None, :]
        out = x.copy()
        r = self.n_rot
        if self.neox:  # pairs (i, i + r/2)
            a, b = x[..., : r // 2], x[..., r // 2 : r]
            out[..., : r // 2] = a * c - b * s
            out[..., r // 2 : r] = b * c + a * s
        else:  # pairs (2i, 2i + 1)
            a, b = x[..., 0:r:2], x[..., 1:r:2]
            out[..., 0:r:2] = a * c - b * s
            out[..., 1:r:2] = b * c + a * s
        return out


def rope_neox(spec: RopeSpec, freq_factors: np.ndarray | None = None, *factors: np.ndarray) -> Rope:
    """NEOX pairs (x[i], x[i + n_rot/2]); factors: longrope's (long, short) divisor tables when the spec has them."""
    return Rope(spec, freq_factors, True, *factors)


def rope_norm(spec: RopeSpec, freq_factors: np.ndarray | None = None, *factors: np.ndarray) -> Rope:
    """NORM pairs (x[2i], x[2i+1]); factors as rope_neox."""
    return Rope(spec, freq_factors, False, *factors)


# -- attention -------------------------------------------------------------------------------


KV_TYPES = ("f32", "f16", "q8_0")  # what the attention ops here can store (q8_0: widths a multiple of 32)
_Q8 = 32  # values per q8_0 block


def _roundf(x: np.ndarray) -> np.ndarray:
    """C roundf (half away from zero) in float32."""
    a = np.abs(x)
    fl = np.floor(a)
    return np.sign(x) * (fl + np.floor(F32(2) * (a - fl)))


class NumpyKvCodec:
    """Cache rows of a kv type in numpy (the readable twin of archrun_blocks.kv_codec's kernels).

    "f32": float32 rows; "f16": float16 bits (uint16); "q8_0": ggml's q8_0 blocks, bytes uint8
    [..., width / 32 * 34]: per 32 values d = max|x| / 127 as float16, then int8 q = roundf(x / d).
    """

    @staticmethod
    def encode(kv_type: str, x: np.ndarray) -> np.ndarray:
        """float32 rows x [..., width] -> stored rows of kv_type."""
        if kv_type == "f16":
            return x.astype(np.float16).view(np.uint16)
        if kv_type == "q8_0":
            blocks = x.reshape(*x.shape[:-1], x.shape[-1] // _Q8, _Q8)
            d = np.abs(blocks).max(axis=-1, keepdims=True) / F32(127)
            with np.errstate(divide="ignore"):
                inv = np.where(d == 0, F32(0), F32(1) / d).astype(F32)
            q = _roundf(blocks * inv).astype(np.int8)
            out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=-1)
            return out.reshape(*x.shape[:-1], x.shape[-1] // _Q8 * (_Q8 + 2))
        return np.asarray(x, F32)

    @staticmethod
    def decode(kv_type: str, raw: np.ndarray) -> np.ndarray:
        """Stored rows of kv_type -> float32 rows [..., width] (float32 rows: as they are, no copy)."""
        if kv_type == "f16":
            return raw.view(np.float16).astype(F32)
        if kv_type == "q8_0":
            blocks = raw.reshape(*raw.shape[:-1], raw.shape[-1] // (_Q8 + 2), _Q8 + 2)
            d = np.ascontiguousarray(blocks[..., :2]).view(np.float16).astype(F32)
            q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(F32)
            return (q * d).reshape(*raw.shape[:-1], raw.shape[-1] // (_Q8 + 2) * _Q8)
        return raw


def kv_row_shape(kv_type: str, n_kv: int, width: int) -> tuple[tuple[int, int], type]:
    """((KV, stored), dtype) of one cached position's rows of `width` values per kv head."""
    if kv_type == "f16":
        return (n_kv, width), np.uint16
    if kv_type == "q8_0":
        return (n_kv, width // _Q8 * (_Q8 + 2)), np.uint8
    return (n_kv, width), F32


class KvSlot:
    """Plain per-layer K/V storage: one row per cached position, stored as `kv_type` (f32, f16, q8_0)."""

    def __init__(self, capacity: int, n_kv: int, head_dim: int, v_head_dim: int, kv_type: str = "f32",
                 codec=NumpyKvCodec):
        (kshape, dt), (vshape, _) = kv_row_shape(kv_type, n_kv, head_dim), kv_row_shape(kv_type, n_kv, v_head_dim)
        self.kv_type = kv_type
        self.codec = codec
        self.k = np.zeros((capacity, *kshape), dt)
        self.v = np.zeros((capacity, *vshape), dt)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def put(self, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store k [n, KV, hd] / v [n, KV, vd] at rows start..start+n-1."""
        end = start + len(k)
        if self.kv_type == "f32":
            self.k[start:end], self.v[start:end] = k, v
            return
        self.k[start:end] = self.codec.encode(self.kv_type, np.ascontiguousarray(k, F32))
        self.v[start:end] = self.codec.encode(self.kv_type, np.ascontiguousarray(v, F32))

    def rows(self, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The float32 values of rows 0..end-1: k [end, KV, hd], v [end, KV, vd] (f32: views)."""
        return self.codec.decode(self.kv_type, self.k[:end]), self.codec.decode(self.kv_type, self.v[:end])


def attend(q, k, v, q_pos, k_pos, scale: float, window: int, softcap: float = 0.0,
           slopes: np.ndarray | None = None, sinks: np.ndarray | None = None) -> np.ndarray:
    """Causal grouped-query attention.

    q [n, H, hd], k [T, KV, hd], v [T, KV, vd]; key j is visible to query i iff
    k_pos[j] <= q_pos[i] and (window == 0 or k_pos[j] > q_pos[i] - window). Scores are
    scaled, then capped to softcap * tanh(s / softcap) when softcap > 0, then (ALiBi, when
    slopes [H] are given) biased by slopes[h] * (k_pos[j] - q_pos[i]). With sinks [H], head h's
    softmax also counts the logit sinks[h], which takes probability mass and adds no value
    (gpt-oss; HF appends it as one more column and drops it after the softmax). Returns [n, H, vd].
    """
    n, n_head, hd = q.shape
    n_kv = k.shape[1]
    qg = q.reshape(n, n_kv, n_head // n_kv, hd)  # [n, KV, G, hd]
    scores = np.einsum("nkgd,tkd->kgnt", qg, k, dtype=F32) * F32(scale)  # [KV, G, n, T]
    if softcap > 0:
        scores = F32(softcap) * np.tanh(scores / F32(softcap))
    if slopes is not None:  # query head h = kv * G + g
        distance = (k_pos[None, :] - q_pos[:, None]).astype(F32)  # [n, T], <= 0 where visible
        scores = scores + slopes.astype(F32).reshape(n_kv, n_head // n_kv, 1, 1) * distance
    visible = k_pos[None, :] <= q_pos[:, None]
    if window:
        visible &= k_pos[None, :] > (q_pos[:, None] - window)
    scores = np.where(visible, scores, F32(-np.inf))
    top = scores.max(axis=-1, keepdims=True)                              # [KV, G, n, 1]
    sink = None
    if sinks is not None:  # query head h = kv * G + g
        sink = sinks.astype(F32).reshape(n_kv, n_head // n_kv, 1, 1)
        top = np.maximum(top, sink)
    p = np.exp(scores - top)
    total = p.sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink - top)
    p /= total
    out = np.einsum("kgnt,tkd->nkgd", p, v, dtype=F32)  # [n, KV, G, vd]
    return out.reshape(n, n_head, v.shape[-1])


class RingKvSlot:
    """K/V of a sliding-window layer: a ring of `window + max_rewind` rows, indexed by position % size.

    Memory is bounded by the window, not the context. Each row remembers its position, so
    masking never depends on where the ring wrapped; rewinding up to max_rewind tokens stays
    exact because the rows the window needs after the rewind are still in the ring.
    """

    def __init__(self, window: int, max_rewind: int, n_kv: int, head_dim: int, v_head_dim: int,
                 kv_type: str = "f32", codec=NumpyKvCodec):
        self.size = window + max_rewind
        self.max_rewind = max_rewind
        (kshape, dt), (vshape, _) = kv_row_shape(kv_type, n_kv, head_dim), kv_row_shape(kv_type, n_kv, v_head_dim)
        self.kv_type = kv_type
        self.codec = codec
        self.k = np.zeros((self.size, *kshape), dt)
        self.v = np.zeros((self.size, *vshape), dt)
        self.pos = np.full(self.size, -1, np.int64)  # position held by each row (-1: empty)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.pos.nbytes

    def gather(self, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows holding positions < start (older rows past a rewind are ignored): k, v (float32), pos."""
        keep = (self.pos >= 0) & (self.pos < start)
        return (self.codec.decode(self.kv_type, self.k[keep]), self.codec.decode(self.kv_type, self.v[keep]),
                self.pos[keep])

    def stored(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The float32 values k, v become once stored (themselves for f32; rounded for other kv types)."""
        if self.kv_type == "f32":
            return k, v
        c, t = self.codec, self.kv_type
        return (c.decode(t, c.encode(t, np.ascontiguousarray(k, F32))),
                c.decode(t, c.encode(t, np.ascontiguousarray(v, F32))))

    def write(self, k: np.ndarray, v: np.ndarray, start: int) -> None:
        """Store positions start.. (only the last `size` of them can matter later)."""
        n = len(k)
        first = max(0, n - self.size)
        pos = np.arange(start + first, start + n)
        rows = pos % self.size
        k, v = np.ascontiguousarray(k[first:], F32), np.ascontiguousarray(v[first:], F32)
        if self.kv_type != "f32":
            k, v = self.codec.encode(self.kv_type, k), self.codec.encode(self.kv_type, v)
        self.k[rows], self.v[rows], self.pos[rows] = k, v, pos


class CausalAttention:
    """Causal GQA. Global layers keep a plain KV slot; windowed layers a ring bounded by the window."""

    def __init__(self, spec: AttentionSpec):
        if spec.alibi_max_bias:
            raise MetadataError(f"attention {spec.kind!r} adds no ALiBi bias, but the model states max_alibi_bias "
                                f"{spec.alibi_max_bias} (an ALiBi model needs an ALiBi attention op, e.g. 'alibi')")
        self.spec = spec
        self.attend = attend  # [n,H,hd] x [T,KV,hd] x [T,KV,vd] -> [n,H,vd]; fast twins swap in a kernel
        self.sinks: np.ndarray | None = None  # [H] (spec.sinks), bound at load

    def bind(self, binder, layer: int) -> None:
        """Bind the layer's `attn_sinks` [H] when the spec has sinks."""
        if self.spec.sinks:
            self.sinks = binder.vector("attn_sinks", layer)

    def _attend(self, q, k, v, q_pos, k_pos) -> np.ndarray:
        s = self.spec
        if self.sinks is not None:
            return self.attend(q, k, v, q_pos, k_pos, s.scale, s.window, s.softcap, sinks=self.sinks)
        return self.attend(q, k, v, q_pos, k_pos, s.scale, s.window, s.softcap)

    codec = NumpyKvCodec  # how slots convert rows of other kv types (fast twins swap in kernels)

    @property
    def kv_types(self) -> tuple[str, ...]:
        """The kv types new_slot can store: f32 and f16, and q8_0 when head widths are multiples of 32."""
        s = self.spec
        return KV_TYPES if s.head_dim % _Q8 == 0 and s.v_head_dim % _Q8 == 0 else KV_TYPES[:2]

    def new_slot(self, capacity: int, max_rewind: int = 64, kv_type: str = "f32") -> KvSlot | RingKvSlot:
        """A layer's K/V slot for `capacity` positions, rows stored as kv_type (one of kv_types): a ring of
        window + max_rewind rows for a windowed layer when that is smaller."""
        s = self.spec
        if kv_type not in self.kv_types:
            raise MetadataError(f"attention {s.kind!r} stores no kv type {kv_type!r} (it has {self.kv_types})")
        if s.window and s.window + max_rewind < capacity:
            return RingKvSlot(s.window, max_rewind, s.n_head_kv, s.head_dim, s.v_head_dim, kv_type, self.codec)
        return KvSlot(capacity, s.n_head_kv, s.head_dim, s.v_head_dim, kv_type, self.codec)

    def __call__(self, q, k, v, slot: KvSlot | RingKvSlot, start: int) -> np.ndarray:
        """Store k/v (as the slot's kv type), then attend q over every visible stored row: the new
        rows too are read back as stored (rounded for f16 / q8_0, as llama.cpp reads its cache)."""
        n = q.shape[0]
        q_pos = np.arange(start, start + n)
        if isinstance(slot, RingKvSlot):
            old_k, old_v, old_pos = slot.gather(start)
            new_k, new_v = slot.stored(k, v)
            keys, values = np.concatenate([old_k, new_k]), np.concatenate([old_v, new_v])
            k_pos = np.concatenate([old_pos, q_pos])
            slot.write(k, v, start)
            return self._attend(q, keys, values, q_pos, k_pos)
        end = start + n
        slot.put(start, k, v)
        keys, values = slot.rows(end)
        return self._attend(q, keys, values, q_pos, np.arange(end))


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi slopes float32 [n_head] (ggml_soft_max_ext): with n = 2^floor(log2 n_head),
    m0 = 2^(-max_bias / n) and m1 = 2^(-max_bias / 2 / n), head h < n has slope m0^(h+1) and
    head h >= n slope m1^(2 (h - n) + 1); max_bias 0 gives slope 1 for every head (as in ggml)."""
    if max_bias <= 0:
        return np.ones(n_head, F32)
    n = 2 ** math.floor(math.log2(n_head))
    m0, m1 = 2.0 ** (-max_bias / n), 2.0 ** (-max_bias / 2.0 / n)
    return np.array([m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(n_head)], F32)


class AlibiAttention(CausalAttention):
    """Causal GQA with ALiBi (llama.cpp: bloom, mpt): no rotary embedding; query head h adds
    slope_h * (key position - query position) to its scores (alibi_slopes of the spec's
    alibi_max_bias), i.e. a penalty growing linearly with distance. Windows and softcap as causal."""

    def __init__(self, spec: AttentionSpec):
        if spec.sinks:
            raise MetadataError("attention 'alibi' has no attention sinks; the model has attn_sinks")
        self.spec = spec
        self.attend = attend
        self.sinks = None
        self.slopes = alibi_slopes(spec.n_head, spec.alibi_max_bias)

    def _attend(self, q, k, v, q_pos, k_pos) -> np.ndarray:
        s = self.spec
        return self.attend(q, k, v, q_pos, k_pos, s.scale, s.window, s.softcap, self.slopes)


# -- FFN activations, gating, MoE --------------------------------------------------------------


def _activation(f):
    """An activation op from the elementwise function f: act(x) (* up when given)."""

    def act(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        y = f(x)
        return y if up is None else y * up

    return act


def silu():
    """silu(x) = x / (1 + exp(-x)); gated: SwiGLU."""
    return _activation(lambda g: g / (F32(1.0) + np.exp(-g)))


def gelu_tanh():
    """gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); gated: GeGLU (tanh)."""
    c = F32(np.sqrt(2.0 / np.pi))
    return _activation(lambda g: F32(0.5) * g * (F32(1.0) + np.tanh(c * (g + F32(0.044715) * g * g * g))))


_ERF = np.vectorize(math.erf, otypes=[np.float64])


def gelu():
    """Exact GELU: 0.5 x (1 + erf(x / sqrt 2)) (computed in float64)."""
    return _activation(lambda g: (0.5 * g * (1.0 + _ERF(g.astype(np.float64) / math.sqrt(2.0)))).astype(F32))


def relu2():
    """Squared ReLU: max(x, 0)^2."""
    return _activation(lambda g: np.square(np.maximum(g, F32(0.0))))


def swiglu_oai(alpha: float = 1.702, limit: float = 7.0):
    """gpt-oss's clamped SwiGLU: g = min(x, limit), u = clip(up, -limit, limit);
    g * sigmoid(alpha g) * (u + 1) (llama.cpp ggml_swiglu_oai; alpha and limit are fixed there)."""

    def act(x: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
        if up is None:
            raise ValueError("swiglu_oai is a gated activation: it needs the up projection")
        g = np.minimum(x, F32(limit))
        u = np.clip(up, F32(-limit), F32(limit))
        return g / (F32(1.0) + np.exp(-F32(alpha) * g)) * (u + F32(1.0))

    return act


# -- residual topologies -------------------------------------------------------------------------


class Sequential:
    """x -> h = x + s attn(x) -> h + s ffn(h): the FFN reads the stream after the attention."""

    ffn_reads_input = False  # the FFN needs its own norm (it cannot share the attention's)

    def __init__(self, scale: float = 1.0):
        self.scale = F32(scale)

    def ffn_input(self, x: np.ndarray, a: np.ndarray) -> np.ndarray:
        return x + a * self.scale

    def combine(self, x: np.ndarray, a: np.ndarray, f: np.ndarray) -> np.ndarray:
        return (x + a * self.scale) + f * self.scale


class Parallel:
    """x -> x + s (attn(x) + ffn(x)): attention and FFN read the same input."""

    ffn_reads_input = True  # a block without an FFN norm may share the attention's normed input

    def __init__(self, scale: float = 1.0):
        self.scale = F32(scale)

    def ffn_input(self, x: np.ndarray, a: np.ndarray) -> np.ndarray:
        return x

    def combine(self, x: np.ndarray, a: np.ndarray, f: np.ndarray) -> np.ndarray:
        return x + (a + f) * self.scale


def gating_softmax():
    def probs(logits: np.ndarray) -> np.ndarray:
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return probs


def gating_sigmoid():
    def probs(logits: np.ndarray) -> np.ndarray:
        return F32(1.0) / (F32(1.0) + np.exp(-logits))

    return probs


def gating_sparsemixer(jitter_eps: float = 0.01):
    """PhiMoE's sparsemixer in inference (HF `sparsemixer`, eval mode) as gating probs: the best
    expert i1 gets softmax(logits masked to those within the relative gap 2 eps of the best)[i1],
    the second best i2 the same softmax over the others (i1 excluded) relative to the second best;
    every other expert 0. Top-k of these probs picks i1 and i2 with exactly those weights (HF routes
    to two experts whatever the top-k; a larger k adds zero-weight experts), unrenormalised.
    jitter_eps: HF's `router_jitter_noise` (0.01 in PhimoeConfig and the released Phi-3.5-MoE;
    GGUF files do not carry it)."""
    gap = F32(2 * jitter_eps)

    def masked_softmax_at(logits: np.ndarray, scores: np.ndarray, best: np.ndarray) -> np.ndarray:
        top = np.take_along_axis(scores, best[:, None], axis=-1)  # [n, 1]
        factor = np.maximum(np.abs(logits), top)
        keep = ~((top - logits) / factor > gap) & np.isfinite(scores)
        z = np.where(keep, scores - top, F32(-np.inf))
        e = np.exp(z)
        return (e / e.sum(axis=-1, keepdims=True))[np.arange(len(best)), best]

    def probs(logits: np.ndarray) -> np.ndarray:
        rows = np.arange(logits.shape[0])
        first = np.argmax(logits, axis=-1)
        out = np.zeros_like(logits)
        out[rows, first] = masked_softmax_at(logits, logits, first)
        if logits.shape[-1] > 1:
            rest = logits.copy()
            rest[rows, first] = F32(-np.inf)
            second = np.argmax(rest, axis=-1)
            out[rows, second] = masked_softmax_at(logits, rest, second)
        return out

    return probs


def route(probs: np.ndarray, bias: np.ndarray | None, spec: MoeSpec) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp build_moe_ffn selection: ids [n, k] and weights [n, k] (llama-graph.cpp)."""
    select = probs if bias is None else probs + bias  # bias steers the choice only
    if spec.n_group > 1:
        select = _limit_groups(select, spec.n_group, spec.n_group_used)
    ids = np.argsort(-select, axis=-1, kind="stable")[:, : spec.n_expert_used]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if spec.weights_norm:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), F32(6.103515625e-5))
    if spec.weights_scale != 1.0:
        weights = weights * F32(spec.weights_scale)
    return ids, weights.astype(F32)


def _limit_groups(select: np.ndarray, n_group: int, n_used: int) -> np.ndarray:
    """Mask experts outside the best `n_used` groups (group score = sum of its top-2 scores)."""
    n, n_expert = select.shape
    grouped = select.reshape(n, n_group, n_expert // n_group)
    top2 = -np.sort(-grouped, axis=-1)[:, :, :2].sum(axis=-1)  # [n, n_group]
    keep = np.argsort(-top2, axis=-1, kind="stable")[:, :n_used]
    mask = np.zeros((n, n_group), bool)
    np.put_along_axis(mask, keep, True, axis=-1)
    return np.where(np.repeat(mask, n_expert // n_group, axis=-1), select, F32(-np.inf))


def moe_topk(spec: MoeSpec, gating, act):
    """Mixture of experts: route, run each selected expert's gated FFN, weighted sum (+ shared experts)."""

    def moe(x: np.ndarray, w) -> np.ndarray:
        logits = w.gate_inp(x)  # [n, E]
        ids, weights = route(gating(logits), w.probs_bias, spec)
        out = np.zeros_like(x)
        for e in np.unique(ids):
            rows, slot = np.nonzero(ids == e)
            xe = x[rows]
            ye = w.down[e](act(w.gate[e](xe), w.up[e](xe)))  # [m, d]: down(act(gate) * up)
            out[rows] += weights[rows, slot][:, None] * ye
        if w.shared is not None:
            out += shared_experts(x, w, act)
        return out

    return moe


def shared_experts(x: np.ndarray, w, act) -> np.ndarray:
    """The shared experts' FFN of x [n, d] (MoeWeights.shared), gated per token by
    sigmoid(x . shared_gate) when the weights have one (Qwen2-MoE)."""
    g, u, d = w.shared
    ys = d(act(g(x), u(x)))
    if w.shared_gate is not None:
        ys *= F32(1) / (F32(1) + np.exp(-(x @ w.shared_gate)))[:, None]
    return ys


def softcap_tanh(cap: float):
    """c * tanh(logits / c)."""

    def softcap(logits: np.ndarray) -> np.ndarray:
        return F32(cap) * np.tanh(logits / F32(cap))

    return softcap
