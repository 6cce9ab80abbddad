"""Regression tests of the root causes the fuzzing harness (tests/fuzzing) found.

Every hostile input ends in success or a typed archrun.ArchrunError naming what was wrong:
non-finite weights and metadata, chat template compile errors and C-level builders, Rust panics
of the BPE engine, the sampler on non-finite logits and extreme options, rope scaling kinds,
API argument types, self-referencing messages, a FIFO as the model path, a file truncated after
load, and the loader's and tokenizer's memory under an address-space limit.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from support.gguf_fixtures import RawGGUF, T, V
from support.models import real_model

import archrun
from archrun.errors import (
    ChatTemplateError,
    ContextOverflow,
    InvalidRequest,
    MetadataError,
    ModelLoadError,
    NumericalError,
    TokenizerError,
)
from archrun.generation.sampling import Sampler, SamplingParams
from archrun.text.chat_template import render_chat
from archrun.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
from fuzzing.gguf_model import KV, parse, serialize  # noqa: E402

LLAMA = ROOT / "families/archrun-llama/tests/goldens/llama_gqa.gguf"
LONGROPE = ROOT / "families/archrun-phi/tests/goldens/phi_3_longrope.gguf"
USER = [{"role": "user", "content": "hi"}]


def _variant(tmp_path: Path, edit, src: Path = LLAMA, name: str = "v.gguf") -> Path:
    """A copy of a tiny fixture with `edit(model)` applied to its parsed form."""
    m = parse(src.read_bytes())
    edit(m)
    path = tmp_path / name
    path.write_bytes(serialize(m))
    return path


def _set(m, key: str, vtype: int, value) -> None:
    m.kvs = [kv for kv in m.kvs if kv.key != key] + [KV(key, vtype, value)]


@pytest.fixture(scope="module")
def model():
    return archrun.load(LLAMA, backend="reference")


# ---- 1. non-finite weights, scales and metadata ----------------------------------------------------

@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_f32_weight_is_refused_at_load(tmp_path, value) -> None:
    def poison(m):
        t = m.tensor("blk.1.ffn_down.weight")
        arr = np.frombuffer(t.data, np.float32).copy()
        arr[77] = value
        t.data = arr.tobytes()

    path = _variant(tmp_path, poison)
    for backend in ("fast", "reference"):
        with pytest.raises(ModelLoadError, match=r"'blk.1.ffn_down.weight' \(F32\).*non-finite.*element 77"):
            archrun.load(path, backend=backend)


@pytest.mark.parametrize("ggml_type", [T.Q8_0, T.Q4_K, T.Q6_K, T.F16, T.BF16])
def test_non_finite_block_scale_is_refused_at_load(tmp_path, ggml_type) -> None:
    from support.gguf_fixtures import SCALE_FIELDS, random_blocks

    def poison(m):
        t = m.tensor("blk.0.ffn_up.weight")
        n_blocks = 64 * 64 // (32 if ggml_type in (T.Q8_0, T.F16, T.BF16) else 256)
        if ggml_type in (T.F16, T.BF16):
            n_blocks = 64 * 64
        blocks = random_blocks(np.random.default_rng(0), ggml_type, n_blocks)
        if ggml_type == T.F16:
            blocks.reshape(-1).view(np.float16)[5] = np.inf
        elif ggml_type == T.BF16:
            blocks.reshape(-1).view(np.uint16)[5] = 0x7FC0  # NaN
        else:
            lo, hi = SCALE_FIELDS[ggml_type][0]
            blocks[3, lo:hi] = np.array([np.nan], np.float16).view(np.uint8)
        t.ggml_type, t.data = int(ggml_type), blocks.tobytes()

    if ggml_type in (T.Q4_K, T.Q6_K):
        pytest.skip("the tiny fixture's rows (64) are shorter than a k-quant block (256)")
    path = _variant(tmp_path, poison)
    with pytest.raises(ModelLoadError, match=r"'blk.0.ffn_up.weight'.*non-finite.*(element 5|scale of block 3)"):
        archrun.load(path, backend="reference")


@pytest.mark.parametrize("ggml_type", [T.F32, T.Q8_0])
def test_the_scan_in_ranges_names_the_global_index(tmp_path, monkeypatch, ggml_type) -> None:
    """The load scans a tensor a range at a time (releasing each range's pages); an Inf in a later
    range is reported at its index in the whole tensor."""
    from support.gguf_fixtures import SCALE_FIELDS, random_blocks

    from archrun.io import ggufio

    def poison(m):
        t = m.tensor("blk.1.ffn_down.weight")
        if ggml_type == T.F32:
            arr = np.frombuffer(t.data, np.float32).copy()
            arr[3000] = np.inf
            t.data = arr.tobytes()
        else:
            blocks = random_blocks(np.random.default_rng(0), ggml_type, 64 * 64 // 32)
            lo, hi = SCALE_FIELDS[ggml_type][0]
            blocks[100, lo:hi] = np.array([np.inf], np.float16).view(np.uint8)
            t.ggml_type, t.data = int(ggml_type), blocks.tobytes()

    monkeypatch.setattr(ggufio, "_SCAN_BYTES", 1000)  # ranges of 250 floats / 29 blocks
    path = _variant(tmp_path, poison)
    where = "element 3000" if ggml_type == T.F32 else "scale of block 100"
    with pytest.raises(ModelLoadError, match=rf"'blk.1.ffn_down.weight'.*non-finite.*{where};"):
        archrun.load(path, backend="reference")


def test_first_non_finite_finds_k_quant_scales() -> None:
    from support.gguf_fixtures import SCALE_FIELDS, random_blocks

    from archrun.io.quant import first_non_finite

    for t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        blocks = random_blocks(np.random.default_rng(1), t, 16)
        assert first_non_finite(blocks.reshape(-1), int(t)) is None
        for lo, hi in SCALE_FIELDS[t]:
            bad = blocks.copy()
            bad[9, lo:hi] = np.array([-np.inf], np.float16).view(np.uint8)
            assert first_non_finite(bad.reshape(-1), int(t)) == ("scale of block", 9)


@pytest.mark.parametrize("key", ["attention.scale", "attention.layer_norm_rms_epsilon", "rope.freq_base"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_non_finite_float_metadata_is_refused_at_compile(tmp_path, key, value) -> None:
    path = _variant(tmp_path, lambda m: _set(m, f"llama.{key}", V.FLOAT32, value))
    with pytest.raises(MetadataError, match=f"llama.{key}.*not a finite number"):
        archrun.load(path, backend="reference")


@pytest.mark.parametrize("backend", ["fast", "reference"])
@pytest.mark.parametrize("tensor", ["blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.0.attn_norm.weight"])
def test_overflowing_finite_weights_give_nan_logits_as_a_typed_error(tmp_path, backend, tensor) -> None:
    """Weights near float32's max are finite (accepted) but overflow the activations: the kernels
    divide by zero as IEEE says (never raising ZeroDivisionError), the logits say NaN where the
    overflow reaches them (the reference backend's always do; the fast backend's 8-bit activations
    may saturate instead), and sampling NaN logits stops generation with NumericalError."""
    def huge(m):
        t = m.tensor(tensor)
        t.data = np.full(len(t.data) // 4, 3e38, np.float32).tobytes()

    with np.errstate(all="ignore"):
        m = archrun.load(_variant(tmp_path, huge), backend=backend)
        steps = [m.forward_step([1, 2], m.init_cache(4))]
        c = m.init_cache(4)
        steps += [m.forward_step([3], c), m.forward_step([4], c)]  # one token at a time: the fused path
        if backend == "reference":
            assert all(np.isnan(x).all() for x in steps)
        for options in ({"temperature": 0.0}, {"seed": 1}):
            try:
                archrun.generate(m, [1, 2], max_tokens=2, **options).complete()
            except NumericalError as e:
                assert "NaN logits" in str(e)
            else:
                assert not np.isnan(steps[0]).any()


def test_moe_tensor_with_too_few_dimensions_is_a_shape_mismatch(tmp_path) -> None:
    """Found by the long fuzz run: a 1-D expert stack made the compiler index past its shape."""
    from archrun.errors import ShapeMismatch

    src = ROOT / "families/archrun-olmo/tests/goldens/olmoe_4experts.gguf"

    def flatten(m):
        t = m.tensor("blk.0.ffn_up_exps.weight")
        t.dims = [len(t.data) // 4]

    with pytest.raises(ShapeMismatch, match=r"'blk.0.ffn_up_exps.weight' has shape \(\d+,\), expected at least 2"):
        archrun.load(_variant(tmp_path, flatten, src=src), backend="reference")


# ---- 2. chat templates: compile errors and C-level builders ---------------------------------------

@pytest.mark.parametrize("template", [
    "{% break %}", "{% continue %}", "{% macro f(a, a) %}{% endmacro %}{{ f(1, 2) }}",
    "{% if true %}" * 120 + "x" + "{% endif %}" * 120, "{% for i in [1] %}" * 200 + "x" + "{% endfor %}" * 200,
    "{{ (" * 5000 + "1" + ") }}" * 5000,
])
def test_template_compile_errors_are_typed(template) -> None:
    with pytest.raises(ChatTemplateError):
        render_chat(template, USER)


@pytest.mark.parametrize("expr", [
    "'%*d' % (1000000000, 1)", "'%.*f' % (1000000000, 1.0)", "'x' * 1000000000", "[1, 2] * 1000000000",
    "'abc'|batch(1000000000)|list", "'x'|center(1000000000)", "'{:>{}}'.format(1, 1000000000)",
])
def test_template_builders_are_refused_before_they_allocate(expr) -> None:
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError, match="budget"):
        render_chat("{{ " + expr + " }}", USER)
    assert time.monotonic() - t0 < 1.0  # refused up front, not after building a gigabyte


# templates that allocate before their bounds: values cheap to hold (one string shared by a million list
# items) that flattening, joining or multiplying turns into terabytes; refused from their estimates
ALLOCATING_TEMPLATES = [
    "{% set a = ['x' * 1000000] * 1000000 %}{{ a|join|length }}",
    "{% set a = 'x' * 1000000 %}{% set b = [a, a, a, a, a, a, a, a] %}{% set c = [b, b, b, b, b, b, b, b] %}"
    "{{ c|join|length }}{{ c|tojson|length }}{{ c }}",
    "{% set a = 'x' * 1000000 %}{% set b = [a, a, a, a, a, a, a, a] %}{{ b ~ b }}",
    "{% set a = 'x' * 1000000 %}{% set b = [a, a, a, a, a, a, a, a] %}{{ '%s' % (b,) }}",
    "{% set a = 'x' * 1000000 %}{% set b = [a, a, a, a, a, a, a, a] %}{{ '{}'.format(b) }}",
    "{% set a = ['x' * 1000000] * 1000000 %}{{ a|string|length }}",
    "{% set a = ['x' * 1000000] * 1000000 %}{{ a|unique|list|length }}",
    "{% set a = [[1]] * 1000000 %}{{ a|sum(start=[])|length }}",
    "{{ range(100000)|join('x' * 1000000) }}", "{{ range(100000)|map('string')|join('x' * 1000000) }}",
    "{{ ''.join(range(100000)|map('string')|list) }}{{ ('x' * 1000000).join(range(100000)|map('string')) }}",
    "{{ (('a\n' * 500000)|indent(1000000))|length }}", "{{ ('\t' * 1000000).expandtabs(1000000)|length }}",
    "{{ ('a' * 1000000)|replace('a', 'b' * 1000000)|length }}", "{{ ('a' * 1000000).replace('a', 'b' * 1000000) }}",
    "{{ ('a' * 1000000).translate({97: 'b' * 1000000})|length }}",
    "{{ dict.fromkeys(range(100000), 'x' * 1000000)|tojson|length }}",
    "{{ ('ab\n' * 300000)|wordwrap(2, wrapstring='x' * 1000000)|length }}",
    "{{ ('%999999s' * 100000) % ((1,) * 100000) }}", "{{ ('{:999999}' * 100000).format(*range(100000)) }}",
    "{{ ('{:>{}}' * 100000).format(*([1, 1000000] * 100000)) }}",
    "{% set ns = namespace(x=[]) %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x + ['y' * 1000] %}"
    "{% endfor %}{{ ns.x|length }}",
    "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = [ns.s, ns.s] %}{% endfor %}"
    "{{ ns|string|length }}",
    "{{ messages|tojson(indent=1000000) }}", "{{ range(10)|batch(1000000, 'x' * 1000000)|list|length }}",
    "{{ (['x' * 100000] * 10)|map('center', 1000000)|join|length }}",
]


def test_templates_that_allocate_are_refused_under_a_2_gib_address_space() -> None:
    """Each construct ends in ChatTemplateError naming the budget, refused from an estimate before it allocates:
    no MemoryError in a process limited to 2 GiB of address space, and each within 1.5 s of CPU time (the
    process's, not the wall clock's: a loaded host must not fail it)."""
    out = _python(f"""
        import json, resource, time
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from archrun.text.chat_template import render_chat
        from archrun.errors import ArchrunError
        results = []
        for t in {json.dumps(ALLOCATING_TEMPLATES)}:
            t0 = time.process_time()
            try:
                render_chat(t, [{{"role": "user", "content": "hi"}}])
                got = "rendered"
            except ArchrunError as e:
                got = type(e).__name__ + ": " + str(e)
            except BaseException as e:
                got = "untyped " + type(e).__name__ + ": " + str(e)
            results.append([got[:300], time.process_time() - t0])
        print(json.dumps(results))
    """, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for template, (got, seconds) in zip(ALLOCATING_TEMPLATES, results, strict=True):
        assert got.startswith("ChatTemplateError: chat template exceeded its budget"), (template, got)
        assert "MemoryError" not in got and seconds < 1.5, (template, got, seconds)


def test_templates_real_and_small_still_render() -> None:
    """The budgets count what is built, not what is held: a large conversation's tools and contents pass."""
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(50)]
    text = render_chat("{{ tools|tojson(indent=2) }}{% for m in messages %}{{ m.content|trim }}{% endfor %}"
                       "{{ messages|map(attribute='role')|join(', ') }}{{ range(1000)|sum }}"
                       "{{ [[1], [2]]|sum(start=[]) }}", [{"role": "user", "content": "x" * 200_000}] * 3, tools=tools)
    assert len(text) > 600_000 and text.endswith("user, user, user499500[1, 2]")


