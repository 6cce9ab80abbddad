"""The reference tracer: an HF transformers causal LM's activations as an archrun trace.

Forward hooks map HF module outputs onto the aligned op names of ``trace_format``: each decoder
layer's output -> ``<i>/block``, its attention module -> ``<i>/attn_out``, its MLP (or MoE block)
-> ``<i>/ffn_out`` (less the ``residual`` argument of a branch module that adds it itself, as
BLOOM's do), the final norm -> ``head/final_norm``, the output embedding -> ``head/output``.
The modules are found by the names HF models use (``ATTENTION``, ``FFN``, ``FINAL_NORM``); a model
with other names still yields its blocks, head and logits. Needs torch and transformers (the
``reference`` extra).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from archrun.conformance.trace_format import Trace

ATTENTION = ("self_attn", "attention", "attn", "self_attention", "mixer")
FFN = ("mlp", "feed_forward", "block_sparse_moe", "ffn")
FINAL_NORM = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f")


def load_hf(model_dir: str | Path) -> Any:
    """An HF model directory (config + safetensors) as a float32 eager-attention model in eval mode."""
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager").eval()


def _layers(model: Any) -> tuple[Any, Any]:
    """(the decoder layers' ModuleList, the module holding it): the ModuleList as long as the model's
    layer count, found by walking the module tree."""
    import torch

    n = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
    for _, module in model.named_modules():
        for child in module.children():
            if isinstance(child, torch.nn.ModuleList) and len(child) == n:
                return child, module
    raise ValueError(f"no ModuleList of {n} decoder layers in {type(model).__name__}")


def _child(module: Any, names: Sequence[str]) -> Any:
    """The first submodule of ``module`` with one of ``names``, or None."""
    import torch

    return next((getattr(module, n) for n in names if isinstance(getattr(module, n, None), torch.nn.Module)), None)


def _residual_input(module: Any, args: Any, kwargs: Any) -> Any:
    """The ``residual`` argument of a branch module that adds its block's residual to its own output
    (HF BLOOM's attention and MLP take it), or None."""
    try:
        bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    return bound.arguments.get("residual")


def trace_hf(model: Any, ids: Sequence[int], name: str = "") -> Trace:
    """Run ``model`` on ``ids`` (one sequence) and return its trace."""
    import torch

    ops: dict[str, np.ndarray] = {}

    def hook(op: str, branch: bool = False):
        def record(module: Any, args: Any, kwargs: Any, out: Any) -> None:
            t = out[0] if isinstance(out, tuple) else out
            if isinstance(t, torch.Tensor) and op not in ops:
                residual = _residual_input(module, args, kwargs) if branch else None
                if residual is not None and residual.shape == t.shape:
                    t = t - residual  # the module adds its block's residual itself: record its branch alone
                ops[op] = t.detach().to(torch.float32).numpy()[0].reshape(t.shape[1], -1).copy()
        return record

    layers, owner = _layers(model)
    handles = []
    for i, layer in enumerate(layers):
        for names, op in ((ATTENTION, "attn_out"), (FFN, "ffn_out")):
            sub = _child(layer, names)
            if sub is not None:
                handles.append(sub.register_forward_hook(with_kwargs=True, hook=hook(f"{i}/{op}", branch=True)))
        handles.append(layer.register_forward_hook(with_kwargs=True, hook=hook(f"{i}/block")))
    final = _child(owner, FINAL_NORM)
    if final is not None:
        handles.append(final.register_forward_hook(with_kwargs=True, hook=hook("head/final_norm")))
    head = model.get_output_embeddings()
    if head is not None:
        handles.append(head.register_forward_hook(with_kwargs=True, hook=hook("head/output")))
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([list(map(int, ids))])).logits[0].to(torch.float32).numpy()
    finally:
        for h in handles:
            h.remove()
    # hooks fire in execution order: ops is in it already
    return Trace(np.asarray(ids, np.int64), logits.copy(), ops, "transformers", name or type(model).__name__)
