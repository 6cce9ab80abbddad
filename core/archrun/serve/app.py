"""The HTTP layer: OpenAI-compatible routes on Starlette, in front of the batching Engine.

Every route checks the API key (except /health and the chat page at /), reads at most `max_body`
bytes (413 beyond, before parsing) and answers errors in OpenAI's shape: {"error": {"message",
"type", "code"}}.
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

from archrun.errors import ArchrunError
from archrun.fingerprint import system_fingerprint
from archrun.generation import GenerationRequest, GenerationResult, make_request
from archrun.grammar import vocabulary
from archrun.serve import protocol
from archrun.serve.config import ServeConfig
from archrun.serve.engine import Engine, Event, QueueFull, Ticket
from archrun.serve.metrics import Metrics
from archrun.tools import ToolCallFormat, ToolCallStream, plan_tool_chat

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there
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
        return JSONResponse({"error": {"message": str(self), "type": self.kind, "param": None, "code": self.status}},
                            status_code=self.status)


def _api_error(exc: BaseException) -> ApiError:
    """The HTTP error for an exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, QueueFull):
        return ApiError(429, str(exc), "rate_limit_error")
    if isinstance(exc, ArchrunError):
        return ApiError(400, str(exc))
    return ApiError(500, f"internal error ({type(exc).__name__})", "server_error")


