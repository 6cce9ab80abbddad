"""Hypothesis strategies for fuzz cases: JSON-able dicts the worker turns into hostile inputs.

A case names a seed (one of the tiny fixtures in SEEDS) and says what to do to it: structured
edits of the parsed GGUF (metadata keys, value types, tensor infos, tensor data, tokenizer arrays
and merges, chat template), then byte edits of the serialized file; or a chat template to render;
or an API/CLI call with hostile arguments on a valid model; or a filesystem special (a FIFO, a
file truncated after load, a device). Hostile Python values that JSON cannot hold are tagged
dicts ({"$": "bytes", ...}) that `worker.build_value` turns into the real thing.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
# small fixtures of different shapes: GQA, tied, softcaps, learned positions, longrope, ALiBi, MoE, sliding
SEEDS = (
    "families/archrun-llama/tests/goldens/llama_gqa.gguf",
    "families/archrun-qwen/tests/goldens/qwen3_tied_kv1.gguf",
    "families/archrun-gemma/tests/goldens/gemma2_softcaps.gguf",
    "families/archrun-gpt2/tests/goldens/gpt2_tied.gguf",
    "families/archrun-phi/tests/goldens/phi_3_longrope.gguf",
    "families/archrun-mpt/tests/goldens/mpt_alibi.gguf",
    "families/archrun-olmo/tests/goldens/olmoe_4experts.gguf",
    "families/archrun-gemma3/tests/goldens/gemma3_period6_tied.gguf",
)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# ---- values ---------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
SPECIAL_INTS = [0, 1, -1, 2, 3, 7, 16, 31, 32, 64, 255, 256, 1023, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 10**6, 10**9, 10**12]
SPECIAL_FLOATS = ["nan", "inf", "-inf", 0.0, -0.0, 1e-45, 5e-324, 1e-38, 3.4e38, 1e308, -1.0, 0.5, 1e-6, 1e6, 1e30]
TEXTS = ["", " ", "hello world", "<|im_end|>", "<|im_start|>user", "<t4>", "<", "\x00", "\n\n\n", "é漢字🙂",
         "\ufffd", "a" * 300, "<0x41>", "▁▁", "Ġ", "\u2581hello", "\r\n\t", "{{ 1 }}", "{% raw %}"]


def ints() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(SPECIAL_INTS), st.sampled_from([-x for x in SPECIAL_INTS[1:]]),
                     st.integers(-(2**65), 2**65))


def floats() -> st.SearchStrategy:
    """Floats as JSON: "nan"/"inf"/"-inf" strings stand for the non-finite values."""
    return st.one_of(st.sampled_from(SPECIAL_FLOATS),
                     st.floats(allow_nan=False, allow_infinity=False, width=32))


def texts() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(TEXTS), st.text(max_size=24))


# ---- GGUF edits -----------------------------------------------------------------------------------

ARCH_KEYS = [
    "attention.scale", "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
    "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_attn_factor", "rope.scaling.attn_factor", "rope.freq_base", "rope.freq_base_swa",
    "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.dimension_count", "vocab_size",
    "logit_scale", "final_logit_softcapping", "attn_logit_softcapping", "attention.sliding_window",
    "attention.sliding_window_pattern", "expert_count", "expert_used_count", "embedding_scale", "residual_scale",
    "attention.clamp_kqv", "attention.max_alibi_bias", "nextn_predict_layers", "leading_dense_block_count",
    "expert_weights_scale", "expert_gating_func", "expert_feed_forward_length", "expert_weights_norm",
    "use_parallel_residual",
]
GLOBAL_KEYS = [
    "general.alignment", "general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
]
STRING_VALUES = ["", "yarn", "longrope", "linear", "none", "llama3", "llama", "gpt2", "qwen2", "bert", "bogus",
                 "x" * 5000, "\udcff", "gemma3", "qwen3", "mpt", "t5", "bert", "rwkv"]
VALUE_TYPES = list(range(13))  # GGUFValueType codes 0..12
BAD_TYPE_CODES = [13, 99, 255, 2**31, 2**32 - 1]
GGML_TYPES = [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30, 16, 17, 18, 19, 20, 21, 22, 23, 24, 4, 5, 39, 40,
              99, 2**31]
QUANT_TYPES = [2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 1, 30]  # supported ggml block types (+ F16, BF16)
DATA_VALUES = ["nan", "inf", "-inf", "denormal", "huge", "zero", "-zero", "max"]
SCALE_KINDS = ["finite", "nan", "inf", "denormal", "zero", "huge"]


@st.composite
def array_values(draw) -> dict:
    etype = draw(st.one_of(st.sampled_from(VALUE_TYPES), st.sampled_from(BAD_TYPE_CODES)))
    if etype == 8:
        items = draw(st.lists(texts(), max_size=6))
    elif etype in (6, 12):
        items = draw(st.lists(floats(), max_size=6))
    elif etype == 7:
        items = draw(st.lists(st.integers(0, 3), max_size=6))
    else:
        items = draw(st.lists(ints(), max_size=6))
    count = draw(st.one_of(st.none(), st.none(), ints()))
    return {"etype": etype, "items": items, "count": count}


@st.composite
def kv_values(draw) -> dict:
    """A (type code, value) pair; the value usually fits the type, sometimes not."""
    vtype = draw(st.one_of(st.sampled_from(VALUE_TYPES), st.sampled_from(VALUE_TYPES),
                           st.sampled_from(BAD_TYPE_CODES)))
    if vtype == 8:
        return {"vtype": 8, "value": draw(st.one_of(st.sampled_from(STRING_VALUES), texts()))}
    if vtype == 9:
        return {"vtype": 9, **draw(array_values())}
    if vtype in (6, 12):
        return {"vtype": vtype, "value": draw(floats())}
    if vtype == 7:
        return {"vtype": 7, "value": draw(st.integers(0, 3))}
    if vtype in BAD_TYPE_CODES:
        return {"vtype": vtype, "value": None}
    return {"vtype": vtype, "value": draw(ints())}


def key_names() -> st.SearchStrategy:
    """A metadata key: "{arch}.x" names are resolved against the file's architecture."""
    return st.one_of(st.sampled_from(["{arch}." + k for k in ARCH_KEYS]), st.sampled_from(GLOBAL_KEYS),
                     st.integers(0, 60).map(lambda i: f"#{i}"), texts())


