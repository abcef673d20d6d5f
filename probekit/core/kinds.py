"""Kinds: the types of options. A `Kind` reads the command line's text (`parse`) and checks a
Python value (`check`: the API's value as given, or what `parse` read), so that both front ends
apply one rule; a refusal is a phrase that reads after the option's name ("must be at least 1
(got 0)"), raised as `argparse.ArgumentTypeError`, which `probekit.core.options` words with the
option's name. Calling a kind reads and checks text: the command line's reader
(`positive_int("8")`). This module imports no model library: a `torch.dtype` or a
`torch.device` is named by its text."""

from __future__ import annotations

import argparse
import math
import numbers
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from probekit.core.errors import ProbekitError

DTYPES = ("float32", "bfloat16", "float16", "float64")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
DEVICE = re.compile(r"cpu|mps|cuda(:\d+)?")


def _refuse(phrase: str) -> NoReturn:
    raise argparse.ArgumentTypeError(phrase)


@dataclass(frozen=True)
class Kind:
    """An option's type. `parse` reads the command line's text; `check` takes a Python value
    (the API's as given, or what `parse` read) and returns it as the option holds it. Both raise
    `argparse.ArgumentTypeError` with a phrase that reads after the option's name."""

    name: str
    parse: Callable[[str], Any]
    check: Callable[[Any], Any]

    def __call__(self, text: str) -> Any:
        return self.check(self.parse(text))


