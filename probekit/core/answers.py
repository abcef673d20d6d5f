"""Finite answer sets: integer ranges (`0-100`), letter ranges (`A-E`), explicit lists
(`A,B,C,D`) and files (`@path`, one answer a line), of 2 to `MAX_ANSWERS` (1,000) answers.

A spec that yields one answer is refused rather than read as that one answer (`Yes-No` is not a
range, and a one-answer set has probability 1 whatever the model says); so is a larger set,
which the exact scorer would spend minutes building a trie for.

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
MAX_ANSWERS = 1000
"""The most answers a set may hold."""
_INTEGER = re.compile(r"^-?\d+$")


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


def _is_integer(answer: str) -> bool:
    return bool(_INTEGER.match(answer))


def _starts_with_digit(text: str) -> bool:
    return text[:1].isdigit()


def _starts_with_letter_or_digit(text: str) -> bool:
    return text[:1].isdigit() or text[:1].isalpha()


def _any(answer: str) -> bool:
    return True


INTEGER = AnswerKind("integer", _is_integer, _starts_with_digit, float)
"""Whole numbers (`0-100`): a number ends where no digit follows."""
WORD = AnswerKind("word", _any, _starts_with_letter_or_digit)
"""Words and letters (`A-E`, `joy,fear`): an answer ends where no letter or digit follows."""
ANSWER_KINDS = (INTEGER, WORD)
"""Every kind, in the order a set's kind is chosen: the first that accepts all its answers."""


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
        if len(self.answers) > MAX_ANSWERS:
            raise ProbekitError(
                f"the answer set has {len(self.answers)} answers; at most {MAX_ANSWERS} are allowed"
            )
        if any(not a or a != a.strip() for a in self.answers):
            raise ProbekitError("answers must be non-empty and carry no leading/trailing spaces")
        for index, answer in enumerate(self.answers):
            refuse_lone_surrogate(answer, f"answer {index} ({answer!r})")
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
    @public()
    def parse(cls, spec: str) -> AnswerSet:
        """`lo-hi` (integers), `A-E` (letters of one case), `a,b,c` (a list) or `@file` (one
        answer a line, UTF-8); one line refusing a spec that yields a single answer or more
        than `MAX_ANSWERS`."""
        if spec.startswith("@"):
            answers = cls(tuple(_read_answer_file(Path(spec[1:]))))
        elif match := _RANGE.match(spec):
            lo, hi = int(match.group(1)), int(match.group(2))
            if lo > hi:
                raise ProbekitError(f"answer range '{spec}' has lo > hi; write it as {hi}-{lo}")
            if hi - lo + 1 > MAX_ANSWERS:
                raise ProbekitError(
                    f"answer range '{spec}' has {hi - lo + 1} answers; at most {MAX_ANSWERS} are "
                    "allowed"
                )
            answers = cls.range(lo, hi)
        elif match := _LETTERS.match(spec):
            lo, hi = match.group(1), match.group(2)
            if lo.isupper() != hi.isupper():
                raise ProbekitError(f"letter range '{spec}' mixes cases; write A-E or a-e")
            if lo > hi:
                raise ProbekitError(f"letter range '{spec}' has lo > hi; write it as {hi}-{lo}")
            answers = cls(tuple(chr(c) for c in range(ord(lo), ord(hi) + 1)))
        else:
            items = [item.strip() for item in spec.split(",")]
            if any(not item for item in items):
                raise ProbekitError(f"answer list '{spec}' has an empty item")
            ranged = [item for item in items if _RANGE.match(item) or _LETTERS.match(item)]
            if len(items) > 1 and ranged:
                raise ProbekitError(
                    f"answer list '{spec}' holds '{ranged[0]}', which reads as a range: a spec is "
                    "one range or a list; write every answer of the list out"
                )
            answers = cls(tuple(items))
        said = f"answer spec '{spec}' gives one answer ({answers.answers[0]!r})"
        return _several(answers, said, "give a range (0-100, A-E), a list (A,B,C) or @file")

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


def as_answer_set(answers: object) -> AnswerSet:
    """The answer set `answers` names: an `AnswerSet`, a spec (`AnswerSet.parse`: `0-100`,
    `A-E`, `A,B,C`, `@file`), or a list or tuple of strings or numbers (each answer as
    written), checked like a spec (two or more distinct answers); one
    line for anything else."""
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
    return _several(
        AnswerSet(tuple(texts)), f"the answer list {texts!r} has one answer", "give two or more"
    )


def _several(answers: AnswerSet, said: str, hint: str) -> AnswerSet:
    """`answers`, or one line (`said`, then `hint`) when it is a single answer: its probability
    is always 1, so it measures nothing."""
    if len(answers) == 1:
        raise ProbekitError(f"{said}, whose probability is always 1; {hint}")
    return answers


def _answer_text(value: object, index: int) -> str:
    """One answer of a Python list as text: a string, or a finite number (`3`, `3.0` -> "3",
    `0.5` -> "0.5")."""
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        if math.isfinite(number):
            return str(int(number)) if number.is_integer() else repr(number)
    raise ProbekitError(
        f"answer {index} is {value!r}: answers in a list must be strings or finite numbers"
    )


def _read_answer_file(path: Path) -> list[str]:
    """The non-empty lines of an answer file, stripped; one line naming the file and line for
    a missing file or bytes that are not UTF-8."""
    if not path.is_file():
        raise ProbekitError(f"answer file '{path}' does not exist")
    answers = [line.strip() for line in read_text(path).splitlines() if line.strip()]
    if len(answers) > MAX_ANSWERS:
        raise ProbekitError(
            f"answer file '{path}' has {len(answers)} answers; at most {MAX_ANSWERS} are allowed"
        )
    return answers
