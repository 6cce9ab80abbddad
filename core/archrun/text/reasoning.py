"""Reasoning: a thinking model's reply split into its thinking and its answer.

How a model marks its thinking is a family's knowledge: a family plugin answers the
`archrun_reasoning_format` hook with a `ReasoningFormat` (the open and close texts, e.g. the
`<think>`/`</think>` of Qwen3's and DeepSeek-R1's templates). The core knows no family: it asks
the hook once per model, sees from the rendered prompt whether the reply starts inside the
thinking (templates that open it for the model), and streams a reply as reasoning plus content
(`ReasoningStream`).

    fmt = reasoning_format(model)
    stream = ReasoningStream(fmt, inside=fmt.opened_by(prompt_text))
    reasoning, content = stream.push(piece)

A reasoning budget (`ReasoningBudget`) watches a reply as it is generated and, once the thinking
has used its tokens, has the close text forced as the next tokens (llama-server's
`--reasoning-budget`): the model then answers. A format with `answer_open` (gpt-oss's harmony
channels) also drops that text where the answer starts with it (after the thinking or in its
place).
"""

from __future__ import annotations

from typing import Any

import attrs

from archrun.errors import InvalidRequest, PluginError


@attrs.frozen
class ReasoningFormat:
    """Thinking written between `open` and `close` at the start of a reply; `answer_open`, when
    given, is markup that opens the answer (dropped where the answer starts with it: at the start
    of a reply that skips the thinking, or right after the close). An answer that starts with
    other markup (e.g. a tool call's header) keeps it, for the tool-call format to read."""

    open: str
    close: str
    name: str = "tags"
    answer_open: str = ""

    def applies(self, chat_template: str | None) -> bool:
        """Whether a model chatting with `chat_template` thinks in this format (the template names
        the open text: it renders or strips past thinking)."""
        return chat_template is not None and self.open in chat_template

    def opened_by(self, prompt_text: str) -> bool:
        """Whether a prompt ending in `prompt_text` leaves the reply inside the thinking (the
        template wrote the open text and no close after it)."""
        at = prompt_text.rfind(self.open)
        return at >= 0 and prompt_text.find(self.close, at) < 0


THINK_TAGS = ReasoningFormat("<think>", "</think>", "think")


def reasoning_format(model: Any, plugins: Any = None, template: str | None = None) -> ReasoningFormat | None:
    """The ReasoningFormat a family plugin declares for `model` chatting with `template` (default the
    model's), or None (the reply is all answer)."""
    from archrun.plugins import default_plugin_manager

    pm = plugins or default_plugin_manager()
    fmt = pm.hook.archrun_reasoning_format(architecture=model.descriptor.architecture,
                                           chat_template=template or getattr(model, "chat_template", None))
    if fmt is not None and not isinstance(fmt, ReasoningFormat):
        raise PluginError(f"a plugin answered archrun_reasoning_format with {type(fmt).__name__}, "
                          "not an archrun.text.reasoning.ReasoningFormat")
    return fmt


def _partial(text: str, mark: str) -> int:
    """How many trailing characters of `text` could begin `mark`."""
    for k in range(min(len(mark) - 1, len(text)), 0, -1):
        if text.endswith(mark[:k]):
            return k
    return 0


