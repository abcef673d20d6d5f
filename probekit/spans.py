"""Find the token positions of named pieces of a chat prompt (identities, emotion, event, answer).

A span is named by where the caller put it, not by searching the whole prompt: a message index
plus a character range inside that message's content. Rendering records where each message's
content starts in the templated text, and the tokenizer's offset mapping turns character ranges
into token positions. A span is every token that overlaps its characters, so a token the
tokenizer merged across the boundary (the space in " a", a trailing '."') belongs to it, and
spans of different identities may have different numbers of tokens.

Positions index the unpadded token sequence `LocatedPrompt.input_ids`; in a left-padded batch of
width W add `W - len(input_ids)` to each of them.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from probekit.errors import ProbekitError
from probekit.studies.intergroup import Setting, render_messages

ANSWER = "answer"
"""The span that every located prompt has: the last token, where the answer is read."""

Messages = Sequence[dict[str, str]]
Renderer = Callable[[Messages], str]


@dataclass(frozen=True)
class Span:
    """`text` found at character `start` of `messages[message]["content"]`, called `name`."""

    name: str
    message: int
    start: int
    text: str

    @property
    def end(self) -> int:
        return self.start + len(self.text)


@dataclass(frozen=True)
class LocatedPrompt:
    """A rendered prompt, its tokens, and the token positions of each named span."""

    text: str
    input_ids: list[int]
    offsets: list[tuple[int, int]]
    message_starts: list[int]
    positions: dict[str, list[int]]

    def span_text(self, name: str) -> str:
        """The characters covered by the tokens of span `name` (for checks and display)."""
        pos = self.positions[name]
        return self.text[self.offsets[pos[0]][0] : self.offsets[pos[-1]][1]]


def find_span(
    messages: Messages, name: str, message: int, text: str, occurrence: int = 0, after: int = 0
) -> Span:
    """The `occurrence`-th (negative counts from the end) `text` in a message, at or after `after`.

    Use it when the caller knows which occurrence is meant; prefer `fill_template` offsets when
    the message was built from a template.
    """
    content = _content(messages, message)
    if not text:
        raise ProbekitError(f"span '{name}' is empty; give the text it should cover")
    starts = []
    at = content.find(text, after)
    while at != -1:
        starts.append(at)
        at = content.find(text, at + 1)
    if not -len(starts) <= occurrence < len(starts):
        raise ProbekitError(
            f"span '{name}': {text!r} occurs {len(starts)} time(s) in message {message} after "
            f"character {after}, so occurrence {occurrence} does not exist"
        )
    return Span(name, message, starts[occurrence], text)


def fill_template(template: str, **values: str) -> tuple[str, dict[str, list[tuple[int, int]]]]:
    """Fill a `str.format` template with plain `{field}`s and say where each field landed.

    Returns the text (equal to `template.format(**values)`) and, per field, the (start, end)
    character ranges of its values in template order.
    """
    parts: list[str] = []
    where: dict[str, list[tuple[int, int]]] = {}
    length = 0
    for literal, field, spec, conversion in string.Formatter().parse(template):
        parts.append(literal)
        length += len(literal)
        if field is None:
            continue
        if spec or conversion or field not in values:
            raise ProbekitError(f"template field {{{field}}} is not a plain field with a value")
        value = str(values[field])
        where.setdefault(field, []).append((length, length + len(value)))
        parts.append(value)
        length += len(value)
    return "".join(parts), where


def chat_renderer(tokenizer: Any) -> Renderer:
    """Render with the tokenizer's chat template and its generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ProbekitError(
            "this tokenizer has no chat template; pass a render function that formats the turns"
        )

    def render(messages: Messages) -> str:
        return tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )

    return render


def message_starts(text: str, messages: Messages) -> list[int]:
    """Where each message's content starts in `text`, searching left to right after the last one.

    Searching in order keeps a system prompt that the template puts before the first message, or
    a content repeated in an earlier message, from being taken for a later message.
    """
    starts = []
    at = 0
    for i, message in enumerate(messages):
        content = message["content"]
        found = text.find(content, at)
        if found == -1:
            raise ProbekitError(
                f"message {i} ({message.get('role', '?')}) is not in the rendered prompt verbatim; "
                "the chat template changes message text, so spans cannot be placed"
            )
        starts.append(found)
        at = found + len(content)
    return starts


def locate(
    tokenizer: Any,
    messages: Messages,
    spans: Sequence[Span],
    render: Renderer | None = None,
    add_special_tokens: bool | None = None,
) -> LocatedPrompt:
    """Render `messages`, tokenize, and give each span's token positions, plus `answer`.

    `render` defaults to the chat template; give one for base models (e.g. plain text or a
    hand-written turn format). `add_special_tokens=None` adds the tokenizer's special tokens
    (its BOS) unless the rendered text already starts with the BOS token, as chat templates
    often do.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ProbekitError("span location needs a fast tokenizer (one with offset mappings)")
    text = (render or chat_renderer(tokenizer))(messages)
    starts = message_starts(text, messages)
    if add_special_tokens is None:
        bos = tokenizer.bos_token
        add_special_tokens = not (bos and text.startswith(bos))
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    positions: dict[str, list[int]] = {}
    for span in spans:
        if span.name in positions or span.name == ANSWER:
            raise ProbekitError(f"span name '{span.name}' is used twice")
        content = _content(messages, span.message)
        if not span.text or content[span.start : span.end] != span.text:
            raise ProbekitError(
                f"span '{span.name}': message {span.message} does not contain {span.text!r} at "
                f"character {span.start}"
            )
        a, b = starts[span.message] + span.start, starts[span.message] + span.end
        positions[span.name] = [i for i, (s, e) in enumerate(offsets) if s < b and e > a]
        if not positions[span.name]:
            raise ProbekitError(f"span '{span.name}' ({span.text!r}) covers no token")
    positions[ANSWER] = [len(offsets) - 1]
    return LocatedPrompt(text, list(enc["input_ids"]), offsets, starts, positions)


def intergroup_spans(
    setting: Setting, perceiver: str, experiencer: str, emotion: str, text: str
) -> tuple[list[dict[str, str]], list[Span]]:
    """The study's chat messages and the spans `perceiver`, `experiencer`, `emotion`, `event`.

    Positions come from the setting's templates, so an identity that also occurs in the event or
    in the question ("the person") is never confused with the filled one. `emotion` is the
    emotion word of the question ("How much {emotion} did ..."), which every template has.
    """
    messages = render_messages(setting, perceiver, experiencer, emotion, text)
    _, persona = fill_template(setting.persona, persona=perceiver)
    _, user = fill_template(setting.template, experiencer=experiencer, emotion=emotion, sent=text)
    spans = [
        Span("perceiver", 0, persona["persona"][0][0], perceiver),
        Span("experiencer", 1, user["experiencer"][0][0], experiencer),
        Span("emotion", 1, user["emotion"][-1][0], emotion),
        Span("event", 1, user["sent"][0][0], text),
    ]
    return messages, spans


def _content(messages: Messages, index: int) -> str:
    if not 0 <= index < len(messages):
        raise ProbekitError(f"message index {index} is out of range for {len(messages)} messages")
    return messages[index]["content"]