def tensor_refs() -> st.SearchStrategy:
    """A tensor: '#i' is the i-th tensor of the file (mod its count), other strings are names."""
    return st.one_of(st.integers(0, 60).map(lambda i: f"#{i}"),
                     st.sampled_from(["token_embd.weight", "output.weight", "output_norm.weight",
                                      "blk.0.attn_q.weight", "blk.0.attn_norm.weight", "blk.0.ffn_down.weight",
                                      "rope_factors_long.weight", "position_embd.weight"]))


def _dims() -> st.SearchStrategy:
    return st.lists(st.one_of(st.sampled_from([0, 1, 2, 31, 32, 64, 256, 288, 2**32, 2**63, 2**64 - 1]),
                              st.integers(0, 1024)), min_size=0, max_size=6)


def gguf_edits() -> st.SearchStrategy[dict]:
    """One structured edit of a parsed seed."""
    return st.one_of(
        st.builds(lambda k, v: {"op": "set_kv", "key": k, **v}, key_names(), kv_values()),
        st.builds(lambda k: {"op": "del_kv", "key": k}, key_names()),
        st.builds(lambda k: {"op": "dup_kv", "key": k}, key_names()),
        st.builds(lambda k, t: {"op": "retype_kv", "key": k, "vtype": t}, key_names(),
                  st.one_of(st.sampled_from(VALUE_TYPES), st.sampled_from(BAD_TYPE_CODES))),
        st.builds(lambda k, n: {"op": "array_count", "key": k, "count": n},
                  st.sampled_from(["tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                                   "#0", "#5", "#12"]), ints()),
        st.builds(lambda t, d: {"op": "tensor_dims", "tensor": t, "dims": d}, tensor_refs(), _dims()),
        st.builds(lambda t, n: {"op": "tensor_ndims", "tensor": t, "n_dims": n}, tensor_refs(),
                  st.sampled_from([0, 1, 2, 3, 4, 5, 64, 2**32 - 1])),
        st.builds(lambda t, g: {"op": "tensor_type", "tensor": t, "type": g}, tensor_refs(),
                  st.sampled_from(GGML_TYPES)),
        st.builds(lambda t, o: {"op": "tensor_offset", "tensor": t, "offset": o}, tensor_refs(),
                  st.one_of(st.sampled_from([0, 1, 16, 32, 2**63, 2**64 - 32, 2**64 - 1]), st.integers(0, 2**20))),
        st.builds(lambda t, n: {"op": "tensor_rename", "tensor": t, "name": n}, tensor_refs(),
                  st.one_of(tensor_refs(), texts())),
        st.builds(lambda t: {"op": "tensor_drop", "tensor": t}, tensor_refs()),
        st.builds(lambda t: {"op": "tensor_dup", "tensor": t}, tensor_refs()),
        st.builds(lambda t, v, p, n: {"op": "tensor_values", "tensor": t, "value": v, "pos": p, "n": n},
                  tensor_refs(), st.sampled_from(DATA_VALUES), st.integers(0, 2**20),
                  st.sampled_from([1, 1, 3, 10**6])),
        st.builds(lambda t, q, s, r: {"op": "tensor_quantize", "tensor": t, "type": q, "scales": s, "seed": r},
                  tensor_refs(), st.sampled_from(QUANT_TYPES), st.sampled_from(SCALE_KINDS), st.integers(0, 1000)),
        st.builds(lambda f, v: {"op": "header", "field": f, "value": v},
                  st.sampled_from(["magic", "version", "n_kv", "n_tensors", "alignment"]), ints()),
        tokenizer_edits(),
        st.builds(lambda t: {"op": "set_kv", "key": "tokenizer.chat_template", "vtype": 8, "value": t}, templates()),
    )


def tokenizer_edits() -> st.SearchStrategy[dict]:
    """Edits of tokenizer arrays and merges (elements replaced, appended, malformed)."""
    merge_texts = st.one_of(st.sampled_from(["", " ", "a", "a b", "a  b", " a", "a ", "a b c", "<t4> <t5>",
                                             "< t", "zz qq", "\u0120 \u0120", "Ġ Ġ", "\x00 \x00", "é 漢"]), texts())
    return st.one_of(
        st.builds(lambda i, v: {"op": "array_set", "key": "tokenizer.ggml.tokens", "index": i, "value": v},
                  ints(), st.one_of(texts(), st.sampled_from(["<0xZZ>", "<0x41>", "x" * 20000, "<|im_end|>"]))),
        st.builds(lambda i, v: {"op": "array_set", "key": "tokenizer.ggml.merges", "index": i, "value": v},
                  ints(), merge_texts),
        st.builds(lambda v, n: {"op": "array_append", "key": "tokenizer.ggml.merges", "value": v, "n": n},
                  merge_texts, st.sampled_from([1, 2, 100])),
        st.builds(lambda i, v: {"op": "array_set", "key": "tokenizer.ggml.token_type", "index": i, "value": v},
                  ints(), st.one_of(st.integers(-3, 9), ints())),
        st.builds(lambda a, b: {"op": "merge_pair", "a": a, "b": b}, st.integers(0, 300), st.integers(0, 300)),
        st.builds(lambda v: {"op": "spm", "scores": v}, st.sampled_from(["finite", "nan", "inf", "missing", "short"])),
        st.builds(lambda r, i: {"op": "special_id", "role": r, "value": i},
                  st.sampled_from(["bos", "eos", "eot", "padding", "unknown", "eom", "sep"]), ints()),
    )


def byte_edits() -> st.SearchStrategy[dict]:
    """Edits of the serialized file: positions are taken modulo its length."""
    return st.one_of(
        st.builds(lambda p: {"op": "truncate", "pos": p}, st.integers(0, 2**20)),
        st.builds(lambda p, x: {"op": "flip", "pos": p, "xor": x}, st.integers(0, 2**20), st.integers(1, 255)),
        st.builds(lambda p, x: {"op": "flip_header", "pos": p, "xor": x}, st.integers(0, 4096), st.integers(1, 255)),
        st.builds(lambda p, b: {"op": "set", "pos": p, "hex": b.hex()}, st.integers(0, 4096),
                  st.one_of(st.sampled_from([b"\xff" * 8, b"\x00" * 8, b"\xff\xff\xff\x7f", b"\x00\x00\xc0\x7f"]),
                            st.binary(min_size=1, max_size=8))),
        st.builds(lambda p, b: {"op": "insert", "pos": p, "hex": b.hex()}, st.integers(0, 4096), st.binary(max_size=8)),
        st.builds(lambda p, n: {"op": "delete", "pos": p, "n": n}, st.integers(0, 4096), st.integers(1, 16)),
    )


# ---- chat templates -------------------------------------------------------------------------------

SIZES = [0, 1, 2, 10, 1000, 10**5, 10**6, 10**7, 10**9, 10**18, -1, -(10**9)]
EXPRS = [
    "'x' * {n}", "[1] * {n}", "[1, 2] * {n}", "('a',) * {n}", "{n} * 'x'", "range({n})|list", "range({n})|length",
    "{n} ** {n}", "2 ** {n}", "'%*d' % ({n}, 1)", "'%.*f' % ({n}, 1.0)", "'%{n}d' % 1", "'{{:>{n}}}'.format(1)",
    "'x'|center({n})", "'abc'|batch({n})|list", "range(10)|batch({n})|list", "range(10)|slice({n})|list",
    "'ab'|wordwrap({n})", "'a\\nb'|indent({n})", "messages|tojson(indent={n})", "'x'|truncate({n})",
    "'abc'|replace('a', 'b' * {n})", "('x' * 100)|replace('x', 'yy' * 100)", "'%s' % messages",
    "messages[0].__class__", "''.__class__.__mro__", "messages.__class__.__subclasses__()", "cycler(1,2).next()",
    "joiner()", "namespace(_x=1)", "namespace(a={n})", "lipsum({n})", "raise_exception('boom')",
    "strftime_now('%Y' * {n})", "range({n})|sum", "messages|map(attribute='role')|join(',')", "messages|unique|list",
    "'x'|int", "'1e999'|float", "1.5|round({n})", "{n}|filesizeformat", "'www.x.com'|urlize", "{{'a': 1}}|xmlattr",
    "{{'b': 1, 'a': 2}}|dictsort", "messages|groupby('role')", "messages|selectattr('role')|list",
    "messages|attr('__class__')", "'<b>x</b>'|striptags", "[1,2]|random", "self", "self._TemplateReference__context",
    "dict(a=1).update(b=2)", "[].append(1)", "{n} // 0", "{n} % 0", "1 / 0", "'%s' % ()", "'{{0}}'.format_map({{}})",
    "'{{0.__class__}}'.format(1)", "x.y.z", "undefined_name()", "messages[{n}]", "messages[0]['content'][{n}]",
    "(messages|first).content * {n}", "range(3)|map('string')|join", "'%c' % {n}", "{n}|string|length",
    "'abc'[::{n}]", "loop.cycle(1)", "caller()", "varargs", "kwargs", "none.x", "[]|max", "[]|first",
    "'x'|format({n})", "'%s'|format(messages)", "{n} ~ 'x'", "('x' ~ 'y') * {n}", "range(3)|join('x' * {n})",
    # allocation-heavy: what flattening or multiplying builds from values that are cheap to hold
    "(['x' * {n}] * {n})|join|length", "range({n})|join('x' * {n})", "range({n})|map('string')|join('x' * {n})",
    "(['x' * {n}] * {n})|string|length", "(['x' * {n}] * {n})|tojson|length", "([[1] * {n}] * {n})|sum(start=[])",
    "([[1]] * {n})|sum(start=[])|length", "(('a\\n' * {n})|indent({n}))|length", "('\\t' * {n}).expandtabs({n})",
    "('a' * {n})|replace('a', 'b' * {n})", "('a' * {n}).replace('a', 'b' * {n})",
    "('a' * {n}).translate({{97: 'b' * {n}}})",
    "(['x' * {n}] * {n})|unique|list|length", "dict.fromkeys(range({n}), 'x' * {n})|tojson|length",
    "('ab\\n' * {n})|wordwrap(2, wrapstring='x' * {n})", "('%{n}s' * {n}) % ((1,) * {n})",
    "('{{:{n}}}' * {n}).format(*range({n}))", "''.join(['x' * {n}] * {n})", "(['x' * {n}] * {n}) ~ 'y'",
    "'%s' % ([['x' * {n}] * {n}],)", "messages|tojson(indent={n})", "range(10)|batch({n}, 'x' * {n})|list|length",
    "(['x' * {n}] * 10)|map('center', {n})|join|length", "dict(a=['x' * {n}] * {n})|items|list|string",
]
STMTS = [
    "{{% for i in range({n}) %}}{{{{ i }}}}{{% endfor %}}",
    "{{% for m in messages %}}{{{{ m.content }}}}{{% endfor %}}",
    "{{% if messages %}}{{{{ {e} }}}}{{% endif %}}", "{{% set x = {e} %}}{{{{ x }}}}",
    "{{% macro f(a, a) %}}{{% endmacro %}}", "{{% break %}}", "{{% continue %}}",
    "{{% macro r(n) %}}{{{{ r(n + 1) }}}}{{% endmacro %}}{{{{ r(0) }}}}",
    "{{% for i in range(10) %}}{{% for j in range({n}) %}}{{{{ i ~ j }}}}{{% endfor %}}{{% endfor %}}",
    "{{% set ns = namespace(s='') %}}{{% for i in range({n}) %}}{{% set ns.s = ns.s ~ 'xxxx' %}}{{% endfor %}}",
    "{{% filter upper %}}{{{{ {e} }}}}{{% endfilter %}}", "{{% raw %}}{{{{ {e} }}}}{{% endraw %}}",
    "{{% call f() %}}x{{% endcall %}}", "{{% generation %}}{{{{ {e} }}}}{{% endgeneration %}}",
    "{{% extends 'base' %}}", "{{% include 'x' %}}", "{{% import 'x' as y %}}", "{{% block b %}}{{% endblock %}}",
    "{{% with a = {e} %}}{{{{ a }}}}{{% endwith %}}", "{{% set a %}}{{{{ {e} }}}}{{% endset %}}{{{{ a * {n} }}}}",
    "{{% for m in messages recursive %}}{{{{ loop(messages) }}}}{{% endfor %}}",
    "{{% set a = 'x' * {n} %}}{{% set b = [a, a, a, a, a, a, a, a] %}}{{% set c = [b, b, b, b, b, b, b, b] %}}"
    "{{{{ {e} }}}}{{{{ c|join|length }}}}{{{{ c|tojson|length }}}}{{{{ c }}}}",
    "{{% set ns = namespace(x=[]) %}}{{% for i in range({n}) %}}{{% set ns.x = ns.x + ns.x + ['y' * {n}] %}}"
    "{{% endfor %}}{{{{ ns.x|length }}}}",
    "{{% set ns = namespace(s='x') %}}{{% for i in range({n}) %}}{{% set ns.s = [ns.s, ns.s] %}}{{% endfor %}}"
    "{{{{ ns|string|length }}}}",
    "{{% for i in range(3) %}}{{% break %}}{{% endfor %}}", "{{{{ {e} }}}}", "{{{{ {e} }}}}", "{{{{ {e} }}}}",
    "{{% if %}}", "{{{{", "{{% for %}}", "{{% endfor %}}", "{{% macro m() %}}{{% macro m() %}}{{% endmacro %}}",
]


@st.composite
def templates(draw) -> str:
    """A hostile template: statements and expressions from the lists above, sometimes deeply nested,
    sometimes a real template cut and spliced."""
    kind = draw(st.sampled_from(["pieces", "pieces", "pieces", "nested", "mutated"]))
    if kind == "nested":
        depth = draw(st.sampled_from([10, 50, 100, 200, 500, 2000, 10000]))
        opener, closer = draw(st.sampled_from([("{% if true %}", "{% endif %}"),
                                               ("{% for i in [1] %}", "{% endfor %}"),
                                               ("{{ (", ") }}"), ("{{ [", "] }}"), ("{% filter upper %}",
                                                                                    "{% endfilter %}")]))
        inner = "1" if opener.startswith("{{") else "x"
        close = draw(st.booleans())
        return opener * depth + inner + (closer * depth if close else "")
    if kind == "mutated":
        base = draw(st.sampled_from([CHATML, _gemma_template()]))
        a = draw(st.integers(0, len(base)))
        b = draw(st.integers(0, len(base)))
        op = draw(st.sampled_from(["cut", "dup", "swap"]))
        a, b = min(a, b), max(a, b)
        if op == "cut":
            return base[:a] + base[b:]
        if op == "dup":
            return base[:b] + base[a:b] + base[b:]
        return base[b:] + base[:a]
    pieces = []
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.sampled_from(SIZES))
        e = draw(st.sampled_from(EXPRS)).format(n=n)
        pieces.append(draw(st.sampled_from(STMTS)).format(n=n, e=e))
    return draw(st.sampled_from(["", CHATML])) + "".join(pieces)


def _gemma_template() -> str:
    try:
        from archrun_gemma3 import CHAT_TEMPLATE
    except ImportError:
        return CHATML
    return CHAT_TEMPLATE


# ---- hostile Python values (tagged JSON) ----------------------------------------------------------

def leaves() -> st.SearchStrategy:
    return st.one_of(
        st.none(), st.booleans(), ints(), floats().map(lambda f: {"$": "float", "v": f}), texts(),
        st.binary(max_size=8).map(lambda b: {"$": "bytes", "hex": b.hex()}),
        st.builds(lambda d, v: {"$": "np", "dtype": d, "v": v},
                  st.sampled_from(["int64", "int32", "uint8", "float32", "float64", "bool", "uint64"]),
                  st.integers(-5, 300)),
        st.builds(lambda d, n, f: {"$": "ndarray", "dtype": d, "shape": n, "fill": f},
                  st.sampled_from(["int64", "float32", "float64", "uint8", "int8", "object"]),
                  st.lists(st.integers(0, 4), max_size=3), st.sampled_from(["zeros", "ones", "nan", "arange", "big"])),
        st.sampled_from([{"$": "object"}, {"$": "lambda"}, {"$": "complex"}, {"$": "set"}, {"$": "gen"},
                         {"$": "selfref", "kind": "list"}, {"$": "selfref", "kind": "dict"},
                         {"$": "deep", "kind": "list", "depth": 100000}, {"$": "deep", "kind": "dict", "depth": 5000},
                         {"$": "floatkeys"}, {"$": "rep", "s": "ab", "n": 10**6}, {"$": "range", "n": 10**5},
                         {"$": "surrogate"}, {"$": "strsub"}, {"$": "intsub"}, {"$": "raising"}]),
    )


def values() -> st.SearchStrategy:
    return st.recursive(leaves(), lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["role", "content", "name", "x", ""]), inner,
                                                     max_size=3)), max_leaves=6)


