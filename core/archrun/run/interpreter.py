"""The interpreter: one family-independent decoder that runs any bound Plan.

The per-token path (`Interpreter.forward_step`, op by op through `Interpreter._forward`) only calls the
bound ops; it does no registry lookups and knows no architecture. Block styles (archrun.run.decoders)
subclass it with their guarded entries.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from archrun.contracts import OpCapabilities
from archrun.decoder import Caps
from archrun.descriptor import Descriptor, LayerSpec
from archrun.errors import (
    ContextOverflow,
    InvalidRequest,
    KvTypeUnsupported,
    NotGenerative,
    check_flag,
    shown,
)
from archrun.io.ggufio import GGUFFile
from archrun.io.weights import Matrix
from archrun.run.bind import bind_layer
from archrun.run.cache import CacheOwner, KvCache, PairSlot, kv_options
from archrun.run.plan import LayerPlan, Plan

F32 = np.float32


def _qk_norm(norm, lp: LayerPlan, a, q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q [n, H, hd] and K [n, KV, hd] through their norms: per head (shared weights, or a weight row
    per head), or one norm over all heads."""
    if a.qk_norm_per_head:
        return (np.stack([norm(q[:, h], lp.q_norm[h]) for h in range(q.shape[1])], axis=1),
                np.stack([norm(k[:, h], lp.k_norm[h]) for h in range(k.shape[1])], axis=1))
    if a.qk_norm_full:
        n = q.shape[0]
        return (norm(q.reshape(n, -1), lp.q_norm).reshape(q.shape),
                norm(k.reshape(n, -1), lp.k_norm).reshape(k.shape))
    return norm(q, lp.q_norm), norm(k, lp.k_norm)


@attrs.frozen
class HostStep:
    """Result of host_step: logits [n, vocab] and the trunk's final hidden states [n, d].

    hidden is what the output head reads (after output_norm): the state MTP heads consume.
    """

    logits: np.ndarray
    hidden: np.ndarray


def cache_owner(d: Descriptor, gguf: GGUFFile) -> CacheOwner:
    """The identity and geometry a model stamps on the caches it makes (archrun.run.cache.CacheOwner)."""
    file = gguf.identity()  # a split model's: every part's
    key = hashlib.sha256(repr((file, attrs.evolve(d, block_style=""))).encode()).hexdigest()[:24]
    geometry = tuple((s.attention.kind, s.attention.n_head_kv, s.attention.head_dim, s.attention.v_head_dim,
                      s.attention.window) for s in d.layers)
    return CacheOwner(gguf.path.name, key, geometry)