# ---- 3. the BPE engine's Rust panics ---------------------------------------------------------------

def test_merge_whose_result_is_no_token_is_a_tokenizer_error() -> None:
    """HF tokenizers panics (pyo3 PanicException, a BaseException) on such a merge."""
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
            "tokenizer.ggml.tokens": ["a", "b", "ab", "c"], "tokenizer.ggml.merges": ["a b", "ab c"]}
    with pytest.raises(TokenizerError, match=r"merge 1 ab c: 'abc' is not a token"):
        Tokenizer.from_metadata(meta)


# ---- 4. the sampler --------------------------------------------------------------------------------

def _logits(n: int = 50) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_sampler_nan_logits_are_a_numerical_error(temperature) -> None:
    x = _logits()
    x[7] = np.nan
    with pytest.raises(NumericalError, match="NaN logits"):
        Sampler(SamplingParams(temperature=temperature, seed=0), 50)(x)


def test_sampler_infinite_logits() -> None:
    x = _logits()
    x[[3, 9]] = np.inf
    x[[1, 2]] = -np.inf
    for params in (SamplingParams(seed=1), SamplingParams(temperature=0.0), SamplingParams(top_k=0, min_p=0)):
        assert Sampler(params, 50)(x) in (3, 9)
    x = np.full(50, -np.inf, np.float32)
    x[4] = 0.0
    assert Sampler(SamplingParams(seed=0), 50)(x) == 4


