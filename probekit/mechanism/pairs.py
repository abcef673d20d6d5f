"""Counterfactual pairs: building them, choosing them, and aligning their spans.

A pair is two encoded prompts on the same unit (event, question) that differ in one identity,
(clean, corrupt). A study builds its pairs (`Study.pairs`); `make_pair` builds one from two
strings with the identity given as text.

Spans: any span the items declare (intergroup: `experiencer`, `perceiver`, ...), `from_<span>`
(every token from the span's first to the prompt's last, the answer position included) and
`<span>@<i>` (the i-th of the span's aligned positions; negative from its end).

Alignment. The clean and corrupt spans may differ in length ("a Buddhist" can be three tokens,
"a Jew" two). They are aligned right to left: the last k = min(len_clean, len_corrupt) positions
of each, last token to last token; the longer span's leading tokens are not patched. A name is
complete at its last token, and the text after it is the same in both prompts, so for
`from_<span>` this pairs identical tokens counted from the end of the sequence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.items import CharSpan, EncodedItem, Item, Pair
from probekit.core.public import public

FROM = "from_"  # `from_<span>`: the span's first token to the prompt's end
AT = "@"  # `<span>@<i>`: the i-th of the span's aligned positions (negative: from its end)


def split_position(span: str) -> tuple[str, int | None]:
    """`experiencer@-1` -> ("experiencer", -1); a span without `@` -> (span, None)."""
    name, at, index = span.partition(AT)
    if not at:
        return span, None
    try:
        return name, int(index)
    except ValueError:
        raise ProbekitError(
            f"bad span {span!r}: after {AT} comes a position index (0, 1, ... or -1 for the last)"
        ) from None


def base_span(span: str) -> str:
    """The declared span a span spec refers to (`from_experiencer@-1` -> `experiencer`)."""
    return split_position(span)[0].removeprefix(FROM)


def span_positions(prompt: EncodedItem, span: str) -> list[int]:
    """Token positions of `span` in the unpadded prompt (`from_<span>` runs to the end; a
    position index `@i` is applied after the clean and corrupt spans are aligned)."""
    positions = prompt.positions.get(base_span(span))
    if not positions:
        raise ProbekitError(
            f"unknown span {span!r}: the prompts have the spans {', '.join(prompt.positions)} "
            f"(and {FROM}<span> for everything from a span to the end)"
        )
    if span.startswith(FROM):
        return list(range(positions[0], len(prompt.input_ids)))
    return list(positions)


def align(clean: Sequence[int], corrupt: Sequence[int]) -> tuple[list[int], list[int]]:
    """Right-to-left alignment: the last min(len) positions of each, last to last."""
    k = min(len(clean), len(corrupt))
    return list(clean[len(clean) - k :]), list(corrupt[len(corrupt) - k :])


def aligned_positions(pair: Pair, span: str) -> tuple[list[int], list[int]]:
    """The clean and corrupt positions a patch of `span` copies between, aligned (one of each
    with `@i`; an index beyond the aligned span is refused)."""
    clean, corrupt = pair
    clean_pos, corrupt_pos = align(span_positions(clean, span), span_positions(corrupt, span))
    index = split_position(span)[1]
    if index is None:
        return clean_pos, corrupt_pos
    if not -len(clean_pos) <= index < len(clean_pos):
        raise ProbekitError(
            f"{span}: the span has {len(clean_pos)} aligned positions in pair "
            f"{clean.id} / {corrupt.id}, so {AT}{index} is out of range"
        )
    return [clean_pos[index]], [corrupt_pos[index]]


def single_positions(spans: Iterable[str], pairs: Sequence[Pair]) -> list[str]:
    """Each span as its single positions `span@-k` ... `span@-1`, k the fewest aligned positions
    of any pair: the same index is the same place relative to the span's end in every pair."""
    out = []
    for span in spans:
        if split_position(span)[1] is not None:
            out.append(span)
            continue
        k = min(len(aligned_positions(pair, span)[0]) for pair in pairs)
        out += [f"{span}{AT}{i}" for i in range(-k, 0)]
    return out


