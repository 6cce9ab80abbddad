"""Tool calls: OpenAI's `tools` / `tool_choice` rendered through the chat template, and the model's
tool-call output parsed back into calls.

How a model writes a call (Qwen's `<tool_call>{json}</tool_call>`, Llama 3's bare JSON, ...) is a
family's knowledge: a family plugin answers the `archrun_tool_call_format` hook with a
`ToolCallFormat`, which parses that syntax and writes the grammar of one call (used to force a
call when `tool_choice` is "required" or names a tool). The core knows no format: it validates
tools, renders them (through the template's `tools` variable when the template uses one, else as a
system message the format writes), and streams a reply as content plus calls (`ToolCallStream`).

    plan = plan_tool_chat(model, messages, tools, "auto")
    gen = archrun.generate(model, plan.ids, grammar=plan.grammar)
"""

from __future__ import annotations

import contextlib
import json
import secrets
import weakref
from collections.abc import Sequence
from typing import Any

import attrs

from archrun.errors import InvalidRequest, PluginError
from archrun.generation.grammar import Grammar

CHOICES = ("none", "auto", "required")
MAX_TOOLS = 128


@attrs.frozen
class Tool:
    """A function the model may call: its name, description and the JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict

    def to_openai(self) -> dict[str, Any]:
        """The tool in OpenAI's shape (what chat templates receive as `tools`)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@attrs.frozen
class ToolCall:
    """A call the model made: function name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = attrs.field(factory=lambda: f"call_{secrets.token_hex(12)}")

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's message.tool_calls[] entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class ToolCallFormat:
    """How one family writes tool calls; family plugins subclass it (see docs/plugins.md).

    The core finds where the tool-call part of a reply starts (`start`, from `triggers` by
    default), keeps back text that may begin it (`hold`), and asks `parse` for the calls in it.
    """

    name = "base"
    triggers: tuple[str, ...] = ()  # text that opens the tool-call part of a reply

    def start(self, text: str) -> int | None:
        """Index in `text` where the tool-call part begins, or None (not begun yet)."""
        hits = [i for t in self.triggers if (i := text.find(t)) >= 0]
        return min(hits) if hits else None

    def hold(self, text: str) -> int:
        """How many trailing characters of `text` could still begin a tool-call part."""
        best = 0
        for t in self.triggers:
            for k in range(min(len(t) - 1, len(text)), 0, -1):
                if text.endswith(t[:k]):
                    best = max(best, k)
                    break
        return best

    def parse(self, section: str, final: bool) -> list[tuple[str, Any]]:
        """The complete calls in `section` (the reply from `start` on) as (name, arguments) pairs,
        arguments a dict or JSON text. With final False the section may end mid-call."""
        raise NotImplementedError

    def grammar(self, tools: Sequence[Tool]) -> Grammar:
        """A grammar of output that is a call (or calls) to one of `tools`, arguments per their schema."""
        raise NotImplementedError

    def describe(self, tools: Sequence[Tool]) -> str:
        """A system message offering `tools`, for chat templates that do not render them."""
        raise NotImplementedError


def arguments_schema(tool: Tool, name_key: str = "name", args_key: str = "arguments") -> dict[str, Any]:
    """The JSON Schema of {name_key: tool.name, args_key: {...}}: a helper for formats' grammars.

    A forced call is strict: arguments the tool does not name are not admitted unless its schema
    says additionalProperties itself.
    """
    params = {"additionalProperties": False, **tool.parameters} if "properties" in tool.parameters \
        else tool.parameters
    return {"type": "object", "additionalProperties": False, "required": [name_key, args_key],
            "properties": {name_key: {"const": tool.name}, args_key: params}}


# --- validation of OpenAI's fields ---


def parse_tools(tools: Any) -> tuple[Tool, ...]:
    """OpenAI's `tools` ([{"type": "function", "function": {"name", "description", "parameters"}}])."""
    if tools is None:
        return ()
    if not isinstance(tools, list | tuple) or len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"tools must be an array of at most {MAX_TOOLS} tools")
    out = [_tool(t, i) for i, t in enumerate(tools)]
    if len({t.name for t in out}) != len(out):
        raise InvalidRequest("tools have duplicate function names")
    return tuple(out)