@pytest.mark.parametrize("params", [
    {"temperature": 1e-300}, {"temperature": 5e-324}, {"temperature": 1e308}, {"top_p": 1e-300},
    {"min_p": 1.0}, {"repetition_penalty": 1e-308}, {"repetition_penalty": 1e308}, {"frequency_penalty": -1e308},
    {"frequency_penalty": 1e308}, {"presence_penalty": -1e308}, {"top_k": 10**18}, {"penalty_last_n": 10**18},
    {"seed": 2**200}, {"logit_bias": {3: math.inf}}, {"logit_bias": {3: -math.inf, 4: math.inf}},
    {"frequency_penalty": 2**63}, {"presence_penalty": -(2**70)}, {"temperature": 10**300},  # ints (a long run)
    {"top_k": 2**70}, {"penalty_last_n": 10**30}, {"logit_bias": {3: 10**400, 5: -(2**64)}},
])
def test_sampler_extreme_but_valid_options(params) -> None:
    tok = Sampler(SamplingParams(**{"seed": 0, **params}), 50)(_logits(), [1, 1, 2, 3])
    assert 0 <= tok < 50


def test_sampler_options_that_exclude_every_token() -> None:
    with pytest.raises(InvalidRequest, match="no token"):
        Sampler(SamplingParams(logit_bias={i: -math.inf for i in range(5)}), 5)(_logits(5))


