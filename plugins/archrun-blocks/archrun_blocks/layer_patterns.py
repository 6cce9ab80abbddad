"""The built-in layer patterns (archrun.describe.layers): llama.cpp's rules for which layers have no token
mixer, are recurrent, sliding-window or without rope, from a file's keys and its family's hints.

mixerless (only when the family names a `mixerless` op): the layers whose per-layer
`attention.head_count_kv` is 0 and whose per-layer `feed_forward_length` is not (llama.cpp's
nemotron_h: an FFN-only block).
recurrent: the file's per-layer `attention.recurrent_layers` flags (llama.cpp's key, newer than
gguf-py); every layer of a file without attention heads whose family names a recurrent op; with
`full_attention_interval` P every layer but each P-th; else the layers whose per-layer
`attention.head_count_kv` is 0, those without a token mixer excepted.
sliding (only with `attention.sliding_window` > 0): the file's `attention.sliding_window_pattern`
(a flag per layer, or a period P), else the family's `swa_period` P: layer i slides iff
i % P < P - 1.
nope: the family's `nope_period` P (every P-th layer, i % P == P - 1) and, with `nope_global`, the
full-attention layers of a model that has sliding ones.
"""

from __future__ import annotations

import numpy as np

from archrun.describe.layers import LayerFacts, LayerPattern
from archrun.errors import MetadataError

RECURRENT_LAYERS_KEY = "attention.recurrent_layers"
SLIDING_PATTERN_KEY = "attention.sliding_window_pattern"


def marked_recurrent(f: LayerFacts) -> tuple[bool, ...] | None:
    marked = f.value(RECURRENT_LAYERS_KEY)
    if marked is None:
        return None
    if not isinstance(marked, np.ndarray) or marked.ndim != 1 or len(marked) < f.n_layer:
        raise MetadataError(f"'{f.arch}.{RECURRENT_LAYERS_KEY}' must hold a flag per layer ({f.n_layer})")
    return tuple(bool(x) for x in marked[:f.n_layer])


def attention_free(f: LayerFacts) -> tuple[bool, ...] | None:
    return (True,) * f.n_layer if not any(f.heads) and f.hints.recurrent is not None else None


def full_attention_interval(f: LayerFacts) -> tuple[bool, ...] | None:
    if not f.has("full_attention_interval"):
        return None
    period = f.period("full_attention_interval", f.get("full_attention_interval", int))
    return tuple((i + 1) % period != 0 for i in range(f.n_layer))


def kv_heads_zero(f: LayerFacts) -> tuple[bool, ...] | None:
    if not isinstance(f.value("attention.head_count_kv"), np.ndarray):
        return None
    return tuple(kv == 0 and not none for kv, none in zip(f.heads_kv, f.layers("mixerless"), strict=True))


def ffn_without_heads(f: LayerFacts) -> tuple[bool, ...] | None:
    n_ff = f.value("feed_forward_length")
    if f.hints.mixerless is None or not isinstance(n_ff, np.ndarray) \
            or not isinstance(f.value("attention.head_count_kv"), np.ndarray):
        return None
    if len(n_ff) != f.n_layer:
        raise MetadataError(f"'{f.arch}.feed_forward_length' must hold a width per layer ({f.n_layer})")
    return tuple(kv == 0 and int(ff) > 0 for kv, ff in zip(f.heads_kv, n_ff, strict=True))


def _periodic(f: LayerFacts, period: int) -> tuple[bool, ...]:
    if not f.get("attention.sliding_window", int, 0) or not period:
        return (False,) * f.n_layer
    return tuple(i % period < period - 1 for i in range(f.n_layer))


def sliding_window_pattern(f: LayerFacts) -> tuple[bool, ...] | None:
    pattern = f.value(SLIDING_PATTERN_KEY)
    if pattern is None:
        return None
    if isinstance(pattern, np.ndarray):
        if len(pattern) != f.n_layer:
            raise MetadataError(f"{SLIDING_PATTERN_KEY} must have one entry per layer")
        return tuple(bool(x) for x in pattern)
    return _periodic(f, f.period(SLIDING_PATTERN_KEY, pattern))


def swa_period(f: LayerFacts) -> tuple[bool, ...]:
    return _periodic(f, f.hints.swa_period)


def nope_period(f: LayerFacts) -> tuple[bool, ...]:
    period, sliding = f.hints.nope_period, f.layers("sliding")
    glob = f.hints.nope_global and any(sliding)
    return tuple((bool(period) and i % period == period - 1) or (glob and not sliding[i]) for i in range(f.n_layer))


LAYER_PATTERNS = {
    "ffn_without_heads": LayerPattern("mixerless", ffn_without_heads, 10,
                                      "layers with a feed-forward width and head_count_kv 0 (the family names "
                                      "a mixerless op)"),
    "recurrent_layers_key": LayerPattern("recurrent", marked_recurrent, 40, "the file's attention.recurrent_layers"),
    "attention_free": LayerPattern("recurrent", attention_free, 30, "no attention heads: every layer recurrent"),
    "full_attention_interval": LayerPattern("recurrent", full_attention_interval, 20,
                                            "every layer but each full_attention_interval-th"),
    "kv_heads_zero": LayerPattern("recurrent", kv_heads_zero, 10, "layers whose head_count_kv is 0"),
    "sliding_window_pattern": LayerPattern("sliding", sliding_window_pattern, 20,
                                           "the file's attention.sliding_window_pattern (flags or a period)"),
    "swa_period": LayerPattern("sliding", swa_period, 10, "the family's swa_period"),
    "nope_period": LayerPattern("nope", nope_period, 10, "the family's nope_period and nope_global"),
}
