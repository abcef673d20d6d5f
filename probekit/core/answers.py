"""Finite answer sets: integer ranges (`0-100`, `00-09` zero-padded as written), letter ranges
(`A-E`), explicit lists (`A,B,C,D`) and files (`@path`, one answer a line), of 2 to
`MAX_ANSWERS` (1,000) answers.

A set of one answer is refused however it is given (a spec, a list or an `AnswerSet`): `Yes-No`
is not a range, and a one-answer set has probability 1 whatever the model says; so is a larger
set, which the exact scorer would spend minutes building a trie for.

An answer may have aliases, other surface forms that count as the same answer (`Joy` for `joy`):
`AnswerSet(("joy", "fear"), aliases={"joy": ("Joy",), "fear": ("Fear",)})`, or
`AnswerSet.parse("joy,fear").with_capitalised()`. Every surface form is also matched with one
leading space, and an answer's probability is the sum over all of its forms.

Every set has a kind (`AnswerKind`): which answers it accepts, its stop rule (which next token
would continue an answer, so that the answer has not ended) and, for numbers, each answer's value.
A new kind (decimals, another stop rule) is one more `AnswerKind` in `ANSWER_KINDS`.

`as_answer_set` is the one entry for every front end: an `AnswerSet`, a spec string, or a Python
list of strings or integers (`["yes", "no"]`, `[1, 2, 3]`), each checked like a spec.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from probekit.core.errors import ProbekitError
from probekit.core.public import public
from probekit.core.text import read_text, refuse_lone_surrogate

_RANGE = re.compile(r"^\s*(-?\d+)\s*-\s*(-?\d+)\s*$")
_LETTERS = re.compile(r"^\s*([A-Za-z])\s*-\s*([A-Za-z])\s*$")
_INTEGER = re.compile(r"^-?\d+$")
MAX_ANSWERS = 1000
"""The most answers a set may hold."""


@public()
@dataclass(frozen=True)
class AnswerKind:
    """A kind of answer: `accepts(answer)` says whether an answer is of this kind, `extends(text)`
    whether a next token whose text is `text` would continue such an answer (then the answer has
    not ended there: its stop rule), and `value(answer)` its number, for kinds that have one
    (expected value and standard deviation are reported for those)."""

    name: str
    accepts: Callable[[str], bool]
    extends: Callable[[str], bool]
    value: Callable[[str], float] | None = None

    @property
    def numeric(self) -> bool:
        return self.value is not None


INTEGER = AnswerKind("integer", lambda a: bool(_INTEGER.match(a)), lambda t: t[:1].isdigit(), float)
"""Whole numbers (`0-100`): a number ends where no digit follows."""
WORD = AnswerKind("word", lambda a: True, lambda t: t[:1].isdigit() or t[:1].isalpha())
"""Words and letters (`A-E`, `joy,fear`): an answer ends where no letter or digit follows."""
ANSWER_KINDS = (INTEGER, WORD)
"""Every kind, in the order a set's kind is chosen: the first that accepts all its answers."""


def _one_answer(said: str, hint: str = "give two or more") -> ProbekitError:
    """One line for a set of one answer: its probability is always 1, so it measures nothing."""
    return ProbekitError(f"{said}, whose probability is always 1; {hint}")