class Interpreter:
    """Runs a Plan. Subclasses (block styles) add their guarded entries and say so in `caps`."""

    caps = Caps()
    prefill_chunk = 512  # tokens per pass of a long prompt (_forward); llama.cpp's default micro-batch

    def __init__(self, plan: Plan, gguf: GGUFFile, tokenizer_factory: Callable[[], Any] | None = None,
                 chat_template: str | None = None):
        self.plan = plan
        self.descriptor = plan.descriptor
        self.gguf = gguf
        self._tokenizer_factory = tokenizer_factory
        self._tokenizer = None
        self.default_chat_template = chat_template
        self.cache_owner = cache_owner(plan.descriptor, gguf)  # stamped on every cache init_cache makes
        if not plan.descriptor.causal:  # an encoder has no cache to batch, rewind or read logits from
            self.caps = Caps(rewind=False, all_logits=False, workers=type(self).caps.workers)

    # -- public entries (Decoder protocol) --------------------------------------------------

    @property
    def backend(self) -> str:
        """"fast" or "reference": whose kernels compute the weight products."""
        return self.plan.binder.backend

    @property
    def tokenizer(self):
        """The tokenizer built from the file's metadata (built on first use)."""
        if self._tokenizer is None and self._tokenizer_factory is not None:
            self._tokenizer = self._tokenizer_factory()
        return self._tokenizer

    def init_cache(self, max_tokens: int | None = None, max_rewind: int = 64, kv_type: str = "f32") -> KvCache:
        """A cache for up to max_tokens tokens (default: the model's context length).

        max_rewind bounds how far `cache.rewind` can go back on sliding-window layers, whose
        ring buffers hold window + max_rewind rows (global layers can always rewind fully).
        kv_type: how K/V rows are stored, "f32", "f16" or "q8_0" (ggml's blocks), as far as every
        layer's op supports it (`op.kv_types`; ops without it store f32 only): else KvTypeUnsupported.
        An encoder (bidirectional attention) has no cache to extend: NotGenerative.
        """
        if not self.causal:
            raise NotGenerative(f"{self.descriptor.architecture} is an encoder (bidirectional attention): it "
                                "embeds text (archrun.embed, POST /v1/embeddings) and cannot generate")
        return self._new_cache(max_tokens, max_rewind, kv_type)

    def _new_cache(self, max_tokens: int | None, max_rewind: int, kv_type: str) -> KvCache:
        n_ctx = self.descriptor.n_ctx
        max_tokens = n_ctx if max_tokens is None else max_tokens
        max_tokens = int(max_tokens) if isinstance(max_tokens, np.integer) else max_tokens  # numpy ints too
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be a positive integer, got {shown(max_tokens)}")
        if max_tokens > n_ctx:
            raise ContextOverflow(f"max_tokens {max_tokens} exceeds the model's context length {n_ctx}")
        if not isinstance(max_rewind, int) or isinstance(max_rewind, bool) or max_rewind < 0:
            raise InvalidRequest(f"max_rewind must be a non-negative integer, got {shown(max_rewind)}")
        check_kv_type(self.plan.layers, kv_type, self.plan.binder.declared)
        return KvCache([_new_slot(lp, max_tokens, max_rewind, kv_type) for lp in self.plan.layers], max_tokens,
                       kv_type=kv_type, owner=self.cache_owner)

    def forward_step(self, token_ids: Sequence[int] | np.ndarray, cache: KvCache,
                     all_logits: bool = False) -> np.ndarray:
        """Append token_ids to cache; float32 logits of the last position [vocab] or of all [n, vocab]."""
        ids = self._check_ids(token_ids)
        all_logits = check_flag("all_logits", all_logits)
        self._check_cache(cache)
        cache.check_room(len(ids))
        logits, _ = self._forward(ids, cache, all_logits)
        return logits if all_logits else logits[-1]

    def forward_step_hidden(self, token_ids: Sequence[int] | np.ndarray, cache: KvCache) -> HostStep:
        """Append token_ids; logits [n, vocab] of every position and the trunk's final hidden states
        [n, d] (after output_norm): what a head on the trunk reads (an MTP drafter). Every block style."""
        ids = self._check_ids(token_ids)
        self._check_cache(cache)
        cache.check_room(len(ids))
        return HostStep(*self._forward(ids, cache, True))

    @property
    def causal(self) -> bool:
        """False for an encoder: its attention sees the whole sequence, so it embeds and does not generate."""
        return self.descriptor.causal

    def hidden_states(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 [n, d]: the trunk's final hidden states of a whole sequence (after the final norm, when the
        model has one), without a caller-visible cache: what pooling (archrun.embed) reads. A decoder runs
        its prefill path (in chunks of `prefill_chunk`); an encoder runs the sequence in one pass, so every
        position sees every other."""
        ids = self._check_ids(token_ids)
        if len(ids) > self.descriptor.n_ctx:
            raise ContextOverflow(f"{len(ids)} tokens exceed the context length {self.descriptor.n_ctx}")
        cache = self._new_cache(len(ids), 0, "f32")
        if self.caps.workers:  # the prefill's BLAS threads need the cores
            self.rest_workers()
        if not self.causal:
            return self._forward_span(ids, cache, False)[1]
        return Interpreter._forward(self, ids, cache, False)[1]

    def logits(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 logits [n, vocab] of a whole sequence, without a caller-visible cache."""
        ids = self._check_ids(token_ids)
        if len(ids) > self.descriptor.n_ctx:
            raise ContextOverflow(f"{len(ids)} tokens exceed the context length {self.descriptor.n_ctx}")
        logits, _ = self._forward(ids, self.init_cache(len(ids)), True)
        return logits

    # -- the interpreter ---------------------------------------------------------------------

    def _check_cache(self, cache: Any) -> None:
        """Before any kernel runs: `cache` is a KvCache this model (its file and geometry) made, holding the
        slots and arrays it was made with (KvCache.verify; ModelMismatch names what differs)."""
        if not isinstance(cache, KvCache):
            raise InvalidRequest(f"cache must be a KvCache from init_cache(), got {type(cache).__name__}")
        cache.verify(self.cache_owner)

    @property
    def takes_hidden(self) -> bool:
        """Whether this is a pipeline stage after the first (build_plan's layers): its steps take the previous
        stage's hidden states, float32 [n, d], where a model takes token ids."""
        return self.plan.span is not None and self.plan.span[0] > 0

    @property
    def gives_hidden(self) -> bool:
        """Whether this is a pipeline stage before the last: its steps give the hidden states [n, d] of every
        position after its last block (no final norm, no head) where a model gives logits."""
        return self.plan.span is not None and self.plan.span[1] < self.descriptor.n_layer

    def step_paths(self) -> tuple:
        """What decides which kernel path a step takes on this model's blocks: pipeline stages of one model
        (archrun.pipeline) must agree on it to compute what one process computes."""
        return (type(self).__name__,)

    def _check_hidden(self, x: Any) -> np.ndarray:
        d = self.descriptor.n_embd
        if not isinstance(x, np.ndarray) or x.ndim != 2 or not len(x) or x.shape[1] != d or x.dtype != F32:
            got = f"{x.dtype} {list(x.shape)}" if isinstance(x, np.ndarray) else type(x).__name__
            raise InvalidRequest(f"this pipeline stage starts at block {self.plan.span[0]}: it takes hidden states "
                                 f"(float32 [n, {d}], n >= 1) where a model takes token ids, got {got}")
        return x

    def _check_ids(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        if self.takes_hidden:
            return self._check_hidden(token_ids)
        try:
            arr = np.asarray(token_ids)
        except (ValueError, TypeError, RecursionError):  # ragged, self-referencing, ...
            raise InvalidRequest("token_ids must be a non-empty 1-D sequence of integers") from None
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise InvalidRequest("token_ids must be a non-empty 1-D sequence of integers")
        if arr.min() < 0 or arr.max() >= self.descriptor.n_vocab:
            raise InvalidRequest(f"token ids must lie in [0, {self.descriptor.n_vocab})")
        return arr.astype(np.int64)

    def _forward(self, ids: np.ndarray, cache: KvCache, all_logits: bool) -> tuple[np.ndarray, np.ndarray]:
        """Run ids through every layer, appending to cache; returns (logits, normed final hidden states).

        A prompt longer than `prefill_chunk` goes in chunks of that many tokens, each attending to the cache
        the previous ones filled: the same math (to float rounding), but every intermediate of a layer
        ([n, ffn] activations, [n, n_kv] scores) stays a few MB instead of growing with the prompt
        (a 4096-token prompt of Qwen2.5-0.5B: 5 x 80 MB of fresh activations a layer, 43 s -> 27 s)."""
        n = self.prefill_chunk
        if len(ids) <= n:
            return self._forward_span(ids, cache, all_logits)
        steps = [self._forward_span(ids[i:i + n], cache, all_logits or i + n >= len(ids))
                 for i in range(0, len(ids), n)]
        logits = np.concatenate([s[0] for s in steps]) if all_logits else steps[-1][0]
        return logits, np.concatenate([s[1] for s in steps])

    def _forward_span(self, ids: np.ndarray, cache: KvCache, all_logits: bool) -> tuple[np.ndarray, np.ndarray]:
        """_forward for one chunk of tokens (all of them in one pass through every layer)."""
        start = len(cache)
        x = self.embed(ids, start)
        angles = self.rope_angles(np.arange(start, start + len(ids)))
        x = self._through_blocks(x, ids, lambda i, lp, h, sub=None, ids=None: self.run_block(
            lp, h, cache.slots[i], start, angles, sub, ids))
        cache.advance(len(ids))
        hidden = self._final_norm(x)
        return self.head(hidden if all_logits else hidden[-1:]), hidden

    def _through_blocks(self, x: np.ndarray, ids: np.ndarray,
                        block: Callable[..., np.ndarray]) -> np.ndarray:
        """The embeddings x [n, d] of token ids through every block (block(i, lp, h, sub=None, ids=None) ->
        [n, d] runs block i on h, or with sub "attention"/"ffn" only that branch: see StreamBlock; ids, the
        rows' token ids, reach the FFN ops that read them, MoeFfn.token_ids); a model whose residual
        stream is more than one array runs the blocks through its stream op (Plan.stream: enter, layer per
        block, leave). Experts streamed from disk go back under their cap after every block (or branch), so a
        prompt's peak is the cap plus one layer's picks. A later pipeline stage (hidden states for ids) gives
        no token ids."""
        stream, pager = self.plan.stream, self.plan.pager
        tokens = None if self.takes_hidden else ids
        if pager is not None:
            run = block

            def block(i: int, lp: LayerPlan, h: np.ndarray, sub: str | None = None,
                      ids: np.ndarray | None = None) -> np.ndarray:
                h = run(i, lp, h, sub, ids)
                pager.between_steps()
                return h

        if stream is None:
            for i, lp in enumerate(self.plan.layers):
                x = block(i, lp, x, ids=tokens)
            return x
        state = stream.enter(x, ids)
        for i, lp in enumerate(self.plan.layers):
            state = stream.layer(i, state, StreamBlock(functools.partial(block, i, lp, ids=tokens)))
        return stream.leave(state)

    def _final_norm(self, x: np.ndarray) -> np.ndarray:
        """The trunk's final norm on x [n, d] (x itself without one, and on a stage before the last)."""
        p = self.plan
        if p.output_norm is None or self.gives_hidden:
            return x
        return (p.final_norm_op or p.norm)(x, p.output_norm, p.output_norm_b)

    @property
    def chat_template(self) -> str | None:
        """The chat template: the file's (tokenizer.chat_template), else the family's default."""
        tok = self.tokenizer
        return (tok.chat_template if tok is not None else None) or self.default_chat_template

    # -- the Trunk interface (archrun.decoder.Trunk): for heads that hang off the trunk -------------

    def has_tensor(self, role: str, layer: int | None = None) -> bool:
        """Whether the file holds the tensor of `role` (in block `layer`)."""
        try:
            name = self.descriptor.tensor_name(role, layer)
        except KeyError:  # the family maps this role to no tensor
            return False
        return name in self.gguf.tensors

    def bind_matrix(self, role: str, layer: int | None = None) -> Matrix:
        """The product of the tensor of `role` (x[n, n_in] -> [n, n_out]), on the model's backend."""
        return self.plan.binder.matrix(role, layer)

    def bind_vector(self, role: str, layer: int | None = None) -> np.ndarray:
        """The tensor of `role` as float32."""
        return self.plan.binder.vector(role, layer)

    def norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """The model's norm op over the last axis."""
        return self.plan.norm(x, w, b)

    @property
    def output_norm(self) -> np.ndarray:
        """The trunk's final norm weight [d]."""
        return self.plan.output_norm

    def embed(self, ids: np.ndarray, start: int | None = None) -> np.ndarray:
        """Token embeddings [n, d], scaled by the descriptor's embed_scale; a model with a learned
        position table adds its rows start..start+n-1 (start is required then)."""
        self.gguf.check_intact()  # every step starts here: a truncated file is an error, not SIGBUS
        if self.plan.pager is not None:  # experts streamed from disk: back under their cap before the step
            self.plan.pager.between_steps()
        if self.takes_hidden:  # a later pipeline stage: the previous stage's hidden states (a copy: steps write it)
            return np.array(ids, dtype=F32)
        x = self.plan.embed.rows(ids)
        if self.descriptor.embed_scale != 1.0:
            x *= F32(self.descriptor.embed_scale)
        table = self.plan.positions
        if table is not None:
            if start is None:
                raise InvalidRequest("this model adds learned position embeddings: embed(ids, start) needs the "
                                     "position of ids[0]")
            end = start + len(ids)
            if start < 0 or end > len(table):
                raise ContextOverflow(f"positions {start}..{end - 1} are past the model's {len(table)} learned "
                                      "positions")
            x += table[start:end]
        if self.plan.token_type is not None:
            x += self.plan.token_type
        if self.plan.embed_norm is not None:
            x = self.plan.norm(x, self.plan.embed_norm, self.plan.embed_norm_b)
        return x

    def head(self, hidden: np.ndarray) -> np.ndarray:
        """Output head on normed hidden states [n, d] -> logits [n, vocab] (scaled and softcapped if the
        model says so); a stage before the last gives the hidden states back."""
        if self.gives_hidden:
            return hidden
        return self.finish_logits(self.plan.output(hidden))

    def finish_logits(self, logits: np.ndarray) -> np.ndarray:
        """The output product's logits [n, vocab] times the logit scale, then softcapped."""
        if self.gives_hidden:  # a stage before the last: its "logits" are hidden states
            return logits
        if self.descriptor.logit_scale != 1.0:
            logits *= F32(self.descriptor.logit_scale)
        return self.plan.softcap(logits) if self.plan.softcap is not None else logits

    def rope_angles(self, positions: np.ndarray) -> list:
        """(cos, sin) of every rope table at these positions (None for tables without rope)."""
        return [rope.cos_sin(positions) if rope is not None else None for rope in self.plan.ropes]

    def bind_block(self, index: int, spec: LayerSpec) -> LayerPlan:
        """Bind the weights of block `index` (e.g. an MTP block after the trunk) with this model's ops."""
        return bind_layer(self.plan.binder, index, spec)

    def run_block(self, lp: LayerPlan, x: np.ndarray, slot: Any, start: int, angles: list,
                  sub: str | None = None, ids: np.ndarray | None = None) -> np.ndarray:
        """One decoder block on x [n, d] (or one branch of it: sub, see StreamBlock); its K/V (or state) go to
        `slot` at rows start..start+n-1; ids: the rows' token ids, for an FFN op that reads them."""
        if lp.mixer is not None:
            return self._block(lp, x, angles, lambda h: lp.mixer(h, slot, start), sub=sub, ids=ids)
        if lp.parallel is not None:
            return self._block(lp, x, angles, lambda q, k, v, *side: lp.attention(q, k, v, slot.attention, start,
                                                                                  *side),
                               lambda h: lp.parallel.mix(h, slot.mixer, start), sub, ids)
        return self._block(lp, x, angles, lambda q, k, v, *side: lp.attention(q, k, v, slot, start, *side), sub=sub,
                           ids=ids)

    def _block(self, lp: LayerPlan, x: np.ndarray, angles: list, attend: Callable[..., np.ndarray],
               beside: Callable[[np.ndarray], np.ndarray] | None = None, sub: str | None = None,
               ids: np.ndarray | None = None) -> np.ndarray:
        """A decoder block on x [n, d] whose attention is attend(q [n,H,hd], k, v) -> [n, H, vd], or,
        for a layer whose op is the whole token mixer, attend(h [n, d]) -> [n, d]; beside(h) -> [n, d]
        is the token mixer running beside the attention (added to its output), if any. sub "attention":
        only the attention branch's output (pre-norm, attention, post-norm: no residual); sub "ffn": only
        the FFN branch on x as the FFN's input before its norm. ids: the rows' token ids (an FFN op may read
        them: MoeFfn.token_ids)."""
        norm = self.plan.norm
        if sub == "ffn":
            return self._ffn_branch(lp, x, ids)
        h = x if lp.attn_norm is None else norm(x, lp.attn_norm, lp.attn_norm_b)
        o = attend(h) if lp.mixer is not None else self._attend(lp, h, angles, attend)
        if beside is not None:
            o = o + beside(h)
        if lp.post_attn_norm is not None:
            o = norm(o, lp.post_attn_norm)
        if sub == "attention":
            return o
        if lp.ffn is None:  # the mixer is the block's only branch
            return lp.residual.combine(x, o, np.zeros_like(x))
        # without an FFN norm: a parallel block's shared norm, or (no pre-norms) the FFN's input as is
        shared = lp.ffn_norm is None and lp.attn_norm is not None
        return lp.residual.combine(x, o, self._ffn_branch(lp, h if shared else lp.residual.ffn_input(x, o), ids))

    def _ffn_branch(self, lp: LayerPlan, g: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        """The FFN branch on its input g [n, d]: the FFN norm (if the block has one), the FFN, its post-norm;
        zeros for a block without FFN. ids: the rows' token ids, for a mixture that routes by them."""
        if lp.ffn is None:
            return np.zeros_like(g)
        norm = self.plan.norm
        if lp.ffn_norm is not None and not lp.ffn_applies_norm:
            g = norm(g, lp.ffn_norm, lp.ffn_norm_b)
        f = lp.ffn(g, ids)
        return f if lp.post_ffn_norm is None else norm(f, lp.post_ffn_norm)

    def _attend(self, lp: LayerPlan, h: np.ndarray, angles: list,
                attend: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """The attention branch on normed h [n, d]: projections, q/k norms, rope, attend, output -> [n, d].
        An attention layout's qkv may give row-aligned side inputs after q, k, v (arrays [n, ...]: what its
        op reads besides them, e.g. a key selector's own projections); they go to the op as they are."""
        norm, a = self.plan.norm, lp.spec.attention
        n = len(h)
        q, k, v, *side = lp.qkv(h)
        if a.clamp_kqv:  # OLMo / MPT clip_qkv
            c = F32(a.clamp_kqv)
            q, k, v = np.clip(q, -c, c), np.clip(k, -c, c), np.clip(v, -c, c)
        q = q.reshape(n, a.n_head, a.head_dim)
        k = k.reshape(n, a.n_head_kv, a.head_dim)
        v = v.reshape(n, a.n_head_kv, a.v_head_dim)
        if lp.q_norm is not None and not a.qk_norm_after_rope:
            q, k = _qk_norm(norm, lp, a, q, k)
        rope = self.plan.ropes[a.rope]
        if rope is not None:
            cos, sin = angles[a.rope]
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        if lp.q_norm is not None and a.qk_norm_after_rope:
            q, k = _qk_norm(norm, lp, a, q, k)
        out = attend(q, k, v, *side).reshape(n, a.n_head * a.v_head_dim)
        return lp.o(out if lp.attn_sub_norm is None else norm(out, lp.attn_sub_norm))


class StreamBlock:
    """What a stream op's layer(i, state, block) gets: block(h) runs the whole block on h [n, d] (residual
    included); block.attention(h) only its attention branch (pre-norm, attention or token mixer, post-norm:
    the branch's output, no residual), block.ffn(g) only its FFN branch on g, the FFN's input before its
    norm (FFN norm, FFN, post-norm; zeros without FFN): for ops that mix their streams between a block's
    two branches (hyper-connections). A branch call writes the cache as the whole block does: call each
    once per block."""

    def __init__(self, run: Callable[..., np.ndarray]):
        self._run = run

    def __call__(self, h: np.ndarray) -> np.ndarray:
        return self._run(h)

    def attention(self, h: np.ndarray) -> np.ndarray:
        return self._run(h, "attention")

    def ffn(self, g: np.ndarray) -> np.ndarray:
        return self._run(g, "ffn")


def per_span(op: Any, slots: list, starts: list[int], ends: np.ndarray) -> Callable:
    """attend(q, k, v, *side) (or a token mixer's attend(h)) over the rows of several sequences: each span
    runs in its own slot (op(q, k, v, slot, start, *side), side inputs after the start)."""

    def attend(*rows: np.ndarray) -> np.ndarray:
        bounds = zip([0, *ends[:-1]], ends, strict=True)
        return np.concatenate([op(*(r[a:b] for r in rows[:3]), slot, start, *(r[a:b] for r in rows[3:]))
                               for (a, b), slot, start in zip(bounds, slots, starts, strict=True)])

    return attend


def kv_types_of(op: Any, caps: OpCapabilities) -> tuple[str, ...]:
    """The kv types an op's slots can store: its `kv_types` when it declares them, else f32 only."""
    return tuple(op.kv_types) if caps.kv_types else ("f32",)


def check_kv_type(layers: Sequence[LayerPlan], kv_type: Any, declared: Callable[[Any], OpCapabilities]) -> None:
    """Raise KvTypeUnsupported unless every layer's op (and the mixer beside it) stores kv_type
    (declared: the binder's declaration of a bound op)."""
    kv_options(kv_type)
    for i, lp in enumerate(layers):
        for op, spec in ((lp.attention, lp.spec.attention), (lp.parallel, lp.spec.parallel)):
            if op is not None and kv_type not in (have := kv_types_of(op, declared(op))):
                raise KvTypeUnsupported(f"layer {i}'s op {spec.kind!r} ({type(op).__name__}) cannot store a "
                                        f"{kv_type} cache; it stores {', '.join(have)}")


def _new_slot(lp: LayerPlan, capacity: int, max_rewind: int, kv_type: str = "f32") -> Any:
    """A layer's cache slot, made by its op (with its parallel mixer's beside it: a PairSlot); the kv type
    is passed only when it is not f32 (ops that store f32 only need not take it)."""
    kw = {} if kv_type == "f32" else {"kv_type": kv_type}
    slot = lp.attention.new_slot(capacity, max_rewind, **kw)
    return slot if lp.parallel is None else PairSlot(slot, lp.parallel.new_slot(capacity, max_rewind, **kw))
