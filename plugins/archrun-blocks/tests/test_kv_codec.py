"""KV cache row formats (archrun_blocks.kv_codec, reference.NumpyKvCodec) and attention over them.

Conversions are held to independent references bit for bit: numpy's float16 casts and gguf-py's
q8_0 quantizer (which follows ggml's quantize_row_q8_0). Attention over a float16 / q8_0 cache
must equal attention over the float32 values those rows decode to.
"""

from __future__ import annotations

import gguf
import numba
import numpy as np
import pytest

from archrun.descriptor import AttentionSpec
from archrun.kernels.decode.parts import NO_TASK
from archrun_blocks import fast, kv_codec, reference
from archrun_blocks.decode_attention import KEY_BLOCK, attend_biased, attend_one

RNG = np.random.default_rng(11)
Q8 = gguf.GGMLQuantizationType.Q8_0


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("decoder", ["_decode_f16_bits", "_decode_f16_f16c"])
def test_decode_f16_every_bit_pattern(decoder):
    if decoder == "_decode_f16_f16c" and not kv_codec.F16C:
        pytest.skip("the CPU has no F16C (or no JIT): decode_f16 is the bit-moving loop")
    h = np.arange(1 << 16, dtype=np.uint16)
    out = np.empty(h.shape, np.float32)
    getattr(kv_codec, decoder)(h, out)
    ref = h.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(_bits(out)[~nan], _bits(ref)[~nan])  # incl. subnormals, -0, inf
    assert np.isnan(out[nan]).all()


def test_encode_f16_rounds_as_numpy():
    edges = np.array([0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 1e6, -1e6, np.inf, -np.inf,
                      2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26, 1e-30, 1.0 + 2.0 ** -11,
                      1.0 + 3 * 2.0 ** -11, 2.0 ** -14 - 2.0 ** -25, 6.1e-5, 1e-45], np.float32)
    n = 1 << 12 if numba.config.DISABLE_JIT else 1 << 20  # the loop version runs as Python without the JIT
    rand = RNG.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ties = (np.arange(-4096, 4096, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0 ** -24)  # subnormal ties
    x = np.concatenate([edges, -edges, rand, ties, np.float32(1.0) + ties * np.float32(2 ** 13)])
    out = np.empty(x.shape, np.uint16)
    kv_codec.encode_f16(x, out)
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(out[~nan], ref[~nan])
    assert np.isnan(out[nan].view(np.float16)).all()


@pytest.mark.parametrize("scale", [1.0, 1e-4, 3e-7, 250.0])
def test_q8_0_matches_gguf_py(scale):
    x = (RNG.standard_normal(32 * 257) * scale).astype(np.float32)
    x[:32] = 0  # d = 0: all quants 0
    x[32:64] = np.arange(32, dtype=np.float32) * np.float32(0.5) - 8  # halves: roundf's ties
    x[64:96] = np.float32(127 * scale)  # q = 127 exactly
    out = np.empty(257 * 34, np.uint8)
    kv_codec.encode_q8_0(x, out)
    ref = gguf.quants.quantize(x.reshape(1, -1), Q8).reshape(-1)
    assert np.array_equal(out, ref)
    assert np.array_equal(reference.NumpyKvCodec.encode("q8_0", x.reshape(1, 1, -1)).reshape(-1), ref)
    back = np.empty_like(x)
    kv_codec.decode_q8_0(out, back)
    want = gguf.quants.dequantize(ref, Q8).reshape(-1).astype(np.float32)
    assert np.array_equal(_bits(back), _bits(want))
    assert np.array_equal(_bits(reference.NumpyKvCodec.decode("q8_0", out.reshape(1, 1, -1)).reshape(-1)),
                          _bits(want))


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_kernel_codec_equals_numpy_codec(kv_type):
    x = (RNG.standard_normal((5, 3, 64)) * 3).astype(np.float32)
    raw = fast.KernelKvCodec.encode(kv_type, x)
    assert np.array_equal(raw, reference.NumpyKvCodec.encode(kv_type, x))
    assert raw.shape == (5, 3, kv_codec.row_width(kv_type, 64))
    assert np.array_equal(_bits(fast.KernelKvCodec.decode(kv_type, raw)),
                          _bits(reference.NumpyKvCodec.decode(kv_type, raw)))


def _cache(kv_type, cap, n_kv, width):
    vals = RNG.standard_normal((cap, n_kv, width)).astype(np.float32)
    raw = np.ascontiguousarray(reference.NumpyKvCodec.encode(kv_type, vals))
    return raw, np.ascontiguousarray(reference.NumpyKvCodec.decode(kv_type, raw), np.float32)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_load_rows_decodes_runs_and_gaps_as_numpy(kv_type):
    """load_rows decodes each run of consecutive rows in one call: rows listed with gaps, runs of one, a
    run ending at the cache's last row and a block starting mid-list all give numpy's decoded values."""
    raw, vals = _cache(kv_type, 40, 3, 64)
    rows = np.array([0, 1, 2, 5, 7, 8, 9, 10, 20, 39, 3, 4, 36, 37, 38, 39], np.int64)
    out = np.full((16, 3, 64), np.nan, np.float32)
    for j0, n in [(0, 16), (3, 9), (10, 6), (15, 1)]:
        out[:] = np.nan
        kv_codec.load_rows(raw, rows, j0, n, out)
        assert np.array_equal(_bits(out[:n]), _bits(vals[rows[j0:j0 + n]]))
        assert np.isnan(out[n:]).all()  # nothing past n written


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("count", [1, 37, KEY_BLOCK + 70])
def test_attention_over_stored_rows_equals_their_values(kv_type, count):
    """The decode attention over f16 / q8_0 rows = the same kernel over the float32 values they hold (to float32
    rounding: each cache dtype is its own fastmath compilation, so the last bit may differ)."""
    n_head, n_kv, hd, vd, cap = 6, 2, 64, 32, count + 5
    kc, kf = _cache(kv_type, cap, n_kv, hd)
    vc, vf = _cache(kv_type, cap, n_kv, vd)
    q = RNG.standard_normal(n_head * hd).astype(np.float32)
    rows = RNG.permutation(cap)[:count].astype(np.int64)
    got, want = np.empty(n_head * vd, np.float32), np.empty(n_head * vd, np.float32)
    attend_one(q, kc, vc, rows, count, n_head, 0.125, 0.0, got)
    attend_one(q, kf, vf, rows, count, n_head, 0.125, 0.0, want)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
    slopes = RNG.uniform(0, 1, n_head)
    dist = -RNG.uniform(0, 50, count).astype(np.float32)
    attend_biased(q, kc, vc, rows, count, n_head, 0.125, 3.0, slopes, dist, got)
    attend_biased(q, kf, vf, rows, count, n_head, 0.125, 3.0, slopes, dist, want)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())


