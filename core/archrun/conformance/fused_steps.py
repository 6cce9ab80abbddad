"""A fused layer's one-token step against the same layer op by op: the check a plugin's layer kernel
(an op's `fused_layer`) must pass to give the op path's bits (docs/plugins.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def check_fused_steps(model: Any, same: Callable[[np.ndarray, np.ndarray], None],
                      same_slot: Callable[[Any, Any], None], threads: int = 1,
                      select: Callable[[Any], bool] = lambda fb: True, context: int = 5, steps: int = 4,
                      seed: int = 3) -> None:
    """For every fused block of `model` that `select(fb)` keeps: two fresh caches get the same `context`
    random rows op by op (model.run_block), then `steps` random tokens go through the fused block on one
    and op by op on the other, on `threads` kernel threads. Each step's output must be `same` (e.g.
    np.testing.assert_array_equal), and `same_slot(fused_slot, op_slot)` must accept the layer's slots after
    it (the cached rows, a recurrent state)."""
    from archrun.kernels.matmul import qmatrix

    assert model.fused_blocks is not None, "the model decodes op by op: nothing fused to check"
    rng = np.random.default_rng(seed)
    before = qmatrix.current_threads()
    qmatrix.set_threads(threads)
    try:
        for i, (lp, fb) in enumerate(zip(model.plan.layers, model.fused_blocks, strict=True)):
            if not select(fb):
                continue
            ops, fused = model.init_cache(context + steps + 1), model.init_cache(context + steps + 1)
            rows = rng.standard_normal((context, model.descriptor.n_embd)).astype(np.float32)
            for cache in (ops, fused):
                model.run_block(lp, rows, cache.slots[i], 0, model.rope_angles(np.arange(context)))
            for pos in range(context, context + steps):
                x = rng.standard_normal(model.descriptor.n_embd).astype(np.float32)
                angles = model.rope_angles(np.array([pos]))
                want = model.run_block(lp, x[None].copy(), ops.slots[i], pos, angles)[0]
                fb(x, fused.slots[i], pos, angles)
                same(x, want)
                same_slot(fused.slots[i], ops.slots[i])
    finally:
        qmatrix.set_threads(before)


def check_decode_bits(model: Any, path: Any, n_tokens: int, seed: int = 6, capacity: int = 16) -> np.ndarray:
    """The whole model token by token, fused (`model`) against the same file loaded op by op
    (`archrun.load(path, fused=False)`): every step's logits the same bits. Returns the token ids it fed."""
    import archrun

    ops = archrun.load(path, fused=False)
    assert model.fused_blocks is not None and ops.fused_blocks is None
    ids = np.random.default_rng(seed).integers(0, model.descriptor.n_vocab, n_tokens)
    caches = [m.init_cache(max(capacity, n_tokens)) for m in (model, ops)]
    for t in ids:
        a, b = (m.forward_step([t], cache) for m, cache in zip((model, ops), caches, strict=True))
        np.testing.assert_array_equal(a, b)
    return ids
