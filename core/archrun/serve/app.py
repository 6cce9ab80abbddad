"""The HTTP layer: OpenAI- and Anthropic-compatible routes on Starlette, in front of the batching Engine.

Every route checks the API key (except /health and the chat page at /), reads at most `max_body`
bytes (413 beyond, before parsing) and answers errors in its API's shape: OpenAI's {"error":
{"message", "type", "code"}}, Anthropic's {"type": "error", "error": {"type", "message"}} on
/v1/messages. Chat completions, Messages and Responses share one path: a body in chat-completions
form, a tool plan, a request for the engine; the reply's text is split into reasoning, text and
tool calls (archrun.serve.reply) and each API shapes those parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

import attrs
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from archrun.errors import ArchrunError, NotGenerative
from archrun.generation.fingerprint import system_fingerprint
from archrun.generation.generate import GenerationRequest, GenerationResult, make_request
from archrun.generation.grammar import vocabulary
from archrun.generation.tools import ToolPlan, plan_tool_chat
from archrun.serve import anthropic, protocol, responses
from archrun.serve.config import ServeConfig
from archrun.serve.embeddings import Embedder
from archrun.serve.engine import Engine, EngineDown, Event, QueueFull, Ticket
from archrun.serve.memory import MemoryBudget, weights_bytes
from archrun.serve.metrics import Metrics
from archrun.serve.reply import PROMPT_TAIL, Blocks, Part, ReplyParts, reasoning_stream, split_reply, stop_sequence
from archrun.text.reasoning import ReasoningBudget, effort_budget, reasoning_format, says_effort

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there
GENERATING_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")
OPEN_PATHS = ("/", "/health")  # answered without the API key (the page asks for it and sends it itself)
PAGE_POLICY = "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'none'"


@functools.cache
def _chat_page() -> str:
    return resources.files("archrun.serve").joinpath("static/index.html").read_text(encoding="utf-8")


class ApiError(Exception):
    """An HTTP error answered in OpenAI's error shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind

    def response(self) -> JSONResponse:
        """The error in OpenAI's shape."""
        return JSONResponse({"error": {"message": str(self), "type": self.kind, "param": None, "code": self.status}},
                            status_code=self.status)


def _api_error(exc: BaseException) -> ApiError:
    """The HTTP error for an exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, QueueFull):
        return ApiError(429, str(exc), "rate_limit_error")
    if isinstance(exc, EngineDown):
        return ApiError(503, str(exc), "server_error")
    if isinstance(exc, ArchrunError):  # 400 unless the error names its status (archrun.serve.memory, models)
        return ApiError(getattr(exc, "http_status", 400), str(exc), getattr(exc, "http_kind", "invalid_request_error"))
    return ApiError(500, f"internal error ({type(exc).__name__})", "server_error")


def _drafter(model: Any, spec: str | None) -> Any:
    """The drafter of `archrun serve --speculative SPEC`, or None."""
    if spec is None:
        return None
    from archrun.generation import speculative

    speculative.check_target(model)
    return speculative.make_drafter(model, spec)


class _Mailbox:
    """Events from the inference thread to the event loop's request queues. Sinks only post; the engine's
    `flushed()` after each step wakes the loop once to deliver them all (a step's events for every stream
    together: one wake-up of the loop, one hand-over of the interpreter lock, instead of one per stream)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._posted: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue, Event]] = []

    def post(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, event: Event) -> None:
        """Hold `event` for `queue` (inference thread)."""
        with self._lock:
            self._posted.append((loop, queue, event))

    def flush(self) -> None:
        """Deliver what was posted: one call into each event loop that has events (inference thread)."""
        with self._lock:
            posted, self._posted = self._posted, []
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for loop, queue, event in posted:
            by_loop.setdefault(loop, []).append((queue, event))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[tuple[asyncio.Queue, Event]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)


