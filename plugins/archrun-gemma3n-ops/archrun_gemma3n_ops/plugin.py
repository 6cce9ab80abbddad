"""Registers archrun-gemma3n-ops' vocabulary through the archrun_register_vocabulary hook."""

from __future__ import annotations

from archrun.contracts import OpCapabilities
from archrun.hookspecs import hookimpl
from archrun.vocab import Lazy, Op
from archrun_gemma3n_ops import altup, laurel, sparsity
from archrun_gemma3n_ops.layout import Gemma3nLayout
from archrun_gemma4_ops import attention


@hookimpl
def archrun_register_vocabulary(register) -> None:
    register(Op("stream", "altup", altup.altup, None,
                "Gemma 3n's AltUp: altup.num_inputs residual streams (predict, the block on the active one, "
                "correct) with per-layer inputs from a per-layer token table and a projection of the embeddings",
                layout=altup.AltupLayout()))
    register(Op("residual", "gemma3n_laurel", laurel.Laurel, None,
                "sequential block whose FFN reads (x + attn + LAuReL(norm x)) / sqrt(2): a low-rank branch "
                "beside the attention", capabilities=OpCapabilities(binds=True)))
    register(Op("activation", "gelu_tanh_sparse", sparsity.gelu_tanh_sparse,
                Lazy("archrun_gemma3n_ops.sparsity:gelu_tanh_sparse_fast"),
                "tanh GELU whose input is first cut at mean + z std of its row (z from the file's "
                "activation_sparsity_scale; -inf: no cut)", layout=sparsity.SparsityLayout(),
                capabilities=OpCapabilities(fused=True)))
    register(Op("attention", "gemma3n", attention.gemma4_reference, attention.gemma4_fast,
                "Gemma 3n: Gemma 4's attention (q/k norms, RMS-normed values, unscaled scores, the last "
                "shared_kv_layers layers reusing an earlier layer's keys and values) with one head width",
                layout=Gemma3nLayout(), capabilities=OpCapabilities(kv_types=True, binds=True)))