def check_pairs(pairs: Any, spans: Iterable[str] = ()) -> list[Pair]:
    """The pairs as a list of (clean, corrupt) encoded prompts; one line for anything else (an
    empty list, a list of prompts, a pair whose prompts are about different units) or a span a
    pair cannot align."""
    if isinstance(pairs, str | bytes) or not isinstance(pairs, Sequence) or not pairs:
        raise ProbekitError(
            f"pairs must be a non-empty list of (clean, corrupt) pairs, got {_what(pairs)}"
        )
    out = []
    for i, pair in enumerate(pairs):
        if not (
            isinstance(pair, tuple | list)
            and len(pair) == 2
            and all(isinstance(p, EncodedItem) for p in pair)
        ):
            raise ProbekitError(
                f"pair {i} is {_what(pair)}, not a (clean, corrupt) pair of encoded prompts "
                "(model.encode(item), or make_pair(model, clean_text, corrupt_text))"
            )
        clean, corrupt = pair
        if clean.item.unit != corrupt.item.unit:
            raise ProbekitError(
                f"pair {i}: the clean prompt is about {clean.item.unit!r} and the corrupt one "
                f"about {corrupt.item.unit!r}; a pair must share its unit"
            )
        for span in dict.fromkeys(spans):
            aligned_positions((clean, corrupt), span)
        out.append((clean, corrupt))
    return out


def pick_pairs(pairs: Sequence[Pair], gaps: Sequence[float], per_unit: int) -> list[Pair]:
    """The `per_unit` pairs of each unit with the largest |gap| (readout(clean) -
    readout(corrupt), one per pair)."""
    size = [abs(g) if math.isfinite(g) else -1.0 for g in gaps]
    chosen: dict[str, list[Pair]] = {}
    for i in sorted(range(len(pairs)), key=size.__getitem__, reverse=True):
        pair = pairs[i]
        group = chosen.setdefault(pair[0].item.unit, [])
        if len(group) < per_unit:
            group.append(pair)
    return [pair for group in chosen.values() for pair in group]


@public()
def make_pair(
    model: Any,
    clean: str | Sequence[dict[str, str]],
    corrupt: str | Sequence[dict[str, str]],
    span: str | tuple[str, str] | None = None,
    name: str = "identity",
    chat: bool = True,
) -> Pair:
    """A (clean, corrupt) pair from two prompts that differ in one place, with that place
    declared as the span `name`.

    Each prompt is a text or a chat-message list (`[{"role": "system", "content": "You are a
    Muslim."}, {"role": "user", "content": ...}]`: a persona system prompt, a user message, or
    both); two message lists have the same roles and differ in one message, where the span is
    found by its text. `span`: the clean side's text (`"Muslim"`; the corrupt span is what
    stands in its place, the rest being equal), a (clean text, corrupt text) tuple (each found
    at its first occurrence), or None for the characters where the prompts differ, widened to
    whole words. `chat`: send a text as one user message through the chat template (else raw
    text). The key column `name` holds each side's span text; the unit is the clean prompt with
    the span replaced by `{name}`. Two prompts whose tokens differ outside the span (the
    tokenizer merged the span with its neighbours) are refused, saying where."""
    clean_messages, corrupt_messages = _messages(clean, chat), _messages(corrupt, chat)
    if clean_messages is None or corrupt_messages is None:
        if clean_messages is not None or corrupt_messages is not None:
            raise ProbekitError("make_pair takes two texts or two message lists, not one of each")
        sources, at = ([clean], [corrupt]), None
    else:
        sources, at = (
            (clean_messages, corrupt_messages),
            _differing(clean_messages, corrupt_messages),
        )
    index = 0 if at is None else at
    first = sources[0][index] if at is None else sources[0][index]["content"]
    second = sources[1][index] if at is None else sources[1][index]["content"]
    (a, b), (c, d) = _locate(first, second, span)
    unit_text = f"{first[:a]}{{{name}}}{first[b:]}"
    unit = (
        unit_text
        if at is None
        else " | ".join(unit_text if i == at else m["content"] for i, m in enumerate(sources[0]))
    )
    items = []
    for side, text, start, end in ((0, first, a, b), (1, second, c, d)):
        key = {name: text[start:end]}
        if at is None:
            where = CharSpan(0 if chat else None, start, end)
            messages = ({"role": "user", "content": text},) if chat else None
            items.append(
                Item(
                    text,
                    key,
                    unit,
                    messages=messages,
                    text=None if chat else text,
                    spans={name: (where,)},
                )
            )
        else:
            listed = tuple(dict(m) for m in sources[side])
            ident = " | ".join(m["content"] for m in listed)
            items.append(
                Item(ident, key, unit, messages=listed, spans={name: (CharSpan(at, start, end),)})
            )
    pair = model.encode(items[0]), model.encode(items[1])
    check_alignment(pair, name, getattr(getattr(model, "tokenizer", None), "decode", repr))
    return pair


