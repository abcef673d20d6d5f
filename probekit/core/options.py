"""Options as typed values, declared once for the command line and the Python API.

An option is a field of a frozen dataclass declared with `option(default, help=..., kind=...)`.
Its `Kind` reads the command line's text (`parse`) and checks a Python value (`check`: the API's
value as given, or what `parse` read), so both front ends apply one rule and word a refusal the
same way, naming the flag (`--batch-size must be at least 1 (got 0)`) or the keyword
(`batch_size must be at least 1 (got 0)`). A `Command` is one command's options: the dataclasses
it takes, its own defaults and the checks that span several options; `Command.parse` reads argv
through the parser it generates, `Command.build` makes the same values from keywords, and both
refuse before any work. `checked` gives a plain public function the same checks of its keywords.
An unknown option or keyword is one line with a "did you mean"; options are matched exactly (no
prefixes). This module imports no model library, so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import inspect
import math
import numbers
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from probekit.core.errors import ProbekitError

DTYPES = ("float32", "bfloat16", "float16", "float64")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
DEVICE = re.compile(r"cpu|mps|cuda(:\d+)?")
REQUIRED: Any = dataclasses.MISSING
"""The default of an option that must be given (`option(REQUIRED, ...)`)."""
F = TypeVar("F", bound=Callable[..., Any])
Spell = Callable[[str], str]
"""An option's name as a front end shows it: `flag` (the command line) or `keyword` (Python)."""


def flag(name: str) -> str:
    """An option's name on the command line: `batch_size` -> `--batch-size`."""
    return "--" + name.replace("_", "-")


def keyword(name: str) -> str:
    """An option's name in the Python API: the field's own."""
    return name


def option_message(name: str, phrase: str) -> str:
    """One line refusing a value of the option `name` (a flag or a keyword) with its kind's
    phrase: `--epsilon must be at least 0 (got -1)`, `epsilon: 'x' is not a number`."""
    return f"{name} {phrase}" if phrase.startswith("must") else f"{name}: {phrase}"


def _refuse(phrase: str) -> NoReturn:
    raise argparse.ArgumentTypeError(phrase)


# Kinds: how a value is read from text and checked


@dataclass(frozen=True)
class Kind:
    """An option's type. `parse` reads the command line's text; `check` takes a Python value
    (the API's as given, or what `parse` read) and returns it as the option holds it. Both raise
    `argparse.ArgumentTypeError` with a phrase that reads after the option's name ("must be at
    least 1 (got 0)"). Calling a kind reads and checks text: the command line's reader."""

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
    value = float(value)
    if not math.isfinite(value):
        _refuse(f"must be a finite number (got {value:g})")
    return value


def _ranged(value: Callable[[Any], Any], spec: str, low: Any, high: Any) -> Callable[[Any], Any]:
    """The check of a value (read by `value`) in [low, high] (no upper bound when `high` is
    None); bounds and value shown with the format `spec`."""

    def check(given: Any) -> Any:
        number = value(given)
        if number < low or (high is not None and number > high):
            bound = (
                f"at least {low:{spec}}"
                if high is None
                else f"between {low:{spec}} and {high:{spec}}"
            )
            _refuse(f"must be {bound} (got {number:{spec}})")
        return number

    return check


integer = Kind("integer", _read(int, "an integer"), _int_value)
finite_float = Kind("number", _read(float, "a number"), _float_value)


def int_range(low: int, high: int | None = None) -> Kind:
    """An integer in [low, high] (no upper bound when `high` is None)."""
    return Kind("integer", integer.parse, _ranged(_int_value, "", low, high))


def float_range(low: float, high: float | None = None) -> Kind:
    """A finite number in [low, high] (no upper bound when `high` is None)."""
    return Kind("number", finite_float.parse, _ranged(_float_value, "g", low, high))


positive_int = int_range(1)
"""An integer >= 1 (batch sizes, counts)."""
non_negative_int = int_range(0)
"""An integer >= 0 (seeds)."""
non_negative_float = float_range(0.0)
"""A finite number >= 0 (epsilon, temperature)."""
probability = float_range(0.0, 1.0)
"""A number in [0, 1]."""


