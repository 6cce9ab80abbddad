"""The app of a server with several models: a request's `model` picks the model's own Server.

The front answers /, /health, /metrics and /v1/models itself; any other request's body is read
(bounded by max_body), its `model` looked up in the ModelPool (archrun.serve.models: 404 for an
unknown one, 503 when memory cannot be made for it), and the request replayed, body and all,
into that model's Server app (archrun.serve.app), which answers it as a one-model server would.
Each model counts in its own Metrics (kept while it is unloaded), the front in its own: /metrics labels
every model's series with `model`. /health is 503 while any loaded model's engine is stalled or stopped.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from archrun.errors import InvalidRequest
from archrun.serve import anthropic
from archrun.serve.app import PAGE_POLICY, ApiError, Server, _api_error, _chat_page, check_api_key, read_body
from archrun.serve.config import ServeConfig
from archrun.serve.metrics import Metrics, render_metrics
from archrun.serve.models import ModelPool

LOCAL_PATHS = ("/", "/health", "/metrics", "/v1/models")


class Front:
    """The ASGI app over a ModelPool (see the module docstring)."""

    def __init__(self, pool: ModelPool, config: ServeConfig, metrics: Metrics, per_model: dict[str, Metrics]):
        self.pool, self.config, self.metrics = pool, config, metrics  # metrics: the front's own requests
        self.per_model = per_model  # each model's Metrics by id (its Server's, from its first load on)
        routes = [Route(path, fn, methods=["GET"]) for path, fn in (
            ("/", self.page), ("/health", self.health), ("/metrics", self.prometheus), ("/v1/models", self.models))]
        self.local = Starlette(routes=routes, lifespan=self.lifespan)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        server = await self.pool.acquire(None)  # the first model loads at start: ready means it answers
        self.pool.release(server)
        try:
            yield
        finally:
            await run_in_threadpool(self.pool.close)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in LOCAL_PATHS:
            await self.local(scope, receive, send)
        else:
            await self._dispatch(scope, receive, send)

    async def _dispatch(self, scope: dict, receive: Any, send: Any) -> None:
        request, path = Request(scope, receive), scope["path"]
        try:
            check_api_key(self.config.api_key, request)
            body = await read_body(request, self.config.max_body)
            server = await self.pool.acquire(_model_of(body))
        except Exception as exc:  # every failure is an HTTP answer in the API's shape
            err = _api_error(exc)
            response = anthropic.error_response(err.status, str(err)) if path.startswith("/v1/messages") \
                else err.response()
            self.metrics.request(path, response.status_code)
            await response(scope, receive, send)
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then the client's own messages (its disconnect)

        try:
            await server.asgi(scope, replay, send)
        finally:
            self.pool.release(server)

    async def page(self, request: Request) -> Response:
        return HTMLResponse(_chat_page(), headers={"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-cache"})

    async def health(self, request: Request) -> Response:
        """200 while every loaded model's engine serves; 503 naming the ones that do not and why."""
        models = {name: server.engine.stalled(self.config.watchdog) for name, server in self.pool.servers()}
        bad = {name: why for name, why in models.items() if why is not None}
        if bad:
            return JSONResponse({"status": "unavailable", "reason": "; ".join(f"{n}: {w}" for n, w in bad.items()),
                                 "models": bad}, status_code=503)
        return JSONResponse({"status": "ok", "loaded": sorted(models),
                             "waiting": sum(m.queue_depth for m in list(self.per_model.values()))})

    async def prometheus(self, request: Request) -> Response:
        def answer() -> Response:
            groups = [({"model": name}, m) for name, m in sorted(self.per_model.items())]
            return PlainTextResponse(render_metrics(groups, front=self.metrics), media_type="text/plain; version=0.0.4")

        return await self._local(request, "/metrics", answer)

    async def models(self, request: Request) -> Response:
        return await self._local(request, "/v1/models",
                                 lambda: JSONResponse({"object": "list", "data": self.pool.listing()}))

    async def _local(self, request: Request, path: str, answer: Any) -> Response:
        try:
            check_api_key(self.config.api_key, request)
            response = answer()
        except ApiError as err:
            response = err.response()
        self.metrics.request(path, response.status_code)
        return response


def _model_of(body: bytes) -> Any:
    """The `model` a request body names, or its `lora` (the name of a LoRA adapter served as a model of its
    own: `archrun serve BASE --adapter NAME=PATH`), which wins; None when it names none, or is not JSON (the
    model's own Server then answers what is wrong with it)."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict):
        return None
    lora = parsed.get("lora")
    if lora is not None and (not isinstance(lora, str) or not lora):
        raise InvalidRequest("lora must name an adapter this server serves (archrun serve --adapter NAME=PATH)")
    return lora if lora is not None else parsed.get("model")


def create_pool_app(files: Sequence[tuple[str, Path]], load: Callable[[Path], Any], config: ServeConfig,
                    loaders: dict[str, Callable[[], Any]] | None = None) -> Front:
    """The ASGI app serving the models of `files` ((id, path), archrun.serve.models.model_files), each
    loaded with `load(path)` (or its entry of `loaders`, by id) on first use; each model's Servers count in
    one Metrics of its own."""
    per_model: dict[str, Metrics] = {}
    pool = ModelPool(files, load, server_factory(config, lambda name: per_model.setdefault(name, Metrics())),
                     config.max_memory, config.context_for, loaders)
    return Front(pool, config, Metrics(), per_model)


def server_factory(config: ServeConfig, metrics_of: Callable[[str], Metrics]) -> Any:
    """ModelPool's serve(model, id, budget): the model's started Server, with its own ASGI app, counting
    in `metrics_of(id)`."""

    def serve(model: Any, model_id: str, budget: Any) -> Server:
        server = Server(model, config, model_id, metrics=metrics_of(model_id), memory=budget)
        server.asgi = Starlette(routes=server.routes())
        server.engine.start()
        return server

    return serve