def check_alignment(pair: Pair, span: str, decode: Any = repr) -> None:
    """One line when the two prompts' tokens differ outside `span`: before it, or after it
    counted from the end (e.g. the tokenizer merged the span with a neighbour). `decode` shows
    a token id."""
    clean, corrupt = pair
    p, q = clean.positions[span], corrupt.positions[span]
    a, b = clean.input_ids, corrupt.input_ids
    where = None
    for k in range(max(p[0], q[0])):
        if k >= min(p[0], q[0]) or a[k] != b[k]:
            where = (k, k, "before")
            break
    if where is None:
        tail_a, tail_b = len(a) - 1 - p[-1], len(b) - 1 - q[-1]
        for k in range(1, max(tail_a, tail_b) + 1):
            if k > min(tail_a, tail_b) or a[-k] != b[-k]:
                where = (len(a) - k, len(b) - k, "after")
                break
    if where is None:
        return
    i, j, side = where

    def show(ids: Sequence[int], at: int) -> str:
        return repr(decode([ids[at]])) if 0 <= at < len(ids) else "nothing"

    raise ProbekitError(
        f"the clean and corrupt prompts' tokens diverge {side} the span '{span}': clean token "
        f"{i} is {show(a, i)}, corrupt token {j} is {show(b, j)}; a pair must tokenize alike "
        "outside its span (widen the span, e.g. to the whole word)"
    )


def _messages(prompt: Any, chat: bool) -> list[dict[str, str]] | None:
    """A message list as a list of {role, content} dicts (None for a text); one line for
    anything else."""
    if isinstance(prompt, str):
        if not prompt:
            raise ProbekitError("make_pair takes non-empty texts or message lists, got ''")
        return None
    if (
        isinstance(prompt, Sequence)
        and prompt
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in prompt
        )
    ):
        if not chat:
            raise ProbekitError("message lists go through the chat template: leave chat=True")
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise ProbekitError(
        "make_pair takes two texts or two chat-message lists ([{'role': 'system', 'content': "
        f"...}}, ...]), got {_what(prompt)}"
    )


def _differing(clean: list[dict[str, str]], corrupt: list[dict[str, str]]) -> int:
    """The index of the one message where two message lists differ (the span's message)."""
    if [m["role"] for m in clean] != [m["role"] for m in corrupt]:
        raise ProbekitError(
            f"the two message lists have different roles: {[m['role'] for m in clean]} vs "
            f"{[m['role'] for m in corrupt]}"
        )
    differ = [i for i, (x, y) in enumerate(zip(clean, corrupt, strict=True)) if x != y]
    if len(differ) > 1:
        raise ProbekitError(
            f"the two message lists differ in messages {differ}; a pair differs in one place"
        )
    if differ:
        return differ[0]
    raise ProbekitError("the two prompts are equal: a pair needs a difference to patch")


def _locate(
    clean: str, corrupt: str, span: str | tuple[str, str] | None
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The span's character range in each text."""
    bad = ProbekitError(f"span must be a text or a (clean, corrupt) pair of texts: {span!r}")
    if isinstance(span, tuple | list):
        if len(span) != 2 or not all(isinstance(s, str) and s for s in span):
            raise bad
        return _find(clean, span[0], "clean"), _find(corrupt, span[1], "corrupt")
    if span is not None and (not isinstance(span, str) or not span):
        raise bad
    if span is None:
        pre = len(_common_prefix(clean, corrupt))
        post = len(_common_prefix(clean[pre:][::-1], corrupt[pre:][::-1]))
        if pre + post == len(clean) and pre + post == len(corrupt):
            raise ProbekitError("the two texts are equal: a pair needs a difference to patch")
        a = _word_start(clean, pre)
        b = _word_end(clean, len(clean) - post)
        shift = len(corrupt) - len(clean)
        return (a, b), (a, b + shift)
    a, b = _find(clean, span, "clean")
    shift = len(corrupt) - len(clean)
    if clean[:a] != corrupt[:a] or clean[b:] != corrupt[b + shift :] or b + shift <= a:
        raise ProbekitError(
            f"the texts differ outside {span!r}; give span=(clean text, corrupt text)"
        )
    return (a, b), (a, b + shift)


def _find(text: str, part: str, side: str) -> tuple[int, int]:
    at = text.find(part)
    if at < 0:
        raise ProbekitError(f"the span {part!r} is not in the {side} text {text!r}")
    return at, at + len(part)


def _common_prefix(a: str, b: str) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a[:n]


def _word_start(text: str, at: int) -> int:
    while at > 0 and re.match(r"\w", text[at - 1]):
        at -= 1
    return at


def _word_end(text: str, at: int) -> int:
    while at < len(text) and re.match(r"\w", text[at]):
        at += 1
    return at


def _what(value: Any) -> str:
    """A short description of a wrong value for an error line."""
    if isinstance(value, list | tuple) and value:
        return f"a {type(value).__name__} of {type(value[0]).__name__}"
    return f"a {type(value).__name__}" if not isinstance(value, str) else f"the string {value!r}"
