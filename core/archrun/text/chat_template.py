"""Chat templates: render a conversation with the model's Jinja template, then tokenize it.

Templates come from model files, so they are untrusted code. They run in jinja2's
`ImmutableSandboxedEnvironment` (jinja2 >= 3.1.6) with the helpers HF transformers provides
(`raise_exception`, `strftime_now`, a non-escaping `tojson`, `dict`, an underscore-free
`namespace`, the `{% generation %}` tag), and under budgets:

- time: every block body (loop iterations included), call, operator, filter and output checks a
  deadline (RENDER_SECONDS);
- size: strings, lists and ints produced by operators, calls and filters, every value written to
  the output and the output itself are capped (MAX_OUTPUT_CHARS), and arguments that ask for
  huge results (`center(10**9)`, `"%999999999d"`) are refused before they run.

Anything that goes wrong inside a template -- a syntax error, `raise_exception(...)`, an unsafe
attribute, a blown budget -- becomes `ChatTemplateError`; malformed messages are `InvalidRequest`.

`chat_tokens` tokenizes the rendered text so that the template's own markup is parsed for
special tokens while every message's content stays plain text: "<|im_end|>" typed by a user
is spelled out character by character, never turned into a control token.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import re
import secrets
import time
from collections.abc import Callable, ItemsView, KeysView, Sequence, Sized, ValuesView
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from archrun.errors import ArchrunError, ChatTemplateError, InvalidRequest, check_flag, shown

if TYPE_CHECKING:
    from archrun.text.tokenizer import Tokenizer

RENDER_SECONDS = 2.0  # wall-clock budget of one render
MAX_OUTPUT_CHARS = 1 << 20  # rendered text, and any single string/list a template builds
MAX_EMITTED_CHARS = 4 * MAX_OUTPUT_CHARS  # everything written by {{ }}, captured blocks included
MAX_INT_BITS = 100_000  # ints a template computes (10**30000 is fine, 2**10**9 is not)
MAX_TEMPLATE_CHARS = 256 * 1024
MAX_CALL_DEPTH = 200  # calls inside calls (a macro calling itself): not the process's recursion limit,
# which other libraries raise (a raised limit let a recursive macro run for seconds before failing)
_HUGE_WIDTH = re.compile(r"\d{7,}")  # a format width/precision of a million or more


class _Budget:
    """Per-render limits; the active one lives in a ContextVar so the shared environment is reusable."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.emitted = 0
        self.depth = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _LimitExceeded(f"rendering took longer than {RENDER_SECONDS:g} s")


class _LimitExceeded(Exception):
    """A template exhausted its time or size budget."""


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("archrun_chat_budget", default=None)


def _tick() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.tick()


def _check_size(value: Any) -> Any:
    """Raise when `value` is a string/sequence/int beyond the caps; return it unchanged otherwise."""
    if isinstance(value, str | list | tuple | dict | set | bytes) and len(value) > MAX_OUTPUT_CHARS:
        raise _LimitExceeded(f"template built a {type(value).__name__} of {len(value)} items "
                             f"(limit {MAX_OUTPUT_CHARS})")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise _LimitExceeded(f"template built an integer of {value.bit_length()} bits (limit {MAX_INT_BITS})")
    return value