class Server:
    """The routes' shared state: model, engine, options, metrics."""

    def __init__(self, model: Any, config: ServeConfig, model_id: str, metrics: Metrics | None = None,
                 memory: MemoryBudget | None = None):
        """memory: the budget (--max-memory) this model's weights are already reserved in and its KV caches
        are reserved from (None: a budget of config.max_memory of its own, when set)."""
        self.model, self.config, self.model_id = model, config, model_id
        self.ctx = config.context_for(model.descriptor.n_ctx)
        self.metrics = metrics or Metrics()
        self.mailbox = _Mailbox()
        budgets, limit = kv_budgets(model, config, memory)
        self.engine = Engine(model, parallel=config.parallel, ctx=self.ctx, queue=config.queue,
                             prefill_chunk=config.prefill_chunk, metrics=self.metrics,
                             drafter=_drafter(model, config.speculative), draft_max=config.draft_max,
                             kv_type=config.kv_type, flushed=self.mailbox.flush, kv_budgets=budgets, kv_limit=limit)
        self.embedder = Embedder(model, model_id, config.pooling)
        self.logprobs = protocol.LogprobFormatter(model.tokenizer)
        self.reasoning = reasoning_format(model)  # how the model marks its thinking (None: it does not)
        self.created = int(time.time())
        self.fingerprint()  # reads the weights file once, at start rather than in the first request

    def close(self) -> None:
        """Stop the engine and give back its caches' memory reservations."""
        self.engine.stop()
        self.engine.release_memory()

    def fingerprint(self) -> str:
        """The responses' system_fingerprint (it changes when a tiered start goes fast)."""
        return system_fingerprint(self.model)

    def routes(self) -> list[Route]:
        """The server's routes, each wrapped with the key check, error mapping and request count."""
        table = [("/", self.page, ["GET"]), ("/health", self.health, ["GET"]), ("/metrics", self.prometheus, ["GET"]),
                 ("/v1/models", self.models, ["GET"]), ("/v1/chat/completions", self.chat, ["POST"]),
                 ("/v1/completions", self.completions, ["POST"]), ("/v1/messages", self.messages, ["POST"]),
                 ("/v1/messages/count_tokens", self.count_tokens, ["POST"]),
                 ("/v1/responses", self.responses, ["POST"]), ("/v1/embeddings", self.embeddings, ["POST"])]
        return [Route(path, self._wrap(path, fn), methods=methods) for path, fn, methods in table]

    def _wrap(self, path: str, handler: Callable[[Request], Awaitable[Response]]) -> Callable:
        def shape(err: ApiError) -> Response:
            return anthropic.error_response(err.status, str(err)) if path.startswith("/v1/messages") else err.response()

        async def endpoint(request: Request) -> Response:
            try:
                if path not in OPEN_PATHS:
                    self._check_key(request)
                if path in GENERATING_PATHS and not getattr(self.model, "causal", True):
                    raise NotGenerative(f"model {self.model_id!r} is an encoder: it serves /v1/embeddings only")
                response = await handler(request)
            except Exception as exc:  # every failure is an HTTP answer, never a dropped connection
                response = shape(_api_error(exc))
            self.metrics.request(path, response.status_code)
            return response

        return endpoint

    def _check_key(self, request: Request) -> None:
        check_api_key(self.config.api_key, request)

    async def _json(self, request: Request) -> dict[str, Any]:
        """The request body as a JSON object; 413 past max_body (before parsing), 400 if malformed."""
        return json_body(await read_body(request, self.config.max_body))

    # -- routes ----------------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        """The chat page: one static file that streams from /v1/chat/completions."""
        return HTMLResponse(_chat_page(), headers={"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-cache"})

    async def health(self, request: Request) -> Response:
        """200 while the engine serves; 503 with the reason when its thread stopped or a step stalled
        beyond the watchdog's bound (it says ok again once the step ends)."""
        why = self.engine.stalled(self.config.watchdog)
        if why is not None:
            return JSONResponse({"status": "unavailable", "reason": why}, status_code=503)
        return JSONResponse({"status": "ok", "running": self.engine.running,
                             "waiting": self.metrics.queue_depth})

    async def prometheus(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "archrun",
             "context_length": self.ctx}]})

    async def chat(self, request: Request) -> Response:
        req, opts, plan = await self._chat_request(await self._json(request))
        reqs = [req, *(_another_choice(req, i) for i in range(1, opts.n))]  # n: choices of one computed prompt
        parts = [self._parts(plan, opts) for _ in reqs]
        head = protocol.envelope("chat.completion.chunk", protocol.new_id("chatcmpl"), self.model_id,
                                 self.fingerprint())
        return await self._run(request, reqs, opts, lambda i: _Chunks(self, "chat", opts, parts[i], i, head),
                               lambda results: self._complete("chat", results, opts, parts))

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API (archrun.serve.anthropic)."""
        req, opts, plan = await self._chat_request(anthropic.chat_body(await self._json(request)))
        parts = self._parts(plan, opts)
        head = {"id": protocol.new_id("msg"), "model": self.model_id}

        def stop_of(result: GenerationResult) -> str | None:
            return stop_sequence(self.model.tokenizer, result, req.stops)

        def complete(results: list[GenerationResult]) -> dict[str, Any]:
            return anthropic.message(head, self._blocks(parts, results[0].text), results[0], stop_of(results[0]))

        return await self._run(request, [req], opts,
                               lambda i: anthropic.MessageEvents(head, parts, len(req.ids), stop_of), complete)

    async def embeddings(self, request: Request) -> Response:
        """OpenAI's embeddings (archrun.serve.embeddings): every input checked, then one pass each."""
        ids, fmt = self.embedder.parse(await self._json(request))
        vectors = await run_in_threadpool(self.embedder.compute, ids)
        return JSONResponse(self.embedder.answer(ids, vectors, fmt))

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's token count of a Messages request: {"input_tokens": prompt tokens}."""
        body = await self._json(request)
        _req, _opts, plan = await self._chat_request(anthropic.chat_body({"max_tokens": 1, **body}))
        return JSONResponse({"input_tokens": len(plan.ids)})

    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API (archrun.serve.responses)."""
        body = await self._json(request)
        req, opts, plan = await self._chat_request(responses.chat_body(body))
        parts = self._parts(plan, opts)
        head = responses.head(body, self.model_id)

        def count(text: str) -> int:
            return len(self.model.tokenizer.encode(text, add_special=False))

        def complete(results: list[GenerationResult]) -> dict[str, Any]:
            blocks = self._blocks(parts, results[0].text)
            output = [responses.item(b, responses.item_id(b)) for b in blocks]
            reasoning = "".join(b.text for b in blocks if b.kind == "reasoning")
            return responses.finished(head, output, results[0], count(reasoning) if reasoning else 0)

        return await self._run(request, [req], opts, lambda i: responses.ResponseEvents(head, parts, count), complete)

    async def _chat_request(self, body: dict[str, Any]) -> tuple[GenerationRequest, protocol.Options, ToolPlan]:
        """The engine request of a chat-completions body, its options and its tool plan."""
        opts = await run_in_threadpool(protocol.chat_options, body)  # compiles a response_format grammar
        asked = opts.reasoning_budget is not None  # the request's own budget comes first, then its effort's
        if not asked:
            opts = attrs.evolve(opts, reasoning_budget=self.config.reasoning_budget)
        messages = protocol.chat_messages(body)
        tools, choice, template_vars = protocol.chat_tools(body)
        if opts.reasoning_budget == 0 and "enable_thinking" not in template_vars:
            template_vars = {**template_vars, "enable_thinking": False}  # no budget: no thinking, if it can say so
        plan = await run_in_threadpool(plan_tool_chat, self.model, messages, tools, choice, None, **template_vars)
        if plan.grammar is not None:
            if opts.generation["grammar"] is not None:
                raise ApiError(400, "a forced tool call (tool_choice) cannot also take a response_format")
            opts = attrs.evolve(opts, generation={**opts.generation, "grammar": plan.grammar})
        req = await run_in_threadpool(self._request, plan.ids, opts)
        effort = template_vars.get("reasoning_effort")
        if not asked and effort is not None and not says_effort(self.model.chat_template):
            budget = effort_budget(effort, req.budget)  # a model the template cannot tell: the thinking is cut
            opts = attrs.evolve(opts, reasoning_budget=budget if budget is not None else opts.reasoning_budget)
        return req, opts, plan

    def _parts(self, plan: ToolPlan, opts: protocol.Options) -> ReplyParts:
        """The reply splitter of a planned chat: tool calls when offered; reasoning when the model thinks
        and the reply is not constrained to a grammar (JSON, a forced call)."""
        thinks = self.reasoning if opts.generation["grammar"] is None else None
        return ReplyParts(plan.format, reasoning_stream(thinks, self.model.tokenizer, plan.ids))

    def _budgets(self, reqs: list[GenerationRequest], opts: protocol.Options) -> list[ReasoningBudget] | None:
        """The reasoning budget of each choice (engine steers), or None: no budget, a model that does not
        think, or a reply constrained to a grammar."""
        fmt = self.reasoning
        if opts.reasoning_budget is None or fmt is None or opts.generation["grammar"] is not None:
            return None
        tok = self.model.tokenizer
        close = tok.encode(fmt.close, add_special=False, parse_special=True)
        inside = fmt.opened_by(tok.decode(list(reqs[0].ids[-PROMPT_TAIL:])))
        return [ReasoningBudget(fmt, close, opts.reasoning_budget, inside) for _ in reqs]

    @staticmethod
    def _blocks(parts: ReplyParts, text: str) -> list:
        """The blocks of a whole reply (archrun.serve.reply.Blocks)."""
        blocks = Blocks()
        blocks.feed(parts.push(text) + parts.finish())
        return blocks.blocks

    async def completions(self, request: Request) -> Response:
        body = await self._json(request)
        opts = await run_in_threadpool(protocol.completion_options, body)
        prompt = protocol.completion_prompt(body)
        ids = await run_in_threadpool(self.model.tokenizer.encode, prompt) if isinstance(prompt, str) else prompt
        req = await run_in_threadpool(self._request, ids, opts)
        return await self._run(request, [req], opts, lambda i: _Chunks(self, "completion", opts),
                               lambda results: self._complete("completion", results, opts))

    # -- generation ------------------------------------------------------------------------------

    def _request(self, ids: list[int], opts: protocol.Options) -> GenerationRequest:
        """The validated request (a grammar's vocabulary table is built here, not on the inference thread)."""
        req = make_request(self.model, ids, context=self.ctx, **opts.generation)
        if req.grammar is not None:
            vocabulary(self.model.tokenizer, self.model.descriptor.n_vocab)
        return req

    async def _run(self, request: Request, reqs: list[GenerationRequest], opts: protocol.Options,
                   emitter: Callable[[int], Any], complete: Callable[[list[GenerationResult]], dict[str, Any]]
                   ) -> Response:
        """Run `reqs` (choices of one prompt) on the engine: streamed through `emitter(i)` per choice (open,
        piece, finish, fail, close: lists of SSE texts), or answered with `complete(results)` as JSON."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

        def sink_of(i: int) -> Callable[[Event], None]:
            def sink(event: Event) -> None:  # called on the inference thread; delivered at the engine's flush
                self.mailbox.post(loop, events, (i, event))

            return sink

        tickets = self.engine.submit_group(reqs, [sink_of(i) for i in range(len(reqs))],
                                           reuse_prefix=opts.cache_prompt, steers=self._budgets(reqs, opts))
        if opts.stream:
            return StreamingResponse(self._stream([emitter(i) for i in range(len(reqs))], tickets, events),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            results = await self._collect(request, events, len(reqs))
        finally:
            for ticket in tickets:
                ticket.cancel()  # a no-op once finished; frees the slot when the client left
        return JSONResponse(complete(results))

    async def _collect(self, request: Request, events: asyncio.Queue, n: int) -> list[GenerationResult]:
        results: list[GenerationResult | None] = [None] * n
        while any(r is None for r in results):
            try:
                i, event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    raise ApiError(499, "client disconnected") from None
                continue
            if event.error is not None:
                raise _api_error(event.error)
            if event.result is not None:
                results[i] = event.result
        return results

    def _complete(self, kind: str, results: list[GenerationResult], opts: protocol.Options,
                  parts: list[ReplyParts] | None = None) -> dict[str, Any]:
        choices = [self._choice(kind, i, result, opts, parts[i] if parts else None) for i, result in enumerate(results)]
        if kind == "chat":
            out = protocol.envelope("chat.completion", protocol.new_id("chatcmpl"), self.model_id, self.fingerprint())
        else:
            out = protocol.envelope("text_completion", protocol.new_id("cmpl"), self.model_id, self.fingerprint())
        return {**out, "choices": choices, "usage": protocol.usage(*results)}

    def _choice(self, kind: str, index: int, result: GenerationResult, opts: protocol.Options,
                parts: ReplyParts | None) -> dict[str, Any]:
        lps = result.logprobs if opts.logprobs is not None else None
        if kind == "chat":
            message, finish = {"role": "assistant", "content": result.text}, result.finish_reason
            if parts is not None and parts.splits:
                thought, text, calls = split_reply(parts, result.text)
                message = {"role": "assistant", "content": text}
                if calls:
                    message = {**message, "content": text or None, "tool_calls": [c.to_openai() for c in calls]}
                    finish = "tool_calls"
                if thought:
                    message["reasoning_content"] = thought
            choice = {"index": index, "message": message,
                      "logprobs": None if lps is None else {"content": self.logprobs.chat(lps), "refusal": None},
                      "finish_reason": finish}
        else:
            choice = {"index": index, "text": result.text, "finish_reason": result.finish_reason,
                      "logprobs": None if lps is None else self.logprobs.completion(lps)}
        if result.logit_hashes is not None:
            choice["logit_hashes"] = list(result.logit_hashes)
        return choice

    async def _stream(self, emitters: list[Any], tickets: list[Ticket], events: asyncio.Queue) -> AsyncIterator[str]:
        results: list[GenerationResult | None] = [None] * len(emitters)
        try:
            opening = [text for emitter in emitters for text in emitter.open()]
            if opening:
                yield "".join(opening)
            failed = False
            while not failed and any(r is None for r in results):
                ready = [await events.get()]
                while not events.empty():  # events this loop fell behind on go out in one write
                    ready.append(events.get_nowait())
                out: list[str] = []
                for i, event in ready:
                    if event.error is not None:
                        err = _api_error(event.error)
                        out += emitters[i].fail(err.status, str(err))
                        failed = True
                        break
                    if event.piece or event.logprobs:
                        out += emitters[i].piece(event.piece, event.logprobs)
                    if event.result is not None:
                        results[i] = event.result
                        out += emitters[i].finish(event.result)
                if out:
                    yield "".join(out)
            closing = emitters[0].close(results)
            if closing:
                yield "".join(closing)
        finally:
            for ticket, result in zip(tickets, results, strict=True):
                if result is None:
                    ticket.cancel()  # the client went away (or the stream failed): free the slot now


class _Chunks:
    """The SSE chunks of one streamed chat completion or completion (the emitter of Server._stream); a
    chat reply's parts (archrun.serve.reply) become content, reasoning_content and tool_calls deltas."""

    def __init__(self, server: Server, kind: str, opts: protocol.Options, parts: ReplyParts | None = None,
                 index: int = 0, head: dict[str, Any] | None = None):
        self.server, self.kind, self.opts, self.index = server, kind, opts, index
        prefix, obj = ("chatcmpl", "chat.completion.chunk") if kind == "chat" else ("cmpl", "text_completion")
        self.head = head or protocol.envelope(obj, protocol.new_id(prefix), server.model_id, server.fingerprint())
        self.offset = 0  # characters streamed (completion logprobs' text_offset)
        self.parts = parts if parts is not None and parts.splits and kind == "chat" else None
        self.n_calls = 0

    def _choice(self, text_or_delta: Any, logprobs: Any, finish: str | None, **extra: Any) -> str:
        key = "delta" if self.kind == "chat" else "text"
        choice = {"index": self.index, key: text_or_delta, "logprobs": logprobs, "finish_reason": finish, **extra}
        return _sse(json.dumps({**self.head, "choices": [choice]}))

    def delta(self, delta: dict[str, Any]) -> str:
        return self._choice(delta, None, None)

    def open(self) -> list[str]:
        return [self.delta({"role": "assistant", "content": ""})] if self.kind == "chat" else []

    def piece(self, text: str, entries: tuple) -> list[str]:
        lps = None
        if self.opts.logprobs is not None and entries:
            fmt = self.server.logprobs
            lps = {"content": fmt.chat(entries)} if self.kind == "chat" else fmt.completion(entries, self.offset)
        self.offset += len(text)
        if self.parts is not None:
            return self._deltas(self.parts.push(text), lps)
        return [self._choice({"content": text} if self.kind == "chat" else text, lps, None)]

    def _deltas(self, parts: list[Part], lps: Any = None) -> list[str]:
        out = []
        for part in parts:
            if part.kind == "tool":
                out.append(self.delta({"tool_calls": [{"index": self.n_calls, **part.call.to_openai()}]}))
                self.n_calls += 1
            else:
                key = "content" if part.kind == "text" else "reasoning_content"
                out.append(self._choice({key: part.text}, lps, None))
                lps = None
        return out if lps is None else [self._choice({"content": ""}, lps, None), *out]

    def finish(self, result: GenerationResult) -> list[str]:
        out, reason = [], result.finish_reason
        if self.parts is not None:
            out = self._deltas(self.parts.finish())
            reason = "tool_calls" if self.parts.calls else reason
        extra = {} if result.logit_hashes is None else {"logit_hashes": list(result.logit_hashes)}
        return [*out, self._choice({} if self.kind == "chat" else "", None, reason, **extra)]

    def fail(self, status: int, text: str) -> list[str]:
        return [_sse(ApiError(status, text).response().body.decode())]

    def close(self, results: list[GenerationResult | None]) -> list[str]:
        """The usage chunk (stream_options.include_usage, after every choice finished) and [DONE]."""
        out = []
        if self.opts.include_usage and all(r is not None for r in results):
            out.append(_sse(json.dumps({**self.head, "choices": [], "usage": protocol.usage(*results)})))
        return [*out, "data: [DONE]\n\n"]


def _another_choice(req: GenerationRequest, i: int) -> GenerationRequest:
    """Choice i of a request with n > 1: a seeded request's seed + i (unseeded ones draw their own)."""
    seed = req.params.seed
    return req if seed is None else attrs.evolve(req, params=attrs.evolve(req.params, seed=seed + i))


def _sse(data: str) -> str:
    return f"data: {data}\n\n"


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def check_api_key(key: str | None, request: Request) -> None:
    """ApiError 401 unless the request carries `key` (or no key is set)."""
    if key is None:
        return
    given = request.headers.get("authorization", "")
    bearer = hmac.compare_digest(given.encode(), f"Bearer {key}".encode())
    if not (bearer or hmac.compare_digest(request.headers.get("x-api-key", "").encode(), key.encode())):
        raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
                       "authentication_error")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body: 413 past `limit` bytes (before reading it all), 400 for a bad Content-Length."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise ApiError(413 if length.isdigit() else 400, f"the request body exceeds {limit} bytes"
                       if length.isdigit() else "bad Content-Length")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise ApiError(413, f"the request body exceeds {limit} bytes")
    return bytes(raw)


