"""archrun's public loading API: `load(path) -> Model`."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from archrun.describe.compile import compile_gguf
from archrun.errors import InvalidRequest, check_flag, shown
from archrun.io.ggufset import open_gguf
from archrun.io.lora import apply_adapters
from archrun.plugins import checked_plugin_manager
from archrun.run.bind import build_plan
from archrun.run.interpreter import Interpreter
from archrun.vocab import BACKENDS, build_vocabulary

Model = Interpreter  # every loaded model is an Interpreter of its block style (a Decoder)


def load(path: str | os.PathLike, block_style: str | None = None, backend: str | None = None,
         plugins: Any = None, threads: int | None = None,
         progress: Callable[[str, int, int], None] | None = None,
         hints: Mapping[str, Any] | None = None, lora: Any = None, lora_scale: float = 1.0,
         layers: tuple[int, int] | None = None, expert_memory: int | None = None,
         share_weights_with: Interpreter | None = None, fused: bool = True) -> Interpreter:
    """Load a GGUF file into a runnable model.

    block_style: a registered block style, e.g. "fused" | "host_reference" (default: what the
    family says, usually fused).
    hints: conventions the file does not state (archrun.family.FamilyHints fields, e.g.
    {"rope_pairing": "norm", "activation": "silu"}), on top of the family's; an architecture no
    plugin describes loads only when they state everything it needs (else UnsupportedArchitecture).
    backend: "reference" runs every op's numpy float32 reference; "fast" (the default) the
    fastest available implementation of each op.
    plugins: a pluggy PluginManager (default: every installed archrun plugin).
    threads: compute threads for the fast kernels (default: numba's default).
    progress: called as progress(stage, done, total) during slow steps (the CLI shows a bar).
    lora: LoRA adapter files (GGUF, llama.cpp's convert_lora_to_gguf.py) merged into the weights at
    load: a path, or a list of paths and (path, scale) pairs; lora_scale is the scale of those given
    without one (archrun.io.lora: the adapted weights become float32, the others keep their encoding).
    path may name any part of a split model (archrun.io.ggufset).
    layers: (start, end) loads a pipeline stage, blocks start..end-1 only (archrun.pipeline): a stage after
    the first takes hidden states float32 [n, d] where a model takes token ids, one before the last gives
    the hidden states of every position where a model gives logits.
    expert_memory: bytes of a mixture-of-experts model's expert matrices kept in memory; the others are paged
    in from disk when the router picks them (archrun.io.experts: the same logits as with every expert resident).
    share_weights_with: a model loaded from the same file on the same backend (without adapters): this model
    reuses its weights wherever `lora` changes nothing, so several adapters on one base hold the base once.
    fused: False runs every one-token step and batch op by op (the interpreter's block, on the backend's
    ops) even where the ops declare kernel parts: the path the fused kernels are checked against.
    """
    backend = "fast" if backend is None or (isinstance(backend, str) and not backend) else backend
    fused = check_flag("fused", fused)
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise InvalidRequest(f"backend must be one of {', '.join(BACKENDS)}, got {shown(backend)}")
    if progress is not None and not callable(progress):
        raise InvalidRequest(f"progress must be a callable (stage, done, total) or None, got {shown(progress)}")
    progress = _reporting(progress)
    pm = checked_plugin_manager(plugins)
    if threads is not None:
        _set_threads(threads)
    vocab = build_vocabulary(pm)
    if block_style is not None and (not isinstance(block_style, str) or ("block_style", block_style) not in vocab):
        styles = ", ".join(sorted(e.op.name for e in vocab if e.op.slot == "block_style"))
        raise InvalidRequest(f"block_style must be one of {styles}, got {shown(block_style)}")
    gguf = open_gguf(path)
    try:
        gguf = apply_adapters(gguf, lora, lora_scale)
        share = _shared_plan(share_weights_with, gguf, backend)
        compiled = compile_gguf(gguf, plugins=pm, block_style=block_style, hints=hints)
        # refuses bad input first
        plan = build_plan(compiled.descriptor, gguf, vocab, backend, progress, layers, expert_memory, share,
                          fused=fused)
        style = vocab.entry("block_style", compiled.descriptor.block_style).op.reference()
        model = style(plan, gguf, lambda: _tokenizer(gguf, pm), compiled.chat_template)
        if backend == "fast":
            gguf.release_pages()  # the kernels hold repacked copies; file pages would double the RSS
            from archrun.kernels.matmul.warmup import warm_up

            # compile before the first token: the kernels of the file's weight types, then a
            # throwaway prefill and decode step (the model's ops, its fused blocks and head)
            warm_up({t.ggml_type for t in gguf.tensors.values()}, progress, extra=[lambda: _throwaway_steps(model)])
    except BaseException:
        gguf.close()
        raise
    return model


def _shared_plan(model: Any, gguf: Any, backend: str) -> Any:
    """The plan of share_weights_with: a model of this very file (without adapters) on this backend."""
    if model is None:
        return None
    base = getattr(gguf, "base", gguf)  # the file under the adapters
    plan = getattr(model, "plan", None)
    if not isinstance(model, Interpreter) or plan is None or getattr(plan.binder, "made", None) is None:
        raise InvalidRequest(f"share_weights_with must be a model archrun.load made, got {type(model).__name__}")
    if model.gguf.identity() != base.identity() or hasattr(model.gguf, "adapted"):
        raise InvalidRequest("share_weights_with must be a model of the same file without adapters")
    if model.backend != backend or plan.span is not None:
        raise InvalidRequest("share_weights_with must be a whole model on the same backend")
    return plan


def _reporting(progress: Callable[[str, int, int], None] | None) -> Callable[[str, int, int], None] | None:
    """The caller's progress callback; one that fails (e.g. takes other arguments) is InvalidRequest."""
    if progress is None:
        return None

    def report(stage: str, done: int, total: int) -> None:
        try:
            progress(stage, done, total)
        except Exception as exc:  # noqa: BLE001 - the caller's code, reported as what it is
            raise InvalidRequest(f"the progress callback failed: {type(exc).__name__}: {exc}"[:300]) from exc

    return report


def _throwaway_steps(model: Interpreter) -> None:
    if not model.causal:  # an encoder has no decode step: one pass over a short sequence
        model.hidden_states([0] * min(3, model.descriptor.n_ctx))
        return
    cache = model.init_cache(min(3, model.descriptor.n_ctx))

    def ids(n: int) -> Any:  # a later pipeline stage takes hidden states
        return np.zeros((n, model.descriptor.n_embd), np.float32) if model.takes_hidden else [0] * n

    if model.descriptor.n_ctx >= 3:
        model.forward_step(ids(2), cache, all_logits=model.gives_hidden)
    model.forward_step(ids(1), cache, all_logits=model.gives_hidden)


def _tokenizer(gguf, pm):
    from archrun.text.tokenizer import Tokenizer

    return Tokenizer.from_metadata(gguf.metadata, pm)


def _set_threads(threads: int) -> None:
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise InvalidRequest(f"threads must be a positive integer, got {shown(threads)}")
    from archrun import kernels

    kernels.set_threads(threads)
