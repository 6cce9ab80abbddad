"""Draft lengths: `AdaptiveLength` picks each round's k from the acceptance measured per draft depth and the
measured cost of each round length; `Stats` counts what was drafted and accepted.
"""

from __future__ import annotations

import attrs
import numpy as np

from archrun.errors import InvalidRequest
from archrun.generation.speculative.drafting import MAX_DRAFT


class AdaptiveLength:
    """Draft length from the acceptance per draft depth and the measured cost of each round length.

    p[i] is the chance that draft i + 1 is kept given that the drafts before it were (the target
    tested it), estimated per depth from the tested drafts: a round that keeps j of its k drafts
    saw depths 1..j agree and, when j < k, depth j + 1 disagree; the drafts after the first
    rejected one were never tested and count nowhere. Acceptance is not one independent rate:
    a lookup either copies (every depth agrees) or not (the first draft fails), so depth 1 is
    uncertain while the deeper depths, tested only once the first agreed, are mostly kept.
    Each depth's counts decay by `decay` with each new observation of it. Depth 1 starts from a
    prior of `prior` drafts at `rate`, decaying with its counts (its estimate can reach 0 or 1
    where the drafts always fail or always agree); each deeper depth leans on the depth before
    it with a lasting weight of `pool` drafts (a depth not yet tested takes the shallower
    depth's rate, and one miss at a depth tested once does not make it a wall: the end of a
    copied run falls at any depth).

    A round of k drafts decides E(k) = 1 + p[0] + p[0] p[1] + ... + p[0]..p[k-1] tokens and costs
    t(k) seconds (drafting and the target step of 1 + k rows), measured per k as generation goes
    (an exponential average; a step's cost is not linear in its rows: the op-by-op span path gets
    dearer per row as the span grows). A k not measured yet is priced from the measured ones:
    linearly between two of them (an over-estimate where the cost is convex), beyond the longest
    with the slope between the two longest (the steepest, where the cost is convex), below the
    shortest (or with nothing measured) by the shape 1 + k / 4; a longer round never counts as
    cheaper than a shorter one. The round drafts
    the k in [0, k_max] deciding the most tokens per second; while that is 0, every `probe`-th
    round drafts one token to keep testing (text turns repetitive, drafts start to agree).

    One-off costs (the first call of a step shape, another process taking the cores) are
    bounded: a sample counts at most `spike` times the current estimate, and a k's first sample,
    when dearer than its estimate, moves the estimate by the weight `w` only. The load moves every
    length alike: a sample's ratio to its estimate moves the other measured lengths by the weight
    `w_load` (a length not drafted for a while does not keep the load of its last measurement),
    and a sample cheaper than the estimate of a shorter round moves that one down by `w`.
    """

    def __init__(self, k_max: int = 5, rate: float = 0.6, decay: float = 0.7, probe: int = 4,
                 prior: float = 1.0, pool: float = 2.0, spike: float = 2.0, w: float = 0.3, w_load: float = 0.1):
        if isinstance(k_max, bool) or not isinstance(k_max, int) or not 1 <= k_max <= MAX_DRAFT:
            raise InvalidRequest(f"the draft length must be an integer in [1, {MAX_DRAFT}], got {k_max!r}")
        self.k_max, self.rate0, self.decay, self.probe = k_max, rate, decay, probe
        self.spike, self.w, self.w_load = spike, w, w_load
        self.kept = np.zeros(k_max)              # [k_max] decayed counts of kept drafts per depth
        self.tested = np.zeros(k_max)            # [k_max] decayed counts of tested drafts per depth
        self.weight = np.full(k_max, float(pool))   # [k_max] each depth's prior, in drafts
        self.weight[0] = prior                        # (depth 1's decays with its counts)
        self.cost_s = np.full(k_max + 1, np.nan)  # [k_max + 1] seconds of a round of k drafts (nan: unmeasured)
        self.rounds = 0

    def acceptance(self) -> np.ndarray:
        """p [k_max]: P(draft i + 1 kept | drafts 1..i kept), each depth on its shallower neighbour's prior."""
        p = np.empty(self.k_max)
        prev = self.rate0
        for i in range(self.k_max):
            w = self.weight[i]
            prev = p[i] = (self.kept[i] + w * prev) / (self.tested[i] + w) if self.tested[i] + w > 0 else prev
        return p

    @property
    def rate(self) -> float:
        """The first draft's acceptance rate (whether the drafter's guesses agree at all)."""
        return float(self.acceptance()[0])

    def expected(self) -> np.ndarray:
        """E [k_max + 1]: tokens a round of k drafts decides, k = 0..k_max."""
        return 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(self.acceptance()))])

    def costs(self) -> np.ndarray:
        """t [k_max + 1]: seconds of a round of k drafts, measured or priced from the measured ones
        (relative 1 + k / 4 while nothing is measured); non-decreasing in k."""
        ks = np.arange(self.k_max + 1, dtype=np.float64)
        known = np.flatnonzero(~np.isnan(self.cost_s))
        if not len(known):
            return 1.0 + ks / 4
        c = self.cost_s[known]
        lo, hi = known[0], known[-1]
        t = np.interp(ks, known, c)                                   # linear between measured lengths
        slope = (c[-1] - c[-2]) / (hi - known[-2]) if len(known) > 1 else c[0] / (4 + lo)
        t[hi + 1:] = c[-1] + (ks[hi + 1:] - hi) * max(slope, 0.0)    # beyond: the longest measured slope
        t[:lo] = c[0] * (4 + ks[:lo]) / (4 + lo)                      # below: the prior's shape
        return np.maximum.accumulate(t)

    @property
    def k(self) -> int:
        """The draft length deciding the most tokens per second (0: drafting does not pay)."""
        return int(np.argmax(self.expected() / self.costs()))

    def next(self) -> int:
        """Tokens to draft this round (0: a plain step). Call once per round."""
        self.rounds += 1
        if self.rounds == 1 and np.isnan(self.cost_s).all():
            return 0  # a plain step first: it measures what a step costs
        k = self.k
        return k if k or self.rounds % self.probe else 1

    def update(self, drafted: int, accepted: int) -> None:
        """A round drafted `drafted` tokens and the target kept `accepted` of them."""
        tested = min(accepted + 1, drafted)               # depths 1..accepted kept, the next one (if any) not
        self.kept[:tested] *= self.decay
        self.tested[:tested] *= self.decay
        self.weight[:min(tested, 1)] *= self.decay
        self.kept[:accepted] += 1.0
        self.tested[:tested] += 1.0

    def observe(self, rows: int, step_s: float, drafted: int, draft_s: float) -> None:
        """A round drafted `drafted` tokens in draft_s seconds and its target step of `rows` rows took step_s."""
        k, sample, w = rows - 1, step_s + draft_s, self.w
        if not 0 <= k <= self.k_max:
            return
        if np.isnan(self.cost_s).all():
            self.cost_s[k] = sample
            return
        est = self.costs()[k] if np.isnan(self.cost_s[k]) else self.cost_s[k]
        bounded = min(sample, self.spike * est)
        others = ~np.isnan(self.cost_s)
        others[k] = False
        self.cost_s[others] *= 1 + self.w_load * (bounded / est - 1)   # the load moves every length alike
        if np.isnan(self.cost_s[k]):
            self.cost_s[k] = min(sample, (1 - w) * est + w * bounded)
        else:
            self.cost_s[k] = (1 - w) * est + w * bounded
        shorter = self.cost_s[:k]
        dear = shorter > sample                           # nan compares False: unmeasured ones stay so
        shorter[dear] = (1 - w) * shorter[dear] + w * sample


@attrs.define
class Stats:
    """Counters of one speculative generation (reported in GenerationResult.timings)."""

    rounds: int = 0          # target steps after the prompt
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0          # tokens decided by those steps
    draft_s: float = 0.0     # time spent drafting
    last_rejected: int = 0   # drafts the last round rejected (its cache holds them until rewound)

    def timings(self) -> dict[str, float]:
        return {
            "spec_acceptance": self.accepted / self.drafted if self.drafted else 0.0,
            "spec_tokens_per_step": self.tokens / self.rounds if self.rounds else 0.0,
            "spec_mean_accepted": self.accepted / self.rounds if self.rounds else 0.0,
            "spec_drafted": float(self.drafted),
            "spec_draft_s": self.draft_s,
        }
