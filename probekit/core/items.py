"""Items, the unit every study produces, and the one encoder that turns them into tokens.

An item is one prompt: its key columns (what identifies it in a results table), its chat messages
or raw text, an optional response prefill (text forced at the start of the answer, e.g. `[[`),
named spans declared by the study as character ranges of its messages, and a unit id (the event
or question that exclusion and resampling work on). `encode_item` renders an item (chat template
and generation prompt, or the raw text), appends the prefill, tokenizes it, and maps each span to
the token positions that overlap its characters; the run loop, capture, patching and directions
all go through it, so their tables share `prompt_id` and can be joined.

A span is named by where the study put it, never by searching the whole prompt: an identity that
also occurs in the event text is not mistaken for it. A token the tokenizer merged across the
span's boundary (the space in " a", a trailing '."') belongs to the span, so spans of different
identities may have different numbers of tokens. Positions index the unpadded token sequence.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from probekit.core.errors import ProbekitError
from probekit.core.public import public
from probekit.core.text import refuse_lone_surrogate

ANSWER = "answer"
"""The span every encoded item has: the last token, where the answer is read."""
PROMPT_ID = "prompt_id"
"""The column holding an item's id in every result table (scores, capture index, directions)."""

ROLES = ("system", "user", "assistant")
"""The chat roles a message may have."""

Message = dict[str, str]
Renderer = Callable[[Sequence[Message]], str]


def parse_messages(messages: object, where: str) -> tuple[Message, ...]:
    """Checked chat messages (a non-empty list of {role, content}, a role of `ROLES`): the one
    rule of an `Item`'s messages, whichever front end made them; `where` prefixes errors."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise ProbekitError(f"{where}: 'messages' must be a non-empty list")
    if not all(
        isinstance(m, Mapping) and m.get("role") in ROLES and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise ProbekitError(f"{where}: each message needs a role in {ROLES} and a string content")
    if not any(m["content"].strip() for m in messages):
        raise ProbekitError(f"{where}: the prompt is empty (no message has any content)")
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)  # type: ignore[index]


@public()
@dataclass(frozen=True)
class CharSpan:
    """Characters [start, end) of `messages[message]["content"]` (or of the raw text when
    `message` is None)."""

    message: int | None
    start: int
    end: int


@public()
@dataclass(frozen=True)
class Item:
    """One prompt of a study, before tokenization."""

    id: str = ""  # unique within a study run; the `prompt_id` column of every result table
    key: Mapping[str, Any] = field(default_factory=dict)  # key columns of the results table
    unit: str = ""  # the event or question this prompt is about (default: the id)
    messages: tuple[Message, ...] | None = None
    text: str | None = None
    prefill: str = ""
    spans: Mapping[str, tuple[CharSpan, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"item {self.id!r}"
        if (self.messages is None) == (self.text is None):
            raise ProbekitError(f"{where} needs chat messages or raw text (one of them)")
        if self.messages is not None:
            object.__setattr__(self, "messages", parse_messages(self.messages, where))
        elif not (self.text + self.prefill).strip():  # type: ignore[operator]
            raise ProbekitError(f"{where}: the prompt is empty (its text is blank)")
        texts = [("id", self.id), ("text", self.text or ""), ("prefill", self.prefill)]
        texts += [(f"message {n}", m["content"]) for n, m in enumerate(self.messages or ())]
        for name, value in texts:
            refuse_lone_surrogate(value, f"{where}: its {name}")
        if not self.unit:  # an ad-hoc prompt is its own unit
            object.__setattr__(self, "unit", self.id)
        for name, ranges in self.spans.items():
            if name == ANSWER:
                raise ProbekitError(f"{where}: the span name '{ANSWER}' is reserved")
            for r in ranges:
                if not 0 <= r.start < r.end <= len(self._source(r.message)):
                    raise ProbekitError(
                        f"{where}: span '{name}' [{r.start}, {r.end}) lies outside "
                        f"{'the text' if r.message is None else f'message {r.message}'}"
                    )

    def _source(self, message: int | None) -> str:
        if message is None:
            if self.text is None:
                raise ProbekitError(f"item {self.id!r}: a span without a message needs raw text")
            return self.text
        if self.messages is None or not 0 <= message < len(self.messages):
            raise ProbekitError(f"item {self.id!r}: a span names message {message}, absent")
        return self.messages[message]["content"]

    def span_text(self, name: str) -> str:
        """The characters a span declares (its ranges joined by a space)."""
        if name not in self.spans:
            raise ProbekitError(f"item {self.id!r} has no span {name!r}; it has {self.span_names}")
        return " ".join(self._source(r.message)[r.start : r.end] for r in self.spans[name])

    @property
    def span_names(self) -> list[str]:
        return list(self.spans)


@public()
@dataclass(frozen=True)
class EncodedItem:
    """An item rendered and tokenized, with the token positions of each span (and `answer`)."""

    item: Item
    text: str
    input_ids: list[int]
    offsets: list[tuple[int, int]]
    positions: dict[str, list[int]]

    @property
    def id(self) -> str:
        return self.item.id

    def span_text(self, name: str) -> str:
        """The characters covered by the tokens of span `name` (for checks and display)."""
        pos = self.positions[name]
        return self.text[self.offsets[pos[0]][0] : self.offsets[pos[-1]][1]]


@public()
class Pair(NamedTuple):
    """A counterfactual (clean, corrupt) pair of prompts on the same unit, built by a study or
    by `make_pair`; any 2-tuple of encoded items works where a pair is expected."""

    clean: EncodedItem
    corrupt: EncodedItem


def chat_renderer(tokenizer: Any) -> Renderer:
    """Render with the tokenizer's chat template and its generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ProbekitError(
            "this tokenizer has no chat template, so chat messages cannot be rendered; give raw "
            "text items or a render function that formats the turns"
        )

    def render(messages: Sequence[Message]) -> str:
        return tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )

    return render


