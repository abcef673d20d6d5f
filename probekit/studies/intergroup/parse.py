"""The paper-faithful baseline's answer extraction: the authors' rules for a generated response,
and when a partial response can no longer change its parsed answer (the decoding stop rule)."""

from __future__ import annotations

import re

REFUSAL_PREFIXES = ("I cannot", "I can't", "I'm not rating")
_INTEGER = re.compile(r"\b\d+\b")


def parse_intensity(response: str, lo: int = 0, hi: int = 100) -> int:
    """Hou et al.'s rule: refusal prefixes give -1; else the first integer, or the second when the
    first lies outside [lo, hi]; a result outside [lo, hi] is -1."""
    if response.strip().startswith(REFUSAL_PREFIXES):
        return -1
    numbers = [int(n) for n in _INTEGER.findall(response)]
    if not numbers:
        return -1
    value = numbers[0]
    if len(numbers) > 1 and not lo <= value <= hi:
        value = numbers[1]
    return value if lo <= value <= hi else -1


_COMPLETE_INTEGER = re.compile(r"\b\d+\b(?=[^\w\ufffd])")  # an integer no later text can extend


def intensity_settled(response: str, lo: int = 0, hi: int = 100) -> bool:
    """True once no continuation of `response` can change `parse_intensity(response)`.

    A refusal prefix fixes -1. Otherwise, once the text can no longer become a refusal, an
    integer followed by a non-word character is final (nothing after it can extend it or undo
    its word boundaries): one final integer on [lo, hi], or two final integers, fix the result.
    """
    text = response.strip()
    if text.startswith(REFUSAL_PREFIXES):
        return True
    if any(prefix.startswith(text) for prefix in REFUSAL_PREFIXES):
        return False  # still on the way to a refusal (or nothing written yet)
    numbers = [int(n) for n in _COMPLETE_INTEGER.findall(response)]
    return len(numbers) >= 2 or (len(numbers) == 1 and lo <= numbers[0] <= hi)
