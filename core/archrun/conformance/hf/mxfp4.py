"""MXFP4 weights as released checkpoints store them, for fixtures whose converter reads only that layout.

DeepSeek-V4's checkpoints (and compressed-tensors' "mxfp4-pack-quantized") hold a 4-bit matrix as
``<name>.weight`` uint8 [rows, cols/2] (element 2i in the low nibble, 2i+1 in the high one, each an
E2M1 code) and ``<name>.scale`` uint8 [rows, cols/32] (one E8M0 biased exponent per group of 32
consecutive elements of a row): element = E2M1[code] * 2^(scale - 127). llama.cpp's converter repacks
that into GGUF MXFP4 without touching a value.

A tiny float32 model can only be compared exactly with its converted file when its weights already
lie on that grid: ``round_to_mxfp4`` puts a float tensor there (per group of 32 along the last dim,
the smallest power-of-two scale whose E2M1 range holds the group, each element to the nearest
E2M1 value), and ``pack_mxfp4`` writes such a tensor in the checkpoint layout, refusing one that
is not exactly representable. torch is imported by the functions.
"""

from __future__ import annotations

#: The 16 E2M1 values in code order (codes 8-15 are the negatives of 0-7).
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

GROUP = 32


def _groups(t):
    if t.shape[-1] % GROUP:
        raise ValueError(f"MXFP4 rows are groups of {GROUP}: last dim {t.shape[-1]} is not a multiple")
    return t.reshape(*t.shape[:-1], t.shape[-1] // GROUP, GROUP)


def _exponents(g):
    """The E8M0 exponent of each group: the smallest e with max |group| <= 6 * 2^e (0 for an all-zero group)."""
    import torch

    amax = g.abs().amax(dim=-1)
    e = torch.ceil(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)) / 6.0))
    return torch.where(amax > 0, e, torch.zeros_like(e)).clamp(-127, 127)


def round_to_mxfp4(t):
    """A float32 copy of ``t`` whose every group of 32 (last dim) is exactly an MXFP4 block."""
    import torch

    g = _groups(t.detach().float())
    scale = torch.exp2(_exponents(g)).unsqueeze(-1)
    grid = torch.tensor(E2M1[:8], dtype=torch.float32)
    mag = (g.abs() / scale).unsqueeze(-1)
    nearest = grid[(mag - grid).abs().argmin(dim=-1)]
    return (torch.sign(g) * nearest * scale).reshape(t.shape).to(torch.float32)


def pack_mxfp4(t):
    """``(codes uint8 [rows, cols/2], scales uint8 [rows, cols/32])`` of a 2-D tensor on the MXFP4 grid.

    Raises ``ValueError`` when a value is not exactly representable (round it with ``round_to_mxfp4``
    first): a packing that changed a weight would make the fixture's file differ from its HF model.
    """
    import torch

    if t.dim() != 2:
        raise ValueError(f"MXFP4 packs a matrix, not a tensor of shape {tuple(t.shape)}")
    g = _groups(t.detach().float())
    e = _exponents(g)
    mag = g.abs() / torch.exp2(e).unsqueeze(-1)
    grid = torch.tensor(E2M1[:8], dtype=torch.float32)
    idx = (mag.unsqueeze(-1) - grid).abs().argmin(dim=-1)
    if not torch.equal(grid[idx], mag):
        bad = (grid[idx] != mag).nonzero()[0].tolist()
        raise ValueError(f"value at group {bad} is not on the MXFP4 grid (round_to_mxfp4 the weights first)")
    codes = (idx + 8 * torch.signbit(g).to(idx.dtype) * (idx > 0)).to(torch.uint8).reshape(t.shape)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), (e + 127).to(torch.uint8).contiguous()


def unpack_mxfp4(packed, scales):
    """The float32 matrix a checkpoint's MXFP4 codes and E8M0 scales hold (the inverse of ``pack_mxfp4``)."""
    import torch

    grid = torch.tensor(E2M1, dtype=torch.float32)
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1).long()
    values = grid[codes].reshape(packed.shape[0], -1, GROUP)
    factor = torch.exp2(scales.float() - 127.0).unsqueeze(-1)
    return (values * factor).reshape(packed.shape[0], -1)