@public()
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
        if len(self.answers) == 1:
            raise _one_answer(f"the answer set {self.answers!r} has one answer")
        if len(self.answers) > MAX_ANSWERS:
            raise ProbekitError(
                f"the answer set has {len(self.answers)} answers; at most {MAX_ANSWERS} are allowed"
            )
        if any(not a or a != a.strip() for a in self.answers):
            raise ProbekitError("answers must be non-empty and carry no leading/trailing spaces")
        seen: set[str] = set()
        for index, answer in enumerate(self.answers):
            refuse_lone_surrogate(answer, f"answer {index} ({answer!r})")
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
    @public()
    def parse(cls, spec: str) -> AnswerSet:
        """`lo-hi` (integers, zero-padded when a bound is written so: `00-09`), `A-E` (letters
        of one case), `a,b,c` (a list) or `@file` (one answer a line, UTF-8); one line refusing
        a spec that yields a single answer or more than `MAX_ANSWERS`."""
        if spec.startswith("@"):
            found = _read_answer_file(Path(spec[1:]))
        elif match := _RANGE.match(spec):
            found = _integer_range(spec, *match.groups())
        elif match := _LETTERS.match(spec):
            lo, hi = match.groups()
            if lo.isupper() != hi.isupper():
                raise ProbekitError(f"letter range '{spec}' mixes cases; write A-E or a-e")
            if lo > hi:
                raise ProbekitError(f"letter range '{spec}' has lo > hi; write it as {hi}-{lo}")
            found = [chr(c) for c in range(ord(lo), ord(hi) + 1)]
        else:
            found = [item.strip() for item in spec.split(",")]
            if not all(found):
                raise ProbekitError(f"answer list '{spec}' has an empty item")
            ranged = [item for item in found if _RANGE.match(item) or _LETTERS.match(item)]
            if len(found) > 1 and ranged:
                raise ProbekitError(
                    f"answer list '{spec}' holds '{ranged[0]}', which reads as a range: a spec is "
                    "one range or a list; write every answer of the list out"
                )
        if len(found) == 1:
            said = f"answer spec '{spec}' gives one answer ({found[0]!r})"
            raise _one_answer(said, "give a range (0-100, A-E), a list (A,B,C) or @file")
        return cls(tuple(found))

    @classmethod
    def range(cls, lo: int, hi: int) -> AnswerSet:
        return cls(tuple(str(v) for v in range(lo, hi + 1)))

    @property
    def kind(self) -> AnswerKind:
        """The first of `ANSWER_KINDS` that accepts every answer of the set."""
        return next(k for k in ANSWER_KINDS if all(k.accepts(a) for a in self.answers))

    @property
    def numeric(self) -> bool:
        """True when the answers have values (integers): then expected value and std are
        reported."""
        return self.kind.numeric

    @property
    def values(self) -> np.ndarray:
        """The answers as numbers (numeric sets only)."""
        value = self.kind.value
        if value is None:
            raise ProbekitError(f"the answers of a {self.kind.name} set have no values")
        return np.array([value(a) for a in self.answers], dtype=np.float64)

    def __len__(self) -> int:
        return len(self.answers)


def _integer_range(spec: str, low: str, high: str) -> list[str]:
    """The answers of `lo-hi`, each as wide as the wider bound where a bound is written with a
    leading zero (`00-09`: `00` ... `09`), else as Python writes the number."""
    lo, hi = int(low), int(high)
    if lo > hi:
        raise ProbekitError(f"answer range '{spec}' has lo > hi; write it as {hi}-{lo}")
    if hi - lo + 1 > MAX_ANSWERS:
        raise ProbekitError(
            f"answer range '{spec}' has {hi - lo + 1} answers; at most {MAX_ANSWERS} are allowed"
        )
    digits = [b.lstrip("-") for b in (low, high)]
    width = max(map(len, digits)) if any(len(d) > 1 and d[0] == "0" for d in digits) else 0
    return [f"{'-' * (v < 0)}{abs(v):0{width}d}" for v in range(lo, hi + 1)]


def as_answer_set(answers: object) -> AnswerSet:
    """The answer set `answers` names: an `AnswerSet`, a spec (`AnswerSet.parse`: `0-100`,
    `A-E`, `A,B,C`, `@file`), or a list or tuple of strings or numbers (each answer as
    written), checked like a spec (two or more distinct answers); one line for anything
    else."""
    if isinstance(answers, AnswerSet):
        return answers
    if isinstance(answers, str):
        return AnswerSet.parse(answers)
    if not isinstance(answers, Sequence) or isinstance(answers, bytes):
        raise ProbekitError(
            "answers must be an AnswerSet, a spec such as 0-100, A-E or A,B,C, or a list of "
            f"strings or numbers; got {type(answers).__name__}"
        )
    texts = [_answer_text(value, index) for index, value in enumerate(answers)]
    if len(texts) == 1:
        raise _one_answer(f"the answer list {texts!r} has one answer")
    return AnswerSet(tuple(texts))


def _answer_text(value: object, index: int) -> str:
    """One answer of a Python list as text: a string, or a finite number (`3`, `3.0` -> "3",
    `0.5` -> "0.5")."""
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, numbers.Real) and math.isfinite(number := float(value)):
        return str(int(number)) if number.is_integer() else repr(number)
    raise ProbekitError(
        f"answer {index} is {value!r}: answers in a list must be strings or finite numbers"
    )


def _read_answer_file(path: Path) -> list[str]:
    """The non-empty lines of an answer file, stripped; one line naming the file and line for
    a missing file, a folder or bytes that are not UTF-8."""
    if not path.is_file():
        why = "is a folder, not a file of one answer a line" if path.is_dir() else "does not exist"
        raise ProbekitError(f"answer file '{path}' {why}")
    answers = [line.strip() for line in read_text(path).splitlines() if line.strip()]
    if len(answers) > MAX_ANSWERS:
        raise ProbekitError(
            f"answer file '{path}' has {len(answers)} answers; at most {MAX_ANSWERS} are allowed"
        )
    return answers
