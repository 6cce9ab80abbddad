"""Continuous batching: one inference thread owns the model and steps every running sequence.

Requests wait in a bounded queue (QueueFull beyond it) and join the running batch at a token
boundary, in a slot whose cached ids share the longest prefix with their prompt (that KV is
reused, see archrun.run.cache.PrefixCache). A prompt is computed in chunks alongside the other
sequences' next tokens, so running streams keep flowing: `prefill_chunk` tokens per step, or,
automatically (None), up to AUTO_MAX_CHUNK tokens when no sequence is decoding and otherwise as
many as fit in the time of the decode-only step (StepCosts, measured as the engine runs).
Each step is one call of the model's batch entry (`forward_step_batch`, where `caps.batch`
says it exists; else one forward_step per sequence). A cancelled request leaves at the next
boundary and its slot is free at once. With a drafter (archrun.generation.speculative), each decoding
sequence appends [last token, *drafts] instead of one token; the step's logits of every
position verify the drafts, and the rejected ones are rewound from that sequence's cache.

Several choices of one prompt (`submit_group`, a request's `n`) share its computation: the
first computes the prompt; the others wait until it has, then start in a slot holding a copy
of its cache (archrun.run.cache.KvCache.copy_from), recompute only the prompt's last token, and
decode in the batch beside it.

Results go back through a sink: a callable the engine thread calls with each Event (the
server's sink hands them to its event loop). After each round of events (a step's, an admission's)
the engine calls `flushed()` when given: a server's sinks may hold a step's events and wake their
event loop once per step, not once per stream.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from archrun.errors import ArchrunError, InvalidRequest
from archrun.generation.generate import Decoding, GenerationRequest, GenerationResult, TokenLogprob
from archrun.run.cache import PrefixCache, common_prefix, kv_options
from archrun.serve.memory import KvCacheTooLarge, MemoryBudget, MemoryBudgetExceeded
from archrun.serve.metrics import Metrics

AUTO_MAX_CHUNK = 512  # prompt tokens of a step when no sequence is decoding (one prefill, bounded memory)
AUTO_MIN_CHUNK = 8    # prompt tokens of a step while others decode: a prompt always moves on
AUTO_FIRST_CHUNK = 16  # ... before the step costs are known
STALL = 1.0           # a step with prompt tokens may take this much longer than the decode-only step
WARM_MAX = 64         # most sequences of the throwaway step that loads the batched kernels at start


class StepCosts:
    """What a step costs, learnt from the steps the engine runs: seconds per decoding sequence (steps
    without prompt tokens) and per prompt token (the rest of a mixed step), as moving averages."""

    def __init__(self, weight: float = 0.2):
        self.row_s: float | None = None
        self.token_s: float | None = None
        self._w = weight

    def _avg(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self._w) * old + self._w * new

    def record(self, seconds: float, decoding: int, prompt_tokens: int) -> None:
        """One step's wall time, its decoding sequences and its prompt tokens."""
        if prompt_tokens == 0:
            if decoding:
                self.row_s = self._avg(self.row_s, seconds / decoding)
        elif self.row_s is not None or decoding == 0:
            rest = seconds - decoding * (self.row_s or 0.0)
            if rest > 0:
                self.token_s = self._avg(self.token_s, rest / prompt_tokens)

    def chunk(self, decoding: int) -> int:
        """Prompt tokens of a step beside `decoding` sequences: those that cost about STALL times the
        decode-only step (within [AUTO_MIN_CHUNK, AUTO_MAX_CHUNK]); the whole bound when none decode."""
        if decoding == 0:
            return AUTO_MAX_CHUNK
        if self.row_s is None or not self.token_s:
            return AUTO_FIRST_CHUNK
        fit = int(STALL * decoding * self.row_s / self.token_s)
        return max(AUTO_MIN_CHUNK, min(AUTO_MAX_CHUNK, fit))


class QueueFull(ArchrunError):
    """Every slot is busy and the queue of waiting requests is at its bound."""


class EngineDown(ArchrunError):
    """The inference thread has stopped: nothing submitted would ever run (HTTP 503)."""


@attrs.frozen
class Event:
    """What a request's sink receives: text (with its tokens' logprobs), then a result or an error."""

    piece: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()
    result: GenerationResult | None = None
    error: BaseException | None = None