def _read(kind: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            _refuse(f"{text!r} is not {what}")

    return parse


def _int_value(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _refuse(f"'{value}' is not an integer")
    return int(value)


def _float_value(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _refuse(f"'{value}' is not a number")
    if not math.isfinite(value := float(value)):
        _refuse(f"must be a finite number (got {value:g})")
    return value


def _ranged(integral: bool, low: float, high: float | None = None, above: bool = False) -> Kind:
    """A number in [low, high] (no upper bound when `high` is None; above `low` if `above`)."""
    value, spec = (_int_value, "") if integral else (_float_value, "g")

    def check(given: Any) -> Any:
        number = value(given)
        if above and number <= low:
            _refuse(f"must be above {low:{spec}} (got {number:{spec}})")
        if number < low or (high is not None and number > high):
            bound = (
                f"at least {low:{spec}}"
                if high is None
                else f"between {low:{spec}} and {high:{spec}}"
            )
            _refuse(f"must be {bound} (got {number:{spec}})")
        return number

    if integral:
        return Kind("integer", _read(int, "an integer"), check)
    return Kind("number", _read(float, "a number"), check)


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


def _text_value(value: Any) -> str:
    if not isinstance(value, str):
        _refuse(f"must be text (got {value!r})")
    return value


text = Kind("text", str, _text_value)
"""Any text."""


def _path_value(value: Any) -> Path:
    if not isinstance(value, str | os.PathLike) or not str(value):
        _refuse(f"must be a path (got {value!r})")
    return Path(value)


path = Kind("path", Path, _path_value)
"""A file or folder (a `str` or a `Path` from Python; held as a `Path`)."""


def choice(kind: str, names: Sequence[str]) -> Kind:
    """One of `names` ("unknown view 'x'; choose one of exact, generate")."""

    def check(value: Any) -> str:
        if value not in names:
            shown = value if isinstance(value, str) else repr(value)
            _refuse(f"unknown {kind} '{shown}'; choose one of {', '.join(names)}")
        return value

    return Kind(kind, str, check)


def _count_value(value: Any) -> int | None:
    if value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _refuse(f"'{value}' must be a positive number or 'all'")
    if value < 1:
        _refuse(f"must be at least 1 (got {value}), or 'all'")
    return int(value)


def _parse_count(value: str) -> int | str:
    if value == "all" or re.fullmatch(r"-?\d+", value):
        return value if value == "all" else int(value)
    _refuse(f"'{value}' must be a positive number or 'all'")


count_or_all = Kind("count", _parse_count, _count_value)
"""A positive count, or `all` (held as None)."""


def _shard_value(value: Any) -> tuple[int, int]:
    if isinstance(value, str):
        try:
            value = [int(x) for x in value.split("/")]
        except ValueError:
            _refuse(f"'{value}' must look like i/n, e.g. 0/4")
    if not isinstance(value, Sequence) or len(value) != 2:
        _refuse(f"{value!r} must look like i/n, e.g. 0/4 (or a pair (i, n))")
    index, count = (_int_value(x) for x in value)
    if count < 1 or not 0 <= index < count:
        _refuse(f"'{index}/{count}': need 0 <= i < n")
    return index, count


shard = Kind("shard", str, _shard_value)
"""`i/n` (or a pair from Python): every n-th prompt from the i-th (0 <= i < n)."""


def _listed(read: Callable[[str], Any], element: Callable[[Any], Any], what: str) -> Kind:
    """A comma-separated list on the command line (each item read by `read`), a list (or a
    range) from Python (each item checked by `element`)."""

    def parse(value: str) -> list[Any]:
        try:
            return [read(x.strip()) for x in value.split(",") if x.strip()]
        except ValueError:
            _refuse(f"{value!r} is not a comma-separated list of {what}")

    def check(value: Any) -> list[Any]:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence | range):
            _refuse(f"must be a list of {what} (got {value!r})")
        return [element(x) for x in value]

    return Kind(what, parse, check)


int_list = _listed(int, _int_value, "integers")
"""Integers: `--layers 0,6,12`; from Python a list or a range."""
float_list = _listed(float, _float_value, "numbers")
"""Finite numbers: `--alphas -4,-2,0,2,4`; from Python a list."""


def _parse_names(value: str) -> list[str]:
    items = [x.strip() for x in value.split(",")]
    if not all(items):
        _refuse(f"{value!r} has an empty item")
    return items


def _names(value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        _refuse(f"must be a list of names (got {value!r})")
    if not value or not all(isinstance(x, str) and x for x in value):
        _refuse(f"must be a non-empty list of names (got {value!r})")
    return list(value)


comma_list = Kind("names", _parse_names, _names)
"""Names: `--sites hook_resid_pre,hook_mlp_out`; from Python a non-empty list."""


def _dtype_value(value: Any) -> str:
    if type(value).__module__ == "torch":  # a torch.dtype: named without importing torch here
        value = str(value).removeprefix("torch.")
    name = DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value
    if name not in DTYPES:
        _refuse(f"{value!r} is not a dtype; choose {', '.join(DTYPES)}")
    return name


floating_dtype = Kind("dtype", str, _dtype_value)
"""A floating-point dtype, held by its name (`bfloat16`; aliases fp32, bf16, fp16, half): text,
or a `torch.dtype`."""


def _device_value(value: Any) -> str:
    if type(value).__module__ == "torch":  # a torch.device
        value = str(value)
    if not isinstance(value, str) or not DEVICE.fullmatch(value):
        _refuse(f"'{value}' is not a device; use cpu, cuda, cuda:N or mps")
    return value


device_name = Kind("device", str, _device_value)
"""cpu, cuda, cuda:N or mps: text, or a `torch.device`."""


def _function_value(value: Any) -> Any:
    if not callable(value):
        _refuse(f"must be a function (got {value!r})")
    return value


function = Kind("function", str, _function_value)
"""A Python function (an option of the API only: no command line reads one)."""


def checked_by(
    kind: str, function: Callable[[Any], Any], parse: Callable[[str], Any] = str
) -> Kind:
    """A kind whose check is `function`, which raises a one-line `ProbekitError` (e.g. a
    parser of a lower module such as `parse_device_map`): its line becomes the kind's phrase."""

    def check(value: Any) -> Any:
        try:
            return function(value)
        except ProbekitError as error:
            _refuse(str(error))

    return Kind(kind, parse, check)