def _positive_float(value: Any) -> float:
    number = _float_value(value)
    if number <= 0:
        _refuse(f"must be above 0 (got {number:g})")
    return number


positive_float = Kind("number", finite_float.parse, _positive_float)
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


def _parse_count(value: str) -> int | str:
    if value == "all":
        return value
    try:
        return int(value)
    except ValueError:
        _refuse(f"'{value}' must be a positive number or 'all'")


def _count_value(value: Any) -> int | None:
    if value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _refuse(f"'{value}' must be a positive number or 'all'")
    if value < 1:
        _refuse(f"must be at least 1 (got {value}), or 'all'")
    return int(value)


count_or_all = Kind("count", _parse_count, _count_value)
"""A positive count, or `all` (held as None)."""


def _parse_shard(value: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in value.split("/"))
    except ValueError:
        _refuse(f"'{value}' must look like i/n, e.g. 0/4")
    return index, count


def _shard_value(value: Any) -> tuple[int, int]:
    if isinstance(value, str):
        value = _parse_shard(value)
    if not isinstance(value, Sequence) or len(value) != 2:
        _refuse(f"{value!r} must look like i/n, e.g. 0/4 (or a pair (i, n))")
    index, count = (_int_value(x) for x in value)
    if count < 1 or not 0 <= index < count:
        _refuse(f"'{index}/{count}': need 0 <= i < n")
    return index, count


shard = Kind("shard", _parse_shard, _shard_value)
"""`i/n` (or a pair from Python): every n-th prompt from the i-th (0 <= i < n)."""


def _items(value: Any, what: str) -> list[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | range):
        _refuse(f"must be a list of {what} (got {value!r})")
    return list(value)


def _parse_list(kind: Callable[[str], Any], what: str) -> Callable[[str], list[Any]]:
    def parse(value: str) -> list[Any]:
        try:
            return [kind(x) for x in value.split(",") if x.strip()]
        except ValueError:
            _refuse(f"{value!r} is not a comma-separated list of {what}")

    return parse


int_list = Kind(
    "integers",
    _parse_list(int, "integers"),
    lambda value: [_int_value(x) for x in _items(value, "integers")],
)
"""Integers: `--layers 0,6,12`; from Python a list or a range."""
float_list = Kind(
    "numbers",
    _parse_list(float, "numbers"),
    lambda value: [_float_value(x) for x in _items(value, "numbers")],
)
"""Finite numbers: `--alphas -4,-2,0,2,4`; from Python a list."""


def _parse_names(value: str) -> list[str]:
    items = [x.strip() for x in value.split(",")]
    if not all(items):
        _refuse(f"{value!r} has an empty item")
    return items


def _names_value(value: Any) -> list[str]:
    items = _items(value, "names")
    if not items or not all(isinstance(x, str) and x for x in items):
        _refuse(f"must be a non-empty list of names (got {value!r})")
    return items


comma_list = Kind("names", _parse_names, _names_value)
"""Names: `--sites hook_resid_pre,hook_mlp_out`; from Python a list."""


def parse_dtype(value: str) -> str:
    """A floating-point dtype's name from text (aliases fp32, bf16, fp16, half accepted)."""
    name = DTYPE_ALIASES.get(value, value)
    if name not in DTYPES:
        _refuse(f"'{value}' is not a dtype; choose {', '.join(DTYPES)}")
    return name


def _dtype_value(value: Any) -> str:
    if type(value).__module__ == "torch":  # a torch.dtype: named without importing torch here
        value = str(value).removeprefix("torch.")
    if not isinstance(value, str):
        _refuse(f"{value!r} is not a dtype; choose {', '.join(DTYPES)}")
    return parse_dtype(value)


floating_dtype = Kind("dtype", parse_dtype, _dtype_value)
"""A floating-point dtype, held by its name (`bfloat16`): text, or a `torch.dtype`."""


def _device_value(value: Any) -> str:
    if type(value).__module__ == "torch":  # a torch.device
        value = str(value)
    if not isinstance(value, str) or not DEVICE.fullmatch(value):
        _refuse(f"'{value}' is not a device; use cpu, cuda, cuda:N or mps")
    return value


device_name = Kind("device", str, _device_value)
"""cpu, cuda, cuda:N or mps: text, or a `torch.device`."""


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


# Declarations


