"""glm4moe multi-token prediction (MTP, "nextn"): a draft head for speculative decoding.

GLM-4.5 files carry `nextn_predict_layers` MTP blocks after the trunk (block index
n_layer + k). One MTP step (HF transformers MtpLayer / MtpModel):

    x      = eh_proj(concat(enorm(embed(tok)), hnorm(h_prev)))      [n, 2d] -> [n, d]
    x      = decoder block n_layer + k on x (own KV cache, rope position of tok)
    logits = shared_head_head(shared_head_norm(x))                  (fallbacks: output, output_norm)

embed is `nextn.embed_tokens` when the file has it, else `token_embd`. h_prev is the trunk's
final hidden state after output_norm (HostStep.hidden), as HF's MTP candidate generator uses it.

Row convention (the cache's invariant): MTP row j pairs the trunk's hidden[j] with token j+1
at rope position j+1 and predicts token j+2. After the trunk has seen T tokens, rows
0..T-2 are committed and hidden[T-1] is pending until token T is known; `draft` computes row
T-1 for a candidate token T. Only the model's bound ops are used here (norm, matrices, embed,
rope_angles, run_block): this module adds no arithmetic beyond concatenation (argmax picks
greedy tokens).

Speculative decoding (greedy) with one MTP head:

    head = MtpHead(model); cache = model.init_cache(n); mtp = head.init_cache(n)
    tok = argmax(model.host_step(prompt, cache, mtp).logits[-1])
    while ...:
        drafts = head.propose(mtp, tok, 1)
        accepted, logits = verify(model, cache, mtp, tok, drafts)
        tok = argmax(logits)            # the output is prompt + ... + [tok_prev, *accepted, tok]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from archrun.errors import (
    ContextOverflow,
    InvalidRequest,
    MissingTensor,
    ModelMismatch,
    ShapeMismatch,
    WrongBlockStyle,
)
from archrun.generation.speculative import MAX_DRAFT, Draft, Drafter, DraftSampler
from archrun.run.cache import KvCache

F32 = np.float32
_REQUIRED = ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm")


class MtpHead:
    """MTP block k of a glm4moe model, bound once with the model's own ops (fast ops on a fused
    model, their float32 references on a host_reference one).

    Raises WrongBlockStyle when the model has no entry returning the trunk's hidden states
    (`forward_step_hidden`), MissingTensor when the model has no MTP block k (e.g.
    nextn_predict_layers = 0) or a required nextn tensor is absent, ShapeMismatch when eh_proj
    is not {2*n_embd, n_embd}.
    """

    def __init__(self, model, k: int = 0):
        d = model.descriptor
        _check_model(model, k)
        self.model, self.k, self.index = model, k, d.n_layer + k
        i = self.index
        for role in _REQUIRED:
            if not model.has_tensor(role, i):
                raise MissingTensor(f"MTP block {i} has no {d.tensor_name(role, i)!r}")
        self.eh_proj = model.bind_matrix("nextn.eh_proj", i)            # [2d] -> [d]
        if (self.eh_proj.n_in, self.eh_proj.n_out) != (2 * d.n_embd, d.n_embd):
            raise ShapeMismatch(f"nextn.eh_proj of block {i} maps {self.eh_proj.n_in} -> "
                                f"{self.eh_proj.n_out}, expected {2 * d.n_embd} -> {d.n_embd}")
        self.enorm, self.hnorm = model.bind_vector("nextn.enorm", i), model.bind_vector("nextn.hnorm", i)
        # optional copies; None means the trunk's own (token_embd, output)
        self.embed_tokens = self._optional(model.bind_matrix, "nextn.embed_tokens")
        self.head_matrix = self._optional(model.bind_matrix, "nextn.shared_head_head")
        head_norm = self._optional(model.bind_vector, "nextn.shared_head_norm")
        self.head_norm = model.output_norm if head_norm is None else head_norm
        self.block = _bind_block(model, i, d.nextn_layers[k])

    def _optional(self, bind, role: str):
        return bind(role, self.index) if self.model.has_tensor(role, self.index) else None

    def init_cache(self, max_tokens: int | None = None, max_rewind: int = 64) -> MtpCache:
        """An MTP cache in step with a trunk cache of the same max_tokens (default: context length).

        max_rewind bounds `MtpCache.rewind` (the cache keeps that many past trunk hidden states).
        """
        n_ctx = self.model.descriptor.n_ctx
        max_tokens = n_ctx if max_tokens is None else max_tokens
        _check_count("max_tokens", max_tokens, 1)
        if max_tokens > n_ctx:
            raise ContextOverflow(f"max_tokens {max_tokens} exceeds the model's context length {n_ctx}")
        _check_count("max_rewind", max_rewind, 0)
        slot = self.block.attention.new_slot(max_tokens, max_rewind)
        return MtpCache(self, KvCache([slot], max_tokens), max_rewind)

    def draft(self, mtp_cache: MtpCache, token: int) -> np.ndarray:
        """float32 logits [vocab] for the token after `token`, which follows the trunk's last position.

        Computes MTP row T-1 (pending hidden + token at rope position T). The row is written to
        the MTP slot as scratch and not committed: the cache's length does not change, and the
        next `advance` recomputes the row from the token the trunk actually sees.
        """
        return self.propose_logits(mtp_cache, token, 1)[0]

    def propose(self, mtp_cache: MtpCache, token: int, n_draft: int = 1) -> list[int]:
        """Greedy chain of n_draft draft tokens following `token` (see `propose_logits`)."""
        return [int(np.argmax(row)) for row in self.propose_logits(mtp_cache, token, n_draft)]

    def propose_logits(self, mtp_cache: MtpCache, token: int, n_draft: int) -> np.ndarray:
        """Logits [n_draft, vocab] of a greedy MTP chain starting at `token`.

        Step 0 is `draft`. Step i > 0 feeds argmax of step i-1 as the token and the MTP block's
        own output after shared_head_norm as h_prev (HF MtpModel chains hidden states that way).
        Rows go to the MTP slot as scratch; the cache's length does not change.
        """
        _check_count("n_draft", n_draft, 1)
        self._check_token(token)
        if mtp_cache.pending is None:
            raise InvalidRequest("draft needs the trunk's hidden state: run host_step with this cache first")
        mtp_cache.kv.check_room(n_draft)
        start, h_prev, out = len(mtp_cache.kv), mtp_cache.pending[None], []
        for i in range(n_draft):
            h_prev = self._normed(self.rows(mtp_cache, [token], h_prev, start + i))
            out.append(self._logits(h_prev)[0])
            token = int(np.argmax(out[-1]))
        return np.stack(out)

    def rows(self, mtp_cache: MtpCache, tokens: Sequence[int] | np.ndarray, h_prev: np.ndarray,
             start: int) -> np.ndarray:
        """MTP rows start..start+n-1 of tokens [n], h_prev [n, d] -> block output [n, d] (pre head norm).

        K/V go to the MTP slot at those rows; attention sees rows 0..start+n-1. The caller
        decides whether the rows count (MtpCache.advance commits them, drafts do not).
        """
        m, norm = self.model, self.model.norm
        ids = np.asarray(tokens, dtype=np.int64)
        e = self.embed_tokens.rows(ids) if self.embed_tokens is not None else m.embed(ids)   # [n, d]
        x = self.eh_proj(np.concatenate([norm(e, self.enorm), norm(h_prev, self.hnorm)], axis=-1))
        angles = m.rope_angles(np.arange(start + 1, start + 1 + len(ids)))  # row j sits at position j+1
        return m.run_block(self.block, x, mtp_cache.kv.slots[0], start, angles)

    def _normed(self, x: np.ndarray) -> np.ndarray:
        return self.model.norm(x, self.head_norm)

    def _logits(self, hidden: np.ndarray) -> np.ndarray:
        # hidden is already normed by shared_head_norm (or output_norm)
        return self.head_matrix(hidden) if self.head_matrix is not None else self.model.head(hidden)

    def _check_token(self, token: int) -> None:
        n_vocab = self.model.descriptor.n_vocab
        if not isinstance(token, int | np.integer) or isinstance(token, bool) or not 0 <= token < n_vocab:
            raise InvalidRequest(f"token must be an integer id in [0, {n_vocab}), got {token!r}")


class MtpCache:
    """The MTP block's KV cache plus the trunk hidden states it still needs.

    Pass it as host_step's mtp_cache: `advance(ids, hidden)` then commits the MTP rows the new
    tokens complete. len() is the number of trunk tokens seen; the MTP KV cache (`kv`) holds
    len() - 1 rows, hidden[len() - 1] stays pending (see the module docstring).
    """

    def __init__(self, head: MtpHead, kv: KvCache, max_rewind: int):
        self.head, self.kv, self.max_rewind = head, kv, max_rewind
        # trunk hidden states of the last max_rewind + 1 positions, row = position % size
        self._hist = np.zeros((max_rewind + 1, head.model.descriptor.n_embd), F32)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def pending(self) -> np.ndarray | None:
        """The trunk's hidden state [d] at the last position (None before the first step)."""
        return self._hist[(self._n - 1) % len(self._hist)] if self._n else None

    def advance(self, ids: Sequence[int] | np.ndarray, hidden: np.ndarray) -> None:
        """The trunk just appended ids [n] with final hidden states hidden [n, d]: commit their MTP rows.

        Rows T-1..T+n-2 pair [pending, hidden[:-1]] with ids (at T = 0 there is no pending
        state and the first token only starts the chain).
        """
        ids = np.asarray(ids, dtype=np.int64)
        if hidden.ndim != 2 or hidden.shape != (len(ids), self._hist.shape[1]):
            raise ShapeMismatch(f"MTP advance needs hidden [{len(ids)}, {self._hist.shape[1]}], "
                                f"got {hidden.shape}")
        prev, toks = hidden[:-1], ids
        if self._n:
            prev = np.concatenate([self.pending[None], prev])
        else:
            toks = ids[1:]
        if len(toks):
            self.kv.check_room(len(toks))
            self.head.rows(self, toks, prev, len(self.kv))
            self.kv.advance(len(toks))
        self._remember(hidden)

    def _remember(self, hidden: np.ndarray) -> None:
        size = len(self._hist)
        keep = hidden[-size:]
        first = self._n + len(hidden) - len(keep)
        self._hist[np.arange(first, first + len(keep)) % size] = keep
        self._n += len(hidden)

    def rewind(self, n: int) -> None:
        """Forget the last n trunk tokens (rewind the trunk cache by the same n)."""
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self._n:
            raise InvalidRequest(f"cannot rewind {n!r} tokens from an MTP cache holding {self._n}")
        if n > self.max_rewind:
            raise InvalidRequest(f"cannot rewind {n} tokens: this MTP cache keeps {self.max_rewind} "
                                 "hidden states of history (init_cache(max_rewind=...))")
        self._n -= n
        self.kv.rewind(len(self.kv) - max(self._n - 1, 0))

    def clear(self) -> None:
        """Forget everything."""
        self._n = 0
        self.kv.clear()