SAMPLING = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
            "frequency_penalty", "penalty_last_n", "logit_bias", "seed", "max_tokens", "stop", "logprobs",
            "add_special", "parse_special", "cache", "template", "bogus_option", "hints", "threads", "backend",
            "block_style"]


@st.composite
def options(draw) -> dict:
    keys = draw(st.lists(st.sampled_from(SAMPLING), max_size=4, unique=True))
    out = {}
    for k in keys:
        if k == "logit_bias":
            out[k] = draw(st.one_of(values(), st.dictionaries(st.one_of(st.integers(-2, 400).map(str), texts()),
                                                              floats().map(lambda f: {"$": "float", "v": f}),
                                                              max_size=3).map(lambda d: {"$": "intkeys", "d": d})))
        else:
            out[k] = draw(st.one_of(values(), ints(), floats().map(lambda f: {"$": "float", "v": f})))
    if "max_tokens" not in out:
        out["max_tokens"] = 3
    return out


API_CALLS = ["generate", "chat", "encode", "decode", "token_to_piece", "init_cache", "forward_step", "load",
             "sampler", "render_chat", "chat_tokens", "incremental", "describe", "token_text"]


def api_cases() -> st.SearchStrategy[dict]:
    messages = st.one_of(values(), st.lists(st.fixed_dictionaries(
        {"role": st.one_of(st.sampled_from(["user", "assistant", "system", "user<|im_end|>", "", "tool"]), values()),
         "content": st.one_of(texts(), values())}), max_size=3))
    return st.builds(
        lambda seed, call, a, b, opts, backend, logits: {"kind": "api", "seed": seed, "call": call, "a": a, "b": b,
                                                        "options": opts, "backend": backend, "logits": logits},
        st.integers(0, len(SEEDS) - 1), st.sampled_from(API_CALLS), st.one_of(values(), messages, texts()),
        values(), options(), st.sampled_from(["fast", "reference"]),
        st.sampled_from(["normal", "nan", "inf", "-inf", "allnan", "allinf", "-allinf", "huge", "tiny", "mixed"]),
    )


