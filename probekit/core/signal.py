"""When the signal of a run is too weak to read: the valid mass (the probability that the model's
answer is in the answer set at all) below which probekit says so, and the prefill that causes it
most often (one ending in whitespace)."""

from __future__ import annotations

import math

WEAK_SIGNAL_VALID_MASS = 0.05
"""A run or call whose mean valid mass is below this says so in one line (and on its report
page): the answer distributions then describe a small, atypical share of the model's output,
usually a prompt that does not ask for the answer set (a letter question read on digits) or a
prefill that breaks the tokenisation."""


def is_weak(mean_valid_mass: float | None) -> bool:
    """Whether a mean valid mass is below `WEAK_SIGNAL_VALID_MASS` (False when unknown)."""
    if mean_valid_mass is None or math.isnan(mean_valid_mass):
        return False
    return mean_valid_mass < WEAK_SIGNAL_VALID_MASS


def weak_signal(mean_valid_mass: float | None) -> str | None:
    """One line saying that the signal is weak, or None when it is not (or unknown)."""
    if not is_weak(mean_valid_mass):
        return None
    return (
        f"weak signal: the mean valid mass is {mean_valid_mass:.4f}, below "
        f"{WEAK_SIGNAL_VALID_MASS:.0%}: most of the probability falls outside the answer set, so "
        "the numbers describe a small share of the model's output (check the question, the "
        "answer set and the prefill)"
    )


def weak_under(what: str, where: list[str], lowest: float, reference: str = "") -> str | None:
    """One line when interventions (steered α's, patched components) drove the valid mass
    below `WEAK_SIGNAL_VALID_MASS`: `what` they are, `where` (their names; none: None),
    `lowest` mean valid mass among them, `reference` (the unintervened mass, as a phrase)."""
    if not where:
        return None
    shown = ", ".join(where[:6]) + (f" and {len(where) - 6} more" if len(where) > 6 else "")
    before = f" ({reference})" if reference else ""
    return (
        f"weak signal under {what} {shown}: the mean valid mass falls to {lowest:.2g}{before}, "
        f"below {WEAK_SIGNAL_VALID_MASS:.0%}, so the numbers there describe almost none of the "
        "model's output (column weak_signal)"
    )


def prefill_trap(prefill: str) -> str | None:
    """One line when `prefill` ends in whitespace, else None: most tokenizers fold a space into
    the next word's token (" B"), so a prefill ending in a space leaves a word answer only its
    rare space-less form (on the default model, a multiple-choice question's valid mass falls
    from 0.88 after "Answer:" to 0.10 after "Answer: ")."""
    if not prefill or not prefill[-1].isspace():
        return None
    return (
        f"the prefill {prefill!r} ends in whitespace: an answer's token usually carries its "
        "leading space, so this often lowers the valid mass and moves the scores; end the "
        "prefill without it unless the model was trained that way"
    )
