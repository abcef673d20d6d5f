"""Per-prompt readouts: one number read from one prompt's exact answer distribution.

A readout is what TransformerLens calls the patching metric: the mechanism (patching,
attribution, mediation, directions) takes one as a parameter, so that it explains the study's own
behaviour: the expected value of a numeric answer, the probability of one answer, the
probability of the item's correct answer, or a difference of two such. Specs (the `--readout`
option of `probekit patch`): `expected`, `p:<answer>`, `p_correct`, and `X - Y` for a
difference (`p:joy - p:fear`). The studies'
aggregate metrics over many prompts (`studies/*/metrics.py`) are another thing.

One readout compares a pair's two distributions instead: `tv`, the overlap 1 - TV(P, P_clean)
with the pair's clean distribution. It is 1 on the clean prompt, so the pair's gap is the total
variation distance between the clean and corrupt distributions, and a patch's recovery is
1 - TV(P_patched, P_clean) / TV(P_corrupt, P_clean). Such a `paired` readout needs the clean
result (`readout(result, item, clean)`), so it serves exact patching only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import Item
from probekit.core.options import given
from probekit.core.public import public
from probekit.engines.base import ScoreResult

PAIRED = "tv"
"""The spec of the readout that reads a pair's two distributions (`clean_overlap`)."""


@public()
@dataclass(frozen=True)
class Readout:
    """A number from a prompt's exact distribution (NaN when the answer set has no mass).

    `spec` is what `parse_readout` reads (and the `readout` column of the tables); `column`
    names table columns (`expected` -> expected_clean, expected_corrupt, expected_patched). A
    `paired` readout also reads the pair's clean result: `read(result, item, clean)`."""

    spec: str
    column: str
    read: Callable[..., float]
    paired: bool = False

    def __call__(self, result: ScoreResult, item: Item, clean: ScoreResult | None = None) -> float:
        if not self.paired:
            return self.read(result, item)
        if clean is None:
            raise ProbekitError(
                f"the readout {self.spec} compares a pair's two distributions and has no value "
                f"for a prompt alone; use it with exact patching ({given('method', 'exact')})"
            )
        return self.read(result, item, clean)


def expected_value(answers: AnswerSet) -> Readout:
    """The expected value of a numeric answer (e.g. the 0–100 intensity)."""
    if not answers.numeric:
        raise ProbekitError(
            "the readout 'expected' (expected value) needs numeric answers, and this study's "
            f"answers are {', '.join(answers.answers[:5])}, ...; use p:<answer> or p_correct"
        )
    return Readout(
        "expected", "expected", lambda r, _: math.nan if r.expected is None else float(r.expected)
    )


def answer_probability(answers: AnswerSet, answer: str) -> Readout:
    """P(answer), normalised over the answer set."""
    if answer not in answers.answers:
        raise ProbekitError(
            f"readout p:{answer}: '{answer}' is not an answer of this study "
            f"({', '.join(answers.answers[:12])})"
        )
    index = answers.answers.index(answer)
    return Readout(f"p:{answer}", "p", lambda r, _: _normalised(r, index))


def correct_probability(answers: AnswerSet, key: str = "correct") -> Readout:
    """P(the item's correct answer), read from the item's key column `key`."""

    def read(result: ScoreResult, item: Item) -> float:
        correct = str(item.key.get(key))
        if correct not in answers.answers:
            raise ProbekitError(
                f"readout p_correct: item {item.id!r} has no correct answer among the answers "
                f"(its '{key}' is {item.key.get(key)!r})"
            )
        return _normalised(result, answers.answers.index(correct))

    return Readout("p_correct", "p_correct", read)


def clean_overlap(answers: AnswerSet | None = None) -> Readout:
    """1 - TV(P, P_clean): the overlap of a prompt's normalised distribution with its pair's
    clean one (1 on the clean prompt; the pair's gap is the total variation distance). It reads
    no answer by name: `answers`, which every readout is made for, is not needed."""

    def read(result: ScoreResult, _: Item, clean: ScoreResult) -> float:
        if result.valid_mass <= 0 or clean.valid_mass <= 0:
            return math.nan
        return 1.0 - 0.5 * float(np.abs(np.asarray(result.probs) - np.asarray(clean.probs)).sum())

    return Readout(PAIRED, "overlap", read, paired=True)


def difference(first: Readout, second: Readout) -> Readout:
    """`first - second`, e.g. P(joy) - P(fear)."""
    if first.paired or second.paired:
        raise ProbekitError("tv compares a pair's distributions and takes no part in a difference")
    return Readout(f"{first.spec} - {second.spec}", "diff", lambda r, i: first(r, i) - second(r, i))


@public()
def parse_readout(spec: str, answers: AnswerSet) -> Readout:
    """The readout a spec names (`expected`, `p:<answer>`, `p_correct`, `tv`, `X - Y`) for
    these answers."""
    if " - " in spec:
        first, second = spec.split(" - ", 1)
        return difference(parse_readout(first, answers), parse_readout(second, answers))
    text = spec.strip()
    named = {"expected": expected_value, "p_correct": correct_probability, PAIRED: clean_overlap}
    if text in named:
        return named[text](answers)
    if text.startswith("p:") and len(text) > 2:
        return answer_probability(answers, text[2:])
    raise ProbekitError(
        f"unknown readout {text!r}; use expected, p:<answer>, p_correct, tv, or a difference "
        "'X - Y'"
    )


def _normalised(result: ScoreResult, index: int) -> float:
    return float(result.probs[index]) if result.valid_mass > 0 else math.nan
