"""Token sampling: logit bias, penalties, greedy, top-k, top-p, min-p, temperature, seeded draws.

The chain follows llama.cpp's order: bias -> penalties -> top-k -> top-p -> min-p ->
temperature -> draw. Temperature 0 (or top_k 1) is greedy. Every option is validated
when the Sampler is made, never per token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from archrun.errors import InvalidRequest, NumericalError, shown

F32 = np.float32


def _finite(name: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False):
    def check(_inst, _attr, value) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidRequest(f"{name} must be a finite number, got {shown(value)}")
        if lo is not None and (value <= lo if lo_open else value < lo):
            raise InvalidRequest(f"{name} must be {'>' if lo_open else '>='} {lo}, got {shown(value)}")
        if hi is not None and value > hi:
            raise InvalidRequest(f"{name} must be <= {hi}, got {shown(value)}")

    return check


def _python(value):
    """numpy scalars as the Python numbers they hold (np.int64(40) is accepted wherever 40 is; a
    numpy bool stays refused as a number)."""
    return value.item() if isinstance(value, np.integer | np.floating | np.bool_) else value


def _real(value):
    """A float option as a Python float: numpy scalars and ints converted (an int beyond float
    range becomes Inf, which the validator refuses), anything else left for the validator."""
    value = _python(value)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return math.inf
    return value


def _int_ge0(name: str):
    def check(_inst, _attr, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRequest(f"{name} must be a non-negative integer, got {shown(value)}")

    return check


@attrs.frozen
class SamplingParams:
    """Sampling options; defaults follow llama.cpp's command line."""

    temperature: float = attrs.field(default=0.8, converter=_real, validator=_finite("temperature", 0.0))
    top_k: int = attrs.field(default=40, converter=_python, validator=_int_ge0("top_k"))
    top_p: float = attrs.field(default=0.95, converter=_real, validator=_finite("top_p", 0.0, 1.0, lo_open=True))
    min_p: float = attrs.field(default=0.05, converter=_real, validator=_finite("min_p", 0.0, 1.0))
    repetition_penalty: float = attrs.field(default=1.0, converter=_real,
                                            validator=_finite("repetition_penalty", 0.0, lo_open=True))
    presence_penalty: float = attrs.field(default=0.0, converter=_real, validator=_finite("presence_penalty"))
    frequency_penalty: float = attrs.field(default=0.0, converter=_real, validator=_finite("frequency_penalty"))
    penalty_last_n: int = attrs.field(default=64, converter=_python, validator=_int_ge0("penalty_last_n"))
    logit_bias: Mapping[int, float] = attrs.field(factory=dict, converter=lambda v: _bias_dict(v))
    seed: int | None = attrs.field(default=None, converter=_python)

    @seed.validator
    def _seed(self, _attr, value) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InvalidRequest(f"seed must be a non-negative integer, got {shown(value)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class Sampler:
    """Draws the next token from logits; holds the seeded random generator of one generation."""

    def __init__(self, params: SamplingParams, n_vocab: int):
        if not isinstance(params, SamplingParams):
            raise InvalidRequest(f"params must be SamplingParams, got {type(params).__name__}")
        if isinstance(n_vocab, bool) or not isinstance(n_vocab, int | np.integer) or n_vocab < 1:
            raise InvalidRequest(f"n_vocab must be a positive integer, got {shown(n_vocab)}")
        self.params = params
        self.n_vocab = int(n_vocab)
        self.bias_ids, self.bias_values = _check_bias(params.logit_bias, n_vocab)
        self.rng = np.random.default_rng(params.seed)

    def check_logits(self, logits: np.ndarray) -> np.ndarray:
        """A float64 copy of logits [n_vocab] (InvalidRequest for anything else: another model's logits, a
        2-D array, values that are not numbers; NumericalError for NaN)."""
        x = _checked_logits(logits)
        if len(x) != self.n_vocab:
            raise InvalidRequest(f"logits have {len(x)} entries; this sampler draws from a vocabulary of "
                                 f"{self.n_vocab} (logits of another model?)")
        return x

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """Pick the next token id from float logits [vocab] given the ids so far."""
        x = self.adjusted(logits, history)
        if self.params.greedy:
            return int(np.argmax(x))
        ids, probs = self._kept(x)
        return int(ids[self.rng.choice(len(ids), p=probs)])

    def adjusted(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """float64 logits [vocab] after the logit bias and the penalties, made safe to sample
        (what greedy takes the argmax of; NumericalError for NaN logits)."""
        x = self.check_logits(logits)
        with np.errstate(over="ignore", invalid="ignore"):  # extreme options: Inf, Inf - Inf = NaN (below)
            if len(self.bias_ids):
                x[self.bias_ids] += self.bias_values
            _apply_penalties(x, _history(history, self.n_vocab, self.params), self.params)
        return _candidates(x)

    def _kept(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probs) a draw chooses among: adjusted logits through top-k, top-p, min-p, temperature."""
        p = self.params
        ids = np.argsort(-x, kind="stable")
        if p.top_k:
            ids = ids[: p.top_k]
        probs = _softmax(x[ids])
        ids, probs = _top_p(ids, probs, p.top_p)
        ids, probs = _min_p(ids, probs, p.min_p)
        return ids, _tempered(probs, p.temperature)

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The distribution `self(logits, history)` draws from, float64 [vocab] (one-hot when greedy).

        Speculative decoding's rejection rule compares it with a drafter's distribution; it
        runs the same chain as `__call__` without drawing.
        """
        x = self.adjusted(logits, history)
        out = np.zeros(len(x))
        if self.params.greedy:
            out[int(np.argmax(x))] = 1.0
            return out
        ids, probs = self._kept(x)
        out[ids] = probs
        return out


def _bias_dict(value: object) -> dict:
    """logit_bias as a plain dict (a mapping of token id -> bias); anything else is InvalidRequest."""
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"logit_bias must be a mapping of token id -> bias, got {type(value).__name__}")
    return dict(value)


def _bias_key(k: object) -> int:
    """A logit_bias key as a token id: an int (numpy ints too) or a decimal string (JSON keys);
    floats are refused rather than truncated."""
    if isinstance(k, int | np.integer) and not isinstance(k, bool | np.bool_):
        return int(k)
    if isinstance(k, str) and k.strip().lstrip("+-").isdecimal() and k.isascii():
        return int(k)
    raise InvalidRequest(f"logit_bias key {shown(k)} is not a token id")


def _check_bias(bias: Mapping[int, float], n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    ids, values = [], []
    for k, val in bias.items():
        tok = _bias_key(k)
        if not 0 <= tok < n_vocab:
            raise InvalidRequest(f"logit_bias token id {tok} is outside the vocabulary [0, {n_vocab})")
        val = _real(val)
        if isinstance(val, bool) or not isinstance(val, (int, float)) or math.isnan(val):
            raise InvalidRequest(f"logit_bias value for {tok} must be a number, got {shown(val)}")
        ids.append(tok)
        values.append(float(val))
    return np.array(ids, dtype=np.int64), np.array(values, dtype=np.float64)


def _history(history: Sequence[int] | None, n_vocab: int, p: SamplingParams) -> np.ndarray | None:
    """The ids the penalties read (the last penalty_last_n of history) as int64, or None when no penalty
    applies; InvalidRequest for a history that is not a sequence of ids in [0, n_vocab)."""
    if history is None:
        return None
    if isinstance(history, str | bytes | bytearray) or not isinstance(history, Sequence | np.ndarray):
        raise InvalidRequest(f"history must be a sequence of token ids, got {type(history).__name__}")
    if not p.penalty_last_n or len(history) == 0:
        return None
    if p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty:
        return None
    try:
        recent = np.asarray(history[-p.penalty_last_n:])
    except Exception:  # noqa: BLE001 - a sequence whose items fail to read
        raise InvalidRequest("history must be a sequence of token ids") from None
    if recent.ndim != 1 or recent.dtype.kind not in "iu" or recent.min() < 0 or recent.max() >= n_vocab:
        raise InvalidRequest(f"history must hold token ids in [0, {n_vocab})")
    return recent.astype(np.int64, copy=False)


def _apply_penalties(x: np.ndarray, recent: np.ndarray | None, p: SamplingParams) -> None:
    """llama.cpp penalties over the last penalty_last_n tokens `recent` (in place)."""
    if recent is None:
        return
    toks, counts = np.unique(recent, return_counts=True)
    vals = x[toks]
    vals = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    x[toks] = vals - counts * p.frequency_penalty - p.presence_penalty


def _checked_logits(logits: np.ndarray) -> np.ndarray:
    """A float64 copy of the model's logits [vocab]; NumericalError when any is NaN.

    Infinite logits are kept: +Inf means "certainly this token", -Inf "never" (see _candidates).
    """
    if isinstance(logits, str | bytes | bytearray):
        raise InvalidRequest(f"logits must be a 1-D array of numbers, got {type(logits).__name__}")
    try:
        x = np.array(logits, dtype=np.float64)
    except Exception:  # noqa: BLE001 - not numbers (objects, ragged lists, values that raise)
        raise InvalidRequest(f"logits must be a 1-D array of numbers, got {type(logits).__name__}") from None
    if x.ndim != 1 or not len(x):
        raise InvalidRequest(f"logits must be a non-empty 1-D array, got shape {x.shape}")
    if not _all_finite(x) and np.isnan(x).any():
        raise NumericalError(f"the model computed NaN logits ({int(np.isnan(x).sum())} of {len(x)}): its "
                             "activations overflowed float32; there is nothing to sample")
    return x


def _candidates(x: np.ndarray) -> np.ndarray:
    """Logits after bias and penalties, made safe to sample: NaN (Inf - Inf from extreme options)
    becomes -Inf; if any logit is +Inf only those tokens stay (equally likely); all -Inf is an
    InvalidRequest (the options exclude every token)."""
    if _all_finite(x):  # the usual case: nothing to change, one pass instead of four
        return x
    x[np.isnan(x)] = -np.inf
    top = np.isposinf(x)
    if top.any():
        return np.where(top, 0.0, -np.inf)
    if np.isneginf(x).all():
        raise InvalidRequest("logit_bias and penalties leave no token with a finite logit")
    return x


def _all_finite(x: np.ndarray) -> bool:
    """True only when float64 x holds no NaN or Inf, in one pass (a NaN or Inf makes the sum so); a
    False may also be a sum that overflowed, so callers then run the element-wise checks."""
    with np.errstate(over="ignore", invalid="ignore"):  # Inf - Inf, an overflow: just "not finite"
        return bool(np.isfinite(x.sum()))


def _tempered(probs: np.ndarray, temperature: float) -> np.ndarray:
    """probs ** (1 / temperature), renormalised; the most likely token stays at exponent 0, so a
    tiny temperature is greedy rather than 0 / 0."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        logp = np.log(probs)
        z = (logp - logp.max()) / temperature
    z[np.isnan(z)] = -np.inf
    return _softmax(z)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _top_p(ids: np.ndarray, probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Keep the smallest prefix (probs sorted descending) whose mass reaches top_p."""
    if top_p >= 1.0:
        return ids, probs
    keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
    keep = min(keep, len(ids))
    return ids[:keep], probs[:keep] / probs[:keep].sum()


def _min_p(ids: np.ndarray, probs: np.ndarray, min_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Keep tokens whose probability is at least min_p times the best one's."""
    if min_p <= 0.0:
        return ids, probs
    keep = probs >= min_p * probs[0]
    return ids[keep], probs[keep] / probs[keep].sum()