class Ticket:
    """A submitted request: `cancel()` drops it (waiting or running) at the next token boundary."""

    def __init__(self, engine: Engine, request: GenerationRequest, sink: Callable[[Event], None],
                 reuse_prefix: bool = True, leader: Ticket | None = None, steer: Any = None):
        self.engine, self.request, self.sink, self.reuse_prefix = engine, request, sink, reuse_prefix
        # forces tokens: steer.forced(text so far, tokens so far) -> ids to take next instead of sampling
        # (archrun.text.reasoning.ReasoningBudget), or None
        self.steer = steer
        self.cancelled = False
        self.leader = leader          # the choice of the same prompt whose computed prompt this one copies
        self.state = "waiting"        # waiting -> prefilling -> decoding -> done (inference thread)
        self.slot: _Slot | None = None

    def cancel(self) -> None:
        """Stop generating for this request and free its slot."""
        self.cancelled = True
        self.engine.wake()


class _Slot:
    """One sequence's place in the batch: its cache (made on first use) and who runs in it."""

    def __init__(self) -> None:
        self.cache: PrefixCache | None = None
        self.last_used = 0.0
        self.capacity = 0   # tokens its cache holds
        self.reserved = 0   # bytes reserved in the engine's memory budgets for its cache


class _Running:
    """A request in the batch: its slot, the prompt ids still to compute, its Decoding."""

    def __init__(self, ticket: Ticket, slot: _Slot, feed: list[int], decoding: Decoding, spec: Any = None):
        self.ticket, self.slot, self.feed, self.decoding = ticket, slot, feed, decoding
        self.spec = spec              # an archrun.generation.speculative.Speculation, or None
        self.cached = len(ticket.request.ids) - len(feed)
        self.t_start = time.perf_counter()
        self.t_first: float | None = None
        self.n_logprobs = 0           # logprob entries already sent
        self.forced: list[int] = []   # ids the ticket's steer forces next

    def next_ids(self, prefill_room: int) -> list[int]:
        """Ids to append this step: a chunk of the prompt, or the token just sampled (and drafts)."""
        if self.feed:
            return self.feed[:prefill_room]
        return self.spec.next_ids(self.slot.cache) if self.spec is not None else self.decoding.next_ids


