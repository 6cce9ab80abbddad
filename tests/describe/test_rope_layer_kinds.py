"""The rope of sliding-window layers: the file's scaling unless the family says its sliding layers
rotate plain; YaRN's unrounded correction dims; the diagnosis and the fixtures' sensitivity per layer
kind (archrun.conformance.trace.flip_rope_scaling)."""

from pathlib import Path

import attrs
import numpy as np
import pytest

import archrun
from archrun.conformance import hf
from archrun.conformance.diagnosis import diagnose
from archrun.conformance.trace import LAYER_KINDS, Skipped, changes, flip_rope_scaling, rope_scaled
from archrun.describe.compile import describe
from archrun.descriptor import RopeSpec
from archrun.errors import InvalidRequest
from archrun.plugins import default_plugin_manager
from archrun.vocab import build_vocabulary

GPT_OSS = Path(__file__).parents[2] / "families/archrun-gpt-oss/tests/goldens/gpt_oss_gqa_window6.gguf"
YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 32.0, "rope.scaling.original_context_length": 4096,
        "attention.sliding_window": 4}
SLIDING = {"swa_period": 2}  # layer 0 sliding, layer 1 global


def _tables(d):
    sliding = {lay.attention.rope for lay in d.layers if lay.attention.window}
    glob = {lay.attention.rope for lay in d.layers if not lay.attention.window}
    assert len(sliding) == len(glob) == 1
    return d.rope_tables[glob.pop()], d.rope_tables[sliding.pop()]


def test_sliding_layers_keep_the_files_scaling_by_default(synth_model):
    """llama.cpp's rule for every architecture that states nothing else: the sliding layers' rope is the
    global one (scaling, factor, YaRN attention factor) with the base rope.freq_base_swa."""
    d = describe(synth_model(key_overrides={**YARN, "rope.freq_base_swa": 5000.0}), hints=SLIDING)
    glob, sliding = _tables(d)
    assert glob.scaling == "yarn" and glob.scaling_factor == 32.0 and glob.freq_base == 10000.0
    assert sliding == attrs.evolve(glob, freq_base=5000.0)


def test_a_family_states_plain_sliding_rope(synth_model):
    """swa_rope="plain": the sliding layers rotate with their base alone (Gemma 3's local layers)."""
    d = describe(synth_model(key_overrides={**YARN, "rope.freq_base_swa": 5000.0}),
                 hints={**SLIDING, "swa_rope": "plain"})
    glob, sliding = _tables(d)
    assert glob.scaling == "yarn"
    assert sliding == RopeSpec(pairing=glob.pairing, n_rot=glob.n_rot, freq_base=5000.0)
    with pytest.raises(InvalidRequest, match="swa_rope"):
        describe(synth_model(key_overrides=YARN), hints={**SLIDING, "swa_rope": "local"})


def test_yarn_truncate_is_stated_per_family(synth_model):
    path = synth_model(key_overrides=YARN)
    assert describe(path).rope_tables[0].truncate
    assert not describe(path, hints={"yarn_truncate": "false"}).rope_tables[0].truncate
    assert describe(synth_model(), hints={"yarn_truncate": False}).rope_tables[0].truncate  # no yarn: no effect


def test_unrounded_yarn_frequencies_reach_the_rope_op():
    from archrun_blocks import reference, rope_scaling

    spec = RopeSpec(pairing="neox", n_rot=64, freq_base=150000.0, scaling="yarn", scaling_factor=32.0,
                    original_context=4096)
    for truncate in (True, False):
        want, _ = rope_scaling.frequencies("yarn", 64, 150000.0, factor=32.0, original_context=4096, truncate=truncate)
        got = reference.Rope(attrs.evolve(spec, truncate=truncate), None, True).inv_freq
        assert np.array_equal(got, want)
    rounded = reference.Rope(spec, None, True).inv_freq
    assert not np.array_equal(rounded, reference.Rope(attrs.evolve(spec, truncate=False), None, True).inv_freq)


