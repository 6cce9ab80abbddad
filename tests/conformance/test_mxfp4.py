"""The kit's MXFP4 checkpoint layout (archrun.conformance.hf.mxfp4) against hand-derived values and gguf-py's
MXFP4 dequantizer (llama.cpp's converter repacks these codes and scales into GGUF MXFP4 without a change)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from archrun.conformance.hf.mxfp4 import E2M1, pack_mxfp4, round_to_mxfp4, unpack_mxfp4  # noqa: E402


def test_round_puts_a_group_on_the_grid_by_hand():
    # max 5.0 -> scale 2^0 (5 <= 6); 5.0 rounds to 4 or 6 (nearest: 4 at distance 1, 6 at 1: argmin takes 4),
    # 0.7 -> 0.5, -2.6 -> -3, 0.2 -> 0 (nearer than 0.5)
    row = torch.zeros(1, 32)
    row[0, :4] = torch.tensor([5.0, 0.7, -2.6, 0.2])
    got = round_to_mxfp4(row)[0, :4].tolist()
    assert got == [4.0, 0.5, -3.0, 0.0]
    # max 13 -> scale 2^2 (13 / 4 = 3.25 <= 6, 13 / 2 = 6.5 > 6): 13 -> 12, 1 -> 0 (0.25 -> 0), 5 -> 4
    row[0, :3] = torch.tensor([13.0, 1.0, 5.0])
    assert round_to_mxfp4(row)[0, :3].tolist() == [12.0, 0.0, 4.0]


def test_pack_is_exact_and_matches_the_layout():
    w = round_to_mxfp4(torch.randn(6, 64, generator=torch.Generator().manual_seed(0)) * 0.3)
    codes, scales = pack_mxfp4(w)
    assert codes.dtype == torch.uint8 and codes.shape == (6, 32) and scales.shape == (6, 2)
    assert torch.equal(unpack_mxfp4(codes, scales), w)
    # element 2i in the low nibble, 2i + 1 in the high one; value = E2M1[code] * 2^(scale - 127)
    e = float(scales[0, 0]) - 127
    assert float(w[0, 0]) == E2M1[int(codes[0, 0]) & 15] * 2.0 ** e
    assert float(w[0, 1]) == E2M1[int(codes[0, 0]) >> 4] * 2.0 ** e


def test_pack_refuses_values_off_the_grid():
    w = torch.zeros(1, 32)
    w[0, 0] = 0.3
    with pytest.raises(ValueError, match="MXFP4 grid"):
        pack_mxfp4(w)
    with pytest.raises(ValueError, match="multiple"):
        pack_mxfp4(torch.zeros(2, 20))


def test_gguf_dequantizes_the_repacked_blocks_to_the_same_values():
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    w = round_to_mxfp4(torch.randn(4, 64, generator=torch.Generator().manual_seed(1)))
    codes, scales = pack_mxfp4(w)
    # llama.cpp's repack (conversion/base.py repack_mxfp4_blocks): per group the scale byte, then 16 bytes,
    # byte j holding element j (low nibble) and element j + 16 (high nibble)
    vals = torch.stack((codes & 15, codes >> 4), dim=-1).reshape(4, 2, 32)
    qs = vals[:, :, :16] | (vals[:, :, 16:] << 4)
    raw = torch.cat((scales.unsqueeze(-1), qs), dim=-1).reshape(4, 34).numpy()
    assert np.array_equal(dequantize(raw, gguf.GGMLQuantizationType.MXFP4), w.numpy())
