"""archrun.generation.speculative: greedy output equals plain greedy decoding for every drafter on every family;
sampled output follows the target's distribution (rejection rule); rewind across a sliding window;
typed errors.

The reference for greedy identity is archrun's plain greedy decoding (itself checked against HF
transformers and llama.cpp by the family tests). The reference distribution of the sampling test
is the target model's own softmax, computed position by position without speculation.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from support.tiny import TINY, golden

import archrun
from archrun.decoder import Caps
from archrun.errors import InvalidRequest, MissingTensor, ModelLoadError, PluginError, VocabularyMismatch
from archrun.generation import speculative
from archrun.generation.generate import Generation, make_request
from archrun.generation.sampling import Sampler, SamplingParams
from archrun.generation.speculative import AdaptiveLength, Draft, Drafter, LookupDrafter, decide
from archrun.io.ggufset import open_gguf
from archrun.run.cache import PrefixCache

FAMILIES = Path(__file__).resolve().parents[2] / "families"


def _generates(path: Path) -> bool:
    """Whether the fixture's file describes a model that generates: not an encoder, whose file states
    `<arch>.attention.causal = false` (it embeds and refuses to decode)."""
    with open_gguf(path) as g:
        return bool(g.metadata.get(f"{g.metadata['general.architecture']}.attention.causal", True))


# one fixture per family package that generates (the first of its goldens), so every family is covered quickly
ONE_PER_FAMILY = sorted({p.parent.parent.parent.name: p.stem
                         for p in sorted(FAMILIES.glob("*/tests/goldens/*.gguf"), reverse=True)
                         if _generates(p)}.values())
DRAFT = "llama_gqa"              # every tiny fixture shares one 288-token vocabulary
MTP = "glm4moe_base"             # a tiny glm4moe with an MTP (nextn) head
GREEDY = dict(max_tokens=24, temperature=0.0)


def load(name: str, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fixtures carry keys some families ignore
        return archrun.load(TINY[name], **kw)


@pytest.fixture(scope="module")
def draft_model():
    return load(DRAFT)


def prompt_of(name: str) -> list[int]:
    """A repetitive prompt from the fixture's golden ids (so lookup finds n-grams to propose)."""
    ids = [int(t) for t in golden(name)[0][:6]]
    return ids * 3


def same_as_plain(model, prompt, drafter, **options):
    plain = archrun.generate(model, prompt, **GREEDY, **options).complete()
    spec = speculative.generate(model, prompt, drafter, **GREEDY, **options).complete()
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text and spec.finish_reason == plain.finish_reason
    return spec


# -- greedy identity ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_greedy_equals_plain_decoding_for_every_drafter(name, draft_model):
    model = load(name)
    prompt = prompt_of(name)
    drafters = [LookupDrafter(), speculative.ModelDrafter(draft_model, model)]
    if model.descriptor.n_nextn:
        drafters.append(speculative.make_drafter(model, "mtp"))
    for drafter in drafters:
        result = same_as_plain(model, prompt, drafter)
        t = result.timings
        assert 0.0 <= t["spec_acceptance"] <= 1.0 and t["spec_tokens_per_step"] >= 1.0


def test_drafts_are_accepted_and_counted(draft_model):
    # a model drafting for itself agrees with itself: every draft the budget allows is kept
    result = same_as_plain(draft_model, prompt_of(DRAFT), speculative.ModelDrafter(draft_model, draft_model))
    t = result.timings
    assert t["spec_drafted"] > 0 and t["spec_acceptance"] == 1.0 and t["spec_tokens_per_step"] > 1.0


@pytest.mark.parametrize("style", ["host_reference", "fused"])
@pytest.mark.parametrize("name", ["glm4moe_base", "glm4moe_qknorm_groups_tied"])
def test_mtp_self_speculation_equals_plain_decoding(name, style):
    model = load(name, block_style=style)  # fused: the head runs the model's fast ops
    drafter = speculative.make_drafter(model, "mtp")
    assert drafter.follows_trunk
    result = same_as_plain(model, prompt_of(name), drafter)
    assert result.timings["spec_drafted"] > 0
    # a PrefixCache kept across calls: the MTP drafter needs every cached token, so it starts over
    cache = PrefixCache(model.init_cache(128))
    for _ in range(2):
        got = speculative.generate(model, prompt_of(name), drafter, cache=cache, **GREEDY).complete()
        assert got.token_ids == result.token_ids


