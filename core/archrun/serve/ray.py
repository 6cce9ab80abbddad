"""`archrun serve --ray`: N replicas of the server as a Ray Serve deployment behind one OpenAI endpoint
(or, with --stages K, one server whose model runs as K pipeline stages on Ray actors: run_stages).

    from archrun.serve import ServeConfig
    from archrun.serve.ray import deployment
    app = deployment("model.gguf", ServeConfig(parallel=4), replicas=2)
    ray.serve.run(app, route_prefix="/")        # on a cluster: ray.init(address="auto") first

Each replica loads the model and runs archrun's own server app (continuous batching, prefix reuse,
the chat page) as the deployment's ASGI ingress; its answers carry `X-Archrun-Replica: host:pid`.
Ray's HTTP proxy on every node spreads requests over the replicas (power of two choices on their
queue lengths) and streams their answers back. A replica admits `parallel + queue` requests at
once, as the single server does. Needs the `ray` extra (pip install 'archrun[ray]');
docs/serving.md shows a multi-node cluster.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import attrs

from archrun.errors import ArchrunError, InvalidRequest
from archrun.serve.config import ServeConfig


def _serve() -> Any:
    try:
        from ray import serve
    except ImportError as exc:
        raise ArchrunError(f"archrun serve --ray needs the 'ray' extra (pip install 'archrun[ray]'): {exc}") from None
    return serve


class Replica:
    """One replica: the model loaded in the Ray worker, served by archrun's app (see create_app)."""

    def __init__(self, model_path: str, config: dict[str, Any], model_id: str, load_options: dict[str, Any]):
        import archrun
        from archrun.serve import create_app

        model = archrun.load(model_path, **load_options)
        self._app = _Tagged(create_app(model, ServeConfig(**config), model_id), f"{socket.gethostname()}:{os.getpid()}")

    def __serve_build_asgi_app__(self) -> Any:
        return self._app


class _Tagged:
    """The ASGI app, with an X-Archrun-Replica header (host:pid) on every HTTP answer."""

    def __init__(self, app: Any, name: str):
        self.app, self.header = app, (b"x-archrun-replica", name.encode())

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def tagged(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, tagged)


def deployment(model_path: str | os.PathLike, config: ServeConfig, replicas: int = 1,
               load_options: dict[str, Any] | None = None, num_cpus: float = 1.0) -> Any:
    """The Ray Serve application of `replicas` archrun servers of one model (bind it with serve.run).

    load_options are archrun.load's keywords (threads, backend, block_style, hints); num_cpus is what
    each replica reserves on its node.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 1024:
        raise InvalidRequest(f"--replicas must be an integer in [1, 1024], got {replicas!r}")
    path = os.fspath(model_path)
    if not os.path.isfile(path):
        raise InvalidRequest(f"no model file at {path}")
    serve = _serve()
    model_id = config.model_name or os.path.basename(path)
    cls = serve.deployment(name="archrun", num_replicas=replicas, ray_actor_options={"num_cpus": num_cpus},
                           max_ongoing_requests=config.parallel + config.queue)(serve.ingress()(Replica))
    return cls.bind(os.path.abspath(path), attrs.asdict(config), model_id, dict(load_options or {}))


def run(model_path: str | os.PathLike, config: ServeConfig, replicas: int, address: str | None = None,
        load_options: dict[str, Any] | None = None, num_cpus: float = 1.0) -> None:
    """Start (or join, given `address`) a Ray cluster, deploy, and serve on config.host:config.port until
    interrupted."""
    import time

    import ray

    serve = _serve()
    app = deployment(model_path, config, replicas, load_options, num_cpus)
    ray.init(address=address, include_dashboard=False)
    serve.start(http_options={"host": config.host, "port": config.port})
    serve.run(app, name="archrun", route_prefix="/")
    print(f"archrun: {replicas} replica(s) serving on http://{config.host}:{config.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        serve.shutdown()


def run_stages(model_path: str | os.PathLike, config: ServeConfig, stages: int, address: str | None = None,
               load_options: dict[str, Any] | None = None, num_cpus: float = 1.0) -> None:
    """Start (or join, given `address`) a Ray cluster, place the model on `stages` pipeline stages
    (archrun.pipeline) and serve it from this process on config.host:config.port until interrupted."""
    import ray

    from archrun import pipeline
    from archrun.serve import serve

    _serve()  # the ray extra's check
    if not os.path.isfile(os.fspath(model_path)):
        raise InvalidRequest(f"no model file at {os.fspath(model_path)}")
    ray.init(address=address, include_dashboard=False)
    model = pipeline.load(model_path, stages, load_options, num_cpus)
    print(f"archrun: {stages} pipeline stages {model.bounds} on Ray", flush=True)
    try:
        serve(model, config, model_path=model_path)
    finally:
        model.close()
