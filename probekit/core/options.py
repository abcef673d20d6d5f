"""Option types and the command-line parser shared by every command and study.

Each type turns one command-line string into a checked value, or raises
`argparse.ArgumentTypeError` with a phrase that reads after the option's name ("must be at
least 1 (got 0)"); `CommandParser` prints it as one line and exits with status 2. Checks that
involve several options run in the same parse (`CommandParser.add_check`), so that every option
is validated before anything touches disk or loads a model. This module imports no model
library: the command line's `--help` stays fast.

The Python API checks its keywords with the same types (`check_value`), so a bad value reads the
same from both front ends, with the keyword in place of the flag. Options are matched exactly
(no prefixes: `--event` is not `--events`); an unknown one gets a "did you mean" for a near miss.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from probekit.core.errors import ProbekitError

DTYPES = ("float32", "bfloat16", "float16", "float64")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
DEVICE = re.compile(r"cpu|mps|cuda(:\d+)?")
EVERY_COMMAND = ("run", "patch", "capture", "steer")  # the commands that take a study's options
MECHANISM = ("patch", "capture", "steer")
T = TypeVar("T")


@dataclass(frozen=True)
class Option:
    """One option of a study, declared once for every command that takes it.

    `type` is one of this module's types (None: the text as given), `default` its value when
    the option is not given (`defaults` overrides it per command, e.g. fewer events for
    patching), `commands` the study commands that take it, `switch` a flag without a value.
    """

    flag: str
    help: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    commands: tuple[str, ...] = ("run",)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    switch: bool = False

    def add_to(self, parser: argparse.ArgumentParser, command: str) -> None:
        """Add this option to `parser` as `command` takes it (nothing if it does not)."""
        if command not in self.commands:
            return
        if self.switch:
            parser.add_argument(self.flag, action="store_true", help=self.help)
            return
        default = self.defaults.get(command, self.default)
        shown = self.help if default is not None else self.help.replace("%(default)s", "all")
        parser.add_argument(self.flag, type=self.type, default=default, help=shown)


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (a ProbekitError: the command line prints
    it, exit status 2) and whose `add_check` functions (raising ProbekitError) validate the
    parsed options together, before any work. Options are matched exactly (`allow_abbrev`
    off: a prefix of an option is refused, not taken for it), with a "did you mean"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.checks: list[Callable[[argparse.Namespace], None]] = []

    def add_check(self, check: Callable[[argparse.Namespace], None]) -> None:
        """Run `check(args)` after parsing (it raises a ProbekitError to refuse them)."""
        self.checks.append(check)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            hint = _did_you_mean(extras, self._chosen(parsed))
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        for check in self.checks:
            check(parsed)
        return parsed

    def _chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser whose options `parsed` was read with: the chosen subcommand's, if any."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(sub, CommandParser):
                    return sub._chosen(parsed)
        return self

    def error(self, message: str) -> NoReturn:
        """Raise one line (a ProbekitError, which the command line prints with exit status 2)
        instead of printing the usage and exiting, as argparse would."""
        match = re.match(r"argument ([^:]+): (.*)", message, re.DOTALL)
        if match:  # "argument --epsilon: must be ..." -> "--epsilon must be ..."
            message = option_message(match.group(1).split("/")[-1], match.group(2))
        raise ProbekitError(" ".join(message.split()))


def _did_you_mean(extras: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """ "; did you mean --events?" for the first unknown option close to one of `parser`'s."""
    known = [flag for flag in parser._option_string_actions if flag.startswith("--")]
    for extra in extras:
        if extra.startswith("--"):
            close = difflib.get_close_matches(extra.split("=")[0], known, n=1, cutoff=0.6)
            if close:
                return f"; did you mean {close[0]}?"
    return ""


def option_message(name: str, phrase: str) -> str:
    """One line refusing a value of the option or keyword `name`, from its type's phrase:
    `--epsilon must be at least 0 (got -1)`, `--epsilon: 'x' is not a number`."""
    return f"{name} {phrase}" if phrase.startswith("must") else f"{name}: {phrase}"


def check_value(name: str, value: Any, kind: Callable[[str], T]) -> T:
    """A Python API keyword's `value` checked by the command line's option type `kind`: the
    value it names, or a ProbekitError with the phrase the command line gives, naming `name`
    (the keyword) where the command line names the flag; it reads `str(value)`, as the command
    line reads its text, so a bool or None is refused as a number too."""
    text = str(value)
    try:
        return kind(text)
    except argparse.ArgumentTypeError as err:
        raise ProbekitError(option_message(name, str(err))) from None


