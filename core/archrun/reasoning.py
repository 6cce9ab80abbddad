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
"""

from __future__ import annotations

from typing import Any

import attrs

from archrun.errors import PluginError


@attrs.frozen
class ReasoningFormat:
    """Thinking written between `open` and `close` at the start of a reply."""

    open: str
    close: str
    name: str = "tags"

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
                          "not an archrun.reasoning.ReasoningFormat")
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

    def push(self, piece: str) -> tuple[str, str]:
        self.buf += piece
        reasoning = content = ""
        if self.state == "start":
            head = self.buf.lstrip()
            if head.startswith(self.fmt.open):
                self.state, self.buf = "reasoning", head[len(self.fmt.open):]
            elif not self.fmt.open.startswith(head):
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
            if self.buf:
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