def json_body(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; ApiError 400 if malformed or not an object."""
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}"[:300]) from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def kv_budgets(model: Any, config: ServeConfig, memory: MemoryBudget | None) -> tuple[tuple[MemoryBudget, ...],
                                                                                    int | None]:
    """The budgets a model's KV caches are reserved from (--max-kv's own, --max-memory's shared one) and the
    most KV bytes it could ever hold (None: no bound)."""
    budgets, limits = [], []
    if config.max_kv is not None:
        budgets.append(MemoryBudget(config.max_kv, "--max-kv"))
        limits.append(config.max_kv)
    if memory is None and config.max_memory is not None:  # a single model: its own budget, its weights in it
        memory = MemoryBudget(config.max_memory)
        memory.try_reserve(min(weights_bytes(model), config.max_memory))
        limits.append(config.max_memory - memory.used)
    elif memory is not None and memory.limit is not None:
        limits.append(memory.limit - weights_bytes(model))
    if memory is not None and memory.limit is not None:
        budgets.append(memory)
    return tuple(budgets), (max(0, min(limits)) if limits else None)


def create_app(model: Any, config: ServeConfig, model_id: str) -> Starlette:
    """The ASGI app serving `model` (any Decoder); its lifespan starts and stops the inference thread."""
    server = Server(model, config, model_id)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await run_in_threadpool(server.engine.start)  # warms the batched kernels: ready means fast
        try:
            yield
        finally:
            await run_in_threadpool(server.engine.stop)

    app = Starlette(routes=server.routes(), lifespan=lifespan)
    app.state.server = server
    return app
