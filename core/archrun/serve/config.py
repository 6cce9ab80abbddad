"""ServeConfig: the server's options (the `archrun serve` flags), validated when made."""

from __future__ import annotations

import attrs

from archrun.errors import InvalidRequest
from archrun.run.cache import kv_options


def _int_in(lo: int, hi: int | None = None):
    def check(_inst, attr, value) -> None:
        if value is None and attr.default is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise InvalidRequest(f"--{attr.name.replace('_', '-')} must be an integer {bound}, got {value!r}")

    return check


@attrs.frozen
class ServeConfig:
    """How the server listens, batches and bounds its work."""

    host: str = "127.0.0.1"
    port: int = attrs.field(default=8080, validator=_int_in(0, 65535))   # 0: any free port
    api_key: str | None = attrs.field(default=None)  # clients must send "Authorization: Bearer <api_key>"
    parallel: int = attrs.field(default=4, validator=_int_in(1, 256))    # sequences decoded together
    ctx: int | None = attrs.field(default=None, validator=_int_in(2))    # tokens per sequence (None: min(n_ctx, 4096))
    queue: int = attrs.field(default=32, validator=_int_in(0))           # requests waiting for a slot (429 beyond)
    # prompt tokens per step; None: automatic (all of a prompt, up to 512, when nothing else decodes; else
    # as many as cost about one decode-only step, measured)
    prefill_chunk: int | None = attrs.field(default=None, validator=_int_in(1))
    max_body: int = attrs.field(default=4 << 20, validator=_int_in(1))   # request body bytes (413 beyond)
    model_name: str | None = None           # the model id clients see (None: the file's name)
    speculative: str | None = None          # a drafter spec ("lookup", "draft:PATH"): decode speculatively
    draft_max: int = attrs.field(default=5, validator=_int_in(1, 16))  # most drafts per verify step
    kv_type: str = attrs.field(default="f32")  # how each sequence's cache stores K/V: f32, f16, q8_0
    # bytes the loaded models' weights and KV caches may hold together (None: no bound); --max-memory
    max_memory: int | None = attrs.field(default=None, validator=_int_in(1))
    # bytes each model's KV caches may hold (None: no bound); --max-kv
    max_kv: int | None = attrs.field(default=None, validator=_int_in(1))
    # seconds one inference step may run before /health reports the engine stalled (503)
    watchdog: float = attrs.field(default=120.0)
    # most thinking tokens of a chat reply unless a request says (None: no bound; 0: thinking off)
    reasoning_budget: int | None = attrs.field(default=None, validator=_int_in(0))

    # how /v1/embeddings pools a sequence: "mean", "cls" or "last" (None: as the file states); --pooling
    pooling: str | None = attrs.field(default=None)

    @pooling.validator
    def _pooling(self, _attr, value) -> None:
        if value is not None and value not in ("mean", "cls", "last"):
            raise InvalidRequest(f"--pooling must be mean, cls or last, got {value!r}")

    @kv_type.validator
    def _kv(self, _attr, value) -> None:
        kv_options(value)  # KvTypeUnsupported for an unknown name (the model's ops are checked at load)

    @watchdog.validator
    def _watchdog(self, _attr, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
            raise InvalidRequest(f"--watchdog must be a positive number of seconds, got {value!r}")

    @api_key.validator
    def _key(self, _attr, value) -> None:
        if value is not None and (not isinstance(value, str) or not value or not value.isprintable()):
            raise InvalidRequest("--api-key must be a non-empty printable string")

    def context_for(self, n_ctx: int) -> int:
        """Tokens each sequence may hold for a model whose context length is n_ctx."""
        if self.ctx is None:
            return min(n_ctx, 4096)
        if self.ctx > n_ctx:
            raise InvalidRequest(f"--ctx {self.ctx} exceeds the model's context length {n_ctx}")
        return self.ctx