def _spec(window: int = 0, hd: int = 64) -> AttentionSpec:
    return AttentionSpec(kind="causal", n_head=4, n_head_kv=2, head_dim=hd, v_head_dim=hd, scale=hd ** -0.5,
                         window=window)


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_slot_attention_reads_rows_as_stored(kv_type, window):
    """The reference op over an f16 / q8_0 slot (plain and ring) = attention over the rounded K/V; the fast op
    (kernel codec and attention) agrees with it; the fused part's one-token step agrees with both."""
    spec = _spec(window)
    n, hd = 12, spec.head_dim
    q = RNG.standard_normal((n, 4, hd)).astype(np.float32)
    k = RNG.standard_normal((n, 2, hd)).astype(np.float32)
    v = RNG.standard_normal((n, 2, hd)).astype(np.float32)
    ref_op, fast_op = reference.CausalAttention(spec), fast.causal_attention(spec)
    codec = reference.NumpyKvCodec
    kr, vr = codec.decode(kv_type, codec.encode(kv_type, k)), codec.decode(kv_type, codec.encode(kv_type, v))
    want = reference.attend(q, kr, vr, np.arange(n), np.arange(n), spec.scale, window)
    for op in (ref_op, fast_op):
        slot = op.new_slot(n, max_rewind=2, kv_type=kv_type)
        assert isinstance(slot, reference.RingKvSlot) == bool(window)
        got = np.concatenate([op(q[:7], k[:7], v[:7], slot, 0), op(q[7:11], k[7:11], v[7:11], slot, 7)])
        np.testing.assert_allclose(got, want[:11], rtol=0, atol=2e-6)
        kc, vc, kpos, ring = fast._slot_arrays(slot)
        out = np.empty(4 * hd, np.float32)
        fast_op.fused_for(kv_type).fn(fast_op.fused.params, q[11].reshape(-1), k[11].reshape(-1), v[11].reshape(-1),
                                      kc, vc, kpos, ring, 11 % kc.shape[0] if ring else 11, 11, out, *NO_TASK)
        np.testing.assert_allclose(out, want[11].reshape(-1), rtol=0, atol=2e-6)


def test_kv_types_and_bad_type():
    assert reference.CausalAttention(_spec()).kv_types == ("f32", "f16", "q8_0")
    assert reference.CausalAttention(_spec(hd=48)).kv_types == ("f32", "f16")  # q8_0 needs multiples of 32
    from archrun.errors import MetadataError

    with pytest.raises(MetadataError, match="q8_0"):
        reference.CausalAttention(_spec(hd=48)).new_slot(8, kv_type="q8_0")


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_bytes_per_token(kv_type):
    spec = _spec()
    per = {t: reference.CausalAttention(spec).new_slot(10, kv_type=t).nbytes // 10 for t in ("f32", kv_type)}
    assert per["f32"] == 2 * 2 * 64 * 4
    assert per[kv_type] == {"f16": 2 * 2 * 64 * 2, "q8_0": 2 * 2 * 2 * 34}[kv_type]