@pytest.mark.parametrize("params", [{"temperature": 10**400}, {"frequency_penalty": -(10**400)}, {"top_p": 10**400}])
def test_sampler_ints_beyond_float_range_are_refused(params) -> None:
    with pytest.raises(InvalidRequest, match="finite number"):
        SamplingParams(**params)


@pytest.mark.parametrize("bias", [{1.5: 1.0}, {2.0: 1.0}, 1, "x", [(1, 2.0)], {b"1": 1.0}, {True: 1.0}])
def test_logit_bias_keys_and_types_are_checked(bias) -> None:
    with pytest.raises(InvalidRequest, match="logit_bias"):
        Sampler(SamplingParams(logit_bias=bias), 50)


def test_logit_bias_accepts_numpy_and_json_string_ids() -> None:
    s = Sampler(SamplingParams(logit_bias={np.int64(3): 100.0, "4": -100.0}, temperature=0.0), 50)
    assert s(np.zeros(50, np.float32)) == 3


# ---- 5. rope scaling kinds: compiled means runnable ------------------------------------------------

@pytest.mark.parametrize("scaling", ["yarn", "linear", "none"])
@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_rope_scaling_that_compiles_also_runs(tmp_path, scaling, backend) -> None:
    def edit(m):
        _set(m, "llama.rope.scaling.type", V.STRING, scaling)
        _set(m, "llama.rope.scaling.factor", V.FLOAT32, 4.0)

    m = archrun.load(_variant(tmp_path, edit), backend=backend)
    assert np.isfinite(m.forward_step([1, 2, 3], m.init_cache(4))).all()


