"""Kinds: the types of options. A `Kind` reads the command line's text (`parse`) and checks a
Python value (`check`: the API's value as given, or what `parse` read), so that both front ends
apply one rule; a refusal is a phrase that reads after the option's name ("must be at least 1
(got 0)"), raised as `argparse.ArgumentTypeError` (or a one-line `ProbekitError`), which
`probekit.core.options` words with the option's name. Calling a kind reads and checks text: the
command line's reader (`positive_int("8")`). This module imports no model library: a
`torch.dtype` or a `torch.device` is named by its text (`probekit.engines.options`)."""

from __future__ import annotations

import argparse
import math
import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from probekit.core.errors import ProbekitError


def refuse(phrase: str) -> NoReturn:
    """Refuse a value with a phrase that reads after the option's name."""
    raise argparse.ArgumentTypeError(phrase)


@dataclass(frozen=True)
class Kind:
    """An option's type. `parse` reads the command line's text; `check` takes a Python value
    (the API's as given, or what `parse` read) and returns it as the option holds it. Both
    refuse with a phrase that reads after the option's name (`refuse`), or a one-line
    `ProbekitError` (a parser of a lower module such as `parse_device_map`)."""

    name: str
    parse: Callable[[str], Any]
    check: Callable[[Any], Any]

    def __call__(self, text: str) -> Any:
        """The command line's reader (argparse's `type`): a refusal is argparse's one line."""
        try:
            return self.check(self.parse(text))
        except ProbekitError as error:
            raise argparse.ArgumentTypeError(str(error)) from None


def _read(kind: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            refuse(f"{text!r} is not {what}")

    return parse


def int_value(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        refuse(f"'{value}' is not an integer")
    return int(value)


def _float_value(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        refuse(f"'{value}' is not a number")
    if not math.isfinite(value := float(value)):
        refuse(f"must be a finite number (got {value:g})")
    return value


def _ranged(integral: bool, low: float, high: float | None = None, above: bool = False) -> Kind:
    """A number in [low, high] (no upper bound when `high` is None; above `low` if `above`)."""
    value, spec = (int_value, "") if integral else (_float_value, "g")

    def check(given: Any) -> Any:
        number = value(given)
        if above and number <= low:
            refuse(f"must be above {low:{spec}} (got {number:{spec}})")
        if number < low or (high is not None and number > high):
            bound = f"between {low:{spec}} and {high:{spec}}" if high is not None else ""
            refuse(f"must be {bound or f'at least {low:{spec}}'} (got {number:{spec}})")
        return number

    what = "an integer" if integral else "a number"
    return Kind(what.split()[1], _read(int if integral else float, what), check)


def int_range(low: int, high: int | None = None) -> Kind:
    """An integer in [low, high] (no upper bound when `high` is None)."""
    return _ranged(True, low, high)


positive_int = int_range(1)
"""An integer >= 1 (batch sizes, counts)."""
non_negative_int = int_range(0)
"""An integer >= 0 (seeds)."""
non_negative_float = _ranged(False, 0.0)
"""A finite number >= 0 (epsilon, temperature)."""
probability = _ranged(False, 0.0, 1.0)
"""A number in [0, 1]."""
positive_float = _ranged(False, 0.0, above=True)
"""A finite number > 0."""


def _is(test: Callable[[Any], Any], what: str, held: Callable[[Any], Any] = lambda v: v) -> Any:
    """A check refusing a value that fails `test` ("must be {what} (got ...)"), else `held`
    of it (the value as the option holds it)."""

    def check(value: Any) -> Any:
        if not test(value):
            refuse(f"must be {what} (got {value!r})")
        return held(value)

    return check


text = Kind("text", str, _is(lambda v: isinstance(v, str), "text"))
"""Any text."""
_as_path = _is(lambda v: isinstance(v, str | os.PathLike) and str(v), "a path", Path)
path = Kind("path", Path, _as_path)
"""A file or folder (a `str` or a `Path` from Python; held as a `Path`)."""
function = Kind("function", str, _is(callable, "a function"))
"""A Python function (an option of the API only: no command line reads one)."""


def choice(kind: str, names: Sequence[str]) -> Kind:
    """One of `names` ("unknown view 'x'; choose one of exact, generate")."""

    def check(value: Any) -> str:
        if value not in names:
            shown = value if isinstance(value, str) else repr(value)
            refuse(f"unknown {kind} '{shown}'; choose one of {', '.join(names)}")
        return value

    return Kind(kind, str, check)


def _parse_count(value: str) -> int | str:
    try:
        return value if value == "all" else int(value)
    except ValueError:
        refuse(f"'{value}' must be a positive number or 'all'")


def _count(value: Any) -> int | None:
    if value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        refuse(f"'{value}' must be a positive number or 'all'")
    if int_value(value) < 1:  # 2.0 is not a count: "'2.0' is not an integer"
        refuse(f"must be at least 1 (got {value}), or 'all'")
    return int(value)


count_or_all = Kind("count", _parse_count, _count)
"""A positive count, or `all` (held as None)."""


def _listed(read: Callable[[str], Any], element: Callable[[Any], Any], what: str) -> Kind:
    """A comma-separated list on the command line (each item read by `read`), a list (or a
    range) from Python (each item checked by `element`): one rule for both, that the list names
    something (an empty one is refused: leave the option out for its default) and nothing
    twice (`--layers 3,3` would read layer 3 twice)."""

    def parse(value: str) -> list[Any]:
        try:
            return [read(x.strip()) for x in value.split(",") if x.strip()]
        except ValueError:
            refuse(f"{value!r} is not a comma-separated list of {what}")

    def check(value: Any) -> list[Any]:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence | range):
            refuse(f"must be a list of {what} (got {value!r})")
        items = [element(x) for x in value]
        if not items:
            refuse(f"must name one or more {what}; leave it out for its default (got [])")
        if twice := [x for i, x in enumerate(items) if x in items[:i]]:
            refuse(f"must name each once (got {items}: {twice[0]} twice)")
        return items

    return Kind(what, parse, check)


int_list = _listed(int, int_value, "integers")
"""Integers (layers, heads): `--layers 0,6,12`; from Python a list or a range."""
float_list = _listed(float, _float_value, "numbers")
"""Finite numbers: `--alphas -4,-2,0,2,4`; from Python a list."""


def _parse_names(value: str) -> list[str]:
    items = [x.strip() for x in value.split(",")]
    if not all(items):
        refuse(f"{value!r} has an empty item")
    return items


def _names(value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        refuse(f"must be a list of names (got {value!r})")
    if not value or not all(isinstance(x, str) and x for x in value):
        refuse(f"must be a non-empty list of names (got {value!r})")
    return list(value)


comma_list = Kind("names", _parse_names, _names)
"""Names: `--sites hook_resid_pre,hook_mlp_out`; from Python a non-empty list."""
