"""Options as typed values, declared once for the command line and the Python API.

An option is a field of a frozen dataclass declared with `option(default, help=..., kind=...)`.
Its kind (`probekit.core.kinds`) reads the command line's text and checks a Python value, so
both front ends apply one rule. A `Command` is one command's options: the dataclasses it takes,
its own defaults and the checks that span several options; `Command.parse` reads argv through
the parser it generates, `Command.build` makes the same values from keywords, and both refuse
before any work, in one line. An unknown option or keyword gets a "did you mean"; options are
matched exactly (no prefixes).

A message names an option with `named("events")` or `given("device", "cuda:3")`
(`probekit.core.errors`): marked text that reads as Python's words (`events`,
`device='cuda:3'`; `ProbekitError` drops the marks) and that the command line's edge writes as
flags (`as_flags`: `--events`, `--device cuda:3`). This module imports no model library, so
`--help` stays fast.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from probekit.core.errors import MARK, ProbekitError, named
from probekit.core.errors import given as given  # re-exported: options are named from here
from probekit.core.io import check_writable
from probekit.core.kinds import Kind, text

REQUIRED: Any = dataclasses.MISSING
"""The default of an option that must be given (`option(REQUIRED, ...)`)."""
_MARKED = re.compile(f"{MARK}(\\w+)(?:=(.*?))?{MARK}")


def flag(name: str) -> str:
    """An option's name on the command line: `batch_size` -> `--batch-size`."""
    return "--" + name.replace("_", "-")


def as_flags(message: str) -> str:
    """A message with its options (`named`, `given`) written as the command line's flags."""

    def spelled(match: re.Match) -> str:
        if match[2] is None:
            return flag(match[1])
        try:
            return f"{flag(match[1])} {ast.literal_eval(match[2])}"
        except (ValueError, SyntaxError):
            return f"{flag(match[1])} {match[2]}"

    return _MARKED.sub(spelled, message)


def as_keywords(message: str) -> str:
    """A message with its options written as Python's keywords (the marks dropped)."""
    return message.replace(MARK, "")


def option_message(name: str, phrase: str) -> str:
    """One line refusing a value of the option `name` with its kind's phrase: `epsilon must be
    at least 0 (got -1)`, `epsilon: 'x' is not a number`."""
    if phrase.startswith(f"{name} "):  # the phrase names the option itself
        return phrase
    return f"{name} {phrase}" if phrase.startswith("must") else f"{name}: {phrase}"


def option_error(name: str, phrase: str) -> ProbekitError:
    """The one way to refuse an option's value, naming it in the caller's words (`named`)."""
    return ProbekitError(option_message(named(name), phrase))


@dataclass(frozen=True)
class Declaration:
    """An option as `option` declared it (kept in its dataclass field's metadata): see `option`."""

    help: str | Mapping[str, str]
    default: Any = REQUIRED
    kind: Kind | None = text  # None: a switch (True when the flag is given)
    commands: Sequence[str] | None = None  # None: every command that takes its dataclass
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    const: Any = None
    several: Sequence[str] = ()
    metavar: str | None = None
    positional: bool = False
    none: str = "all"

    def default_for(self, command: str | None) -> Any:
        return self.defaults.get(command, self.default)  # type: ignore[arg-type]

    def takes(self, command: str | None) -> bool:
        """Whether `command` takes the option (None: a Python function, which takes any)."""
        return self.commands is None or command is None or command in self.commands

    def help_for(self, command: str, default: Any) -> str:
        """The command's help line, `%(default)s` written as `default`."""
        line = self.help if isinstance(self.help, str) else self.help.get(command) or self.help[""]
        shown = self.none if default is None else default
        if isinstance(shown, list | tuple):
            shown = ",".join(str(v) for v in shown)
        return line.replace("%(default)s", str(shown)).replace("%", "%%")


def option(default: Any = REQUIRED, **declared: Any) -> Any:
    """A dataclass field that is an option: `default` (REQUIRED: it must be given; a bool makes
    a switch), `help` (one line, or one per command with "" for the others; `%(default)s` shows
    the command's default), `kind` (default text), the `commands` that take it (None: all that
    take its dataclass) and their own `defaults`, `const` (the flag alone gives this value),
    `several` (commands in which the flag may be repeated: one instance of its dataclass per
    value), `metavar` (the value's name in `--help`), `positional` (the command line gives one
    or more values without a flag), `none` (what a default of None means, in help)."""
    kind = None if isinstance(default, bool) else declared.pop("kind", text)
    metadata = {"option": Declaration(default=default, kind=kind, **declared)}
    return dataclasses.field(default=default, metadata=metadata)


def declaration(field: dataclasses.Field) -> Declaration:
    """The option a dataclass field declares."""
    return field.metadata["option"]


def options_of(group: type) -> list[dataclasses.Field]:
    """The option fields of an options dataclass, in order."""
    return [f for f in dataclasses.fields(group) if "option" in f.metadata]


def option_values(options: Any, leave: Sequence[str] = ()) -> dict[str, Any]:
    """The options of an options dataclass instance by name, as keywords of its function
    (`leave`: those the function does not take, e.g. `json`)."""
    names = [f.name for f in options_of(type(options)) if f.name not in leave]
    return {name: getattr(options, name) for name in names}


