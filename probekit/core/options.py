"""Options as typed values, declared once for the command line and the Python API.

An option is a field of a frozen dataclass declared with `option(default, help=..., kind=...)`.
Its kind (`probekit.core.kinds`) reads the command line's text and checks a Python value, so
both front ends apply one rule and word a refusal the same way, naming the flag (`--batch-size
must be at least 1 (got 0)`) or the keyword (`batch_size must be at least 1 (got 0)`). A
`Command` is one command's options: the dataclasses it takes, its own defaults and the checks
that span several options; `Command.parse` reads argv through the parser it generates,
`Command.build` makes the same values from keywords, and both refuse before any work
(`probekit.core.public` gives every public function and class the same checks, and its
signature from the declarations). An unknown option or keyword is one line with a "did you
mean"; options are matched exactly (no prefixes).

An error about an option, wherever it is raised, names it as the caller gave it: `named("events")`
is `--events` while the command line runs (`spelled(flag)`, which it sets) and `events` from
Python; `given("device", "cuda:3")` is `--device cuda:3` or `device='cuda:3'`; `option_error`
words a refusal with it. This module imports no model library, so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from probekit.core.errors import ProbekitError
from probekit.core.kinds import Kind, non_negative_int, path, positive_int, text

REQUIRED: Any = dataclasses.MISSING
"""The default of an option that must be given (`option(REQUIRED, ...)`)."""
Spell = Callable[[str], str]
"""An option's name as a front end shows it: `flag` (the command line) or `keyword` (Python)."""


def flag(name: str) -> str:
    """An option's name on the command line: `batch_size` -> `--batch-size`."""
    return "--" + name.replace("_", "-")


def keyword(name: str) -> str:
    """An option's name in the Python API: the field's own."""
    return name


_SPELLING: ContextVar[Spell] = ContextVar("probekit_spelling", default=keyword)


@contextmanager
def spelled(spell: Spell) -> Iterator[None]:
    """Name options with `spell` inside the block: the command line runs in `spelled(flag)`;
    outside any, options are named as Python keywords."""
    token = _SPELLING.set(spell)
    try:
        yield
    finally:
        _SPELLING.reset(token)


def named(name: str) -> str:
    """The option `name` as the caller gave it: `--events` on the command line, `events` from
    Python (`spelled`)."""
    return _SPELLING.get()(name)


def given(name: str, value: Any, placeholder: bool = False) -> str:
    """The option `name` with a value, as the caller would write it: `--device cuda:3` on the
    command line, `device='cuda:3'` from Python (a `placeholder` such as `N` is not quoted:
    `--limit N`, `limit=N`)."""
    if on_command_line():
        return f"{flag(name)} {value}"
    return f"{name}={value}" if placeholder else f"{name}={value!r}"


def on_command_line() -> bool:
    """Whether the caller is the command line (inside `spelled(flag)`)."""
    return _SPELLING.get() is flag


def option_message(name: str, phrase: str) -> str:
    """One line refusing a value of the option `name` (a flag or a keyword) with its kind's
    phrase: `--epsilon must be at least 0 (got -1)`, `epsilon: 'x' is not a number`."""
    if phrase.startswith(f"{name} "):  # the phrase names the option itself
        return phrase
    return f"{name} {phrase}" if phrase.startswith("must") else f"{name}: {phrase}"


def option_error(name: str, phrase: str) -> ProbekitError:
    """The one way to refuse an option's value, in the caller's words (`named`):
    `--events must be between 1 and 12 (got 40)` on the command line, `events must be ...` from
    Python."""
    return ProbekitError(option_message(named(name), phrase))


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
    none: str  # what a default of None means, in help ("all", "the engine's choice")

    def default_for(self, command: str | None) -> Any:
        return self.default if command is None else self.defaults.get(command, self.default)

    def takes(self, command: str | None) -> bool:
        """Whether `command` takes the option (None: a Python function, which takes any)."""
        return self.commands is None or command is None or command in self.commands

    def shown(self, value: Any) -> str:
        """A default as help shows it."""
        if value is None:
            return self.none
        if isinstance(value, list | tuple):
            return ",".join(str(v) for v in value)
        return str(value)


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
    none: str = "all",
) -> Any:
    """A dataclass field that is an option: `default` (REQUIRED: it must be given), `help`
    (`%(default)s` shows the command's default), `kind` (default text; a bool default makes a
    switch), the `commands` that take it (None: all that take its dataclass) and their own
    `defaults`, `const` (the flag alone gives this value), `several` (commands in which the
    flag may be repeated: one instance of its dataclass per value), `metavar` (the value's name
    in `--help`), `positional` (the command line gives one or more values without a flag: a
    list of values of `kind`), `none` (what a default of None means, for `%(default)s`)."""
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
        none=none,
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


def option_values(options: Any, leave: Sequence[str] = ()) -> dict[str, Any]:
    """The options of a parsed options dataclass instance by name, as a command hands them to
    its function as keywords (`leave`: those the function does not take, e.g. `json`)."""
    return {
        f.name: getattr(options, f.name) for f in options_of(type(options)) if f.name not in leave
    }


def default_of(group: type, name: str, command: str | None = None) -> Any:
    """The declared default of the option `name` of `group` (as `command` has it)."""
    for field in options_of(group):
        if field.name == name:
            return declaration(field).default_for(command)
    raise KeyError(f"{group.__name__} declares no option {name}")