def test_longrope_runs_and_unknown_scaling_is_refused_at_compile(tmp_path) -> None:
    m = archrun.load(LONGROPE, backend="reference")
    assert np.isfinite(m.forward_step([1, 2, 3], m.init_cache(4))).all()
    path = _variant(tmp_path, lambda m: _set(m, "llama.rope.scaling.type", V.STRING, "dynamic"))
    with pytest.raises(MetadataError, match="rope scaling must be one of"):
        archrun.load(path, backend="reference")
    path = _variant(tmp_path, lambda m: _set(m, "llama.rope.scaling.type", V.STRING, "longrope"), name="l.gguf")
    with pytest.raises(ModelLoadError, match="rope_factors_long"):
        archrun.load(path, backend="reference")


# ---- 6. API argument types -------------------------------------------------------------------------

def _selfref_message() -> list:
    message: dict = {"role": "user", "content": "hi"}
    message["tool_calls"] = [message]
    return [message]


def _deep_message() -> list:
    """A message holding a 10,000-deep list."""
    value: object = "x"
    for _ in range(10_000):
        value = [value]
    return [{"role": "user", "content": "hi", "extra": value}]


@pytest.mark.parametrize("call", [
    lambda m: archrun.generate(m, None), lambda m: archrun.generate(m, 5), lambda m: archrun.generate(m, b"hi"),
    lambda m: archrun.generate(m, [1.5, 2]), lambda m: archrun.generate(m, [1], cache=b"x"),
    lambda m: archrun.generate(m, [1], logit_bias=[1, 2]), lambda m: archrun.generate(m, [1], max_tokens="3"),
    lambda m: archrun.chat(m, None), lambda m: archrun.chat(m, 5), lambda m: archrun.chat(m, _selfref_message()),
    lambda m: archrun.chat(m, _deep_message()), lambda m: archrun.chat(m, [{"role": b"user", "content": "x"}]),
    lambda m: m.forward_step([[1, 2], [3]], m.init_cache(4)), lambda m: m.forward_step([1], "cache"),
    lambda m: m.forward_step(_selfref_message(), m.init_cache(4)), lambda m: m.init_cache(2.5),
    lambda m: m.tokenizer.decode(256), lambda m: m.tokenizer.decode(b"abc"), lambda m: m.tokenizer.decode(np.uint8(3)),
    lambda m: m.tokenizer.decode(np.array(3)), lambda m: m.tokenizer.decode(np.zeros((2, 2), np.int64)),
    lambda m: m.tokenizer.encode(b"abc"),
    lambda m: archrun.load(None), lambda m: archrun.load(b"/x.gguf"), lambda m: archrun.load("a\x00b"),
    lambda m: archrun.load(LLAMA, threads=1.5), lambda m: archrun.load(LLAMA, backend="gpu"),
    # found by the second long run: quoting a 100,000-deep list in the message recursed
    lambda m: m.init_cache(_deep_message()), lambda m: m.init_cache(8, _selfref_message()),
    lambda m: archrun.generate(m, [1], max_tokens=_deep_message()),
    lambda m: archrun.load(LLAMA, threads=_deep_message()),
    lambda m: archrun.generate(m, [1], temperature=_deep_message()),
    lambda m: archrun.load(LLAMA, backend=_deep_message()),
    lambda m: archrun.load(LLAMA, block_style={"x": 1}), lambda m: archrun.load(LLAMA, block_style=["fused"]),
    lambda m: archrun.load(LLAMA, hints=[1]), lambda m: archrun.load(LLAMA, hints={1: 2}),
])
def test_wrong_argument_types_are_typed_errors(model, call) -> None:
    with pytest.raises(archrun.ArchrunError):
        gen = call(model)
        if hasattr(gen, "complete"):
            gen.complete()