def _number(text: str, kind: Callable[[str], Any], name: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {name}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number (got {text!r})")
    return value


def integer(text: str) -> int:
    """Any integer."""
    return _number(text, int, "an integer")


def positive_int(text: str) -> int:
    """An integer >= 1 (batch sizes, counts)."""
    return int_range(1)(text)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds)."""
    return int_range(0)(text)


def _ranged(parse_value: Callable[[str], Any], spec: str, name: str, low: Any, high: Any) -> Any:
    """The type of a value read by `parse_value` that lies in [low, high] (no upper bound when
    `high` is None); bounds and value are shown with the format `spec` in the refusal, and
    argparse names the type `name` in its own errors."""

    def parse(text: str) -> Any:
        value = parse_value(text)
        if value < low or (high is not None and value > high):
            bound = (
                f"at least {low:{spec}}"
                if high is None
                else f"between {low:{spec}} and {high:{spec}}"
            )
            raise argparse.ArgumentTypeError(f"must be {bound} (got {value:{spec}})")
        return value

    parse.__name__ = name
    return parse


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """The type of an integer in [low, high] (no upper bound when `high` is None)."""
    return _ranged(integer, "", "integer", low, high)


def finite_float(text: str) -> float:
    """A finite number (no nan, no inf)."""
    return _number(text, float, "a number")


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (epsilon, temperature)."""
    return float_range(0.0)(text)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0 (got {value:g})")
    return value


def probability(text: str) -> float:
    """A number in [0, 1]."""
    return float_range(0.0, 1.0)(text)


def float_range(low: float, high: float | None = None) -> Callable[[str], float]:
    """The type of a finite number in [low, high] (no upper bound when `high` is None)."""
    return _ranged(finite_float, "g", "number", low, high)


def count_or_all(text: str) -> int | None:
    """A positive count, or `all` (None)."""
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' must be a positive number or 'all'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value}), or 'all'")
    return value


def shard(text: str) -> tuple[int, int]:
    """`i/n`: this process runs every n-th prompt from the i-th (0 <= i < n)."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' must look like i/n, e.g. 0/4") from None
    if count < 1 or not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"'{text}': need 0 <= i < n")
    return index, count


def dtype_name(text: str) -> str:
    """A floating-point dtype name (aliases fp32, bf16, fp16, half accepted)."""
    name = DTYPE_ALIASES.get(text, text)
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"'{text}' is not a dtype; choose {', '.join(DTYPES)}")
    return name


def device_name(text: str) -> str:
    """cpu, cuda, cuda:N or mps."""
    if not DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"'{text}' is not a device; use cpu, cuda, cuda:N or mps")
    return text


def choice(kind: str, names: Sequence[str]) -> Callable[[str], str]:
    """The type of one of `names` ("unknown mode 'x'; choose one of ev, generate")."""

    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(
                f"unknown {kind} '{text}'; choose one of {', '.join(names)}"
            )
        return text

    parse.__name__ = kind
    return parse


def int_list(text: str) -> list[int]:
    """Comma-separated integers such as `--layers 0,6,12`."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None


def comma_list(text: str) -> list[str]:
    """Comma-separated names such as `--sites hook_resid_pre,hook_mlp_out`."""
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item")
    return items


def check_out_dir(path: str | Path, option: str = "--out") -> None:
    """Refuse an output folder that cannot be created or written; leaves nothing behind (a
    temporary file in the nearest existing folder is created and removed)."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise ProbekitError(f"{option} {path} is a file, not a folder")
    existing = target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ProbekitError(f"{option} {path}: {existing} is a file, not a folder")
    try:  # a real write: permissions alone miss read-only file systems and /proc
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".probekit-write-check-"):
            pass
    except OSError as err:
        raise ProbekitError(
            f"{option} {path}: cannot write in {existing} ({err.strerror})"
        ) from None


def options_from_keywords(
    parser: argparse.ArgumentParser,
    options: Mapping[str, Any],
) -> argparse.Namespace:
    """A command's parsed options from Python keywords (`layers=[0, 3]`, `prompt_only=True`,
    `readout="p:5"`), validated by the very types, choices and checks of its command line: each
    keyword is an option's destination (`--top-k` is `top_k`), a list is a comma-separated
    value, True sets a flag, None keeps the default. An unknown keyword is one line with the
    nearest known ones ("did you mean"); an old option name (`metric`, a hidden alias) still
    works with its note. `run_study`, `patch_study` and `capture_study` take keywords here."""
    actions: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        if action.help == argparse.SUPPRESS:  # an old name: reached by its own spelling
            for name in action.option_strings:
                actions.setdefault(name.lstrip("-").replace("-", "_"), action)
        else:
            actions[action.dest] = action
    argv: list[str] = []
    for key, value in options.items():
        action = actions.get(key)
        if action is None:
            known = sorted(k for k, a in actions.items() if a.help != argparse.SUPPRESS)
            near = difflib.get_close_matches(key, known, n=2)
            hint = f"did you mean {' or '.join(near)}?" if near else f"options: {', '.join(known)}"
            raise ProbekitError(f"unknown option {key}={value!r} for {parser.prog}; {hint}")
        if value is None:
            continue
        flag = max(action.option_strings, key=len)
        if action.help == argparse.SUPPRESS:
            flag = "--" + key.replace("_", "-")
        if action.nargs == 0:
            if not isinstance(value, bool):
                raise ProbekitError(f"{key} is a switch: give True or False, got {value!r}")
            if value != action.default:
                argv.append(flag)
            continue
        if isinstance(value, list | tuple | range):
            value = ",".join(str(v) for v in value)
        argv.append(f"{flag}={value}")
    return parser.parse_args(argv)
