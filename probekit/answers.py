"""Finite answer sets: integer ranges (`0-100`), explicit lists (`A,B,C,D`) and files (`@path`).

An answer may have aliases, other surface forms that count as the same answer (`Joy` for `joy`):
`AnswerSet(("joy", "fear"), aliases={"joy": ("Joy",), "fear": ("Fear",)})`, or
`AnswerSet.parse("joy,fear").with_capitalised()`. Every surface form is also matched with one
leading space, and an answer's probability is the sum over all of its forms.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from probekit.errors import ProbekitError

_RANGE = re.compile(r"^\s*(-?\d+)\s*-\s*(-?\d+)\s*$")
_INTEGER = re.compile(r"^-?\d+$")


@dataclass(frozen=True)
class AnswerSet:
    """The answers a response may start with, in report order."""

    answers: tuple[str, ...]
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not self.answers:
            raise ProbekitError(
                "the answer set is empty; give a range like 0-100 or a list A,B,C,D"
            )
        if any(not a or a != a.strip() for a in self.answers):
            raise ProbekitError("answers must be non-empty and carry no leading/trailing spaces")
        seen: set[str] = set()
        for answer in self.answers:
            if answer in seen:
                raise ProbekitError(f"duplicate answer '{answer}' in the answer set")
            seen.add(answer)
        for answer, forms in self.aliases.items():
            if answer not in seen:
                raise ProbekitError(f"alias given for '{answer}', which is not an answer")
            for form in forms:
                if not form or form != form.strip():
                    raise ProbekitError(f"alias {form!r} of '{answer}' is empty or padded")
                if form in seen:
                    raise ProbekitError(f"surface form '{form}' belongs to two answers")
                seen.add(form)

    def surface_forms(self, index: int) -> tuple[str, ...]:
        """Every text that counts as answer `index`: the answer and its aliases, each as written
        and with one leading space."""
        answer = self.answers[index]
        forms = (answer, *self.aliases.get(answer, ()))
        return tuple(text for form in forms for text in (form, " " + form))

    def with_capitalised(self) -> AnswerSet:
        """The same answers, each also accepted with its first letter in upper case."""
        aliases = {a: tuple(self.aliases.get(a, ())) for a in self.answers}
        for a in self.answers:
            if a[:1].upper() != a[:1] and a[:1].upper() + a[1:] not in aliases[a]:
                aliases[a] += (a[:1].upper() + a[1:],)
        return AnswerSet(self.answers, {a: f for a, f in aliases.items() if f})

    @classmethod
    def parse(cls, spec: str) -> AnswerSet:
        """`lo-hi` (integers), `a,b,c` (a list) or `@file` (one answer a line)."""
        if spec.startswith("@"):
            path = Path(spec[1:])
            if not path.is_file():
                raise ProbekitError(f"answer file '{path}' does not exist")
            lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
            return cls(tuple(line for line in lines if line))
        match = _RANGE.match(spec)
        if match:
            lo, hi = int(match.group(1)), int(match.group(2))
            if lo > hi:
                raise ProbekitError(f"answer range '{spec}' has lo > hi; write it as {hi}-{lo}")
            return cls.range(lo, hi)
        items = [item.strip() for item in spec.split(",")]
        if any(not item for item in items):
            raise ProbekitError(f"answer list '{spec}' has an empty item")
        return cls(tuple(items))

    @classmethod
    def range(cls, lo: int, hi: int) -> AnswerSet:
        return cls(tuple(str(v) for v in range(lo, hi + 1)))

    @property
    def numeric(self) -> bool:
        """True when every answer is an integer: then expected value and std are reported."""
        return all(_INTEGER.match(a) for a in self.answers)

    @property
    def values(self) -> np.ndarray:
        """The answers as numbers (numeric sets only)."""
        return np.array([int(a) for a in self.answers], dtype=np.float64)

    def __len__(self) -> int:
        return len(self.answers)