def test_numpy_integers_are_accepted(model) -> None:
    ids = np.array([1, 2, 3], np.int32)
    r = archrun.generate(model, ids, max_tokens=np.int64(2), temperature=0.0).complete()
    assert r.completion_tokens <= 2
    assert model.tokenizer.decode([np.int64(5), np.uint8(6)]) == model.tokenizer.decode([5, 6])
    cache = model.init_cache(np.int64(8))
    model.forward_step(np.array([1, 2], np.uint16), cache)
    options = {"temperature": np.float32(0.5), "top_k": np.int64(5), "top_p": np.float32(0.9),
               "min_p": np.float64(0.01), "repetition_penalty": np.float32(1.1), "penalty_last_n": np.uint8(8),
               "seed": np.int64(3), "logit_bias": {np.int32(3): np.float32(1.0)}}
    r = archrun.generate(model, [1, 2], max_tokens=2, **options).complete()
    assert r.completion_tokens <= 2
    with pytest.raises(InvalidRequest):
        SamplingParams(top_k=np.bool_(True))


# ---- 7/8. the model file: FIFO, devices, truncation after load -------------------------------------

def _python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, NUMBA_NUM_THREADS="1"))


def test_load_of_a_fifo_or_device_does_not_block(tmp_path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    out = _python(f"""
        import archrun
        for path in ({str(fifo)!r}, "/dev/zero", "/dev/null", {str(tmp_path)!r}):
            try:
                archrun.load(path)
            except archrun.ModelLoadError as e:
                print(e)
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "it is a FIFO" in out.stdout and "it is a device" in out.stdout and "it is a directory" in out.stdout


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_file_truncated_after_load_is_a_typed_error_not_sigbus(tmp_path, backend) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(LLAMA.read_bytes())
    out = _python(f"""
        import os, archrun
        m = archrun.load({str(path)!r}, backend={backend!r})
        m.forward_step([1, 2], m.init_cache(8))
        os.truncate({str(path)!r}, 4096)
        try:
            m.forward_step([1, 2], m.init_cache(8))
        except archrun.ModelLoadError as e:
            print("typed:", e)
    """, timeout=900)  # fast: a cold kernel cache compiles the whole decode path in this child (minutes on 2 cores)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])  # -7 would be SIGBUS
    assert "typed:" in out.stdout and "shrank" in out.stdout


# ---- memory: the loader and the tokenizer under an address-space limit -----------------------------

def _hostile_files(tmp: Path) -> dict[str, Path]:
    """Files whose headers ask for far more memory than they hold."""
    files = {}
    files["token count 2^40"] = RawGGUF().kv_str("general.architecture", "llama").kv_raw(
        "tokenizer.ggml.tokens", V.ARRAY, (int(V.STRING)).to_bytes(4, "little") + (1 << 40).to_bytes(8, "little")
    ).write(tmp / "a.gguf", data=bytes(4096))
    files["u64 array 2^37"] = RawGGUF().kv_raw(
        "x", V.ARRAY, (int(V.UINT64)).to_bytes(4, "little") + (1 << 37).to_bytes(8, "little")
    ).write(tmp / "b.gguf", data=bytes(4096))
    files["string length 2^62"] = RawGGUF().kv_raw("x", V.STRING, (1 << 62).to_bytes(8, "little") + b"ab").write(
        tmp / "c.gguf")
    files["tensor 2^40 elements"] = RawGGUF().tensor("w", (1 << 20, 1 << 20), T.F32, 0).write(
        tmp / "d.gguf", data=bytes(4096))
    files["n_kv 2^60"] = RawGGUF().write(tmp / "e.gguf", n_kv=1 << 60, data=bytes(64))
    many = [f"t{i}" for i in range(20000)]
    files["20000 merges of unknown tokens"] = _variant(
        tmp, lambda m: _set_array(m, "tokenizer.ggml.merges", many), name="f.gguf")
    return files


def _set_array(m, key: str, items: list) -> None:
    m.kvs = [kv for kv in m.kvs if kv.key != key] + [KV(key, V.ARRAY, items, V.STRING)]


def test_loader_and_tokenizer_memory_is_bounded_by_the_file_size(tmp_path) -> None:
    """Each file is opened, compiled, its tokenizer built and (if valid) loaded on both backends and
    stepped, in a process whose address space may grow by at most 64 MiB + 8 x the file size beyond
    what it had after importing archrun and loading a model once (so the kernels and libraries are in)."""
    files = {**_hostile_files(tmp_path), "valid": LLAMA}
    out = _python(f"""
        import json, os, resource, archrun
        from archrun.describe.compile import compile_gguf
        from archrun.io.ggufset import open_gguf
        for backend in ("fast", "reference"):
            archrun.load({str(LLAMA)!r}, backend=backend).tokenizer.encode("warm up")
        def vm():
            return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        results = {{}}
        for name, path in {json.dumps({k: str(v) for k, v in files.items()})}.items():
            limit = vm() + 64 * 2**20 + 8 * os.path.getsize(path)
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
            try:
                with open_gguf(path) as g:
                    compile_gguf(g)
                    archrun.Tokenizer.from_metadata(g.metadata).encode("hello world " * 100)
                for backend in ("fast", "reference"):
                    m = archrun.load(path, backend=backend)
                    m.forward_step([1, 2, 3], m.init_cache(8))
                    del m
                results[name] = "ok"
            except archrun.ArchrunError as e:
                results[name] = "typed: " + str(e)[:80]
            except MemoryError:
                results[name] = "MemoryError"
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print(json.dumps(results))
    """, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert results["valid"] == "ok"
    bad = {k: v for k, v in results.items() if k != "valid" and not v.startswith("typed")}
    assert not bad, results


def test_fast_load_of_a_real_model_stays_within_a_small_multiple_of_its_size() -> None:
    """SmolLM2 Q4_1 (94 MiB): the map, the repacked weights and a 256-token cache fit in 4 x the
    file size + 128 MiB of address space (measured: ~2.6 x)."""
    path = real_model("smollm2")
    out = _python(f"""
        import os, resource, archrun
        archrun.load({str(LLAMA)!r})
        vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        limit = vm + 128 * 2**20 + 4 * os.path.getsize({str(path)!r})
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
        m = archrun.load({str(path)!r})
        archrun.generate(m, "Hello", max_tokens=4, temperature=0.0).complete()
        print("ok")
    """, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_error_messages_quote_hostile_values_briefly() -> None:
    from archrun.errors import shown

    class Raising:
        def __repr__(self):
            raise RuntimeError("no repr")

    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert shown(deep) == "[[[[...]]]]"
    assert shown(_selfref_message()).startswith("[{")
    assert shown(Raising()).startswith("<Raising")
    assert len(shown("x" * 10**6)) <= 100


@pytest.mark.parametrize(("prompt", "gen", "error"), [
    (10**21, 2, ContextOverflow), (4, 10**9, ContextOverflow), (0, 2, InvalidRequest), (4, -1, InvalidRequest),
])
def test_bench_token_counts_are_checked_before_allocating(prompt, gen, error) -> None:
    """Found by the fuzzer: `archrun bench --prompt-tokens 10**21` asked numpy for 10**21 ids."""
    from archrun.benchmark import run_bench

    with pytest.raises(error):
        run_bench(LLAMA, backend="reference", prompt_tokens=prompt, gen_tokens=gen)