def verify(model, cache: KvCache, mtp_cache: MtpCache | None, last_token: int,
           drafts: Sequence[int]) -> tuple[list[int], np.ndarray]:
    """Greedy speculative verification: returns (accepted drafts, logits [vocab] after the last of them).

    The trunk has seen every token before `last_token` (not yet fed); `drafts` guess the
    tokens after it. One host_step runs [last_token, *drafts]; draft i is accepted while it
    equals the trunk's argmax at the position before it. The rejected tail is rewound from
    `cache` and `mtp_cache`, so both end after the last accepted token, and the returned
    logits predict the token after it (the "bonus" token of a round).
    """
    drafts = [int(t) for t in drafts]
    step = model.host_step([int(last_token), *drafts], cache, mtp_cache)
    predicted = np.argmax(step.logits[:-1], axis=-1)  # [len(drafts)]: trunk's choice for each draft slot
    n_ok = 0
    while n_ok < len(drafts) and predicted[n_ok] == drafts[n_ok]:
        n_ok += 1
    rejected = len(drafts) - n_ok
    if rejected:
        cache.rewind(rejected)
        if mtp_cache is not None:
            mtp_cache.rewind(rejected)
    return drafts[:n_ok], step.logits[n_ok]


# -- checks -------------------------------------------------------------------------------------


