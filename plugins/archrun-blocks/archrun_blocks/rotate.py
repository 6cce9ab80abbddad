"""The rotation step shared by the rope op's fused part and op-by-op kernel."""

from __future__ import annotations

from numba import njit

from archrun.kernels._jit import JIT


@njit(**dict(JIT, inline="always"))
def rotate_pairs(xi, o, n_rot, neox, c, s):
    """o[ia], o[ib] = rotation of (xi[ia], xi[ib]) by angle i (cos c[i], sin s[i]) for i < n_rot/2:
    NEOX pairs (i, i + n_rot/2), NORM pairs (2i, 2i + 1). o may be xi (each pair is read first)."""
    half = n_rot // 2
    for i in range(half):
        ia = i if neox else 2 * i
        ib = i + half if neox else 2 * i + 1
        a = xi[ia]
        b = xi[ib]
        o[ia] = a * c[i] - b * s[i]
        o[ib] = b * c[i] + a * s[i]