@public()
def encode_item(
    tokenizer: Any,
    item: Item,
    render: Renderer | None = None,
    max_length: int | None = None,
    as_string: bool = False,
) -> EncodedItem:
    """Render, tokenize and locate the spans of one item.

    Chat messages are rendered with `render` (default: the tokenizer's chat template) and carry
    their special tokens from it; raw text gets the tokenizer's own special tokens (its BOS)
    unless it already starts with the BOS token. `as_string=True` tokenizes the rendered chat
    text as a plain string prompt, with the tokenizer's special tokens, as vLLM does when handed
    the template's output: a second BOS for tokenizers that add one (Llama-3.1, Mistral), none
    for those that do not (SmolLM2). `max_length` refuses prompts that leave no room for the
    answer.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ProbekitError(
            "encode_item(): tokenizer must be a fast tokenizer, one with offset mappings (got "
            f"a {type(tokenizer).__name__}); a loaded model encodes with model.encode(item)"
        )
    if item.messages is not None:
        body = (render or chat_renderer(tokenizer))(item.messages)
        starts = message_starts(body, item.messages)
        special = as_string
    else:
        body, starts = item.text, []
        bos = tokenizer.bos_token
        special = not (bos and body.startswith(bos))
    text = body + item.prefill
    enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    if max_length is not None and len(ids) > max_length:
        raise ProbekitError(
            f"id '{item.id}': prompt has {len(ids)} tokens, more than the {max_length} the "
            "model's context leaves after room for the answer"
        )
    positions: dict[str, list[int]] = {}
    for name, ranges in item.spans.items():
        hit: set[int] = set()
        for r in ranges:
            base = 0 if r.message is None else starts[r.message]
            a, b = base + r.start, base + r.end
            hit.update(i for i, (s, e) in enumerate(offsets) if s < b and e > a)
        if not hit:
            raise ProbekitError(f"item {item.id!r}: span '{name}' covers no token")
        positions[name] = sorted(hit)
    positions[ANSWER] = [len(ids) - 1]
    return EncodedItem(item, text, ids, offsets, positions)


def message_starts(text: str, messages: Sequence[Message]) -> list[int]:
    """Where each message's content starts in `text`, searching left to right after the last one.

    Searching in order keeps a system prompt that the template puts before the first message, or
    a content repeated in an earlier message, from being taken for a later message.
    """
    starts, at = [], 0
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


@public()
def fill_template(template: str, **values: str) -> tuple[str, dict[str, list[tuple[int, int]]]]:
    """Fill a `str.format` template with plain `{field}`s and say where each field landed.

    Returns the text (equal to `template.format(**values)`) and, per field, the (start, end)
    character ranges of its values in template order.
    """
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as error:  # a lone brace
        raise ProbekitError(
            f"template {template!r} is not a str.format template: {error}"
        ) from None
    text, where = "", {}
    for literal, name, spec, conversion in fields:
        text += literal
        if name is None:
            continue
        if spec or conversion or name not in values:
            raise ProbekitError(f"template field {{{name}}} is not a plain field with a value")
        value = str(values[name])
        where.setdefault(name, []).append((len(text), len(text) + len(value)))
        text += value
    return text, where


def check_span_names(items: Sequence[Item], names: Sequence[str]) -> None:
    """Refuse span names that an item does not declare, naming the ones it has."""
    for item in items:
        for name in names:
            if name != ANSWER and name not in item.spans:
                raise ProbekitError(
                    f"unknown span {name!r}: the study's items declare "
                    f"{', '.join([*item.spans, ANSWER])}"
                )