def default_of(group: type, name: str, command: str | None = None) -> Any:
    """The declared default of the option `name` of `group` (as `command` has it)."""
    field = next(f for f in options_of(group) if f.name == name)
    return declaration(field).default_for(command)


def check_option(field: dataclasses.Field, value: Any, name: str) -> Any:
    """`value` checked by the option's kind, as the option holds it; a refusal is one line
    naming the option `name`."""
    kind = declaration(field).kind
    try:
        if kind is not None:
            return kind.check(value)
        if not isinstance(value, bool):
            raise argparse.ArgumentTypeError(f"must be True or False (got {value!r})")
        return value
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


Elsewhere = Callable[[str], "str | None"]
"""Where an option a command does not take belongs (another study's, say), as one line naming
it with `named`, or None."""
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
        return self.defaults.get(field.name, declaration(field).default_for(self.name))

    def parser(self, prog: str, description: str | None = None) -> CommandParser:
        """The command's argument parser, generated from its option dataclasses (one argument
        group each, titled by the first line of its docstring)."""
        parser = CommandParser(prog=prog, description=description, allow_abbrev=False)
        taken = self.taken()
        for index, group in enumerate(self.groups):
            fields = [f for i, f in taken.values() if i == index]
            if fields:
                title = (group.__doc__ or group.__name__).strip().splitlines()[0].rstrip(".:")
                section = parser.add_argument_group(title)
            for field in fields:
                arguments = self.argument(field)
                if declaration(field).positional:
                    del arguments["dest"], arguments["default"]
                    section.add_argument(field.name, nargs="+", **arguments)
                else:
                    section.add_argument(flag(field.name), **arguments)
        return parser

    def argument(self, field: dataclasses.Field) -> dict[str, Any]:
        """`add_argument`'s keywords for the option `field` in this command."""
        declared, default = declaration(field), self.default(field)
        help_line = declared.help_for(self.name, default)
        arguments = {"dest": field.name, "default": argparse.SUPPRESS, "help": help_line}
        if declared.kind is None:
            return arguments | {"action": "store_true"}
        arguments["type"] = declared.kind
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
        try:
            self.refuse_not_taken(argv or ())
            return self._values(vars(self.parser(prog, description).parse_args(argv)))
        except ProbekitError as error:
            raise type(error)(as_flags(error.marked)) from None

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
        options of other commands, or what `elsewhere` says; None when nothing is known."""
        for field in (f for group in self.groups for f in options_of(group)):
            if field.name == name and declaration(field).commands:
                commands = spoken(declaration(field).commands)  # type: ignore[arg-type]
                return f"{named(name)} is an option of {commands} only"
        return self.elsewhere(name) if self.elsewhere is not None else None

    def build(self, keywords: Mapping[str, Any], where: str) -> tuple:
        """The same values from Python keywords (`batch_size=8`, `dtype=torch.bfloat16`); None
        leaves an option at its default. A refusal is one line naming the keyword; an unknown
        keyword gets the nearest known ones; `where` names the function in messages."""
        taken = self.taken()
        given: dict[str, Any] = {}
        for key, value in keywords.items():
            if key not in taken:
                if why := self.not_taken(key):
                    raise ProbekitError(f"{where}: {why}")
                raise unknown_keyword(key, list(taken), where)
            if value is not None:
                value = check_option(taken[key][1], value, key)
                several = self.name in declaration(taken[key][1]).several
                given[key] = [value] if several else value
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
            several = None
            for field in options_of(group):
                declared, name = declaration(field), field.name
                taken = declared.takes(self.name)
                several = name if taken and self.name in declared.several else several
                if taken and name in given:
                    fields[name] = given[name]
                    continue
                default = self.default(field)
                if default is not None and default is not REQUIRED:
                    default = check_option(field, default, named(name))
                fields[name] = [default] if name == several else default
            if several is None:
                values.append(group(**fields))
            else:
                values.append([group(**{**fields, several: v}) for v in fields[several]])
        for value in values:  # an output folder (`out`) first
            if getattr(value, "out", None) is not None:
                check_writable(value.out)
        for check in self.checks:
            check(tuple(values))
        return tuple(values)


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (a ProbekitError: the command line prints
    it, exit status 2): an unknown option with a "did you mean"; options are matched exactly (a
    prefix of an option is refused, not taken for it)."""

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        given = list(args or ())
        known = [name for name in self._option_string_actions if name.startswith("--")]
        for index, arg in enumerate(given):  # before argparse's errors (a required option)
            old, _, value = arg.partition("=")
            if arg.startswith("--") and old not in self._option_string_actions:
                following = given[index + 1 : index + 2]
                value = value or next((v for v in following if v[:1] != "-"), "")
                shown = arg if "=" in arg else f"{arg} {value}".strip()
                near = difflib.get_close_matches(old, known, n=1, cutoff=0.6)
                hint = f"; did you mean {near[0]}?" if near else ""
                self.error(f"unrecognized arguments: {shown}{hint}")
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """Raise one line (a ProbekitError, which the command line prints with exit status 2)
        instead of printing the usage and exiting, as argparse would."""
        match = re.match(r"argument ([^:]+): (.*)", message, re.DOTALL)
        if match:  # "argument --epsilon: must be ..." -> "--epsilon must be ..."
            message = option_message(match.group(1).split("/")[-1], match.group(2))
        raise ProbekitError(" ".join(message.split()))
