"""archrun's public loading API: `load(path) -> Model`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from archrun.compile import compile_gguf
from archrun.descriptor import BLOCK_STYLES
from archrun.errors import InvalidRequest
from archrun.ggufio import open_gguf
from archrun.model import Interpreter, build_plan
from archrun.plugins import default_plugin_manager
from archrun.vocab import BACKENDS, build_vocabulary

Model = Interpreter  # every loaded model is an Interpreter of its block style (a Decoder)


def load(path: str | os.PathLike, block_style: str | None = None, backend: str | None = None,
         plugins: Any = None, threads: int | None = None,
         progress: Callable[[str, int, int], None] | None = None) -> Interpreter:
    """Load a GGUF file into a runnable model.

    block_style: "fused" | "host_reference" (default: what the family says, usually fused).
    backend: "reference" runs every op's numpy float32 reference; "fast" (the default) the
    fastest available implementation of each op.
    plugins: a pluggy PluginManager (default: every installed archrun plugin).
    threads: compute threads for the fast kernels (default: numba's default).
    progress: called as progress(stage, done, total) during slow steps (the CLI shows a bar).
    """
    backend = backend or "fast"
    if backend not in BACKENDS:
        raise InvalidRequest(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if block_style is not None and block_style not in BLOCK_STYLES:
        raise InvalidRequest(f"block_style must be one of {', '.join(BLOCK_STYLES)}, got {block_style!r}")
    if threads is not None:
        _set_threads(threads)
    pm = plugins or default_plugin_manager()
    gguf = open_gguf(path)
    try:
        compiled = compile_gguf(gguf, plugins=pm, block_style=block_style)
        vocab = build_vocabulary(pm)
        plan = build_plan(compiled.descriptor, gguf, vocab, backend, progress)  # refuses bad input first
        style = vocab.entry("block_style", compiled.descriptor.block_style).op.reference()
        model = style(plan, gguf, lambda: _tokenizer(gguf), compiled.chat_template)
        if backend == "fast":
            gguf.release_pages()  # the kernels hold repacked copies; file pages would double the RSS
            from archrun.kernels.warmup import warm_up

            # compile before the first token: the kernels of the file's weight types, then one
            # throwaway decode step (the model's own fused blocks and head)
            warm_up({t.ggml_type for t in gguf.tensors.values()}, progress,
                    extra=[lambda: model.forward_step([0], model.init_cache(1))])
    except BaseException:
        gguf.close()
        raise
    return model


def _tokenizer(gguf):
    from archrun.tokenizer import Tokenizer

    return Tokenizer.from_metadata(gguf.metadata)


def _set_threads(threads: int) -> None:
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise InvalidRequest(f"threads must be a positive integer, got {threads!r}")
    from archrun import kernels

    kernels.set_threads(threads)
