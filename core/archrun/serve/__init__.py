"""`archrun serve`: an OpenAI-compatible HTTP server over any Decoder, with continuous batching.

    from archrun.serve import ServeConfig, create_app, serve
    serve(archrun.load("model.gguf"), ServeConfig(port=8080, parallel=4))

Layers: `protocol` (OpenAI's request and response shapes), `engine` (the inference thread:
continuous batching, chunked prefill, prefix reuse), `app` (Starlette routes), `metrics`.
Needs the `serve` extra (starlette, uvicorn).
"""

from __future__ import annotations

import os
from typing import Any

from archrun.errors import ArchrunError
from archrun.serve.config import ServeConfig

__all__ = ["ServeConfig", "create_app", "serve"]


def create_app(model: Any, config: ServeConfig, model_id: str = "archrun") -> Any:
    """The Starlette app serving `model` (see archrun.serve.app.create_app)."""
    try:
        from archrun.serve.app import create_app as make
    except ImportError as exc:  # the optional dependencies are missing
        raise ArchrunError(f"archrun serve needs the 'serve' extra (pip install 'archrun[serve]'): {exc}") from None
    return make(model, config, model_id)


def serve(model: Any, config: ServeConfig, model_path: str | os.PathLike | None = None) -> None:
    """Serve `model` over HTTP until interrupted (uvicorn, one worker process)."""
    model_id = config.model_name or (os.path.basename(str(model_path)) if model_path else "archrun")
    app = create_app(model, config, model_id)
    import uvicorn

    uvicorn.run(app, host=config.host, port=config.port, log_level="info", timeout_graceful_shutdown=5)