def _drafter(model: Any, spec: str | None) -> Any:
    """The drafter of `archrun serve --speculative SPEC`, or None."""
    if spec is None:
        return None
    from archrun import speculative

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

    def __init__(self, model: Any, config: ServeConfig, model_id: str):
        self.model, self.config, self.model_id = model, config, model_id
        self.ctx = config.context_for(model.descriptor.n_ctx)
        self.metrics = Metrics()
        self.mailbox = _Mailbox()
        self.engine = Engine(model, parallel=config.parallel, ctx=self.ctx, queue=config.queue,
                             prefill_chunk=config.prefill_chunk, metrics=self.metrics,
                             drafter=_drafter(model, config.speculative), draft_max=config.draft_max,
                             kv_type=config.kv_type, flushed=self.mailbox.flush)
        self.logprobs = protocol.LogprobFormatter(model.tokenizer)
        self.created = int(time.time())
        self.fingerprint()  # reads the weights file once, at start rather than in the first request

    def fingerprint(self) -> str:
        """The responses' system_fingerprint (it changes when a tiered start goes fast)."""
        return system_fingerprint(self.model)

    def routes(self) -> list[Route]:
        """The server's routes, each wrapped with the key check, error mapping and request count."""
        table = [("/", self.page, ["GET"]), ("/health", self.health, ["GET"]), ("/metrics", self.prometheus, ["GET"]),
                 ("/v1/models", self.models, ["GET"]), ("/v1/chat/completions", self.chat, ["POST"]),
                 ("/v1/completions", self.completions, ["POST"])]
        return [Route(path, self._wrap(path, fn), methods=methods) for path, fn, methods in table]

    def _wrap(self, path: str, handler: Callable[[Request], Awaitable[Response]]) -> Callable:
        async def endpoint(request: Request) -> Response:
            try:
                if path not in OPEN_PATHS:
                    self._check_key(request)
                response = await handler(request)
            except Exception as exc:  # every failure is an HTTP answer, never a dropped connection
                response = _api_error(exc).response()
            self.metrics.request(path, response.status_code)
            return response

        return endpoint

    def _check_key(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')", "authentication_error")

    async def _json(self, request: Request) -> dict[str, Any]:
        """The request body as a JSON object; 413 past max_body (before parsing), 400 if malformed."""
        limit = self.config.max_body
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise ApiError(413 if length.isdigit() else 400, f"the request body exceeds {limit} bytes"
                           if length.isdigit() else "bad Content-Length")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise ApiError(413, f"the request body exceeds {limit} bytes")
        try:
            body = json.loads(raw, parse_constant=_no_constants)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, f"malformed JSON: {exc}"[:300]) from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    # -- routes ----------------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        """The chat page: one static file that streams from /v1/chat/completions."""
        return HTMLResponse(_chat_page(), headers={"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-cache"})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "running": self.engine.running,
                             "waiting": self.metrics.queue_depth})

    async def prometheus(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "archrun",
             "context_length": self.ctx}]})

    async def chat(self, request: Request) -> Response:
        body = await self._json(request)
        opts = await run_in_threadpool(protocol.chat_options, body)  # compiles a response_format grammar
        messages = protocol.chat_messages(body)
        tools, choice, template_vars = protocol.chat_tools(body)
        plan = await run_in_threadpool(plan_tool_chat, self.model, messages, tools, choice, None, **template_vars)
        if plan.grammar is not None:
            if opts.generation["grammar"] is not None:
                raise ApiError(400, "a forced tool call (tool_choice) cannot also take a response_format")
            opts = attrs.evolve(opts, generation={**opts.generation, "grammar": plan.grammar})
        req = await run_in_threadpool(self._request, plan.ids, opts)
        return await self._respond(request, "chat", req, opts, plan.format)

    async def completions(self, request: Request) -> Response:
        body = await self._json(request)
        opts = await run_in_threadpool(protocol.completion_options, body)
        prompt = protocol.completion_prompt(body)
        ids = await run_in_threadpool(self.model.tokenizer.encode, prompt) if isinstance(prompt, str) else prompt
        req = await run_in_threadpool(self._request, ids, opts)
        return await self._respond(request, "completion", req, opts)

    # -- generation ------------------------------------------------------------------------------

    def _request(self, ids: list[int], opts: protocol.Options) -> GenerationRequest:
        """The validated request (a grammar's vocabulary table is built here, not on the inference thread)."""
        req = make_request(self.model, ids, context=self.ctx, **opts.generation)
        if req.grammar is not None:
            vocabulary(self.model.tokenizer, self.model.descriptor.n_vocab)
        return req

    async def _respond(self, request: Request, kind: str, req: GenerationRequest,
                       opts: protocol.Options, tool_format: ToolCallFormat | None = None) -> Response:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:  # called on the inference thread; delivered at the engine's flush
            self.mailbox.post(loop, events, event)

        ticket = self.engine.submit(req, sink, reuse_prefix=opts.cache_prompt)
        if opts.stream:
            chunks = _Chunks(self, kind, opts, tool_format)
            return StreamingResponse(self._stream(chunks, ticket, events, opts), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            result = await self._collect(request, events)
        finally:
            ticket.cancel()  # a no-op once finished; frees the slot when the client left
        return JSONResponse(self._complete(kind, result, opts, tool_format))

    async def _collect(self, request: Request, events: asyncio.Queue[Event]) -> GenerationResult:
        while True:
            try:
                event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    raise ApiError(499, "client disconnected") from None
                continue
            if event.error is not None:
                raise _api_error(event.error)
            if event.result is not None:
                return event.result

    def _complete(self, kind: str, result: GenerationResult, opts: protocol.Options,
                  tool_format: ToolCallFormat | None = None) -> dict[str, Any]:
        lps = result.logprobs if opts.logprobs is not None else None
        if kind == "chat":
            message, finish = {"role": "assistant", "content": result.text}, result.finish_reason
            if tool_format is not None:
                stream = ToolCallStream(tool_format)
                stream.push(result.text)
                stream.finish()
                if stream.calls:
                    message = {"role": "assistant", "content": stream.content or None,
                               "tool_calls": [c.to_openai() for c in stream.calls]}
                    finish = "tool_calls"
            choice = {"index": 0, "message": message,
                      "logprobs": None if lps is None else {"content": self.logprobs.chat(lps), "refusal": None},
                      "finish_reason": finish}
            out = protocol.envelope("chat.completion", protocol.new_id("chatcmpl"), self.model_id, self.fingerprint())
        else:
            choice = {"index": 0, "text": result.text, "finish_reason": result.finish_reason,
                      "logprobs": None if lps is None else self.logprobs.completion(lps)}
            out = protocol.envelope("text_completion", protocol.new_id("cmpl"), self.model_id, self.fingerprint())
        if result.logit_hashes is not None:
            choice["logit_hashes"] = list(result.logit_hashes)
        return {**out, "choices": [choice], "usage": protocol.usage(result)}

    async def _stream(self, chunks: _Chunks, ticket: Ticket, events: asyncio.Queue[Event],
                      opts: protocol.Options) -> AsyncIterator[str]:
        finished = False
        try:
            if chunks.kind == "chat":
                yield chunks.delta({"role": "assistant", "content": ""})
            failed = False
            while not (finished or failed):
                ready = [await events.get()]
                while not events.empty():  # events this loop fell behind on go out in one write
                    ready.append(events.get_nowait())
                out: list[str] = []
                for event in ready:
                    if event.error is not None:
                        out.append(_sse(_api_error(event.error).response().body.decode()))
                        failed = True
                        break
                    if event.piece or event.logprobs:
                        out += chunks.piece(event.piece, event.logprobs)
                    if event.result is not None:
                        finished = True
                        out += chunks.finish(event.result)
                        if opts.include_usage:
                            out.append(chunks.usage(event.result))
                        break
                if out:
                    yield "".join(out)
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                ticket.cancel()  # the client went away (or the stream failed): free the slot now


class _Chunks:
    """The SSE chunks of one streamed response (chat.completion.chunk or text_completion); with a
    tool-call format, chat text is split into content deltas and tool_calls deltas."""

    def __init__(self, server: Server, kind: str, opts: protocol.Options, tool_format: ToolCallFormat | None = None):
        self.server, self.kind, self.opts = server, kind, opts
        prefix, obj = ("chatcmpl", "chat.completion.chunk") if kind == "chat" else ("cmpl", "text_completion")
        self.head = protocol.envelope(obj, protocol.new_id(prefix), server.model_id, server.fingerprint())
        self.offset = 0  # characters streamed (completion logprobs' text_offset)
        self.tools = ToolCallStream(tool_format) if tool_format is not None and kind == "chat" else None

    def _choice(self, text_or_delta: Any, logprobs: Any, finish: str | None, **extra: Any) -> str:
        key = "delta" if self.kind == "chat" else "text"
        choice = {"index": 0, key: text_or_delta, "logprobs": logprobs, "finish_reason": finish, **extra}
        return _sse(json.dumps({**self.head, "choices": [choice]}))

    def delta(self, delta: dict[str, Any]) -> str:
        return self._choice(delta, None, None)

    def piece(self, text: str, entries: tuple) -> list[str]:
        lps = None
        if self.opts.logprobs is not None and entries:
            fmt = self.server.logprobs
            lps = {"content": fmt.chat(entries)} if self.kind == "chat" else fmt.completion(entries, self.offset)
        self.offset += len(text)
        if self.tools is not None:
            return self._split(*self.tools.push(text), lps)
        return [self._choice({"content": text} if self.kind == "chat" else text, lps, None)]

    def _split(self, content: str, calls: list, lps: Any = None) -> list[str]:
        out = [self._choice({"content": content}, lps, None)] if content or lps else []
        first = len(self.tools.calls) - len(calls)
        out += [self.delta({"tool_calls": [{"index": first + i, **c.to_openai()}]}) for i, c in enumerate(calls)]
        return out

    def finish(self, result: GenerationResult) -> list[str]:
        out, reason = [], result.finish_reason
        if self.tools is not None:
            out = self._split(*self.tools.finish())
            reason = "tool_calls" if self.tools.calls else reason
        extra = {} if result.logit_hashes is None else {"logit_hashes": list(result.logit_hashes)}
        return [*out, self._choice({} if self.kind == "chat" else "", None, reason, **extra)]

    def usage(self, result: GenerationResult) -> str:
        return _sse(json.dumps({**self.head, "choices": [], "usage": protocol.usage(result)}))


def _sse(data: str) -> str:
    return f"data: {data}\n\n"


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


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