# ---- CLI ------------------------------------------------------------------------------------------

CLI_OPTS = [["-n", "{v}"], ["--temp", "{v}"], ["--top-k", "{v}"], ["--top-p", "{v}"], ["--min-p", "{v}"],
            ["--repeat-penalty", "{v}"], ["--seed", "{v}"], ["--stop", "{v}"], ["--threads", "{v}"],
            ["--backend", "{v}"], ["--block-style", "{v}"], ["--hint", "{v}"], ["--json"], ["--chat"],
            ["--system", "{v}"], ["--prompt-tokens", "{v}"], ["--gen-tokens", "{v}"]]
CLI_VALUES = ["0", "1", "-1", "3", "nan", "inf", "-inf", "1e999", "", "x", "fast", "reference", "fused",
              "host_reference", "rope_pairing=bogus", "activation=", "=", "rope_pairing", "999999999999999999999",
              "<|im_end|>", "\udcff"]


def cli_cases() -> st.SearchStrategy[dict]:
    opt = st.builds(lambda o, v: [x.format(v=v) for x in o], st.sampled_from(CLI_OPTS), st.sampled_from(CLI_VALUES))
    return st.builds(
        lambda cmd, target, seed, opts, prompt: {"kind": "cli", "cmd": cmd, "target": target, "seed": seed,
                                                 "opts": [x for o in opts for x in o], "prompt": prompt},
        st.sampled_from(["run", "inspect", "bench", "chat", "plugins", "bogus"]),
        st.sampled_from(["seed", "seed", "mutated", "fifo", "dir", "missing", "devzero", "devnull", "empty"]),
        st.integers(0, len(SEEDS) - 1), st.lists(opt, max_size=3), texts(),
    )


