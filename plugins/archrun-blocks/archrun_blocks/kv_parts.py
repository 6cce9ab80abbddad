"""Attention kernel parts over float16 and q8_0 caches (archrun_blocks.kv_codec's row formats).

The same math as archrun_blocks.parts' causal and ALiBi parts, compiled for another cache
dtype (a part's signature fixes it: archrun.kernels.decode.parts.SIGNATURES["attention:<kv type>"]).
This module is imported on the first cache of such a type, so a process that keeps float32
caches never compiles or loads these.
"""

from __future__ import annotations

from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode.parts import SIGNATURES
from archrun_blocks.parts import alibi, causal


@njit(SIGNATURES["attention:f16"], **JIT)
def causal_attention_f16(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """parts.causal_attention over a float16 cache (uint16 bits [cap, KV, hd])."""
    causal(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task)


@njit(SIGNATURES["attention:q8_0"], **JIT)
def causal_attention_q8_0(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """parts.causal_attention over a q8_0 cache (ggml blocks, uint8 [cap, KV, hd / 32 * 34])."""
    causal(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task)


@njit(SIGNATURES["attention:f16"], **JIT)
def alibi_attention_f16(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """parts.alibi_attention over a float16 cache."""
    alibi(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task)


@njit(SIGNATURES["attention:q8_0"], **JIT)
def alibi_attention_q8_0(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """parts.alibi_attention over a q8_0 cache."""
    alibi(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task)
