"""A real uvicorn server on a free loopback port, in a background thread (for the serve tests)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn

from archrun.serve import ServeConfig, create_app


@contextlib.contextmanager
def live_server(model, **options) -> Iterator[tuple[str, object]]:
    """Serve `model` with ServeConfig(**options); yields (base URL, the app's Server)."""
    app = create_app(model, ServeConfig(port=0, **options), "smollm2")
    with live_app(app) as url:
        yield url, app.state.server


@contextlib.contextmanager
def live_app(app) -> Iterator[str]:
    """Serve an ASGI app on a free loopback port; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 600  # a server loads its (first) model at start
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