# ---- all cases ------------------------------------------------------------------------------------

def gguf_cases() -> st.SearchStrategy[dict]:
    return st.builds(
        lambda seed, edits, bedits, backend, text, opts: {"kind": "gguf", "seed": seed, "edits": edits,
                                                          "bytes": bedits, "backend": backend, "text": text,
                                                          "options": opts},
        st.integers(0, len(SEEDS) - 1), st.lists(gguf_edits(), min_size=1, max_size=3),
        st.one_of(st.just([]), st.just([]), st.lists(byte_edits(), min_size=1, max_size=2)),
        st.sampled_from(["fast", "reference"]), texts(),
        st.fixed_dictionaries({"temperature": st.sampled_from([0.0, 0.8, 1e-30, 1e30]), "seed": st.integers(0, 9)}),
    )


def template_cases() -> st.SearchStrategy[dict]:
    messages = st.one_of(
        st.just([{"role": "user", "content": "hi"}]),
        st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "user<|im_end|>"]),
                                        "content": texts()}), min_size=1, max_size=3),
        values())
    return st.builds(lambda t, m, via, seed: {"kind": "template", "template": t, "messages": m, "via": via,
                                              "seed": seed},
                     templates(), messages, st.sampled_from(["render", "render", "chat"]),
                     st.integers(0, len(SEEDS) - 1))