def _check_args(args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Refuse arguments that ask for a huge result (widths, counts) before the callee runs."""
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > MAX_OUTPUT_CHARS:
            raise _LimitExceeded(f"argument {arg} is larger than {MAX_OUTPUT_CHARS}")


def _check_format(fmt: Any) -> None:
    if isinstance(fmt, str) and _HUGE_WIDTH.search(fmt):
        raise _LimitExceeded("format string asks for a width or precision of a million or more")


MAX_WEIGHT = MAX_EMITTED_CHARS  # characters any value a template flattens or multiplies may spell


def _measure(value: Any, limit: int = MAX_WEIGHT) -> tuple[int, int, int]:
    """(weight, nodes, depth) of a value: the characters it spells when flattened (str(), repr, JSON,
    join: each string's length, an int's digits, 2 per item), counting every reference to a shared item
    again (a list of one string repeated n times spells it n times), its items and its nesting. Stops
    soon after the weight passes `limit`, so the walk costs O(limit) at worst, whatever the value holds."""
    memo: dict[int, tuple[int, int, int]] = {}
    visits = [0]

    def walk(v: Any, room: int, depth: int) -> tuple[int, int, int]:
        if isinstance(v, str):
            return len(v) + 2, 1, 0
        if v is None or isinstance(v, bool | float):
            return 24, 1, 0
        if isinstance(v, int):
            return v.bit_length() // 3 + 3, 1, 0
        if isinstance(v, bytes | bytearray):
            return 4 * len(v) + 3, 1, 0
        if isinstance(v, range):
            digits = max(len(str(v.start)), len(str(v.stop))) + 2
            return len(v) * digits + 2, len(v) + 1, 1
        if isinstance(v, jinja2.utils.Namespace):
            v = v._Namespace__attrs  # type: ignore[attr-defined]
        elif isinstance(v, KeysView | ValuesView | ItemsView):
            v = list(v)
        if not isinstance(v, list | tuple | dict | set | frozenset):
            return 64, 1, 0  # any other object a template reaches (cycler, loop, macro): a short repr
        key = id(v)
        if key in memo:
            return memo[key]
        if depth > 200:
            return room + 1, 1, depth  # deeper than any renderer recurses: too big to flatten
        items: Any = [x for kv in v.items() for x in kv] if isinstance(v, dict) else v
        kinds = set(map(type, items))
        if kinds <= {str}:  # the common cases in one C-level pass each
            found = (sum(map(len, items)) + 4 * len(items) + 2, len(items) + 1, 1)
        elif kinds <= {int}:
            found = (sum(map(int.bit_length, items)) // 3 + 5 * len(items) + 2, len(items) + 1, 1)
        else:
            weight, nodes, deepest = 2, 1, 0
            for x in items:
                visits[0] += 1
                if not visits[0] & 0xFFFF:
                    _tick()
                w, n, d = walk(x, room - weight, depth + 1)
                weight, nodes, deepest = weight + w + 2, nodes + n, max(deepest, d + 1)
                if weight > room:
                    break
            found = (weight, nodes, max(deepest, 1))
        memo[key] = found
        return found

    return walk(value, limit, 0)


def _weight(value: Any, limit: int = MAX_WEIGHT) -> int:
    return _measure(value, limit)[0]


def _check_weight(what: str, estimate: int) -> None:
    if estimate > MAX_WEIGHT:
        raise _LimitExceeded(f"{what} would build about {estimate} characters (limit {MAX_WEIGHT})")


def _check_heavy(args: Sequence[Any], kwargs: dict[str, Any], what: str) -> None:
    """Refuse arguments that spell more than MAX_WEIGHT characters (before a callee flattens them)."""
    for arg in (*args, *kwargs.values()):
        if not isinstance(arg, str | int | float | bool | type(None)):
            _check_weight(f"{what}'s argument", _weight(arg))
        elif isinstance(arg, str):
            _check_weight(f"{what}'s argument", len(arg))


def _length(x: Any) -> int:
    return len(x) if isinstance(x, str) else _weight(x)


def _joined(items: Any, sep: Any) -> int:
    n = len(items) if hasattr(items, "__len__") else 0
    return _weight(items) + max(n - 1, 0) * _length(sep if sep is not None else "")


def _replaced(s: Any, old: Any, new: Any, count: Any = None) -> int:
    if not isinstance(s, str) or not isinstance(old, str) or not isinstance(new, str):
        return _length(s)
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and 0 <= count < hits:
        hits = count
    return len(s) + hits * max(len(new) - len(old), 0)


def _lines(s: Any) -> int:
    return s.count("\n") + 1 if isinstance(s, str) else 1


def _width(w: Any) -> int:
    return w if isinstance(w, int) and not isinstance(w, bool) else _length(w) if isinstance(w, str) else 0


def _json_estimate(value: Any, indent: Any = None) -> int:
    weight, nodes, depth = _measure(value)
    step = _width(indent) if indent is not None else 0
    return 6 * weight + nodes * (step * depth + 2)


def _format_estimate(fmt: Any, args: Any) -> int:
    """What fmt % args or fmt.format(*args) can build: the text, the arguments' repr, every width."""
    if not isinstance(fmt, str):
        return 6 * _weight(args)
    widths = sum(int(w) for w in _WIDTHS.findall(fmt))
    stars = fmt.count("*") + fmt.count("{")
    flat = [args] if not isinstance(args, tuple | list | dict) else list(args.values() if isinstance(args, dict)
                                                                         else args)
    ints = [abs(a) for a in flat if isinstance(a, int) and not isinstance(a, bool)]
    return len(fmt) + 6 * _weight(args) + widths + stars * max(ints, default=0)


_WIDTHS = re.compile(r"(?<=[%:.<>^=\-+ #0])(\d{1,6})")
# what a filter or a str method builds from its arguments (bound by name), beyond their own weight
_FILTER_ESTIMATES: dict[str, Callable[[dict[str, Any]], int]] = {
    "join": lambda a: _joined(a.get("value", ()), a.get("d", "")),
    "replace": lambda a: _replaced(a.get("s"), a.get("old"), a.get("new"), a.get("count")),
    "indent": lambda a: _length(a.get("s", "")) + _lines(a.get("s", "")) * _width(a.get("width", 4)),
    "wordwrap": lambda a: _length(a.get("s", "")) * (1 + _length(a.get("wrapstring") or "\n")),
    "tojson": lambda a: _json_estimate(a.get("x"), a.get("indent")),
    "format": lambda a: _format_estimate(a.get("value"), (*a.get("args", ()), *a.get("kwargs", {}).values())),
    "center": lambda a: _length(a.get("value", "")) + _width(a.get("width", 80)),
    "truncate": lambda a: _width(a.get("length", 255)) + _length(a.get("end", "...")),
    "sum": lambda a: _weight(a.get("iterable")) + _weight(a.get("start", 0)),
}
_METHOD_ESTIMATES: dict[str, Callable[[str, tuple, dict], int]] = {
    "join": lambda s, a, k: _joined(a[0] if a else (), s),
    "replace": lambda s, a, k: _replaced(s, *a[:3]) if len(a) >= 2 else len(s),
    "expandtabs": lambda s, a, k: len(s) + s.count("\t") * _width(a[0] if a else k.get("tabsize", 8)),
    "translate": lambda s, a, k: len(s) * max(4, _weight(a[0] if a else None) if a else 0),
    "format": lambda s, a, k: _format_estimate(s, (*a, *k.values())),
    "format_map": lambda s, a, k: _format_estimate(s, a[0] if a else {}),
    **{name: (lambda s, a, k: len(s) + _width(a[0] if a else k.get("width", 0)))
       for name in ("center", "ljust", "rjust", "zfill")},
}


def _precheck_method(obj: Any, args: tuple, kwargs: dict) -> None:
    """A str method's result estimated before it runs (join, replace, expandtabs, translate, format, ...)."""
    receiver = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(receiver, str) and name in _METHOD_ESTIMATES:
        _check_weight(f"str.{name}", _METHOD_ESTIMATES[name](receiver, args, kwargs))


def _do_sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    """jinja's sum filter adding in Python steps that check the budget (summing lists or strings copies
    the total so far on every item: C's sum() would run for minutes on a long list before any check)."""
    if attribute is not None:
        iterable = map(jinja2.filters.make_attrgetter(environment, attribute), iterable)
    total = start
    for item in iterable:
        _tick()
        total = _check_size(total + item)
    return total


# --- the sandbox ---


class _GuardedCodeGenerator(CodeGenerator):
    """Compiles templates with a budget tick at the top of every block body (loop bodies included)
    and a size check around every `~` concatenation."""

    def blockvisit(self, nodes: Any, frame: Any) -> None:
        self.writeline("environment.archrun_tick()")
        super().blockvisit(nodes, frame)

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        # jinja's Concat, with each operand weighed before str() flattens it and the result checked after
        if frame.eval_ctx.volatile:
            func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            func_name = "markup_join"
        else:
            func_name = "str_join"
        self.write(f"environment.archrun_check_size({func_name}((")
        for arg in node.nodes:
            self.write("environment.archrun_flat(")
            self.visit(arg, frame)
            self.write("), ")
        self.write(")))")


class _GuardedSandbox(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment whose calls, operators and attribute lookups obey the budget."""

    code_generator_class = _GuardedCodeGenerator
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def archrun_tick(self) -> None:
        _tick()

    def archrun_check_size(self, value: Any) -> Any:
        _tick()
        return _check_size(value)

    def archrun_flat(self, value: Any) -> Any:
        if not isinstance(value, str):
            _check_weight("concatenating a value", 6 * _weight(value))
        return value

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _tick()
        _check_args(args, kwargs)
        if getattr(__obj, "__name__", "") in ("format", "format_map"):
            receiver = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
            _check_format(receiver)
        method = getattr(__obj, "__wrapped__", __obj)  # jinja wraps str.format / format_map
        receiver = getattr(method, "__self__", None)
        if isinstance(receiver, str) and getattr(method, "__name__", "") == "join" and args and not isinstance(
                args[0], Sized):
            args = (list(args[0]), *args[1:])  # counted before joined
        if isinstance(receiver, str) and len(receiver) > MAX_WEIGHT:
            _check_weight(f"str.{getattr(method, '__name__', '?')}", len(receiver))
        _check_heavy(args, kwargs, getattr(method, "__name__", "a call"))
        _precheck_method(method, args, kwargs)
        budget = _BUDGET.get()
        if budget is None:
            return _check_size(super().call(__context, __obj, *args, **kwargs))
        if budget.depth >= MAX_CALL_DEPTH:
            raise _LimitExceeded(f"calls nest deeper than {MAX_CALL_DEPTH} levels")
        budget.depth += 1
        try:
            return _check_size(super().call(__context, __obj, *args, **kwargs))
        finally:
            budget.depth -= 1

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _tick()
        _precheck_binop(operator, left, right)
        return _check_size(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # jinja2 returns an Undefined that only fails when used; fail loudly right away instead
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _precheck_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse `str * 10**9`, `2 ** 10**9` and `"%999999999d" % x` before computing them."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(n, int) and len(seq) * n > MAX_OUTPUT_CHARS:
                raise _LimitExceeded(f"repeating a {type(seq).__name__} {n} times exceeds the size limit")
            if isinstance(seq, list | tuple) and isinstance(n, int) and n > 1:  # what the copies spell, shared
                _check_weight(f"repeating a {type(seq).__name__} {n} times", _weight(seq) * n)
        if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise _LimitExceeded("integer product exceeds the size limit")
    elif operator == "**" and _is_int(left) and _is_int(right) and abs(left) > 1:
        if right * max(left.bit_length(), 1) > MAX_INT_BITS:
            raise _LimitExceeded(f"{left} ** {right} exceeds the size limit")
    elif operator == "+" and isinstance(left, list | tuple) and isinstance(right, list | tuple):
        _check_weight("adding sequences", _weight(left) + _weight(right))
    elif operator == "%":
        _check_format(left)
        _check_weight("formatting with %", _format_estimate(left, right))
        if isinstance(left, str) and "*" in left:  # '%*d' % (10**9, 1): the width comes from the arguments
            _check_args(right if isinstance(right, tuple) else (right,), {})


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _guard_filter(name: str, func: Callable) -> Callable:
    """Wrap a filter with the budget (keeps jinja's pass_context/pass_environment marker): its arguments
    weighed, and what it builds from them estimated, before it runs; its result checked after."""
    estimate = _FILTER_ESTIMATES.get(name)
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        signature = None
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0  # the context/environment argument

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        _check_args(args, kwargs)
        if func is _FORMAT_FILTER and args:
            _check_format(args[0])
        if name == "join" and len(args) > skip and not isinstance(args[skip], Sized):
            args = (*args[:skip], list(args[skip]), *args[skip + 1:])  # counted before joined
        _check_heavy(args[skip:], kwargs, f"filter {name}")
        if estimate is not None and signature is not None:
            try:
                bound = signature.bind(*args, **kwargs).arguments
            except TypeError:
                bound = None  # the filter itself reports its wrong arguments
            if bound is not None:
                _check_weight(f"filter {name}", estimate(bound))
        return _check_size(func(*args, **kwargs))

    return guarded


_FORMAT_FILTER = jinja2.filters.do_format


def _finalize(value: Any) -> Any:
    """Every {{ }} output passes here: count it against the emitted-text budget."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.tick()
        budget.emitted += len(value) if isinstance(value, str) else 6 * _weight(value)
        if budget.emitted > MAX_EMITTED_CHARS:
            raise _LimitExceeded(f"template wrote more than {MAX_EMITTED_CHARS} characters")
    return value


# --- HF transformers' template helpers ---


def _raise_exception(message: Any) -> None:
    raise TemplateError(str(message))


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """json.dumps without HTML escaping, as HF's chat templates expect."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja's namespace() refusing underscore-prefixed attribute names."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805  (same signature trick as jinja's)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"templates cannot store underscore-prefixed namespace attributes ({name!r})")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (HF's assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Callable[[], str]) -> str:
        return caller()


@functools.lru_cache(maxsize=1)
def _environment() -> _GuardedSandbox:
    env = _GuardedSandbox(trim_blocks=True, lstrip_blocks=True, finalize=_finalize,
                          extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters["sum"] = jinja2.pass_environment(_do_sum)
    env.filters = {name: _guard_filter(name, f) for name, f in env.filters.items()}
    env.globals.pop("lipsum", None)  # generates text in a tight loop the budget cannot interrupt
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=_TemplateDict(), namespace=_TemplateNamespace)
    return env


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    try:
        return _environment().from_string(template)
    except TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not parse (line {exc.lineno}): {exc.message}") from None
    except (RecursionError, MemoryError) as exc:
        raise ChatTemplateError(f"chat template is too deeply nested to compile ({type(exc).__name__})") from None
    except SyntaxError as exc:  # jinja's generated Python does not compile: duplicate macro arguments,
        # `break` outside a loop, too many nested blocks (IndentationError is a SyntaxError)
        raise ChatTemplateError(f"chat template does not compile: {exc.msg}") from None
    except Exception as exc:  # anything else jinja's parser or compiler raises on hostile input
        raise ChatTemplateError(f"chat template does not compile: {type(exc).__name__}: {exc}") from None


# --- messages ---


MAX_MESSAGE_DEPTH = 32  # nesting of lists/dicts inside a message (tool calls need a few levels)


def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """A copy of `value` made of JSON types only (str/int/float/bool/None/list/dict), at most
    MAX_MESSAGE_DEPTH levels deep (which also refuses structures that contain themselves)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if depth >= MAX_MESSAGE_DEPTH and isinstance(value, dict | list | tuple):
        raise InvalidRequest(f"{where} nests deeper than {MAX_MESSAGE_DEPTH} levels (or contains itself)")
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise InvalidRequest(f"{where} has a non-string key")
        return {k: _plain(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise InvalidRequest(f"{where} must be JSON data, got {type(value).__name__}")


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check a conversation (a non-empty list of {"role": str, "content": str, ...}); returns a plain copy."""
    if not isinstance(messages, list | tuple) or not messages:
        raise InvalidRequest("messages must be a non-empty list of {'role': ..., 'content': ...} objects")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object, got {type(message).__name__}")
        for field in ("role", "content"):
            if not isinstance(message.get(field), str):
                raise InvalidRequest(f"messages[{i}].{field} must be a string")
        if not message["role"]:
            raise InvalidRequest(f"messages[{i}].role is empty")
        out.append(_plain(message, f"messages[{i}]"))
    return out


# --- rendering ---


def render_chat(template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", **extra: Any) -> str:
    """Render `messages` with a chat template, as HF's apply_chat_template(tokenize=False) does.

    `extra` is passed to the template as variables (e.g. tools=[...]). Raises InvalidRequest for
    malformed messages and ChatTemplateError for a missing, failing, unsafe or runaway template.
    """
    messages = validate_messages(messages)
    add_generation_prompt = check_flag("add_generation_prompt", add_generation_prompt)
    for name, value in (("bos_token", bos_token), ("eos_token", eos_token)):
        if not isinstance(value, str):
            raise InvalidRequest(f"{name} must be a string, got {shown(value)}")
    return _render(template, messages, add_generation_prompt, bos_token, eos_token, extra)


def _render(template: str | None, messages: list[dict], add_generation_prompt: bool, bos_token: str,
            eos_token: str, extra: dict[str, Any]) -> str:
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"chat template must be a string, got {type(template).__name__}")
    if not template:
        raise ChatTemplateError("no chat template: the model file has none and none was given")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(f"chat template is {len(template)} characters (limit {MAX_TEMPLATE_CHARS})")
    compiled = _compile(template)
    context = {**{k: _plain(v, k) for k, v in extra.items()}, "messages": messages,
               "add_generation_prompt": bool(add_generation_prompt), "bos_token": bos_token,
               "eos_token": eos_token}
    return _run(compiled, context)


def _run(compiled: jinja2.Template, context: dict[str, Any]) -> str:
    """Render under a fresh budget, mapping every failure to ChatTemplateError."""
    token = _BUDGET.set(_Budget(RENDER_SECONDS))
    try:
        chunks, size = [], 0
        for chunk in compiled.generate(**context):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise _LimitExceeded(f"rendered text exceeds {MAX_OUTPUT_CHARS} characters")
            chunks.append(chunk)
        return "".join(chunks)
    except ArchrunError:
        raise
    except _LimitExceeded as exc:
        raise ChatTemplateError(f"chat template exceeded its budget: {exc}") from None
    except UndefinedError as exc:
        raise ChatTemplateError(f"chat template used an undefined value: {exc}") from None
    except SecurityError as exc:
        raise ChatTemplateError(f"chat template tried something unsafe: {exc}") from None
    except TemplateError as exc:
        raise ChatTemplateError(f"chat template raised an error: {exc}") from None
    except Exception as exc:  # TypeError, RecursionError, MemoryError, ... from template code
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
    finally:
        _BUDGET.reset(token)


# --- tokenizing a conversation ---


def chat_tokens(tokenizer: Tokenizer, messages: list[dict], template: str | None = None,
                add_generation_prompt: bool = True, **extra: Any) -> list[int]:
    """Token ids of a rendered conversation, ready to feed the model.

    `template` overrides the file's `tokenizer.chat_template` (pass a family default here when the
    file has none). Template markup is tokenized with special tokens recognised; message contents
    are plain text. BOS/EOS are added once, following the vocabulary's add_bos/add_eos.
    """
    messages = validate_messages(messages)
    _check_tokenizer(tokenizer)
    add_generation_prompt = check_flag("add_generation_prompt", add_generation_prompt)
    template = template if template is not None else tokenizer.chat_template
    bos = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
    eos = tokenizer.token_text(tokenizer.eos_id) if tokenizer.eos_id is not None else ""
    args = (add_generation_prompt, bos, eos, extra)
    text = _render(template, messages, *args)
    spans = _content_spans(template, messages, text, args, tokenizer)
    if tokenizer.add_bos and bos and text.startswith(bos):  # the BOS comes from add_special instead
        text, spans = text[len(bos):], [(a - len(bos), b - len(bos)) for a, b in spans]
    if tokenizer.add_eos and eos and text.endswith(eos):
        text = text[:-len(eos)]
    return tokenizer.encode(text, add_special=True, parse_special=True, plain_spans=spans)


def _check_tokenizer(tokenizer: Any) -> None:
    """InvalidRequest unless `tokenizer` is an archrun Tokenizer (or has its interface)."""
    needed = ("encode", "token_text", "bos_id", "eos_id", "add_bos", "add_eos", "chat_template")
    if not all(hasattr(tokenizer, name) for name in needed):
        raise InvalidRequest(f"tokenizer must be an archrun.Tokenizer, got {type(tokenizer).__name__}")


def _content_spans(template: str, messages: list[dict], text: str, args: tuple,
                   tokenizer: Tokenizer) -> list[tuple[int, int]]:
    """Character ranges of `text` that hold message contents.

    The conversation is rendered a second time with each content replaced by a unique marker; the
    marked render then says exactly where the template put each content. Templates that transform
    content (trim, split, ...) are matched against the stripped content; when contents cannot be
    located and one of them holds control-token text, rendering is refused rather than risk
    turning user text into control tokens.
    """
    nonce = secrets.token_hex(6)
    marked = [{**m, "content": f"\x02{nonce}:{i}\x03"} for i, m in enumerate(messages)]
    pieces = re.split(f"\x02{nonce}:(\\d+)\x03", _render(template, marked, *args))
    spans = _match_pieces(pieces, [m["content"] for m in messages], text)
    if spans is not None:
        return spans
    for i, message in enumerate(messages):
        if tokenizer.encode(message["content"], add_special=False, parse_special=True) != \
                tokenizer.encode(message["content"], add_special=False, parse_special=False):
            raise ChatTemplateError(f"messages[{i}].content holds special-token text and the chat template "
                                    "transforms contents, so it cannot be kept as plain text")
    return []


def _match_pieces(pieces: list[str], contents: list[str], text: str) -> list[tuple[int, int]] | None:
    """Walk `text` along the marked render [markup, index, markup, index, ..., markup]."""
    pos, spans = 0, []
    for k in range(0, len(pieces) - 1, 2):
        markup, content, after = pieces[k], contents[int(pieces[k + 1])], pieces[k + 2]
        if not text.startswith(markup, pos):
            return None
        pos += len(markup)
        for variant in dict.fromkeys((content, content.strip(), content.lstrip(), content.rstrip())):
            if text.startswith(variant, pos) and text.startswith(after, pos + len(variant)):
                spans.append((pos, pos + len(variant)))
                pos += len(variant)
                break
        else:
            return None
    return spans if text[pos:] == pieces[-1] else None


def chat_prompt(model: Any, messages: Sequence[dict], template: str | None = None, **template_vars: Any) -> list[int]:
    """Token ids of `messages` rendered with the model's chat template (or `template`), ending in the
    assistant's turn (`template_vars` are variables the template sees, e.g. tools=[...])."""
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"chat template must be a string, got {type(template).__name__}")
    template = template or model.chat_template
    return chat_tokens(model.tokenizer, messages, template=template, add_generation_prompt=True, **template_vars)