class ReasoningStream:
    """Splits a streamed reply into reasoning and content.

    `push(piece)` and `finish()` return (reasoning, content) now safe to pass on. Text that may
    still open or close the thinking is held back; whitespace around the thinking is dropped. A
    reply that does not open with the open text (after whitespace) is all content; thinking never
    closed (the reply was cut short) is all reasoning.
    """

    def __init__(self, fmt: ReasoningFormat, inside: bool = False):
        self.fmt = fmt
        self.state = "reasoning" if inside else "start"
        self.buf = ""
        self.reasoning = ""   # all reasoning passed on
        self.content = ""     # all content passed on
        self.marked = False   # the answer's markup (answer_open) was seen and dropped

    def push(self, piece: str) -> tuple[str, str]:
        self.buf += piece
        reasoning = content = ""
        answer = self.fmt.answer_open
        if self.state == "start":
            head = self.buf.lstrip()
            if head.startswith(self.fmt.open):
                self.state, self.buf = "reasoning", head[len(self.fmt.open):]
            elif answer and head.startswith(answer):
                self.state, self.buf, self.marked = "answer", head[len(answer):], True
            elif not (self.fmt.open.startswith(head) or answer.startswith(head)):
                self.state = "content"
        if self.state == "reasoning":
            self.buf = self.buf.lstrip() if not self.reasoning else self.buf
            at = self.buf.find(self.fmt.close)
            if at >= 0:
                reasoning, self.buf = self.buf[:at].rstrip(), self.buf[at + len(self.fmt.close):]
                self.state = "answer"
            else:
                safe = len(self.buf[: len(self.buf) - _partial(self.buf, self.fmt.close)].rstrip())
                reasoning, self.buf = self.buf[:safe], self.buf[safe:]
        if self.state == "answer":  # the whitespace that separates thinking from the answer is neither
            self.buf = self.buf.lstrip()
            if answer and not self.marked and self.buf.startswith(answer):  # the answer's own markup
                self.buf, self.marked = self.buf[len(answer):].lstrip(), True
            if self.buf and (self.marked or not answer.startswith(self.buf)):
                self.state = "content"
        if self.state == "content":
            content, self.buf = self.buf, ""
        return self._out(reasoning, content)

    def finish(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        if self.state == "reasoning":
            return self._out(rest.rstrip(), "")
        return self._out("", rest if self.state != "answer" else rest.lstrip())

    def _out(self, reasoning: str, content: str) -> tuple[str, str]:
        self.reasoning += reasoning
        self.content += content
        return reasoning, content


class ReasoningBudget:
    """At most `budget` tokens of thinking in a reply: `forced(text, n_tokens)` is asked before each
    token with the reply so far and returns the token ids to force next (the close text's, once the
    thinking has used its budget; else none). Thinking the reply does not open, or closes itself,
    is never cut. `inside`: the prompt opened the thinking (see ReasoningFormat.opened_by)."""

    def __init__(self, fmt: ReasoningFormat, close_ids: list[int], budget: int, inside: bool = False):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise InvalidRequest(f"a reasoning budget must be an integer >= 0, got {budget!r}")
        self.fmt, self.close_ids, self.budget = fmt, list(close_ids), budget
        self.start: int | None = 0 if inside else None   # tokens of the reply before the thinking began
        self.done = False

    def forced(self, text: str, n_tokens: int) -> list[int]:
        if self.done:
            return []
        if self.start is None:
            head = text.lstrip()
            if head.startswith(self.fmt.open):
                self.start = n_tokens
            else:
                self.done = bool(head) and not self.fmt.open.startswith(head)  # the reply answers at once
                return []
        at = text.find(self.fmt.open) if self.start else 0
        if self.fmt.close in text[max(at, 0):]:
            self.done = True  # the model closed its thinking itself
            return []
        if n_tokens - self.start >= self.budget:
            self.done = True
            return list(self.close_ids)
        return []


# the share of a reply's token budget that a reasoning effort lets the thinking use, for models whose
# template has no `reasoning_effort` variable to tell them (OpenRouter's mapping to a token budget)
EFFORT_SHARE = {"minimal": 0.1, "low": 0.2, "medium": 0.5, "high": 0.8, "xhigh": 0.95}
EFFORTS = ("none", *EFFORT_SHARE)


def effort_budget(effort: str, max_tokens: int) -> int | None:
    """The thinking-token budget of OpenAI's reasoning `effort` for a reply of at most `max_tokens`
    tokens: its EFFORT_SHARE of them, at least 1; None for an effort that names no share."""
    share = EFFORT_SHARE.get(effort) if isinstance(effort, str) else None
    return None if share is None else max(1, int(share * max_tokens))


def says_effort(chat_template: str | None) -> bool:
    """Whether a chat template reads the `reasoning_effort` variable (gpt-oss's tells the model)."""
    return chat_template is not None and "reasoning_effort" in chat_template
