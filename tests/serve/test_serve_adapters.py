"""Per-request LoRA adapters: `archrun serve BASE --adapter NAME=PATH[:SCALE]` serves the base model and, under
each NAME, the base with that adapter merged; a request's `lora` (or `model`) picks one. Each answer equals
greedy decoding of `archrun.load(BASE, lora=[(PATH, SCALE)])` (the merge itself is checked against PEFT in
tests/io/test_lora.py); two adapters and the base answer differently."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from support.live_server import live_app
from support.synth import write_model

import archrun
from archrun.cli import _adapter_models, _parser
from archrun.conformance.synthetic import write_gguf
from archrun.errors import InvalidRequest
from archrun.io.ggufset import open_gguf
from archrun.serve.config import ServeConfig
from archrun.serve.front import create_pool_app
from archrun.serve.models import model_files

PROMPT = [5, 9, 17, 33]
LORA_KEYS = {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 8.0}


def _adapter(path, base, seed: int):
    """A rank-4 LoRA adapter (alpha 8) on three of the base's matrices, written with the gguf writer."""
    names = ["blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.1.attn_v.weight"]
    rng = np.random.default_rng(seed)
    tensors = {}
    with open_gguf(base) as g:
        for name in names:
            n_out, n_in = g.tensors[name].np_shape
            tensors[name + ".lora_a"] = rng.standard_normal((4, n_in)).astype(np.float32)
            tensors[name + ".lora_b"] = rng.standard_normal((n_out, 4)).astype(np.float32)
    return write_gguf(path, "qwen3", LORA_KEYS, tensors)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("adapters")
    base = write_model(d / "base.gguf", n_layer=2)
    return base, _adapter(d / "style.gguf", base, 1), _adapter(d / "domain.gguf", base, 2)


def _greedy(model, n=6):
    cache = model.init_cache(32)
    logits, ids = model.forward_step(PROMPT, cache), []
    for _ in range(n):
        ids.append(int(logits.argmax()))
        if ids[-1] in model.tokenizer.eog_ids:
            ids.pop()
            break
        logits = model.forward_step(ids[-1:], cache)
    return model.tokenizer.decode(ids)


@pytest.fixture(scope="module")
def url(files):
    base, style, domain = files
    args = _parser().parse_args(["serve", str(base), "--adapter", f"style={style}", "--adapter",
                                 f"domain={domain}:0.5", "--backend", "fast"])
    found = model_files(args.model, None, None)
    loaders = _adapter_models(args, found)
    found += [(name, found[0][1]) for name in loaders if name != found[0][0]]
    app = create_pool_app(found, lambda path: archrun.load(path), ServeConfig(port=0), loaders)
    with live_app(app) as u:
        yield u


def _ask(url, **pick):
    r = httpx.post(url + "/v1/completions", timeout=120, json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                                                               **pick})
    return r.status_code, r.json()


def test_each_request_gets_its_adapter(url, files):
    base, style, domain = files
    want = {"base": _greedy(archrun.load(base)), "style": _greedy(archrun.load(base, lora=[(style, 1.0)])),
            "domain": _greedy(archrun.load(base, lora=[(domain, 0.5)]))}
    assert len(set(want.values())) == 3  # the adapters change the greedy text
    got = {"base": _ask(url), "style": _ask(url, lora="style"), "domain": _ask(url, model="domain"),
           "style again": _ask(url, model="base.gguf", lora="style")}
    assert all(status == 200 for status, _ in got.values()), got
    texts = {k: body["choices"][0]["text"] for k, (_, body) in got.items()}
    assert texts == {**want, "style again": want["style"]}
    listed = httpx.get(url + "/v1/models", timeout=30).json()["data"]
    assert {m["id"] for m in listed} == {"base.gguf", "style", "domain"}


def test_adapters_share_the_base_weights(files):
    base, style, _ = files
    plain = archrun.load(base)
    shared = archrun.load(base, lora=[(style, 1.0)], share_weights_with=plain)
    alone = archrun.load(base, lora=[(style, 1.0)])
    p, s = plain.plan.layers, shared.plan.layers
    assert s[0].ffn.down is p[0].ffn.down and s[1].ffn.gate_up.matrices[0] is p[1].ffn.gate_up.matrices[0]  # one copy
    assert s[0].qkv.matrices[0] is not p[0].qkv.matrices[0] and s[1].ffn.down is not p[1].ffn.down  # adapted
    assert np.array_equal(shared.forward_step(PROMPT, shared.init_cache(8)), alone.forward_step(PROMPT,
                                                                                                alone.init_cache(8)))
    for bad in (3, alone, archrun.load(base, backend="reference")):
        with pytest.raises(InvalidRequest, match="share_weights_with"):
            archrun.load(base, lora=[(style, 1.0)], share_weights_with=bad)


def test_unknown_or_bad_adapters_are_refused(url, files):
    status, body = _ask(url, lora="nope")
    assert status == 404 and "nope" in body["error"]["message"]
    assert _ask(url, lora=3)[0] == 400
    base, style, _ = files
    for bad in (["--adapter", "style"], ["--adapter", f"base.gguf={style}"], ["--adapter", "x=missing.gguf"],
                ["--adapter", f"a={style}", "--adapter", f"a={style}"], ["--adapter", f"a={style}", "--ray"],
                ["--adapter", f"a={style}", "--lora", str(style)]):
        args = _parser().parse_args(["serve", str(base), *bad])
        with pytest.raises(InvalidRequest):
            _adapter_models(args, model_files(args.model, None, None))