class Engine:
    """The inference thread and its batch (see the module docstring)."""

    def __init__(self, model: Any, *, parallel: int, ctx: int, queue: int, prefill_chunk: int | None = None,
                 metrics: Metrics | None = None, drafter: Any = None, draft_max: int = 5, kv_type: str = "f32",
                 flushed: Callable[[], None] | None = None, kv_budgets: tuple[MemoryBudget, ...] = (),
                 kv_limit: int | None = None):
        self.model, self.ctx, self.queue_bound = model, ctx, queue
        self.parallel, self._flushed = parallel, flushed
        self.kv = kv_options(kv_type)  # init_cache's kv type keyword
        if self.kv:  # every layer's op must store it: refused now, not at the first request
            model.init_cache(2, **self.kv)
        self.prefill_chunk = prefill_chunk  # prompt tokens per step; None: automatic (StepCosts)
        self.costs = StepCosts()
        self.drafter, self.draft_max = drafter, draft_max   # an archrun.generation.speculative.Drafter, or None
        if drafter is not None and drafter.follows_trunk:
            raise InvalidRequest(f"drafter {drafter.name!r} must see every target step itself; the server's "
                                 "batched steps cannot host it (use it with archrun run)")
        self.metrics = metrics or Metrics()
        # budgets each slot's KV cache is reserved from before it is made; kv_limit: the most KV bytes this
        # engine could ever hold (a request needing more is refused at once)
        self.kv_budgets, self.kv_limit = tuple(kv_budgets), kv_limit
        self._kv_reserved = 0
        self.slot_bytes, self.token_bytes = self._kv_sizes() if self.kv_budgets or kv_limit is not None else (0, 0)
        self._free = [_Slot() for _ in range(parallel)]
        self._waiting: deque[Ticket] = deque()
        self._running: list[_Running] = []       # touched only by the inference thread
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run_loop, name="archrun-inference", daemon=True)
        self._busy_since: float | None = None    # when the step running now began (monotonic), None between
        self._died: BaseException | None = None  # what ended the inference thread unexpectedly
        # called at the start of every step on the inference thread: a test's way to stall the engine
        self.before_step: Callable[[], None] | None = None

    # -- any thread ----------------------------------------------------------------------------

    def start(self) -> None:
        """Load the batched step's kernels (warm_up), then start the inference thread."""
        self.warm_up()
        self._thread.start()

    def warm_up(self) -> None:
        """A throwaway step of `parallel` one-token sequences (with a drafter: verification spans) on fresh
        caches, so the multi-row kernels are loaded (or compiled) and the decode workers' buffers sized
        for the full batch now, not inside the first batched request (archrun.load warms one sequence)."""
        n = min(self.parallel, WARM_MAX)
        if not self.model.caps.batch or n < 2 or getattr(self.model, "backend", "fast") == "reference":
            return  # nothing to load (a tiered start's reference tier has no kernels)
        span = min(self.ctx, 1 + self.draft_max if self.drafter is not None else 1)
        caches = [self.model.init_cache(min(self.ctx, span + 1), **self.kv) for _ in range(n)]
        try:
            self._forward([[0] * span for _ in range(n)], caches)
        except ArchrunError:  # only a head start: a real step reports the problem to its requests
            return

    def _kv_sizes(self) -> tuple[int, int]:
        """(bytes of a slot's cache of ctx tokens, bytes it adds per token), measured on empty caches (their
        memory is not touched: nothing is committed)."""
        full = self.model.init_cache(self.ctx, **self.kv).nbytes
        half = self.model.init_cache(max(1, self.ctx // 2), **self.kv).nbytes
        per_token = max(0, (full - half) // max(1, self.ctx - max(1, self.ctx // 2)))
        return full, per_token

    def kv_need(self, request: GenerationRequest) -> int:
        """The KV bytes `request` fills: its prompt and its token budget, at most the context."""
        return self.kv_bytes(min(self.ctx, len(request.ids) + request.budget))

    def release_memory(self) -> None:
        """Give back the budgets' reservations of this engine's caches (after stop())."""
        for budget in self.kv_budgets:
            budget.free(self._kv_reserved)
        self._kv_reserved = 0

    def kv_bytes(self, tokens: int) -> int:
        """Bytes of a slot cache holding `tokens` tokens."""
        return self.slot_bytes - self.token_bytes * (self.ctx - tokens)

    def _reserve(self, n: int) -> bool:
        """Reserve n bytes in every budget (all or none)."""
        done = []
        for budget in self.kv_budgets:
            if not budget.try_reserve(n):
                for b in done:
                    b.free(n)
                return False
            done.append(budget)
        self._kv_reserved += n
        return True

    def _unreserve(self, n: int) -> None:
        for budget in self.kv_budgets:
            budget.free(n)
        self._kv_reserved -= n

    def _slot_for(self, request: GenerationRequest) -> _Slot | None:
        """A free slot whose cache can hold `request`, its cache made now if need be: the one sharing most of
        its prompt (LRU on ties). Within memory budgets, a cache is made only when its bytes can be reserved:
        one of the full context, else one just big enough for this request (a too small idle cache gives way);
        None when none can be now but running sequences will free memory; MemoryBudgetExceeded when none will."""
        def rank(s: _Slot) -> tuple[int, float]:
            return self._shared(s, request.ids), -s.last_used

        if not self.kv_budgets:
            slot = max(self._free, key=rank)
            if slot.cache is None:
                slot.cache, slot.capacity = PrefixCache(self.model.init_cache(self.ctx, **self.kv)), self.ctx
            return slot
        tokens = min(self.ctx, len(request.ids) + request.budget)
        ready = [s for s in self._free if s.cache is not None and s.capacity >= tokens]
        if ready:
            return max(ready, key=rank)
        empty = [s for s in self._free if s.cache is None]
        slot = empty[0] if empty else min(self._free, key=lambda s: s.last_used)
        if slot.cache is not None:  # too small for this request: its memory goes to the new cache
            slot.cache = None
            self._unreserve(slot.reserved)
            slot.reserved = slot.capacity = 0
        for capacity in (self.ctx, tokens):
            if self._reserve(self.kv_bytes(capacity)):
                slot.cache = PrefixCache(self.model.init_cache(capacity, **self.kv))
                slot.capacity, slot.reserved = capacity, self.kv_bytes(capacity)
                return slot
        if self._running:
            return None
        raise MemoryBudgetExceeded(f"this request's KV cache ({self.kv_bytes(tokens)} bytes for {tokens} tokens) "
                                   "does not fit now: " + "; ".join(b.describe() for b in self.kv_budgets))

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the current step, fail what is left, and end the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout)

    def wake(self) -> None:
        """Make the inference thread look at its queue and cancellations now."""
        with self._cond:
            self._cond.notify()

    def submit(self, request: GenerationRequest, sink: Callable[[Event], None], reuse_prefix: bool = True) -> Ticket:
        """Queue a request; raises QueueFull when `queue` requests already wait for a slot.

        reuse_prefix False computes the whole prompt (its numbers then never depend on what was
        cached before: chunked and whole prefills round differently).
        """
        return self.submit_group([request], [sink], reuse_prefix)[0]

    def submit_group(self, requests: list[GenerationRequest], sinks: list[Callable[[Event], None]],
                     reuse_prefix: bool = True, steers: list[Any] | None = None) -> list[Ticket]:
        """Queue choices of one prompt (equal ids) together: the first computes the prompt, the others
        copy its cache (see the module docstring). Raises QueueFull unless all of them fit. `steers`: one
        per request (Ticket.steer), or None."""
        tickets: list[Ticket] = []
        for request, sink, steer in zip(requests, sinks, steers or [None] * len(requests), strict=True):
            tickets.append(Ticket(self, request, sink, reuse_prefix, tickets[0] if tickets else None, steer))
        with self._cond:
            if self._stop:
                raise QueueFull("the server is shutting down")
            if self._died is not None:
                raise EngineDown(self.stalled(0.0) or "the inference thread has stopped")
            ceiling = self.kv_limit
            if ceiling is not None and (need := max(self.kv_need(r) for r in requests)) > ceiling:
                raise KvCacheTooLarge(f"this request's KV cache needs {need} bytes (prompt and max_tokens, "
                                      f"{self.token_bytes} bytes a token); at most {ceiling} can ever be held here")
            over = len(self._waiting) + len(tickets) - len(self._free) > self.queue_bound if len(tickets) > 1 \
                else len(self._waiting) >= self.queue_bound and not self._free_now()
            if over:
                raise QueueFull(f"all {len(self._free) + len(self._running)} slots are busy and "
                                f"{len(self._waiting)} requests are waiting")
            self._waiting.extend(tickets)
            self.metrics.queue_depth = len(self._waiting)
            self._cond.notify()
        return tickets

    def _free_now(self) -> int:
        return max(0, len(self._free) - len(self._waiting))

    @property
    def running(self) -> int:
        """Sequences in the batch."""
        return len(self._running)

    def stalled(self, limit: float) -> str | None:
        """Why the engine is not serving, or None while it is: the inference thread ended (not by stop()),
        or its current step has run longer than `limit` seconds (the watchdog's bound)."""
        if self._thread.ident is None:
            return None  # not started yet (a model loading on first use)
        if not self._thread.is_alive() and not self._stop:
            why = f": {type(self._died).__name__}: {self._died}" if self._died is not None else ""
            return f"the inference thread has stopped{why}"[:300]
        since = self._busy_since
        if since is not None and (busy := time.monotonic() - since) > limit:
            return (f"the inference step has run for {busy:.1f} s, beyond the watchdog's {limit:g} s "
                    f"({len(self._running)} sequences in it, {len(self._waiting)} waiting)")
        return None

    # -- the inference thread ---------------------------------------------------------------------

    def _run_loop(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the health check reports it; requests waiting fail now
            self._died = exc
            self._fail_all(EngineDown(f"the inference thread stopped ({type(exc).__name__})"))
            self._flush()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop:
                    self._drop_cancelled()
                    self._admit()
                    if self._running:
                        break
                    self._flush()  # e.g. a refused request's error, before sleeping
                    self._cond.wait()
                if self._stop:
                    break
            self._flush()  # events of the admission (a refused grammar)
            self._busy_since = time.monotonic()
            try:
                if self.before_step is not None:
                    self.before_step()
                self._step()
            except Exception as exc:  # never leave the thread (and every slot) hanging
                for run in list(self._running):
                    run.slot.cache.reset()
                    self._end(run, Event(error=exc))
            finally:
                self._busy_since = None
            self._flush()
        self._fail_all(QueueFull("the server is shutting down"))
        self._flush()

    def _flush(self) -> None:
        if self._flushed is not None:
            self._flushed()

    def _drop_cancelled(self) -> None:
        self._waiting = deque(t for t in self._waiting if not t.cancelled)
        for run in [r for r in self._running if r.ticket.cancelled]:
            self._release(run)
        self.metrics.queue_depth = len(self._waiting)

    def _admit(self) -> None:
        """Move waiting requests into free slots, each into the one sharing most of its prompt (a choice
        whose leader still computes the prompt waits for it)."""
        held: list[Ticket] = []
        while self._waiting and self._free:
            ticket = self._waiting.popleft()
            source = self._source(ticket)
            if source is False:
                held.append(ticket)
                continue
            try:
                slot = self._slot_for(ticket.request)
            except MemoryBudgetExceeded as exc:  # nothing running will give memory back: answered now
                ticket.sink(Event(error=exc))
                continue
            if slot is None:  # memory comes back when a running sequence ends: wait for it
                held.append(ticket)
                break
            self._free.remove(slot)
            if not (ticket.reuse_prefix and self.model.caps.rewind):
                slot.cache.reset()
            elif source is not None and self._shared(slot, ticket.request.ids) < len(ticket.request.ids) - 1:
                slot.cache.copy_from(source.cache)  # False (a cache that cannot be copied): computed again
            try:
                decoding = Decoding(self.model.tokenizer, ticket.request, self.model.descriptor.n_vocab)
            except ArchrunError as exc:  # e.g. a grammar llguidance refuses: this request fails, not the thread
                self._free.append(slot)
                ticket.sink(Event(error=exc))
                continue
            feed = slot.cache.prepare(ticket.request.ids)
            spec = None
            if self.drafter is not None and ticket.request.grammar is None and ticket.steer is None and \
                    slot.capacity == self.ctx:
                # constrained or steered: one token a step
                from archrun.generation.speculative import Speculation

                spec = Speculation(self.model, self.drafter, decoding, self.draft_max, self.ctx)
            ticket.slot, ticket.state = slot, "prefilling"
            self._running.append(_Running(ticket, slot, feed, decoding, spec))
        self._waiting.extendleft(reversed(held))
        self.metrics.queue_depth = len(self._waiting)

    def _source(self, ticket: Ticket) -> _Slot | None | bool:
        """The slot whose cache holds the prompt of `ticket`'s leader; False while the leader computes it;
        None when there is nothing to copy (no leader, the leader failed or its slot moved on)."""
        lead = ticket.leader
        if lead is None or not (ticket.reuse_prefix and self.model.caps.rewind):
            return None
        if lead.state in ("waiting", "prefilling") and not lead.cancelled:
            return False
        slot = lead.slot
        if slot is None or slot.cache is None or self._shared(slot, ticket.request.ids) < len(ticket.request.ids) - 1:
            return None
        return slot

    @staticmethod
    def _shared(slot: _Slot, ids: tuple[int, ...]) -> int:
        return common_prefix(slot.cache.ids, ids) if slot.cache is not None else 0

    def _release(self, run: _Running) -> None:
        with self._cond:
            self._running.remove(run)
            run.slot.last_used = time.monotonic()
            self._free.append(run.slot)

    def _room(self) -> int:
        """Prompt tokens this step may compute (the fixed chunk, or the automatic one)."""
        if self.prefill_chunk is not None:
            return self.prefill_chunk
        return self.costs.chunk(sum(1 for run in self._running if not run.feed))

    def _plan(self) -> list[tuple[_Running, list[int]]]:
        """This step's (sequence, ids): every decoding sequence, plus prompt chunks within budget."""
        room, batch = self._room(), []
        for run in self._running:
            if run.feed and room <= 0:
                continue
            ids = run.next_ids(room)
            if run.feed:
                room -= len(ids)
            batch.append((run, ids))
        return batch

    def _step(self) -> None:
        batch = self._plan()
        decoding = sum(1 for run, _ in batch if not run.feed)
        t0 = time.perf_counter()
        try:
            logits = self._forward([ids for _, ids in batch], [run.slot.cache.cache for run, _ in batch])
        except Exception as exc:  # a failed step fails its sequences; the engine goes on
            for run, _ in batch:
                run.slot.cache.reset()
                self._end(run, Event(error=exc))
            return
        if len(batch) > 1 and self.model.caps.workers:
            # sampling and streaming several sequences' tokens takes longer than the decode workers' spin
            # between steps: their core goes to the server's event loop meanwhile (the next step wakes them)
            self.model.rest_workers()
        generated = prefilled = 0
        for (run, ids), lg in zip(batch, logits, strict=True):
            run.slot.cache.fed(ids)
            verifying = run.spec is not None and not run.feed   # lg: [len(ids), vocab] to settle
            if run.feed:
                run.feed = run.feed[len(ids):]
                prefilled += len(ids)
                if run.feed:
                    continue
                run.ticket.state = "decoding"
            try:
                generated += self._accept(run, lg if verifying or self.drafter is None else lg[-1])
            except Exception as exc:  # e.g. logits the sampler refuses: this sequence ends, not the engine
                if run.spec is not None:
                    run.slot.cache.reset()  # it may still hold drafts
                self._end(run, Event(error=exc))
        self.costs.record(time.perf_counter() - t0, decoding, prefilled)
        self.metrics.step(len(batch), prefilled, generated)

    def _forward(self, ids: list[list[int]], caches: list[Any]) -> list[np.ndarray]:
        arrays = [np.asarray(x, dtype=np.int64) for x in ids]
        if self.drafter is not None:  # every position's logits: drafts are verified
            if self.model.caps.batch:
                return self.model.forward_step_batch_spans(arrays, caches, all_logits=True)
            return [self.model.forward_step(a, c, all_logits=True) for a, c in zip(arrays, caches, strict=True)]
        if self.model.caps.batch:  # looked up each step: a tiered model switches to its fast tier between steps
            return self.model.forward_step_batch(arrays, caches)
        return [self.model.forward_step(a, c) for a, c in zip(arrays, caches, strict=True)]

    def _accept(self, run: _Running, logits: np.ndarray) -> int:
        """Sample the sequence's next token and send what it adds; returns tokens generated (0/1)."""
        if run.ticket.cancelled:
            return 0
        dec = run.decoding
        before = len(dec.out_ids)
        if run.t_first is None:
            run.t_first = time.perf_counter()
        if run.spec is not None and logits.ndim == 2:
            piece = run.spec.settle(logits)
            run.spec.rewind(run.slot.cache)
        else:
            if not run.forced and run.ticket.steer is not None:
                run.forced = list(run.ticket.steer.forced(dec.text, len(dec.out_ids)))
            piece = dec.push(run.forced.pop(0), logits) if run.forced else dec.accept(logits)
        new = tuple(dec.logprobs[run.n_logprobs:]) if dec.logprobs is not None else ()
        run.n_logprobs += len(new)
        if piece or new:
            run.ticket.sink(Event(piece=piece, logprobs=new))
        if dec.done:
            now = time.perf_counter()
            result = dec.result(run.t_first - run.t_start, now - run.t_first, cached_tokens=run.cached)
            if run.spec is not None:
                result = attrs.evolve(result, timings={**result.timings, **run.spec.stats.timings()})
            self.metrics.finished(result.prompt_tokens)
            self._end(run, Event(result=result))
        return len(dec.out_ids) - before

    def _end(self, run: _Running, event: Event) -> None:
        run.ticket.state = "done"
        if run in self._running:
            self._release(run)
        run.ticket.sink(event)

    def _fail_all(self, exc: BaseException) -> None:
        with self._cond:
            for ticket in self._waiting:
                ticket.sink(Event(error=exc))
            self._waiting.clear()
        for run in list(self._running):
            self._end(run, Event(error=exc))