def _tool(tool: Any, i: int) -> Tool:
    fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(fn, dict):
        raise InvalidRequest(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}')
    name, desc, params = fn.get("name"), fn.get("description", ""), fn.get("parameters", {"type": "object"})
    if not isinstance(name, str) or not name or len(name) > 64 or not all(c.isalnum() or c in "_-." for c in name):
        raise InvalidRequest(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '-' or '.'")
    if not isinstance(desc, str) or not isinstance(params, dict):
        raise InvalidRequest(f"tools[{i}].function: description must be a string and parameters an object")
    Grammar.json_schema(params)  # an invalid schema is refused here, by name
    return Tool(name=name, description=desc, parameters=params)


def parse_tool_choice(choice: Any, tools: Sequence[Tool]) -> str:
    """"none", "auto", "required" or the name of the one tool to call (OpenAI's named form)."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise InvalidRequest('tool_choice must be "none", "auto", "required" or '
                                 '{"type": "function", "function": {"name": ...}}')
        if name not in {t.name for t in tools}:
            raise InvalidRequest(f"tool_choice names {name!r}, which is not among the tools")
        return name
    if not isinstance(choice, str) or choice not in CHOICES:
        raise InvalidRequest(f"tool_choice must be one of {', '.join(CHOICES)} or a named function")
    if choice != "none" and not tools:
        raise InvalidRequest(f"tool_choice {choice!r} needs tools")
    return choice


# --- the format of a model ---


def tool_format(model: Any, plugins: Any = None, template: str | None = None) -> ToolCallFormat | None:
    """The ToolCallFormat a family plugin declares for `model` (chatting with `template`, default the
    model's), or None."""
    from archrun.plugins import default_plugin_manager

    pm = plugins or default_plugin_manager()
    fmt = pm.hook.archrun_tool_call_format(architecture=model.descriptor.architecture,
                                           chat_template=template or model.chat_template)
    if fmt is not None and not isinstance(fmt, ToolCallFormat):
        raise PluginError(f"a plugin answered archrun_tool_call_format with {type(fmt).__name__}, "
                          "not an archrun.generation.tools.ToolCallFormat")
    return fmt


@attrs.frozen
class ToolPlan:
    """A chat turn with tools, ready to generate: prompt ids, the grammar that forces a call (or
    None), and the format that parses the reply (None when tools are off)."""

    ids: list[int]
    grammar: Grammar | None
    format: ToolCallFormat | None


def plan_tool_chat(model: Any, messages: Sequence[dict], tools: Any, tool_choice: Any = None,
                   template: str | None = None, **template_vars: Any) -> ToolPlan:
    """Render a conversation with `tools` offered; see the module docstring."""
    from archrun.text.chat_template import chat_prompt, validate_messages

    offered = parse_tools(tools)
    choice = parse_tool_choice(tool_choice, offered)
    messages = validate_messages(template_messages(messages))
    _check_fields(model.tokenizer, messages, template_vars)
    if choice == "none":
        return ToolPlan(chat_prompt(model, messages, template, **template_vars), None, None)
    fmt = tool_format(model, template=template)
    if fmt is None:
        raise InvalidRequest(f"no installed family declares a tool-call format for {model.descriptor.architecture}")
    source = template or model.chat_template
    check_plain(model.tokenizer, [t.to_openai() for t in offered], "tools")
    if source is not None and "tools" in source:
        template_vars = {**template_vars, "tools": [t.to_openai() for t in offered]}
    else:
        messages = _with_system(messages, fmt.describe(offered))
    forced = [t for t in offered if choice in ("required", t.name)]
    grammar = fmt.grammar(forced) if choice != "auto" else None
    return ToolPlan(chat_prompt(model, messages, template, **template_vars), grammar, fmt)


def _with_system(messages: list[dict], text: str) -> list[dict]:
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def template_messages(messages: Any) -> list[dict]:
    """OpenAI messages as chat templates expect them: an assistant's null content is "", tool-call
    arguments given as JSON text become objects (templates write them with `tojson`)."""
    if not isinstance(messages, list | tuple):
        return messages
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant" and (m.get("content") is None or m.get("tool_calls")):
            m = {**m, "content": m.get("content") or ""}
            if isinstance(m.get("tool_calls"), list):
                m["tool_calls"] = [_call_for_template(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _call_for_template(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        with contextlib.suppress(ValueError, RecursionError):  # not JSON: the template gets the text
            fn = {**fn, "arguments": json.loads(fn["arguments"])}
        return {**call, "function": fn}
    return call


def _check_fields(tokenizer: Any, messages: list[dict], template_vars: dict) -> None:
    """Message fields besides role and content (tool calls, names, ids) and template variables
    reach the template as data: none may spell a special token."""
    for i, m in enumerate(messages):
        extra = {k: v for k, v in m.items() if k not in ("role", "content")} if isinstance(m, dict) else {}
        if extra:
            check_plain(tokenizer, extra, f"messages[{i}]")
    check_template_vars(tokenizer, template_vars)


RESERVED_VARS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "template"})


def check_template_vars(tokenizer: Any, template_vars: dict[str, Any]) -> None:
    """Template variables: names that are identifiers (not ones the renderer sets), JSON data values
    that spell no special token."""
    from archrun.text.chat_template import _plain

    for name, value in template_vars.items():
        if not isinstance(name, str) or not name.isidentifier() or name in RESERVED_VARS:
            raise InvalidRequest(f"{name!r} is not a template variable archrun can pass"[:200])
        _plain(value, name)  # JSON types only, depth-bounded (a structure that contains itself is refused)
    if template_vars:
        check_plain(tokenizer, template_vars, "template variables")


def check_plain(tokenizer: Any, value: Any, where: str) -> None:
    """Refuse data bound for a template (outside message contents) that spells a control token:
    such text would be parsed as control, not kept as plain text. At most MAX_OUTPUT_CHARS of JSON."""
    from archrun.text.chat_template import MAX_OUTPUT_CHARS

    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:  # not JSON data, or it contains itself
        raise InvalidRequest(f"{where} must be JSON data: {exc}"[:300]) from None
    if len(text) > MAX_OUTPUT_CHARS:
        raise InvalidRequest(f"{where} is larger than {MAX_OUTPUT_CHARS} characters of JSON")
    if any(special in text for special in _control_texts(tokenizer)):
        raise InvalidRequest(f"{where} contains special-token text")


_CONTROL_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _control_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts of a vocabulary's control tokens (what parse_special turns into control ids)."""
    found = _CONTROL_TEXTS.get(tokenizer)
    if found is None:
        found = tuple(t for i in range(tokenizer.n_vocab) if tokenizer.is_control(i) and (t := tokenizer.token_text(i)))
        _CONTROL_TEXTS[tokenizer] = found
    return found


# --- the reply: content and calls ---


class ToolCallStream:
    """Splits a streamed reply into content and tool calls, using a ToolCallFormat.

    `push(piece)` and `finish()` return (content text now safe to show, calls completed since).
    A tool-call part that does not parse by the end is given back as content.
    """

    def __init__(self, fmt: ToolCallFormat):
        self.fmt = fmt
        self.text, self.shown, self.at = "", 0, None   # reply so far; chars of it passed on; tool part start
        self._shown_text = ""                           # the content passed on
        self.calls: list[ToolCall] = []

    def push(self, piece: str) -> tuple[str, list[ToolCall]]:
        self.text += piece
        if self.at is None:
            self.at = self.fmt.start(self.text)
        if self.at is None:
            safe = self.text[: len(self.text) - self.fmt.hold(self.text)].rstrip()  # whitespace before a call
            return self._content(len(safe)), []                                      # is dropped: held too
        return self._content(self.at, before_call=True), self._new_calls(final=False)

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self.at is None:
            return self._content(len(self.text)), []
        calls = self._new_calls(final=True)
        if not self.calls:  # the tool part did not parse: it was text after all
            return self._content(len(self.text)), []
        return "", calls

    @property
    def content(self) -> str:
        """The reply's content (the text outside the tool-call part)."""
        return self._shown_text

    def _content(self, upto: int, before_call: bool = False) -> str:
        piece = self.text[self.shown: upto] if upto > self.shown else ""
        if before_call:  # the whitespace that separates content from the calls is neither
            piece = piece.rstrip() if self.text[:upto].strip() else ""
        self.shown = max(self.shown, upto)
        self._shown_text += piece
        return piece

    def _new_calls(self, final: bool) -> list[ToolCall]:
        try:
            found = self.fmt.parse(self.text[self.at:], final)
        except (ValueError, TypeError, KeyError):
            found = []
        new = [ToolCall(name=str(name), arguments=args if isinstance(args, str) else json.dumps(args))
               for name, args in found[len(self.calls):]]
        self.calls += new
        return new
