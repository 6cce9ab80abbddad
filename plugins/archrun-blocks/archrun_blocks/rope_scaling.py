"""Rotary-embedding frequency scaling as plain numpy math.

`frequencies(kind, n_rot, freq_base, ...)` returns `(inv_freq, attention_factor)`:
`inv_freq` is float64 [n_rot/2] (angle of pair i at position p is p * inv_freq[i]) and
`attention_factor` multiplies both cos and sin (1.0 when the kind has none). The semantics are
those of HF transformers' `modeling_rope_utils.ROPE_INIT_FUNCTIONS` ("linear", "yarn",
"longrope", "llama3"; "none" is HF's "default"), because HF is the oracle for archrun's tiny
reference models. HF builds its tables in float32; this module works in float64 and leaves the
single rounding to the caller, like `reference.Rope`. The "none"/"linear" paths and the final
`freq_factors` division are written exactly as `reference.Rope` writes them, so swapping this
module in changes no existing output.

How llama.cpp GGUF files carry each kind
----------------------------------------
Key names are gguf-py `Keys.Rope` / llama.cpp `llama-arch.cpp`, all prefixed `<arch>.`:

- `rope.dimension_count` -> n_rot; `rope.freq_base` -> freq_base.
- `rope.scaling.type` (string "none" | "linear" | "yarn" | "longrope") -> kind. llama.cpp
  defaults an absent key to "linear", and an absent `factor` to 1, which is no scaling.
  There is no "llama3" value: see `rope_freqs` below.
- `rope.scaling.factor` (older files: `rope.scale_linear`) -> factor. llama.cpp stores its
  inverse as freq_scale = 1/factor and forces freq_scale = 1 when the type is "none".
- `rope.scaling.original_context_length` -> original_context (llama.cpp's n_ctx_orig_yarn,
  falling back to `context_length`).
- `rope.scaling.attn_factor` -> attn_scale. llama.cpp (hparams.rope_attn_factor) multiplies it
  into the cos/sin magnitude for every kind. Phi-3 longrope files keep the finished LongRoPE
  magnitude sqrt(1 + ln(s)/ln(orig)) here (s = context_length/original_context).
- `rope.scaling.yarn_beta_fast` / `rope.scaling.yarn_beta_slow` -> beta_fast / beta_slow
  (llama.cpp reads them only for architectures that ask for them; default 32 / 1).
- `rope.scaling.yarn_ext_factor` -> ext_factor (llama.cpp: unset means 1.0 for yarn, else 0.0).
- `rope.scaling.yarn_attn_factor` -> attn_factor: convert_hf_to_gguf.py writes HF's
  `attention_factor` here. llama.cpp then recomputes the yarn magnitude itself whenever
  ext_factor != 0, so in llama.cpp this key has no effect on yarn (see the differences below).
- `rope.scaling.yarn_log_multiplier` = 0.1 * HF `mscale_all_dim` (DeepSeek-V2/V3). llama.cpp
  divides by 0.1 at load, takes mscale = 1.0, except for deepseek2 when mscale_all_dim != 1,
  where mscale = mscale_all_dim.
- `rope.scaling.finetuned` and `rope.scaling.alpha` do not change these frequencies.
- Tensor `rope_freqs.weight` [n_rot/2] -> freq_factors, per-frequency divisors. llama3 scaling
  arrives this way: the converter bakes `llama3_freq_factors` into it and writes no scaling
  type.
- Tensors `rope_factors_long.weight` / `rope_factors_short.weight` [n_rot/2] -> long_factors /
  short_factors. Phi-3 files write neither a scaling type nor a factor, so a loader must
  recognise longrope from these tensors and take the magnitude from `attn_factor` (leave
  factor at 1.0 so that it is not applied twice). llama.cpp uses the long set iff
  n_ctx_per_seq > n_ctx_orig_yarn. If `rope_freqs` is present as well, it wins.

Where llama.cpp's yarn differs from HF's (this module follows HF)
----------------------------------------------------------------
- ggml (`rope_yarn`, `ggml_rope_yarn_corr_dims`) mixes angles per element, in float32:
  theta = theta_interp * (1 - mix) + theta_extrap * mix, with mix = ext_factor *
  (1 - clamp((i - low) / max(0.001, high - low), 0, 1)). The angles are linear in the
  position, so this equals HF's mixing of inverse frequencies when ext_factor = 1. The
  `ext_factor` keyword exposes the llama.cpp generalisation; HF has no such parameter.
- ggml always floors/ceils the correction dims. HF does that only when `truncate` is true,
  and gpt-oss sets it to false.
- Magnitude: ggml multiplies cos/sin by attn_factor * (1 + 0.1 ln(1/freq_scale)) whenever
  ext_factor != 0. Current llama.cpp (llama-context.cpp, after PR #17945) sets attn_factor to
  get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) / (1 + 0.1 ln f) * rope_attn_factor,
  which cancels ggml's term, so the net magnitude is HF's default times
  `rope.scaling.attn_factor`. HF's explicit `attention_factor` replaces the default instead.
  llama.cpp ignores it for yarn and applies no magnitude when ext_factor == 0, which is why
  `frequencies` returns 1.0 when ext_factor == 0.
- llama.cpp's ramp guard max(0.001, high - low) and HF's "high += 0.001 if equal" differ only
  when 0 < high - low < 0.001, which can happen only with truncate=False.
- DeepSeek's extra softmax-scale mscale**2 is attention math, outside this module.

We follow HF because it is the reference for the tiny test models. For real GGUF files the
loader maps the keys above onto these parameters, which reproduces llama.cpp up to float32
rounding, except where llama.cpp ignores `yarn_attn_factor` and always truncates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

KINDS = ("none", "linear", "yarn", "longrope", "llama3")

FactorsLike = Sequence[float] | np.ndarray | None


def frequencies(
    kind: str,
    n_rot: int,
    freq_base: float,
    *,
    factor: float = 1.0,
    original_context: int = 0,
    context: int = 0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    ext_factor: float = 1.0,
    truncate: bool = True,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attn_factor: float | None = None,
    attn_scale: float = 1.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    short_factors: FactorsLike = None,
    long_factors: FactorsLike = None,
    freq_factors: FactorsLike = None,
) -> tuple[np.ndarray, float]:
    """Inverse frequencies float64 [n_rot/2] and the cos/sin magnitude for one rope table.

    kind: "none" | "linear" | "yarn" | "longrope" | "llama3" (HF rope_type; "none" = "default").
    factor: context-extension factor, must be > 0. Used by linear, yarn, llama3 and longrope's
        default magnitude. Ignored by "none", as llama.cpp does.
    original_context: pre-extension training context (HF original_max_position_embeddings).
        Required by yarn, longrope and llama3.
    context: the context the table serves. longrope uses long_factors iff context >
        original_context (HF: max position + 1; llama.cpp: n_ctx per sequence).
    beta_fast, beta_slow, truncate, mscale, mscale_all_dim: HF yarn parameters.
    ext_factor: llama.cpp's yarn extrapolation mix. 1.0 is HF. 0.0 is plain linear
        interpolation with magnitude 1.
    attn_factor: HF `attention_factor`. It replaces the yarn/longrope default magnitude and
        is rejected for other kinds, where HF has none.
    attn_scale: a plain extra multiplier on the magnitude (GGUF `rope.scaling.attn_factor`).
    low_freq_factor, high_freq_factor: llama3 band edges.
    short_factors, long_factors: longrope per-frequency divisors, each [n_rot/2].
    freq_factors: per-frequency divisors [n_rot/2] (GGUF `rope_freqs`), applied after every
        kind. This matches ggml, which divides theta_extrap before the yarn mix, and the mix
        is linear.
    Raises ValueError on unknown kinds or bad parameters.
    """
    half = _check_common(kind, n_rot, freq_base, factor, original_context, context, attn_factor, attn_scale)
    if kind != "longrope" and (short_factors is not None or long_factors is not None):
        raise ValueError(f"rope scaling {kind!r}: short_factors/long_factors only apply to 'longrope'")
    inv = base_inv_freq(n_rot, freq_base)
    attention = 1.0
    if kind == "linear":
        inv = inv / factor
    elif kind == "yarn":
        _check_yarn(freq_base, original_context, beta_fast, beta_slow, ext_factor)
        inv = _yarn_inv_freq(inv, n_rot, freq_base, factor, original_context, beta_fast, beta_slow, ext_factor,
                             truncate)
        attention = _yarn_attention(factor, mscale, mscale_all_dim) if ext_factor != 0 else 1.0
    elif kind == "longrope":
        ext = _longrope_divisors(half, original_context, context, short_factors, long_factors, freq_factors)
        inv = inv / ext
        attention = _longrope_attention(factor, original_context)
    elif kind == "llama3":
        inv = inv / llama3_freq_factors(n_rot, freq_base, factor=factor, original_context=original_context,
                                        low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor)
    if attn_factor is not None:
        attention = float(attn_factor)
    if freq_factors is not None:
        inv = inv / _per_frequency(freq_factors, half, "freq_factors")
    return inv, attention * float(attn_scale)


def base_inv_freq(n_rot: int, freq_base: float) -> np.ndarray:
    """Unscaled theta_i = base^(-2i/n_rot), float64 [n_rot/2], with reference.Rope's exact expression."""
    return freq_base ** (-np.arange(n_rot // 2, dtype=np.float64) * 2.0 / n_rot)


def yarn_correction_range(
    n_rot: int, freq_base: float, original_context: int, beta_fast: float, beta_slow: float, truncate: bool = True
) -> tuple[float, float]:
    """(low, high) pair indices of yarn's ramp; pairs below low extrapolate, above high interpolate.

    Pair index d completes `beta` rotations over original_context tokens when
    d = n_rot * ln(original_context / (2 pi beta)) / (2 ln base). The clamp to n_rot - 1 (not
    n_rot/2 - 1) is HF's and ggml's.
    """
    low = _yarn_correction_dim(beta_fast, n_rot, freq_base, original_context)
    high = _yarn_correction_dim(beta_slow, n_rot, freq_base, original_context)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, n_rot - 1)


def llama3_freq_factors(
    n_rot: int,
    freq_base: float,
    *,
    factor: float,
    original_context: int,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> np.ndarray:
    """llama3's per-frequency divisors float64 [n_rot/2], what a GGUF `rope_freqs` tensor holds.

    Wavelengths shorter than original_context/high_freq_factor keep their frequency (divisor
    1). Wavelengths longer than original_context/low_freq_factor are divided by factor. The
    band between them blends the two inverse frequencies linearly in original_context/wavelen.
    """
    _check_llama3(factor, original_context, low_freq_factor, high_freq_factor)
    inv = base_inv_freq(n_rot, freq_base)
    wavelen = 2 * math.pi / inv
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    # Blend as 1/((1-s)/factor + s), the inverse of HF's (1-s)*inv/factor + s*inv and llama.cpp's converter formula.
    medium = 1.0 / ((1 - smooth) / factor + smooth)
    divisors = np.where(wavelen > original_context / low_freq_factor, factor, medium)
    return np.where(wavelen < original_context / high_freq_factor, 1.0, divisors)


# -- yarn ------------------------------------------------------------------------------------------------------------


def _yarn_correction_dim(num_rotations: float, n_rot: int, freq_base: float, original_context: int) -> float:
    # Same operation order as HF's find_correction_dim, so truncation lands on the same integer.
    return (n_rot * math.log(original_context / (num_rotations * 2 * math.pi))) / (2 * math.log(freq_base))


def _yarn_inv_freq(inv, n_rot, freq_base, factor, original_context, beta_fast, beta_slow, ext_factor, truncate):
    """inv [n_rot/2] -> yarn-mixed inverse frequencies [n_rot/2]."""
    low, high = yarn_correction_range(n_rot, freq_base, original_context, beta_fast, beta_slow, truncate)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    ramp = np.clip((np.arange(n_rot // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolate = ext_factor * (1.0 - ramp)  # share of the unscaled frequency; fast pairs keep theirs
    return (inv / factor) * (1.0 - extrapolate) + inv * extrapolate


def _get_mscale(scale: float, mscale: float = 1.0) -> float:
    # HF's get_mscale: no magnitude change unless the context is actually extended.
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn_attention(factor: float, mscale: float | None, mscale_all_dim: float | None) -> float:
    # HF tests truthiness, so 0 or None on either side falls back to the plain 0.1 ln(factor) + 1.
    if mscale and mscale_all_dim:
        return float(_get_mscale(factor, mscale) / _get_mscale(factor, mscale_all_dim))
    return _get_mscale(factor)


# -- longrope --------------------------------------------------------------------------------------------------------


def _longrope_divisors(half, original_context, context, short_factors, long_factors, freq_factors) -> np.ndarray:
    """The long or short divisor set [n_rot/2], checked."""
    if original_context <= 0:
        raise ValueError("rope scaling 'longrope' needs original_context > 0 (original_max_position_embeddings)")
    if short_factors is None or long_factors is None:
        raise ValueError("rope scaling 'longrope' needs both short_factors and long_factors")
    if freq_factors is not None:
        # Both would divide the same frequencies. llama.cpp lets rope_freqs win; we refuse the ambiguity.
        raise ValueError("rope scaling 'longrope' takes short/long factors, not freq_factors as well")
    short = _per_frequency(short_factors, half, "short_factors")
    long = _per_frequency(long_factors, half, "long_factors")
    return long if context > original_context else short


def _longrope_attention(factor: float, original_context: int) -> float:
    # LongRoPE's magnitude, with the same conventions as HF.
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_context))


# -- checks ----------------------------------------------------------------------------------------------------------


def _check_common(kind, n_rot, freq_base, factor, original_context, context, attn_factor, attn_scale) -> int:
    """Validate what every kind shares; return n_rot/2."""
    if kind not in KINDS:
        raise ValueError(f"unknown rope scaling {kind!r}; expected one of {KINDS}")
    if not isinstance(n_rot, int | np.integer) or n_rot <= 0 or n_rot % 2:
        raise ValueError(f"rope n_rot must be a positive even integer, got {n_rot!r}")
    _positive(freq_base, "freq_base")
    _positive(factor, "factor")
    if original_context < 0 or context < 0:
        raise ValueError(f"rope contexts must be >= 0, got original_context={original_context}, context={context}")
    if attn_factor is not None:
        if kind not in ("yarn", "longrope"):
            raise ValueError(f"rope scaling {kind!r} has no attention factor; use attn_scale for a plain multiplier")
        _positive(attn_factor, "attn_factor")
    _positive(attn_scale, "attn_scale")
    return n_rot // 2


def _check_yarn(freq_base, original_context, beta_fast, beta_slow, ext_factor) -> None:
    if original_context <= 0:
        raise ValueError("rope scaling 'yarn' needs original_context > 0 (original_max_position_embeddings)")
    if freq_base <= 1:
        raise ValueError(f"rope scaling 'yarn' needs freq_base > 1 (it divides by ln base), got {freq_base}")
    _positive(beta_fast, "beta_fast")
    _positive(beta_slow, "beta_slow")
    if beta_fast < beta_slow:
        raise ValueError(f"rope yarn needs beta_fast >= beta_slow, got {beta_fast} < {beta_slow}")
    if not 0.0 <= ext_factor <= 1.0:
        raise ValueError(f"rope yarn ext_factor must be in [0, 1], got {ext_factor}")


def _check_llama3(factor, original_context, low_freq_factor, high_freq_factor) -> None:
    _positive(factor, "factor")
    if original_context <= 0:
        raise ValueError("rope scaling 'llama3' needs original_context > 0 (original_max_position_embeddings)")
    _positive(low_freq_factor, "low_freq_factor")
    if high_freq_factor <= low_freq_factor:
        raise ValueError(
            f"rope llama3 needs high_freq_factor > low_freq_factor, got {high_freq_factor} <= {low_freq_factor}"
        )


def _positive(value, name: str) -> None:
    if not (isinstance(value, int | float | np.number) and math.isfinite(value) and value > 0):
        raise ValueError(f"rope {name} must be a finite number > 0, got {value!r}")


def _per_frequency(values, half: int, name: str) -> np.ndarray:
    """A per-frequency divisor vector as float64 [half], all finite and > 0."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (half,):
        raise ValueError(f"rope {name} must have length n_rot/2 = {half}, got shape {arr.shape}")
    if not np.all(np.isfinite(arr) & (arr > 0)):
        raise ValueError(f"rope {name} must be finite and > 0")
    return arr