# what each family with sliding windows states (llama.cpp's hparams.rope_freq_scale_train_swa per
# architecture: 1.0 for gemma3 and olmo2's sliding layers, the global scale for every other; HF: one
# rotary embedding for every layer of cohere2, gemma2, exaone4, llama4, gpt-oss)
SWA_ROPE = {"gemma3": "plain", "olmo2": "plain", "gemma2": "global", "cohere2": "global", "exaone4": "global",
            "llama4": "global", "gpt-oss": "global", "hunyuan-dense": "global"}


@pytest.mark.parametrize("arch", sorted(SWA_ROPE))
def test_families_state_their_sliding_layers_rope(arch):
    hints = default_plugin_manager().hook.archrun_describe_family(architecture=arch)
    assert hints is not None, f"no family describes {arch}"
    assert hints.swa_rope == SWA_ROPE[arch]
    assert hints.yarn_truncate == (arch != "gpt-oss")


def test_flip_rope_scaling_per_layer_kind():
    d = archrun.load(GPT_OSS, backend="reference").descriptor
    for kind in LAYER_KINDS:
        what, flipped = flip_rope_scaling(d, kind)
        assert f"the rope of the {kind} layers without scaling" in what
        for stated, new in zip(d.layers, flipped.layers, strict=True):
            same_kind = (stated.attention.window > 0) == (kind == "sliding")
            assert rope_scaled(flipped.rope_tables[new.attention.rope]) != same_kind
    plain = archrun.load(GPT_OSS, backend="reference", hints={"swa_rope": "plain"}).descriptor
    what, flipped = flip_rope_scaling(plain, "sliding")
    assert "scaled as the global layers' (yarn x32" in what
    table = {lay.attention.rope for lay in flipped.layers if lay.attention.window}.pop()
    assert flipped.rope_tables[table] == plain.rope_tables[0]
    unscaled = attrs.evolve(d, rope_tables=[RopeSpec(pairing=t.pairing, n_rot=t.n_rot, freq_base=t.freq_base)
                                            for t in d.rope_tables])
    assert flip_rope_scaling(unscaled, "sliding").startswith("no rope scaling to flip")


def test_diagnose_names_the_sliding_layers_rope():
    """A model whose sliding layers lose YaRN (as stated by a caller's hint here) against HF's logits."""
    golden = hf.load_golden(GPT_OSS.with_suffix(".npz"))
    why = diagnose(GPT_OSS, golden["ids"].astype(np.int64), golden["logits"], hf.TOLERANCE,
                   hints={"swa_rope": "plain"}, reference_name="HF")
    assert "with the rope of the sliding layers scaled as the global layers' (yarn x32" in why, why
    assert "first diverging op (as stated vs corrected): op rope=neox in layer 0, position 0" in why, why


def test_diagnose_skips_swaps_the_slot_cannot_take():
    """An attention op with its own projections (a token mixer, MLA) never swaps into layers described
    for the standard ones: the change is Skipped, and diagnose explains instead of raising."""
    pm = default_plugin_manager()
    vocab = build_vocabulary(pm)
    d = archrun.load(GPT_OSS, backend="reference").descriptor
    skipped = {what: alt for what, alt in changes(d, vocab) if isinstance(alt, Skipped)}
    layouts = [e.op.name for e in vocab if e.op.slot == "attention" and e.op.layout is not None]
    if not layouts:
        pytest.skip("no installed attention op brings its own projections")
    for name in layouts:
        assert f"attention={name} (stated: attention=causal)" in skipped
    golden = hf.load_golden(GPT_OSS.with_suffix(".npz"))
    why = diagnose(GPT_OSS, golden["ids"].astype(np.int64), golden["logits"] * 1.3, hf.TOLERANCE,
                   reference_name="HF")
    assert "no single convention change makes archrun match it" in why
    assert "changes not tried" in why