def check_fields(options: Any) -> None:
    """Check each option of a dataclass instance made in code (not by a `Command`) by its kind:
    for an options dataclass's `__post_init__`. None is left alone (a default)."""
    for field in options_of(type(options)):
        value = getattr(options, field.name)
        if value is not None and value is not REQUIRED:
            object.__setattr__(options, field.name, check_option(field, value, named(field.name)))


def check_option(field: dataclasses.Field, value: Any, name: str) -> Any:
    """`value` checked by the option's kind, as the option holds it; a refusal is one line
    naming the option `name` (its flag or its keyword)."""
    kind = declaration(field).kind
    try:
        if kind is None:
            if not isinstance(value, bool):
                raise argparse.ArgumentTypeError(f"must be True or False (got {value!r})")
            return value
        return kind.check(value)
    except (argparse.ArgumentTypeError, ProbekitError) as error:
        raise ProbekitError(option_message(name, str(error))) from None


def spoken(names: Sequence[str]) -> str:
    """Names as a sentence says them: `a`, `a and b`, `a, b and c`."""
    *rest, last = names
    return f"{', '.join(rest)} and {last}" if rest else last


def unknown_keyword(key: str, known: Sequence[str], where: str) -> ProbekitError:
    """One line refusing the keyword `key` of `where`, with the nearest known ones."""
    near = difflib.get_close_matches(key, list(known), n=2)
    takes = f"it takes {', '.join(sorted(known))}" if known else "it takes no keywords"
    hint = f"did you mean {' or '.join(near)}?" if near else takes
    return ProbekitError(f"unknown keyword {key} for {where}; {hint}")


# Commands

Elsewhere = Callable[[str], "str | None"]
"""Where an option a command does not take belongs (another study's, say), as one line naming
it with `named`, or None: a command's own hint before the "did you mean"."""
Check = Callable[[tuple], None]
"""A check spanning several options: the command's values, in the order of its groups -> None,
or a ProbekitError naming the options with `named`."""


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
    elsewhere: Elsewhere | None = None

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
        shown = declared.shown(default)
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
        with spelled(flag):
            self.refuse_not_taken(argv or ())
            given = vars(self.parser(prog, description).parse_args(argv))
            return self._values(given)

    def refuse_not_taken(self, argv: Sequence[str]) -> None:
        """One line for the first flag of `argv` that this command does not take and that is
        known elsewhere (`not_taken`): before argparse's "unrecognized arguments"."""
        taken = self.taken()
        for arg in argv:
            name = arg.split("=")[0].removeprefix("--").replace("-", "_")
            if arg.startswith("--") and name not in taken and (why := self.not_taken(name)):
                raise ProbekitError(why)

    def not_taken(self, name: str) -> str | None:
        """Where the option `name`, which this command does not take, belongs: one of its groups'
        options of other commands, or what `elsewhere` says (another study's); None when
        nothing is known of it."""
        for group in self.groups:
            for field in options_of(group):
                if field.name == name and declaration(field).commands:
                    commands = spoken(declaration(field).commands)
                    return f"{named(name)} is an option of {commands} only"
        return self.elsewhere(name) if self.elsewhere is not None else None

    def build(self, keywords: Mapping[str, Any], where: str) -> tuple:
        """The same values from Python keywords (`batch_size=8`, `dtype=torch.bfloat16`); None
        leaves an option at its default. A refusal is one line naming the keyword; an unknown
        keyword gets the nearest known ones; `where` names the function in messages."""
        with spelled(keyword):
            return self._build(keywords, where)

    def _build(self, keywords: Mapping[str, Any], where: str) -> tuple:
        taken = self.taken()
        given: dict[str, Any] = {}
        for key, value in keywords.items():
            if key not in taken:
                if why := self.not_taken(key):
                    raise ProbekitError(f"{where}: {why}")
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
        return self._values(given)

    def _values(self, given: Mapping[str, Any]) -> tuple:
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
                    default = check_option(field, default, named(field.name))
                fields[field.name] = [default] if field.name == several else default
            if several is None:
                values.append(group(**fields))
            else:
                values.append([group(**{**fields, several: v}) for v in fields[several]])
        parsed = tuple(values)
        for value in parsed:
            if isinstance(value, OutOption) and value.out is not None:
                check_out_dir(value.out)
        for check in self.checks:
            check(parsed)
        return parsed

    def add_to(self, parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
        """Add the options `names` of this command to a script's own argparse parser (the
        benchmarks): the flag, kind, help and default of probekit's commands."""
        taken = self.taken()
        for name in names:
            field = taken[name][1]
            arguments = self._argument(field)
            default = self.default(field)
            arguments["default"] = None if default is REQUIRED else default
            parser.add_argument(flag(name), **arguments)


def _reader(kind: Kind) -> Callable[[str], Any]:
    """argparse's `type` for `kind`: a ProbekitError of its check becomes argparse's refusal."""

    def read(value: str) -> Any:
        try:
            return kind(value)
        except ProbekitError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

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


def check_out_dir(folder: str | Path, option: str = "out") -> None:
    """Refuse an output folder that cannot be created or written (`option`: the option that
    names it, in the caller's words in the refusal); leaves nothing behind (a temporary file in
    the nearest existing folder is created and removed)."""
    name = named(option)
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
        none="the study's",
    )


@dataclass(frozen=True)
class BatchSizeOption:
    """Batch size."""

    batch_size: int | None = option(
        None,
        help="prompts per forward pass (default %(default)s)",
        kind=positive_int,
        defaults={"capture": 8},
        metavar="N",
        none="the engine's choice for the device",
    )