def _check_model(model, k: int) -> None:
    d = model.descriptor
    if not callable(getattr(model, "forward_step_hidden", None)):
        raise WrongBlockStyle(f"MTP heads need the trunk's hidden states (forward_step_hidden); this model's block "
                              f"style {d.block_style!r} has no such entry")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise InvalidRequest(f"MTP block index k must be a non-negative integer, got {k!r}")
    if k >= d.n_nextn:
        raise MissingTensor(f"{d.architecture} model has {d.n_nextn} MTP (nextn) blocks; "
                            f"block {k} does not exist (nextn_predict_layers = {d.n_nextn})")


def _bind_block(model, i: int, spec):
    try:
        return model.bind_block(i, spec)
    except KeyError as e:  # a block tensor the spec needs is absent
        raise MissingTensor(f"MTP block {i} is incomplete: {e}") from None


def _check_count(what: str, value: int, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidRequest(f"{what} must be an integer >= {low}, got {value!r}")


# -- speculative decoding: the MTP head as a drafter ------------------------------------------


class MtpDrafter(Drafter):
    """Self-speculation: MTP block k drafts greedy chains; the trunk verifies them.

    Every trunk step goes through `forward_step_hidden` and then `MtpCache.advance` (the head
    reads the trunk's hidden states), so the MTP cache follows the trunk's cache, rewinds
    included. Works on either block style: on a fused model the head runs the model's fast ops.
    Drafts are argmax chains (deterministic), which the rejection rule accepts for any sampling.
    """

    name = "mtp"
    follows_trunk = True

    def __init__(self, model, k: int = 0):
        self.head = MtpHead(model, k)
        self.mtp: MtpCache | None = None

    def start(self, model, capacity: int) -> None:
        mine, theirs = getattr(self.head.model, "cache_owner", None), getattr(model, "cache_owner", None)
        if model is not self.head.model and (mine is None or theirs is None or mine != theirs):
            raise ModelMismatch(f"this MTP drafter reads the trunk of {mine.describe() if mine else 'another model'}, "
                                f"not of {theirs.describe() if theirs else type(model).__name__}: make one for "
                                "this model (make_drafter(model, 'mtp'))")
        if self.mtp is None or self.mtp.kv.capacity < capacity:
            self.mtp = self.head.init_cache(capacity, max_rewind=max(64, 2 * MAX_DRAFT + 2))
        self.mtp.clear()

    def step(self, model, cache, ids: np.ndarray, all_logits: bool) -> np.ndarray:
        step = model.forward_step_hidden(ids, cache)           # logits [n, vocab], hidden [n, d]
        self.mtp.advance(ids, step.hidden)
        return step.logits if all_logits else step.logits[-1:]

    def propose(self, history: Sequence[int], k: int, sampler: DraftSampler) -> Draft:
        k = min(k, self.mtp.kv.capacity - len(self.mtp.kv))
        if k < 1 or self.mtp.pending is None:
            return Draft()
        return Draft(tuple(self.head.propose(self.mtp, int(history[-1]), k)))

    def rewind(self, n: int) -> None:
        self.mtp.rewind(n)

    def reset(self) -> None:
        if self.mtp is not None:
            self.mtp.clear()


def mtp_drafter(model, arg: str | None) -> MtpDrafter:
    """Drafter factory for "mtp" / "mtp:K" (K: which MTP block, default 0)."""
    if arg is not None and not arg.isdigit():
        raise InvalidRequest(f"mtp takes an MTP block index (mtp:0), got {arg!r}")
    return MtpDrafter(model, int(arg or 0))