def test_stop_strings_logprobs_and_a_kept_cache(draft_model):
    model = load("qwen2_gqa")
    prompt = prompt_of("qwen2_gqa")
    plain = archrun.generate(model, prompt, **GREEDY, logprobs=2).complete()
    stop = plain.text[len(plain.text) // 2:][:3] or None
    same_as_plain(model, prompt, "lookup", stop=stop, logprobs=2)
    cache = PrefixCache(model.init_cache(128))
    for _ in range(2):  # the second call reuses the cached prompt
        got = speculative.generate(model, prompt, "lookup", cache=cache, **GREEDY).complete()
        assert got.token_ids == archrun.generate(model, prompt, **GREEDY).complete().token_ids
    assert got.cached_tokens > 0


# -- sliding-window layers: rewind inside the ring, and past it ------------------------------------


@pytest.mark.parametrize("max_rewind", [64, 2])
def test_rewind_across_a_sliding_window_boundary(max_rewind, draft_model):
    name = "gemma3_period6_tied"
    model = load(name)
    windows = {lp.spec.attention.window for lp in model.plan.layers}
    assert 0 < max(windows) <= 8  # 40 generated tokens cross the window many times
    prompt = prompt_of(name)
    options = dict(max_tokens=40, temperature=0.0)
    plain = archrun.generate(model, prompt, **options).complete()
    for drafter in (LookupDrafter(ngram_min=1), speculative.ModelDrafter(draft_model, model), Scatter(model)):
        # max_rewind 2: rings keep 2 spare rows, so rejecting more drafts recomputes instead of rewinding
        cache = PrefixCache(model.init_cache(len(prompt) + 48, max_rewind=max_rewind))
        spec = speculative.generate(model, prompt, drafter, cache=cache, **options).complete()
        assert spec.token_ids == plain.token_ids
    assert spec.timings["spec_drafted"] > 0 and spec.timings["spec_acceptance"] < 0.5  # Scatter: many rewinds


class Scatter(Drafter):
    """Proposes arbitrary tokens (a drafter the target almost always rejects: many rewinds)."""

    def __init__(self, model):
        self.n_vocab = model.descriptor.n_vocab

    def propose(self, history, k, sampler):
        return Draft(tuple((7 * len(history) + 13 * i) % self.n_vocab for i in range(k)))


# -- sampling: the rejection rule keeps the target's distribution --------------------------------------

FULL = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def chi2_ok(counts: np.ndarray, probs: np.ndarray, alpha_z: float = 3.7) -> tuple[bool, float, int]:
    """Pearson's chi-square of counts against probs (bins with expected count < 5 lumped together),
    compared with the chi-square quantile at z = alpha_z (Wilson-Hilferty; 3.7 ~ p 1e-4)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    df = int(keep.sum()) - 1
    limit = df * (1 - 2 / (9 * df) + alpha_z * math.sqrt(2 / (9 * df))) ** 3
    return stat <= limit, stat, df


@pytest.mark.parametrize("deterministic", [True, False])
def test_decide_draws_from_the_target_distribution(deterministic):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=8).astype(np.float32) * 1.5
    sampler = Sampler(SamplingParams(seed=1, **FULL), 8)
    p = sampler.distribution(logits)
    q = np.roll(p, 3) * 0.5 + 0.5 / 8  # a drafter that is often wrong
    counts = np.zeros(8)
    for _ in range(20000):
        x = int(np.argmax(q)) if deterministic else int(rng.choice(8, p=q))
        draft = Draft((x,), None if deterministic else q[None])
        tok, _ = decide(sampler, logits, [], draft, 0)
        counts[tok] += 1
    ok, stat, df = chi2_ok(counts, p)
    assert ok, (stat, df)


def test_sampled_speculation_follows_the_target_distribution(draft_model):
    """The second token (decided by a verify step from a model's draft; max_tokens 3 leaves room
    for one) follows sum over t1 of p(t1) p(t2 | t1), computed without speculation."""
    model = load("qwen2_gqa")
    prompt = prompt_of("qwen2_gqa")[:8]
    n_vocab = model.descriptor.n_vocab
    options = dict(FULL, logit_bias={t: -50.0 for t in model.tokenizer.eog_ids})  # no early stop
    sampler = Sampler(SamplingParams(**options), n_vocab)
    cache = model.init_cache(len(prompt) + 2)
    p1 = sampler.distribution(model.forward_step(prompt, cache), prompt)
    p2 = np.zeros(n_vocab)
    for t1 in np.flatnonzero(p1 > 1e-6):
        p2 += p1[t1] * sampler.distribution(model.forward_step([int(t1)], cache), [*prompt, int(t1)])
        cache.rewind(1)
    drafter = speculative.ModelDrafter(draft_model, model)  # another model: q differs from p
    seconds = np.zeros(n_vocab)
    accepted = 0.0
    for seed in range(1500):
        req = make_request(model, prompt, max_tokens=3, seed=seed, **options)
        length = AdaptiveLength(2)
        length.cost_s[0] = 1.0  # as if a step had been measured: the first round drafts (no plain step first)
        out = Generation(lambda gen, r=req, n=length: speculative.run(gen, model, r, None, drafter, n)).complete()
        seconds[out.token_ids[1]] += 1
        accepted += out.timings["spec_acceptance"]
    assert 0.05 < accepted / 1500 < 0.95  # both branches of the rule ran
    ok, stat, df = chi2_ok(seconds, p2 / p2.sum())
    assert ok, (stat, df)


def test_sampled_runs_repeat_with_a_seed():
    model = load("qwen2_gqa")
    results = [speculative.generate(model, prompt_of("qwen2_gqa"), "lookup", max_tokens=16, seed=5, **FULL)
               .complete() for _ in range(2)]
    runs = [r.token_ids for r in results]
    assert runs[0] == runs[1] and results[0].timings["spec_drafted"] > 0
    # a deterministic drafter's tokens are kept iff plain sampling's draw picks them: one draw per
    # token, so the seeded run is plain seeded sampling's, whatever draft lengths the timings chose
    plain = archrun.generate(model, prompt_of("qwen2_gqa"), max_tokens=16, seed=5, **FULL).complete()
    assert runs[0] == plain.token_ids


# -- adaptive draft length ---------------------------------------------------------------------------


def test_draft_length_follows_the_acceptance_and_probes_when_drafting_does_not_pay():
    length = AdaptiveLength(6)
    assert length.next() == 0                       # a plain step first (it measures what a step costs)
    for _ in range(10):
        k = length.next()
        length.update(k, k)
    assert length.next() == 6                       # drafts always agree: as many as allowed
    for _ in range(12):
        k = length.next()
        length.update(k, 0)
    assert length.k == 0                            # the first draft never agrees: plain steps...
    assert [length.next() for _ in range(8)].count(1) == 2   # ...probing every 4th round


def test_acceptance_is_learnt_per_draft_depth_from_the_tested_drafts():
    # depth 1 on a prior of 1 draft at 0.5 (decaying with its counts), each deeper depth on the depth
    # before with a lasting weight of 1 draft; counts decay by 0.5 per observation of their depth
    length = AdaptiveLength(3, rate=0.5, decay=0.5, prior=1.0, pool=1.0)
    assert length.acceptance() == pytest.approx([0.5, 0.5, 0.5])   # untested: each depth the prior
    length.update(3, 3)          # every depth kept once. depth 1: (1 + 0.5 x 0.5) / (1 + 0.5) = 5/6
    assert length.acceptance() == pytest.approx([5 / 6, 11 / 12, 23 / 24])   # (1 + p before) / 2
    length.update(3, 0)          # depth 1 missed (kept 0.5, tested 1.5, prior 0.25); 2, 3 never tested
    assert length.acceptance() == pytest.approx([5 / 14, 19 / 28, 47 / 56])   # .625 / 1.75, then (1 + p) / 2
    length.update(3, 1)          # depth 1 kept (1.25 / 1.75, prior .125), depth 2 missed (0.5 / 1.5), 3 untested
    assert length.acceptance() == pytest.approx([0.7, 0.48, 0.74])     # 1.3125 / 1.875, 1.2 / 2.5, 1.48 / 2
    length.update(0, 0)          # a round without drafts changes nothing
    assert length.acceptance() == pytest.approx([0.7, 0.48, 0.74])
    assert length.rate == pytest.approx(0.7)
    assert length.expected() == pytest.approx([1, 1.7, 1.7 + 0.7 * 0.48, 1.7 + 0.7 * 0.48 * 1.74])


def _length_with(p: list[float], costs_ms: dict[int, float]) -> AdaptiveLength:
    """An AdaptiveLength whose acceptance per depth is p (prior 0: the counts alone) and whose
    rounds of k drafts measured costs_ms[k] (one sample each)."""
    length = AdaptiveLength(len(p), prior=0.0, pool=0.0)
    length.kept, length.tested = np.array(p) * 10, np.full(len(p), 10.0)
    for k, ms in costs_ms.items():
        length.cost_s[k] = ms / 1000
    return length


def test_draft_length_maximises_expected_tokens_per_second_over_measured_costs():
    # E(k) = 1, 1.5, 1.95, 2.355, 2.7195; costs 10, 12, 14, 20 ms and k = 4 priced with the steepest
    # measured slope (6 ms): 26 ms. Tokens per ms: .1, .125, .1393, .1178, .1046 -> k = 2 (a linear
    # cost of 10 + 2k ms, learnt from the short rounds, gives 2.7195 / 18 = .151 at k = 4)
    length = _length_with([0.5, 0.9, 0.9, 0.9], {0: 10, 1: 12, 2: 14, 3: 20})
    assert length.expected() == pytest.approx([1, 1.5, 1.95, 2.355, 2.7195])
    assert length.costs() * 1000 == pytest.approx([10, 12, 14, 20, 26])
    assert length.k == 2
    # copy or not: the first draft is kept 20 % of the time, a kept one is followed by more:
    # E = 1, 1.2, 1.4, 1.6, 1.8 over 10, 11, 12, 13, 14 ms -> k = 4 (1.8 / 14 = .1286 > .1231 at k = 3)
    assert _length_with([0.2, 1.0, 1.0, 1.0], {0: 10, 1: 11, 2: 12, 3: 13, 4: 14}).k == 4
    # the same first-draft rate as an independent rate (0.2 at every depth) pays for no draft:
    # E = 1, 1.2, 1.24 over 10, 11, 12 ms: .1, .1091, .1033 -> k = 1
    assert _length_with([0.2, 0.2, 0.2, 0.2], {0: 10, 1: 11, 2: 12, 3: 13, 4: 14}).k == 1
    # each row as dear as a step: 1.2 / 20 < 1 / 10, nothing pays
    assert _length_with([0.2, 1.0, 1.0, 1.0], {0: 10, 1: 20}).k == 0


def test_unmeasured_lengths_are_priced_from_the_measured_ones():
    assert _length_with([0.5] * 4, {}).costs() == pytest.approx([1, 1.25, 1.5, 1.75, 2])   # nothing: 1 + k / 4
    assert _length_with([0.5] * 4, {0: 10}).costs() * 1000 == pytest.approx([10, 12.5, 15, 17.5, 20])
    # between two measured lengths: linear; beyond: the steepest measured slope
    assert _length_with([0.5] * 4, {0: 10, 4: 30}).costs() * 1000 == pytest.approx([10, 15, 20, 25, 30])
    assert _length_with([0.5] * 5, {0: 10, 1: 11, 3: 19}).costs() * 1000 == pytest.approx([10, 11, 15, 19, 23, 27])
    # below the shortest measured: the shape 1 + k / 4 through it (12 ms at k = 2: 12 x (4 + k) / 6);
    # above it with that shape's slope (2 ms)
    assert _length_with([0.5] * 4, {2: 12}).costs() * 1000 == pytest.approx([8, 10, 12, 14, 16])
    # more rows never count as cheaper (a noisy sample)
    assert _length_with([0.5] * 2, {0: 10, 1: 20, 2: 15}).costs() * 1000 == pytest.approx([10, 20, 20])


def test_a_one_off_slow_step_moves_a_round_cost_at_most_by_the_spike_bound():
    length = AdaptiveLength(5)                       # w 0.3 for the sampled length, 0.1 for the others
    length.observe(1, 0.020, 0, 0.0)                 # 20 ms for a round without drafts
    assert length.cost_s[0] == pytest.approx(0.020)
    length.observe(3, 0.100, 2, 0.0)                 # a first 3-row call: 100 ms (one-off); priced at 30 ms
    assert length.cost_s[2] == pytest.approx(0.7 * 0.030 + 0.3 * 0.060)    # bounded at 2 x 30: 39 ms
    assert length.cost_s[0] == pytest.approx(0.020 * (1 + 0.1 * (2 - 1)))  # the load doubled? by 0.1: 22 ms
    length.observe(3, 0.029, 2, 0.001)               # 30 ms with the drafting
    c0 = 0.022 * (1 + 0.1 * (0.030 / 0.039 - 1))
    c2 = 0.7 * 0.039 + 0.3 * 0.030
    assert length.cost_s[[0, 2]] == pytest.approx([c0, c2])
    length.observe(6, 0.015, 5, 0.0)                 # 6 rows in 15 ms: the load fell
    assert length.cost_s[5] == pytest.approx(0.015)  # a first sample cheaper than its price is taken as is
    est5 = c2 + 3 * (c2 - c0) / 2                    # its price: beyond k = 2 with the slope from k = 0
    load = 1 + 0.1 * (0.015 / est5 - 1)
    # the shorter rounds (dearer than 15 ms) move with the load, then toward the sample
    assert length.cost_s[0] == pytest.approx(0.7 * c0 * load + 0.3 * 0.015)
    assert length.cost_s[2] == pytest.approx(0.7 * c2 * load + 0.3 * 0.015)
    assert np.isnan(length.cost_s[[1, 3, 4]]).all()  # unmeasured ones stay so


def test_lookup_proposes_what_followed_the_best_matching_place():
    lookup = LookupDrafter()
    a, b, c, d, e, x, y = 1, 2, 3, 4, 5, 6, 7
    # the latest occurrence of the longest n-gram
    assert lookup.propose([a, b, c, x, a, b, c, y, e, a, b, c], 2, None).tokens == (y, e)
    # no n-gram matches: the output replaced one token (x -> y) after 4 copied ones and copies on after it
    assert lookup.propose([9, a, b, c, d, x, c, d, e, 8, a, b, c, d, y], 3, None).tokens == (c, d, e)
    # ...but a run of 2 before the replaced token is too short to count
    assert lookup.propose([a, b, x, c, d, e, 8, a, b, y], 3, None).tokens == ()
    # the 2-gram (e, d) occurs twice: the place whose window agrees more with the history's wins
    src = [9, 9, a, x, e, d, c, b, x, e, d, a]          # "x e d" after a, then after b
    assert lookup.propose([*src, 9, 9, a, y, e, d], 2, None).tokens == (c, b)
    # nothing long enough to match: no draft
    assert lookup.propose([a, b, c, d], 3, None).tokens == ()
    assert lookup.propose([a], 3, None).tokens == ()
    assert LookupDrafter(ngram_min=1).propose([a, b, c, a], 2, None).tokens == (b, c)


def test_lookup_remembers_a_replacement_once_the_output_copies_on_after_it():
    a, b, c, d, e, f, x, y = 1, 2, 3, 4, 5, 6, 7, 8
    src = [9, a, b, c, d, x, e, f, 15, 16, x, f, 17]      # x occurs twice in the source
    lookup = LookupDrafter()
    lookup.start(None, 64)
    # the output copies a b c d, then puts y where the source has x: drafted after the substitution
    assert lookup.propose([*src, a, b, c, d, y], 3, None).tokens == (e, f, 15)
    assert lookup.renames == {}                         # not yet: did the output go on with e?
    out = [a, b, c, d, y, e, f, 13, 15, 16]             # it did (then rewrote f 15 as f 13 15)
    assert lookup.propose([*src, *out], 3, None).tokens == (y, f, 17)   # the later x drafted as y
    assert lookup.renames == {x: y}
    # "15 16 y" matches the source's "15 16 x"; without the map nothing matches (the run before y is 2)
    assert lookup.propose([*src, *out, y], 2, None).tokens == (f, 17)
    plain = LookupDrafter(renames=False)
    assert plain.propose([*src, a, b, c, d, y], 3, None).tokens == (e, f, 15)
    assert plain.propose([*src, *out], 3, None).tokens == (x, f, 17)
    assert plain.propose([*src, *out, y], 2, None).tokens == ()
    # a sequence of its own (the server's slots) and a new generation start without the map
    assert lookup.fork().renames == {}
    lookup.start(None, 64)
    assert lookup.renames == {}
    # a different token after the substitution: a rewrite, not a replacement
    lookup.propose([*src, a, b, c, d, y], 3, None)
    assert lookup.propose([*src, a, b, c, d, y, 12, 15, 16], 3, None).tokens == (x, f, 17)
    assert lookup.renames == {}


# -- typed errors ------------------------------------------------------------------------------------


def test_bad_arguments_raise_typed_errors(draft_model):
    m = draft_model
    prompt = prompt_of(DRAFT)
    with pytest.raises(InvalidRequest, match="unknown drafter 'nope'.*lookup"):
        speculative.generate(m, prompt, "nope")
    for bad in ("", None, 3):
        with pytest.raises(InvalidRequest, match="speculative must be"):
            speculative.generate(m, prompt, bad)
    with pytest.raises(InvalidRequest, match="draft:PATH"):
        speculative.generate(m, prompt, "draft")
    with pytest.raises(InvalidRequest, match="no argument"):
        speculative.generate(m, prompt, "lookup:3")
    for k in (0, 17, True, 2.5):
        with pytest.raises(InvalidRequest, match="draft length"):
            speculative.generate(m, prompt, "lookup", draft_max=k)
    with pytest.raises(InvalidRequest, match="ngram"):
        LookupDrafter(ngram_max=1, ngram_min=2)
    with pytest.raises(InvalidRequest, match="temperature"):
        speculative.generate(m, prompt, "lookup", temperature=float("nan"))
    with pytest.raises(ModelLoadError, match="cannot open"):
        speculative.generate(m, prompt, "draft:/nonexistent/model.gguf")


def test_a_draft_model_with_another_vocabulary_is_refused(synth_model, draft_model):
    path = synth_model(arch="llama", qk_norm=False, n_vocab=96)
    other = archrun.load(path)
    with pytest.raises(VocabularyMismatch, match="96 tokens"):
        speculative.ModelDrafter(other, draft_model)
    with pytest.raises(VocabularyMismatch):
        speculative.generate(draft_model, prompt_of(DRAFT), f"draft:{path}")
    assert issubclass(VocabularyMismatch, InvalidRequest)


def test_mtp_needs_a_model_with_an_mtp_head(draft_model):
    with pytest.raises(MissingTensor, match="0 MTP"):
        speculative.make_drafter(draft_model, "mtp")
    with pytest.raises(MissingTensor):
        speculative.make_drafter(load("glm4moe_hd24_shared2_nomtp"), "mtp")
    with pytest.raises(InvalidRequest, match="mtp:0"):
        speculative.make_drafter(load(MTP), "mtp:x")


def test_a_model_that_cannot_verify_is_refused(draft_model):
    class NoAllLogits:
        caps = Caps(all_logits=False)

    with pytest.raises(InvalidRequest, match="every position"):
        speculative.check_target(NoAllLogits())


def test_a_drafter_proposing_bad_ids_is_a_plugin_error(draft_model):
    class Bad(Drafter):
        def propose(self, history, k, sampler):
            return Draft((10**6,))

    with pytest.raises(PluginError, match="proposed"):
        speculative.generate(draft_model, prompt_of(DRAFT), Bad(), **GREEDY).complete()


# -- the server's engine: speculation inside batched steps ---------------------------------------------


@pytest.mark.parametrize("style", ["fused", "host_reference"])
def test_the_engine_speculates_in_its_batched_steps(style, draft_model):
    import queue

    from archrun.serve.engine import Engine

    name = "gemma3_period6_tied"
    model = load(name, block_style=style)
    prompts = [prompt_of(name), prompt_of(name)[3:] + [5, 9]]
    no_end = {t: -100.0 for t in model.tokenizer.eog_ids}
    want = [archrun.generate(model, p, max_tokens=20, temperature=0.0, logit_bias=no_end).complete().token_ids
            for p in prompts]
    for drafter in (LookupDrafter(ngram_min=1), speculative.ModelDrafter(draft_model, model)):
        engine = Engine(model, parallel=2, ctx=96, queue=2, prefill_chunk=8, drafter=drafter, draft_max=4)
        engine.start()
        try:
            done = [queue.Queue() for _ in prompts]
            for p, q in zip(prompts, done, strict=True):
                req = make_request(model, p, max_tokens=20, temperature=0.0, context=96, logit_bias=no_end)
                engine.submit(req, lambda e, q=q: q.put(e) if e.result or e.error else None)
            results = [q.get(timeout=60) for q in done]
        finally:
            engine.stop()
        assert all(e.error is None for e in results), [e.error for e in results]
        assert [e.result.token_ids for e in results] == want
        assert all(e.result.timings["spec_tokens_per_step"] >= 1.0 for e in results)
    assert max(e.result.timings["spec_drafted"] for e in results) > 0


def test_the_engine_refuses_a_drafter_that_follows_the_trunk():
    from archrun.serve.engine import Engine

    model = load(MTP)
    with pytest.raises(InvalidRequest, match="batched steps"):
        Engine(model, parallel=1, ctx=64, queue=1, prefill_chunk=8, drafter=speculative.make_drafter(model, "mtp"))


# -- the command line --------------------------------------------------------------------------------


def test_cli_run_speculative_prints_the_same_text_and_its_rates(capsys):
    from archrun.cli import main

    path = str(TINY[DRAFT])
    assert main(["run", path, "-p", "a b a b a b", "-n", "12", "--temp", "0"]) == 0
    plain = capsys.readouterr().out
    assert main(["run", path, "-p", "a b a b a b", "-n", "12", "--temp", "0", "--speculative", "lookup",
                 "--draft-max", "3"]) == 0
    out = capsys.readouterr()
    assert out.out == plain
    assert "acceptance" in out.err and "tokens per verify step" in out.err
    assert main(["run", path, "-p", "x", "--speculative", "nope"]) == 1
    assert "unknown drafter 'nope'" in capsys.readouterr().err
    assert main(["run", path, "-p", "x", "--speculative", "lookup", "--draft-max", "0"]) == 1
    assert "draft length" in capsys.readouterr().err


def test_serve_options_are_validated():
    from archrun.serve.app import _drafter
    from archrun.serve.config import ServeConfig

    assert ServeConfig(speculative="lookup", draft_max=3).draft_max == 3
    for bad in (0, 17, True):
        with pytest.raises(InvalidRequest, match="draft-max"):
            ServeConfig(draft_max=bad)
    model = load(DRAFT)
    assert _drafter(model, None) is None
    assert isinstance(_drafter(model, "lookup"), LookupDrafter)
    with pytest.raises(InvalidRequest, match="unknown drafter"):
        _drafter(model, "nope")
