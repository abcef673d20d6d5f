"""Counterfactual pairs and the sets of them a study's effect is read on: building them,
drawing them, and aligning their spans.

A pair is two encoded prompts on the same unit (event, question) that differ in one identity,
(clean, corrupt). A study builds its pairs (`Study.pairs`); `make_pair` builds one from two
strings with the identity given as text.

Sets. Patching reads the effect a study's headline measures (`MechanismDefaults.effect`) on
sets of pairs, each pair with a sign: a set's gap is the signed sum of its pairs' gaps
readout(clean) - readout(corrupt), and a patch's effect on it the signed sum of the pairs'
readout(patched) - readout(corrupt). A `Difference` makes each pair a set of its own (sign +1).
An `Interaction` of identities in the key columns `rows` x `columns` (intergroup: perceiver x
experiencer) makes, for two identities g, h of different groups on one unit, two sets of the
cells (g,g), (g,h), (h,g), (h,h) with R(p, e) the readout of the cell: one swapping the column
identity (each cell is the clean prompt of a pair whose corrupt prompt has the other column
identity: (g,g) -> (g,h), (g,h) -> (g,g), (h,g) -> (h,h), (h,h) -> (h,g)) and one swapping
the row identity ((g,g) -> (h,g), ...). The sign is +1 for a cell whose two identities are
one (in-group), -1 otherwise, so the set's clean value sum_c sign(c) R(c) is the
difference-in-differences DiD = [R(g,g) - R(g,h)] - [R(h,g) - R(h,h)], its corrupt value
(each cell read with the other identity) is -DiD, and the set's gap is 2 DiD. Its recovery
is (DiD_patched - DiD_corrupt) / (DiD_clean - DiD_corrupt): 1 when the patch gives every cell
its clean readout, 0 when it changes nothing.

Which sets: every one by default, or `draw_sets` draws some per unit at random (seeded); never
by the size of their gap.

Spans: any span the items declare (intergroup: `experiencer`, `perceiver`, ...), `from_<span>`
(every token from the span's first to the prompt's last, the answer position included) and
`<span>@<i>` (the i-th of the span's aligned positions; negative from its end).

Alignment. Clean and corrupt spans of equal token counts are patched position by position.
Spans of different counts ("a Buddhist" can be three tokens, "a Jew" two) are patched as a block
(`probekit.mechanism.components`): the patched run is the corrupt run with its span replaced by
the clean span, at a residual-stream site, where every position outside the span can be mapped
(the prompts are equal before the span and after it); at other sites a whole span of unequal
counts has no position-by-position match and is refused in one line. A single position
`<span>@<i>` of such spans is counted from the span's end (the last tokens aligned).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from probekit.core.errors import ProbekitError
from probekit.core.items import CharSpan, EncodedItem, Item, Pair
from probekit.core.public import public
from probekit.mechanism.defaults import Difference, Effect, Interaction

FROM = "from_"  # `from_<span>`: the span's first token to the prompt's end
AT = "@"  # `<span>@<i>`: the i-th of the span's aligned positions (negative: from its end)


@dataclass(frozen=True)
class PairSet:
    """Pairs on one unit whose signed sum of gaps is the study's effect there (see the module):
    `name`, the `contrast` it reads (`difference`, `interaction`), the key column(s) its pairs
    swap (`swapped`), and `draw`, the key `draw_sets` draws by (the two sets of one identity
    pair share it)."""

    name: str
    contrast: str
    pairs: tuple[Pair, ...]
    signs: tuple[int, ...]
    swapped: str
    draw: str

    @property
    def unit(self) -> str:
        return self.pairs[0][0].item.unit


def difference_sets(pairs: Sequence[Pair]) -> list[PairSet]:
    """Each pair a set of its own, sign +1 (a `Difference`)."""
    out = []
    for clean, corrupt in pairs:
        name, key = f"{clean.id} > {corrupt.id}", clean.item.key
        swapped = ",".join(c for c in key if key[c] != corrupt.item.key.get(c)) or "none"
        out.append(PairSet(name, Difference.name, ((clean, corrupt),), (1,), swapped, name))
    return out


def interaction_sets(
    effect: Interaction, probe: Any, encoded: Sequence[EncodedItem]
) -> list[PairSet]:
    """The 2x2 sets of an `Interaction` (see the module), per unit in the prompts' order, for
    every two identities of different groups whose four cells are all among the prompts."""
    same = effect.same(probe)
    cells = {(e.item.unit, e.item.key[effect.rows], e.item.key[effect.columns]): e for e in encoded}
    out = []
    for unit in dict.fromkeys(e.item.unit for e in encoded):
        names = list(dict.fromkeys(r for u, r, c in cells if u == unit and r == c))
        for g, h in combinations(names, 2):
            four = [(p, e) for p in (g, h) for e in (g, h)]
            if same(g, h) or any((unit, *cell) not in cells for cell in four):
                continue
            other, draw = {g: h, h: g}, f"{unit}|{g}|{h}"
            signs = tuple(1 if p == e else -1 for p, e in four)
            for column, swapped in (
                (effect.columns, [(p, other[e]) for p, e in four]),
                (effect.rows, [(other[p], e) for p, e in four]),
            ):
                pairs = tuple(
                    (cells[(unit, *c)], cells[(unit, *k)])
                    for c, k in zip(four, swapped, strict=True)
                )
                name = f"{draw}|{column}"
                out.append(PairSet(name, Interaction.name, pairs, signs, column, draw))
    return out


def effect_sets(
    effect: Effect, probe: Any, encoded: Sequence[EncodedItem], pairs: Sequence[Pair]
) -> list[PairSet]:
    """The sets a study's `effect` is read on: its `pairs` one by one (`Difference`) or the
    2x2 sets of its prompts (`Interaction`); one line when there are none."""
    if isinstance(effect, Interaction):
        found = interaction_sets(effect, probe, encoded)
    else:
        found = difference_sets(pairs)
    if not found:
        raise ProbekitError(
            f"no {effect.name} sets among these prompts: patching needs two identities of "
            "different groups on one unit"
        )
    return found


def draw_sets(sets: Sequence[PairSet], per_unit: int | None, seed: int) -> list[PairSet]:
    """Every set (`per_unit` None), or `per_unit` draws (`PairSet.draw`) per unit chosen at
    random with `seed`, in their order: never by the size of their gap."""
    if per_unit is None:
        return list(sets)
    rng = np.random.default_rng(seed)
    kept: set[str] = set()
    for unit in dict.fromkeys(s.unit for s in sets):
        keys = list(dict.fromkeys(s.draw for s in sets if s.unit == unit))
        chosen = rng.choice(len(keys), size=min(per_unit, len(keys)), replace=False)
        kept.update(keys[i] for i in chosen)
    return [s for s in sets if s.draw in kept]


def as_sets(pairs: Any, encode: Callable[[Item], EncodedItem] | None = None) -> list[PairSet]:
    """Pair sets as they are, or pairs (checked, `check_pairs`) each a set of its own; with
    `encode`, pairs of `Item`s are encoded by it and one pair alone is a list of one."""
    if isinstance(pairs, Sequence) and pairs and all(isinstance(s, PairSet) for s in pairs):
        return list(pairs)
    if encode is not None and isinstance(pairs, Sequence) and not isinstance(pairs, str):
        lone = len(pairs) == 2 and all(isinstance(p, EncodedItem | Item) for p in pairs)
        pairs = [
            tuple(encode(p) if isinstance(p, Item) else p for p in pair)
            if isinstance(pair, tuple | list)
            else pair
            for pair in ([pairs] if isinstance(pairs, tuple) and lone else pairs)
        ]
    return difference_sets(check_pairs(pairs))


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
    """Right-to-left alignment: the last min(len) positions of each, last to last (the single
    positions `<span>@<i>` of spans of different token counts)."""
    k = min(len(clean), len(corrupt))
    return list(clean[len(clean) - k :]), list(corrupt[len(corrupt) - k :])


def aligned_positions(pair: Pair, span: str) -> tuple[list[int], list[int]]:
    """The clean and corrupt positions a patch of `span` copies between: the whole span of each
    (of different lengths where their token counts differ: a block, see the module), or one
    position of each with `@i` (counted from the end of spans of different counts; an index
    beyond them is refused)."""
    clean, corrupt = pair
    clean_pos, corrupt_pos = span_positions(clean, span), span_positions(corrupt, span)
    index = split_position(span)[1]
    if index is None:
        return clean_pos, corrupt_pos
    clean_pos, corrupt_pos = align(clean_pos, corrupt_pos)
    if not -len(clean_pos) <= index < len(clean_pos):
        raise ProbekitError(
            f"{span}: the span has {len(clean_pos)} aligned positions in pair "
            f"{clean.id} / {corrupt.id}, so {AT}{index} is out of range"
        )
    return [clean_pos[index]], [corrupt_pos[index]]


def single_positions(spans: Iterable[str], pairs: Sequence[Pair]) -> list[str]:
    """Each span as its single positions `span@-k` ... `span@-1`, k the fewest positions of the
    span in any prompt: the same index is the same place relative to the span's end in every
    pair."""
    out = []
    for span in spans:
        if split_position(span)[1] is not None:
            out.append(span)
            continue
        k = min(min(map(len, aligned_positions(pair, span))) for pair in pairs)
        out += [f"{span}{AT}{i}" for i in range(-k, 0)]
    return out


def check_pairs(pairs: Any) -> list[Pair]:
    """The pairs as a list of (clean, corrupt) encoded prompts; one line for anything else (an
    empty list, a list of prompts, a pair whose prompts are about different units)."""
    if isinstance(pairs, str | bytes) or not isinstance(pairs, Sequence) or not pairs:
        raise ProbekitError(
            f"pairs must be a non-empty list of (clean, corrupt) pairs, got {_what(pairs)}"
        )
    out = []
    for i, pair in enumerate(pairs):
        encoded = isinstance(pair, tuple | list) and len(pair) == 2
        if not (encoded and all(isinstance(p, EncodedItem) for p in pair)):
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
        out.append((clean, corrupt))
    return out


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
    sides = [_messages(prompt, chat) for prompt in (clean, corrupt)]
    if (sides[0] is None) != (sides[1] is None):
        raise ProbekitError("make_pair takes two texts or two message lists, not one of each")
    texts = sides[0] is None
    if texts:  # a text is one user message (sent through the chat template unless not `chat`)
        sides, at = [[{"role": "user", "content": p}] for p in (clean, corrupt)], 0
    else:
        at = _differing(*sides)
    first, second = sides[0][at]["content"], sides[1][at]["content"]
    (a, b), (c, d) = _locate(first, second, span)
    unit = f"{first[:a]}{{{name}}}{first[b:]}"
    unit = " | ".join(unit if i == at else m["content"] for i, m in enumerate(sides[0]))
    items = []
    for messages, text, start, end in ((sides[0], first, a, b), (sides[1], second, c, d)):
        key = {name: text[start:end]}
        if texts and not chat:
            where = {name: (CharSpan(None, start, end),)}
            items.append(Item(text, key, unit, text=text, spans=where))
        else:
            ident = " | ".join(m["content"] for m in messages)
            where = {name: (CharSpan(at, start, end),)}
            items.append(Item(ident, key, unit, messages=tuple(messages), spans=where))
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
    before = [k for k in range(max(p[0], q[0])) if k >= min(p[0], q[0]) or a[k] != b[k]]
    tail_a, tail_b = len(a) - 1 - p[-1], len(b) - 1 - q[-1]
    after = [
        k for k in range(1, max(tail_a, tail_b) + 1) if k > min(tail_a, tail_b) or a[-k] != b[-k]
    ]
    if before:
        i, j, side = before[0], before[0], "before"
    elif after:
        i, j, side = len(a) - after[0], len(b) - after[0], "after"
    else:
        return

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
    if isinstance(prompt, str) and prompt:
        return None
    fields = ("role", "content")
    listed = isinstance(prompt, Sequence) and not isinstance(prompt, str) and prompt
    if not listed or not all(
        isinstance(m, dict) and all(isinstance(m.get(f), str) for f in fields) for m in prompt
    ):
        raise ProbekitError(
            "make_pair takes two non-empty texts or two chat-message lists ([{'role': 'system', "
            f"'content': ...}}, ...]), got {_what(prompt)}"
        )
    if not chat:
        raise ProbekitError("message lists go through the chat template: leave chat=True")
    return [{f: m[f] for f in fields} for m in prompt]


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
    if not differ:
        raise ProbekitError("the two prompts are equal: a pair needs a difference to patch")
    return differ[0]


def _locate(
    clean: str, corrupt: str, span: str | tuple[str, str] | None
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The span's character range in each text."""
    bad = ProbekitError(f"span must be a text or a (clean, corrupt) pair of texts: {span!r}")
    if isinstance(span, tuple | list):
        if len(span) != 2 or not all(isinstance(s, str) and s for s in span):
            raise bad
        return _find(clean, span[0], "clean"), _find(corrupt, span[1], "corrupt")
    shift = len(corrupt) - len(clean)
    if span is None:  # where the texts differ, widened to whole words
        pre = len(os.path.commonprefix([clean, corrupt]))
        post = len(os.path.commonprefix([clean[pre:][::-1], corrupt[pre:][::-1]]))
        if pre + post == len(clean) and pre + post == len(corrupt):
            raise ProbekitError("the two texts are equal: a pair needs a difference to patch")
        a = pre - len(re.search(r"\w*$", clean[:pre])[0])
        b = len(clean) - post + len(re.match(r"\w*", clean[len(clean) - post :])[0])
        return (a, b), (a, b + shift)
    if not isinstance(span, str) or not span:
        raise bad
    a, b = _find(clean, span, "clean")
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


def _what(value: Any) -> str:
    """A short description of a wrong value for an error line."""
    if isinstance(value, list | tuple) and value:
        return f"a {type(value).__name__} of {type(value[0]).__name__}"
    return f"a {type(value).__name__}" if not isinstance(value, str) else f"the string {value!r}"
