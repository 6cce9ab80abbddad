"""LoRA adapters (archrun.io.lora) merged at load, against HF PEFT's merged model.

Each case builds a tiny random HF model (the families' tiny-fixture machinery,
archrun.conformance.hf), converts it with llama.cpp's convert_hf_to_gguf.py, wraps it in a random
PEFT LoRA (nonzero B), converts the adapter with llama.cpp's convert_lora_to_gguf.py, and compares
archrun's logits (base + adapter) with PEFT's merge_and_unload() model on both backends.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest

import archrun
from archrun.conformance import hf, llamacpp
from archrun.conformance.gguf_edit import rewrite_gguf
from archrun.conformance.synthetic import write_gguf
from archrun.errors import AdapterError, AdapterMismatch, InvalidRequest
from archrun.io.ggufset import open_gguf
from archrun.io.lora import parse_lora_arg

FAMILIES = Path(__file__).resolve().parents[2] / "families"
TOLERANCE = 1e-4  # max |Δlogit| / max |logit| against PEFT's merged float32 model
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
CASES = {  # name -> (family's hf_arch.py, HfArch attribute, LoRA target modules)
    "llama": ("archrun-llama", "LLAMA", [*ATTENTION, "gate_proj", "up_proj", "down_proj"]),
    "qwen3": ("archrun-qwen", "QWEN3", [*ATTENTION, "gate_proj", "up_proj", "down_proj"]),
    "qwen3moe": ("archrun-qwen", "QWEN3MOE", ATTENTION),
}


@attrs.frozen
class Case:
    base: Path
    adapter: Path
    ids: np.ndarray
    merged: np.ndarray  # PEFT's merged model's logits
    plain: np.ndarray  # the base model's logits


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    if not llamacpp.available():
        try:
            llamacpp.fetch_source()
        except Exception as e:  # noqa: BLE001 - no network: the reference is unavailable here
            pytest.skip(f"llama.cpp's converters are not available: {e}")
    return {}


def _case(cases: dict[str, Case], name: str, tmp: Path) -> Case:
    import peft
    import torch

    if name not in cases:
        package, attr, targets = CASES[name]
        arch = getattr(hf.load_module(FAMILIES / package / "tests" / "hf_arch.py"), attr)
        model, config = hf.build_tiny(arch, seed=3)
        ids = hf.fixture_ids(f"lora-{name}", config.vocab_size)
        plain = hf.hf_logits(model, ids)[0]
        base = hf.convert(model, tmp / f"{name}.gguf", attrs.evolve(arch, converter="llama.cpp"))
        torch.manual_seed(7)
        lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                          init_lora_weights=False))
        adapter = llamacpp.convert_lora(lora, tmp / f"{name}-lora.gguf")
        merged = hf.hf_logits(lora.merge_and_unload(), ids)[0]
        cases[name] = Case(base, adapter, ids, merged, plain)
    return cases[name]


@pytest.mark.parametrize("backend", ["reference", "fast"])
@pytest.mark.parametrize("name", list(CASES))
def test_merged_adapter_matches_peft(cases, name, backend, tmp_path_factory):
    case = _case(cases, name, tmp_path_factory.mktemp(name))
    assert hf.rel_err(case.merged, case.plain) > 100 * TOLERANCE  # the adapter changes the logits
    model = archrun.load(case.base, backend=backend, lora=case.adapter)
    got = model.forward_step(case.ids, model.init_cache(len(case.ids)), all_logits=True)
    assert hf.rel_err(got, case.merged) <= TOLERANCE


def test_scale_zero_is_the_base_model(cases, tmp_path_factory):
    case = _case(cases, "llama", tmp_path_factory.mktemp("llama"))
    base = archrun.load(case.base, backend="reference")
    scaled = archrun.load(case.base, backend="reference", lora=[(case.adapter, 0.0)])
    a = base.forward_step(case.ids, base.init_cache(len(case.ids)))
    assert np.array_equal(a, scaled.forward_step(case.ids, scaled.init_cache(len(case.ids))))


def test_not_an_adapter(cases, tmp_path_factory):
    case = _case(cases, "llama", tmp_path_factory.mktemp("llama"))
    with pytest.raises(AdapterError, match="is not an adapter: general.type is 'model'"):
        archrun.load(case.base, lora=case.base)


def test_adapter_of_another_architecture(cases, tmp_path_factory):
    llama = _case(cases, "llama", tmp_path_factory.mktemp("llama"))
    qwen3 = _case(cases, "qwen3", tmp_path_factory.mktemp("qwen3"))
    with pytest.raises(AdapterMismatch, match="is an adapter for 'llama' models; the model is 'qwen3'"):
        archrun.load(qwen3.base, lora=llama.adapter)


def test_adapter_of_another_shape(cases, tmp_path):
    case = _case(cases, "llama", tmp_path)
    name = "blk.0.attn_q.weight.lora_a"
    bad = rewrite_gguf(case.adapter, tmp_path / "bad.gguf", drop_tensors=[name],
                       add_tensors={name: np.ones((4, 32), np.float32)})
    with pytest.raises(AdapterMismatch, match=r"the change of 'blk.0.attn_q.weight' is \(64, 32\), the model's "
                                              r"tensor is \(64, 64\)"):
        archrun.load(case.base, lora=bad)


def test_adapter_with_half_a_pair_or_another_rank(cases, tmp_path):
    case = _case(cases, "llama", tmp_path)
    half = rewrite_gguf(case.adapter, tmp_path / "half.gguf", drop_tensors=["blk.1.ffn_up.weight.lora_b"])
    with pytest.raises(AdapterError, match=r"blk.1.ffn_up.weight.lora_b is missing"):
        archrun.load(case.base, lora=half)
    name = "blk.0.attn_k.weight.lora_a"
    rank3 = rewrite_gguf(case.adapter, tmp_path / "rank.gguf", drop_tensors=[name],
                         add_tensors={name: np.ones((3, 64), np.float32)})
    with pytest.raises(AdapterError, match="do not make a product"):
        archrun.load(case.base, lora=rank3)


def _lora_keys(alpha: float) -> dict:
    """The keys of a LoRA adapter file (llama.cpp's convert_lora_to_gguf.py)."""
    return {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": alpha}


def test_merge_is_w_plus_scaled_b_a(synth_model, tmp_path):
    """A hand-written adapter (alpha 8, rank 4, user scale 0.5) against the base file with W + 1.0 * B @ A
    written into it: the same bits on both backends; another merge is another cache owner."""
    base = synth_model()
    names = ["blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.1.attn_v.weight"]
    rng = np.random.default_rng(0)
    merged, tensors = {}, {}
    with open_gguf(base) as g:
        for name in names:
            n_out, n_in = g.tensors[name].np_shape
            a = rng.standard_normal((4, n_in)).astype(np.float32)
            b = rng.standard_normal((n_out, 4)).astype(np.float32)
            tensors[name + ".lora_a"], tensors[name + ".lora_b"] = a, b
            merged[name] = g.dequantize(name) + (b @ a) * np.float32(0.5 * 8 / 4)
    write_gguf(tmp_path / "adapter.gguf", "qwen3", _lora_keys(8.0), tensors)
    by_hand = rewrite_gguf(base, tmp_path / "merged.gguf", drop_tensors=names, add_tensors=merged)
    for backend in ("reference", "fast"):
        want, got, plain = (archrun.load(p, backend=backend, lora=lo) for p, lo in
                            ((by_hand, None), (base, [(tmp_path / "adapter.gguf", 0.5)]), (base, None)))
        a = want.forward_step([1, 2, 3, 4], want.init_cache(8))
        assert np.array_equal(a, got.forward_step([1, 2, 3, 4], got.init_cache(8)))
        assert not np.allclose(a, plain.forward_step([1, 2, 3, 4], plain.init_cache(8)), atol=1e-2)
        assert got.cache_owner.key != plain.cache_owner.key


@pytest.mark.parametrize("lora", [3, [b"x.gguf"], [("x.gguf", float("nan"))]])
def test_bad_lora_arguments(synth_model, lora):
    with pytest.raises(InvalidRequest):
        archrun.load(synth_model(), backend="reference", lora=lora)


def test_cli_lora_option(synth_model, tmp_path, capsys):
    from archrun.cli import main

    base = synth_model()
    adapter = tmp_path / "adapter.gguf"
    write_gguf(adapter, "qwen3", _lora_keys(0.0), {"blk.0.attn_q.weight.lora_a": np.full((2, 32), 0.3, np.float32),
                                                     "blk.0.attn_q.weight.lora_b": np.full((64, 2), 0.3, np.float32)})
    args = ["run", str(base), "-p", "<t5><t7>", "-n", "4", "--temp", "0", "--backend", "reference"]
    assert main([*args, "--lora", f"{adapter}:2"]) == 0
    assert main([*args, "--lora", str(base)]) == 1
    assert "is not an adapter" in capsys.readouterr().err


def test_cli_lora_argument():
    assert parse_lora_arg("a.gguf") == ("a.gguf", 1.0)
    assert parse_lora_arg("a.gguf:0.5") == ("a.gguf", 0.5)
    assert parse_lora_arg("C:/x/a.gguf") == ("C:/x/a.gguf", 1.0)