@dataclass(frozen=True)
class Declaration:
    """An option as `option` declared it (kept in its dataclass field's metadata)."""

    help: str
    kind: Kind | None  # None: a switch (True when the flag is given)
    default: Any
    commands: tuple[str, ...] | None  # None: every command that takes its dataclass
    defaults: Mapping[str, Any]  # command -> its own default
    const: Any  # the value of a flag given without one (`--ray`)
    several: tuple[str, ...]  # commands where the flag may be repeated (one value each)
    metavar: str | None
    positional: bool  # the command line gives its values (one or more) without a flag

    def default_for(self, command: str) -> Any:
        return self.defaults.get(command, self.default)

    def takes(self, command: str) -> bool:
        return self.commands is None or command in self.commands


def option(
    default: Any = REQUIRED,
    *,
    help: str,
    kind: Kind | None = None,
    commands: Sequence[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    const: Any = None,
    several: Sequence[str] = (),
    metavar: str | None = None,
    positional: bool = False,
) -> Any:
    """A dataclass field that is an option: `default` (REQUIRED: it must be given), `help`
    (`%(default)s` shows the command's default), `kind` (default text; a bool default makes a
    switch), the `commands` that take it (None: all that take its dataclass) and their own
    `defaults`, `const` (the flag alone gives this value), `several` (commands in which the
    flag may be repeated: one instance of its dataclass per value), `metavar` (the value's name
    in `--help`), `positional` (the command line gives one or more values without a flag: a
    list of values of `kind`)."""
    switch = isinstance(default, bool)
    declared = Declaration(
        help=help,
        kind=None if switch else (kind or text),
        default=default,
        commands=None if commands is None else tuple(commands),
        defaults=dict(defaults or {}),
        const=const,
        several=tuple(several),
        metavar=metavar,
        positional=positional,
    )
    metadata = {"option": declared}
    if default is REQUIRED:
        return dataclasses.field(metadata=metadata)
    if isinstance(default, list | dict | set):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def declaration(field: dataclasses.Field) -> Declaration:
    """The option a dataclass field declares."""
    return field.metadata["option"]


def options_of(group: type) -> list[dataclasses.Field]:
    """The option fields of an options dataclass, in order."""
    return [f for f in dataclasses.fields(group) if "option" in f.metadata]


def check_option(field: dataclasses.Field, value: Any, name: str) -> Any:
    """`value` checked by the option's kind, as the option holds it; a refusal is one line
    naming the option `name` (its flag or its keyword)."""
    kind = declaration(field).kind
    try:
        if kind is None:
            if not isinstance(value, bool):
                _refuse(f"must be True or False (got {value!r})")
            return value
        return kind.check(value)
    except (argparse.ArgumentTypeError, ProbekitError) as error:
        raise ProbekitError(option_message(name, str(error))) from None


def unknown_keyword(key: str, known: Sequence[str], where: str) -> ProbekitError:
    """One line refusing the keyword `key` of `where`, with the nearest known ones."""
    near = difflib.get_close_matches(key, list(known), n=2)
    hint = f"did you mean {' or '.join(near)}?" if near else f"it takes {', '.join(sorted(known))}"
    return ProbekitError(f"unknown keyword {key} for {where}; {hint}")


# Commands

Check = Callable[[tuple, Spell], None]
"""A check spanning several options: (the command's values, in the order of its groups; how
options are named) -> None, or a ProbekitError."""


@dataclass(frozen=True)
class Command:
    """The options of one command: its option dataclasses (`groups`; no option name twice), the
    defaults it gives (`defaults`, e.g. a study's output folder) and the `checks` spanning
    several options. `parse` (argv) and `build` (keywords) give one value per group, in order:
    a dataclass instance, or for a group with an option the command takes several times, a list
    of instances (one per value). Every option is checked before any work; a group that holds
    `out` (`OutOption`) has its folder checked first."""

    name: str
    groups: tuple[type, ...]
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    checks: tuple[Check, ...] = ()

    def taken(self) -> dict[str, tuple[int, dataclasses.Field]]:
        """Option name -> (its group's index, its field), for the options this command takes."""
        found: dict[str, tuple[int, dataclasses.Field]] = {}
        for index, group in enumerate(self.groups):
            for field in options_of(group):
                if declaration(field).takes(self.name):
                    if field.name in found:
                        raise TypeError(f"option {field.name} is declared twice for {self.name}")
                    found[field.name] = (index, field)
        return found

    def default(self, field: dataclasses.Field) -> Any:
        """The option's default in this command."""
        if field.name in self.defaults:
            return self.defaults[field.name]
        return declaration(field).default_for(self.name)

    def parser(self, prog: str, description: str | None = None) -> CommandParser:
        """The command's argument parser, generated from its option dataclasses (one argument
        group each, titled by the first line of its docstring)."""
        parser = CommandParser(prog=prog, description=description)
        taken = self.taken()
        for index, group in enumerate(self.groups):
            fields = [f for i, f in taken.values() if i == index]
            if not fields:
                continue
            title = (group.__doc__ or group.__name__).strip().splitlines()[0].rstrip(".:")
            section = parser.add_argument_group(title)
            for field in fields:
                arguments = self._argument(field)
                if declaration(field).positional:
                    del arguments["dest"], arguments["default"]
                    section.add_argument(field.name, nargs="+", **arguments)
                else:
                    section.add_argument(flag(field.name), **arguments)
        return parser

    def _argument(self, field: dataclasses.Field) -> dict[str, Any]:
        declared = declaration(field)
        default = self.default(field)
        shown = "all" if default is None else _shown(default)
        arguments: dict[str, Any] = {
            "dest": field.name,
            "default": argparse.SUPPRESS,
            "help": declared.help.replace("%(default)s", shown).replace("%", "%%"),
        }
        if declared.kind is None:
            return arguments | {"action": "store_true"}
        arguments["type"] = _reader(declared.kind)
        if self.name in declared.several:
            arguments["action"] = "append"
        if declared.const is not None:
            arguments |= {"nargs": "?", "const": declared.const}
        if declared.metavar:
            arguments["metavar"] = declared.metavar
        if default is REQUIRED and not declared.positional:
            arguments["required"] = True
        return arguments

    def parse(self, argv: Sequence[str] | None, prog: str, description: str | None = None) -> tuple:
        """The command line `argv` read and checked (a refusal is one line naming the flag)."""
        given = vars(self.parser(prog, description).parse_args(argv))
        return self._values(given, flag)

    def build(self, keywords: Mapping[str, Any], where: str) -> tuple:
        """The same values from Python keywords (`batch_size=8`, `dtype=torch.bfloat16`); None
        leaves an option at its default. A refusal is one line naming the keyword; an unknown
        keyword gets the nearest known ones; `where` names the function in messages."""
        taken = self.taken()
        given: dict[str, Any] = {}
        for key, value in keywords.items():
            if key not in taken:
                elsewhere = [f for g in self.groups for f in options_of(g) if f.name == key]
                if elsewhere and declaration(elsewhere[0]).commands:
                    commands = " and ".join(declaration(elsewhere[0]).commands)
                    raise ProbekitError(f"{where} takes no {key} (an option of {commands} only)")
                raise unknown_keyword(key, list(taken), where)
            if value is None:
                continue
            field = taken[key][1]
            if self.name in declaration(field).several:
                value = [check_option(field, value, key)]
            else:
                value = check_option(field, value, key)
            given[key] = value
        for key, (_, field) in taken.items():
            if key not in given and self.default(field) is REQUIRED:
                raise ProbekitError(f"{where} needs {key}")
        return self._values(given, keyword)

    def _values(self, given: Mapping[str, Any], spell: Spell) -> tuple:
        """Each group's instance (or instances) from the given values and the defaults, then
        the out folder's check and the command's checks."""
        values: list[Any] = []
        for group in self.groups:
            fields: dict[str, Any] = {}
            several: str | None = None
            for field in options_of(group):
                declared = declaration(field)
                taken = declared.takes(self.name)
                if taken and self.name in declared.several:
                    several = field.name
                if taken and field.name in given:
                    fields[field.name] = given[field.name]
                    continue
                default = self.default(field)
                if default is not None and default is not REQUIRED:
                    default = check_option(field, default, spell(field.name))
                fields[field.name] = [default] if field.name == several else default
            if several is None:
                values.append(group(**fields))
            else:
                values.append([group(**{**fields, several: v}) for v in fields[several]])
        parsed = tuple(values)
        for value in parsed:
            if isinstance(value, OutOption) and value.out is not None:
                check_out_dir(value.out, spell("out"))
        for check in self.checks:
            check(parsed, spell)
        return parsed


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _reader(kind: Kind) -> Callable[[str], Any]:
    """argparse's `type` for `kind`: a ProbekitError of its check becomes argparse's refusal."""

    def read(value: str) -> Any:
        try:
            return kind(value)
        except ProbekitError as error:
            _refuse(str(error))

    read.__name__ = kind.name
    return read


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (a ProbekitError: the command line prints
    it, exit status 2). Options are matched exactly (`allow_abbrev` off: a prefix of an option
    is refused, not taken for it), with a "did you mean"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        given = list(args or ())
        for index, arg in enumerate(given):  # before argparse's errors (a required option)
            if arg.startswith("--") and arg.split("=")[0] not in self._option_string_actions:
                value = given[index + 1 : index + 2]
                shown = [arg, *value] if "=" not in arg and value and value[0][:1] != "-" else [arg]
                self.error(f"unrecognized arguments: {' '.join(shown)}{_did_you_mean([arg], self)}")
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            hint = _did_you_mean(extras, self._chosen(parsed))
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
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
    known = [name for name in parser._option_string_actions if name.startswith("--")]
    for extra in extras:
        if extra.startswith("--"):
            close = difflib.get_close_matches(extra.split("=")[0], known, n=1, cutoff=0.6)
            if close:
                return f"; did you mean {close[0]}?"
    return ""


def checked(*groups: type, skip: Sequence[str] = ()) -> Callable[[F], F]:
    """Check a public function's arguments before it runs, with the command line's rules: an
    unknown keyword is one line with a "did you mean", a missing or surplus argument one line,
    and each argument named as an option of `groups` (but those in `skip`, which the function
    takes in another form) is checked by that option's kind and passed on as the option holds
    it, a refusal naming the keyword."""

    def wrap(function: F) -> F:
        signature = inspect.signature(function)
        parameters = signature.parameters
        anything = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        fields = {
            f.name: f
            for group in groups
            for f in options_of(group)
            if f.name in parameters and f.name not in skip
        }
        where = f"{function.__name__}()"

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            for key in kwargs:
                if key not in parameters and not anything:
                    raise unknown_keyword(key, list(parameters), where)
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as error:
                raise ProbekitError(f"{where}: {error}") from None
            for key, value in bound.arguments.items():
                if key in fields and value is not None:
                    bound.arguments[key] = check_option(fields[key], value, key)
            return function(*bound.args, **bound.kwargs)

        return call  # type: ignore[return-value]

    return wrap


def check_out_dir(folder: str | Path, name: str = "--out") -> None:
    """Refuse an output folder that cannot be created or written (`name`: the option, as the
    front end names it); leaves nothing behind (a temporary file in the nearest existing folder
    is created and removed)."""
    target = Path(folder).expanduser()
    if target.exists() and not target.is_dir():
        raise ProbekitError(f"{name} {folder} is a file, not a folder")
    existing = target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ProbekitError(f"{name} {folder}: {existing} is a file, not a folder")
    try:  # a real write: permissions alone miss read-only file systems and /proc
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".probekit-write-check-"):
            pass
    except OSError as err:
        raise ProbekitError(
            f"{name} {folder}: cannot write in {existing} ({err.strerror})"
        ) from None


# Options every command that has them shares: declared here once


@dataclass(frozen=True)
class OutOption:
    """Output."""

    out: Path | None = option(
        None, help="output folder (default %(default)s)", kind=path, metavar="DIR"
    )


@dataclass(frozen=True)
class SeedOption:
    """Seed."""

    seed: int = option(
        0,
        help="seed of everything drawn at random: the items, the statistics' resamples, random "
        "controls (default %(default)s)",
        kind=non_negative_int,
    )


@dataclass(frozen=True)
class BatchSizeOption:
    """Batch size."""

    batch_size: int | None = option(
        None,
        help="prompts per forward pass (default: the engine's choice for the device)",
        kind=positive_int,
        metavar="N",
    )