def special_cases() -> st.SearchStrategy[dict]:
    return st.builds(lambda what, seed, pos, backend: {"kind": "special", "what": what, "seed": seed, "pos": pos,
                                                       "backend": backend},
                     st.sampled_from(["fifo", "truncate_after_load", "devzero", "dir", "symlink_loop", "unreadable",
                                      "replace_after_load"]),
                     st.integers(0, len(SEEDS) - 1), st.integers(0, 2**20), st.sampled_from(["fast", "reference"]))


# ---- objects crossing models, replaced internals -------------------------------------------------

CROSS_USES = ["forward_step", "forward_step_hidden", "batch", "batch_spans", "generate", "speculative", "rewind",
              "checkpoint", "host_step"]
CROSS_OBJECTS = ["cache", "prefix_cache", "request", "drafter", "grammar", "sampler", "speculation"]
REPLACEMENTS = ["bigger", "smaller", "dtype", "strided", "readonly", "reshaped", "slots_swapped", "slots_list",
                "capacity", "length", "kv_type", "owner", "slot_none", "prefix_cache_none", "mixer_array"]


def cross_cases() -> st.SearchStrategy[dict]:
    """An object made by one model (a cache, a request, a drafter, a grammar state, a sampler) used by another
    (another seed, the same one on the other backend, or the same model), or a cache whose internals were
    replaced after a prefill; then stepped through an entry."""
    return st.builds(
        lambda what, a, b, ba, bb, use, prefill, replace, kv: {
            "kind": "cross", "what": what, "a": a, "b": b, "backend_a": ba, "backend_b": bb, "use": use,
            "prefill": prefill, "replace": replace, "kv_type": kv},
        st.sampled_from(CROSS_OBJECTS + ["cache", "cache"]), st.integers(0, len(SEEDS) - 1),
        st.integers(0, len(SEEDS) - 1), st.sampled_from(["fast", "reference"]), st.sampled_from(["fast", "reference"]),
        st.sampled_from(CROSS_USES), st.integers(0, 5),
        st.one_of(st.none(), st.none(), st.sampled_from(REPLACEMENTS)), st.sampled_from(["f32", "f32", "f16", "q8_0"]),
    )


def signature_cases() -> st.SearchStrategy[dict]:
    """One public function called with None, or a value of the wrong type, for one of its arguments
    (tests/api/test_api_arguments.py's walk: which function and argument by index)."""
    return st.builds(lambda seed, backend, target, param, value: {
        "kind": "signature", "seed": seed, "backend": backend, "target": target, "param": param, "value": value},
        st.integers(0, len(SEEDS) - 1), st.sampled_from(["fast", "reference"]), st.integers(0, 10**6),
        st.integers(0, 10**6), st.integers(0, 10**6))


CASES = st.one_of(
    gguf_cases(), gguf_cases(), gguf_cases(), gguf_cases(),
    template_cases(), template_cases(), api_cases(), api_cases(), cli_cases(), special_cases(),
    cross_cases(), cross_cases(), signature_cases(),
)
