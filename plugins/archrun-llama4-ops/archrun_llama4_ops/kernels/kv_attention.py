"""Attention "llama4" parts over float16 and q8_0 caches (archrun-blocks' kv_codec row formats): the float32
part's code (kernels.attention) compiled for another cache dtype. Imported on the first cache of such a
type, so a process that keeps float32 caches never compiles or loads these."""

from __future__ import annotations

from numba import njit

from archrun.kernels._jit import JIT
from archrun.kernels.decode.parts import SIGNATURES
from archrun_llama4_ops.kernels.attention import _llama4


@njit(SIGNATURES["attention:f16"], **JIT)
def llama4_attention_f16(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """attention.llama4_attention over a float16 cache (uint16 bits [cap, KV, hd])."""
    _llama4(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task)


@njit(SIGNATURES["attention:q8_0"], **JIT)
def llama4_attention_q8_0(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task):
    """attention.llama4_attention over a q8_0 cache (ggml blocks, uint8 [cap, KV, hd / 32 * 34])."""
    _llama4(p, q, k, v, kc, vc, kpos, ring, row, pos, out, ctrl, task)
