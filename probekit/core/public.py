"""Every public function and class of probekit checks its arguments before any work, in one line,
and takes its options from their one declaration (`probekit.core.options.option`).

`public(*groups, command=..., defaults=..., skip=...)` decorates a public function (or a class:
its constructor):
- Its signature: a parameter named as an option of `groups` gets that option's default (as the
  command `command` has it, or `defaults`' for this function) from the declaration, so
  `inspect.signature`, `help()` and the API reference show the real one; the function's source
  gives it none (a default restated there is refused when the module is imported). A function
  that takes `**options` also lists the groups' other options as keywords before them.
- Its docstring: the `Args:` section gets each option's line from the declaration's help (a line
  written by hand for an option is refused on import, as a restated default is).
- Its call, before the body runs: an unknown keyword is one line with a "did you mean"; a
  missing or surplus argument one line naming it; an option is checked by its kind, the command
  line's rule (None leaves it at its default; the body gets the checked value: an `AnswerSet`
  for `answers="0-10"`, a `Path` for a str); any other argument by its annotation
  (`probekit.core.typecheck`: an int where an `Item` is expected, `"no"` where True or False is).
  Every refusal is a `ProbekitError` naming the keyword, as the Python caller wrote it.
Parameters in `skip` are not taken as the options of their name (the function takes them in
another form with another meaning, e.g. a `Readout` object); parameters in `wider` take the
option in a wider form (a loaded model as well as a model spec) with its declared default: their
annotation checks them, not the option's kind.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import inspect
import re
import textwrap
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from probekit.core.errors import ProbekitError
from probekit.core.options import (
    REQUIRED,
    check_option,
    declaration,
    options_of,
    unknown_keyword,
)
from probekit.core.typecheck import Check, checker, conforms, hints, refusal, resolve

T = TypeVar("T")
Parameter = inspect.Parameter
SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters):\s*$")
ENTRY = re.compile(r"^\s*\*{0,2}(\w+)( \([^)]*\))?:")
WIDTH = 96
"""Columns of a generated docstring line."""


@dataclasses.dataclass(frozen=True)
class Declared:
    """What `public` took from the declarations for a function (its `__public__`): the option
    fields of its parameters, the defaults it gave them, the command, its own defaults, the
    parameters it skipped and those it takes in a wider form (read by the tests that keep each
    default in one place)."""

    fields: dict[str, dataclasses.Field]
    defaults: dict[str, Any]
    command: str | None
    own: dict[str, Any]
    skip: tuple[str, ...]
    wider: tuple[str, ...]


def public(
    *groups: type,
    command: str | None = None,
    defaults: Mapping[str, Any] | None = None,
    skip: Sequence[str] = (),
    wider: Sequence[str] = (),
) -> Callable[[T], T]:
    """Give a public function or class its signature, docs and checks from the declarations of
    `groups` (see the module). `command`: the command whose per-command defaults apply (e.g.
    `capture`'s batch size); `defaults`: this function's own, where it means something else
    than the command's; `skip`: parameters not taken as options; `wider`: parameters that take
    an option in a wider form, with its default."""

    def wrap(target: T) -> T:
        fields = _fields(groups, command)
        own = dict(defaults or {})
        rules = (command, own, tuple(skip), tuple(wider))
        if isinstance(target, type):
            return _public_class(target, fields, rules)  # type: ignore[return-value]
        where = f"{target.__qualname__}()"  # type: ignore[attr-defined]
        return _checked(target, where, fields, rules, target)  # type: ignore[arg-type]

    return wrap


def _fields(groups: Sequence[type], command: str | None) -> dict[str, dataclasses.Field]:
    """The options of `groups` that `command` takes, by name (one declaration each)."""
    found: dict[str, dataclasses.Field] = {}
    for group in groups:
        for field in options_of(group):
            if not declaration(field).takes(command):
                continue
            if field.name in found and found[field.name] is not field:
                raise TypeError(f"option {field.name} is declared twice in {groups}")
            found[field.name] = field
    return found


Rules = tuple[str | None, dict[str, Any], tuple[str, ...], tuple[str, ...]]
"""A decoration's command, own defaults, skipped and wider parameters."""


def _public_class(cls: type, fields: dict, rules: Rules) -> type:
    """`cls` whose constructor (`__init__`, else a named tuple's `__new__`) is checked."""
    name = "__init__" if "__init__" in vars(cls) or "__new__" not in vars(cls) else "__new__"
    found = inspect.getattr_static(cls, name)
    function = found.__func__ if isinstance(found, staticmethod) else found
    checked = _checked(function, f"{cls.__name__}()", fields, rules, cls)
    setattr(cls, name, staticmethod(checked) if isinstance(found, staticmethod) else checked)
    return cls


def _checked(
    function: Callable[..., Any],
    where: str,
    fields: dict[str, dataclasses.Field],
    rules: Rules,
    owner: Any,
) -> Callable[..., Any]:
    command, own, skip, wider = rules
    signature = inspect.signature(function)
    body = signature.parameters
    defaults = {
        name: own.get(name, declaration(f).default_for(command))
        for name, f in fields.items()
        if name not in skip
    }
    options = {name: fields[name] for name in defaults if name not in wider}
    var_keyword = next((p for p in body.values() if p.kind is p.VAR_KEYWORD), None)
    parameters: list[Parameter] = []
    for parameter in body.values():
        if parameter.name in defaults:
            if parameter.default is not parameter.empty:
                raise TypeError(
                    f"{where}: the default of {parameter.name} is its declaration's; leave it "
                    "out of the signature"
                )
            default = defaults[parameter.name]
            parameter = parameter.replace(
                default=Parameter.empty if default is REQUIRED else default,
                annotation=_annotation(parameter, fields[parameter.name]),
            )
        if parameter.kind is parameter.VAR_KEYWORD:
            parameters += [
                Parameter(
                    name,
                    Parameter.KEYWORD_ONLY,
                    default=Parameter.empty if defaults[name] is REQUIRED else defaults[name],
                    annotation=field.type,
                )
                for name, field in options.items()
                if name not in body
            ]
        parameters.append(parameter)
    outer = signature.replace(parameters=parameters)
    listed = [p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    required = [p.name for p in parameters if p.name in listed and p.default is p.empty]
    first = next(iter(body), None) if owner is not function else None  # self / cls

    kinds = (Parameter.POSITIONAL_OR_KEYWORD, Parameter.KEYWORD_ONLY, Parameter.VAR_KEYWORD)
    if any(p.kind not in kinds for p in parameters):
        raise TypeError(f"{where}: `public` takes no positional-only or *args parameters")
    positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    extra = var_keyword.name if var_keyword else None

    @functools.cache
    def annotations() -> tuple[dict[str, Any], dict[str, Check], dict | None, list[str]]:
        """The parameters' hints and checks, the keywords a `**options: Unpack[...]` takes and
        every keyword allowed, made on the first call (every module is loaded by then)."""
        resolved = hints(function, owner)
        if isinstance(owner, type):  # a dataclass's fields, a named tuple's
            for name, value in getattr(owner, "__annotations__", {}).items():
                resolved.setdefault(name, resolve(value, owner))
        unpacked = _unpacked(resolved.get(extra)) if extra else None
        allowed = [k for k in listed + list(unpacked or {}) if k != first]
        return resolved, {n: checker(h) for n, h in resolved.items()}, unpacked, allowed

    def bound(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name (those of `**options` beside the others); a wrong call
        is one line, as `inspect.Signature.bind` words it."""
        values = dict(zip(positional, args, strict=False))  # surplus: refused below
        wrong = len(args) > len(positional) or any(key in values for key in kwargs)
        values.update(kwargs)
        if wrong or any(name not in values for name in required):
            try:
                outer.bind(*args, **kwargs)
            except TypeError as error:
                raise ProbekitError(f"{where}: {error}") from None
        return values

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        known, checks, unpacked, allowed = annotations()
        for key in kwargs:
            if key in allowed:
                continue
            missing = [k for k in required if k not in kwargs]  # a misspelling of one of them
            if extra is None or unpacked is not None or _close(key, missing):
                raise unknown_keyword(key, allowed, where)
        done = set()
        for key, value in kwargs.items():  # options given by keyword first: the caller's words
            if key in options and value is not None:
                kwargs[key] = check_option(options[key], value, key)
                done.add(key)
        values = bound(args, kwargs)
        rest = {}
        for name, value in values.items():
            if name == first or name in done:
                continue
            if name in defaults and value is None and name in body:
                if defaults[name] is REQUIRED:
                    raise ProbekitError(f"{where} needs {name}")
                values[name] = value = copy.copy(defaults[name])
            if name in options:
                if value is not None:
                    values[name] = check_option(options[name], value, name)
            elif name not in listed:
                rest[name] = value
            elif name in checks and not checks[name](value):
                raise ProbekitError(f"{where}: {refusal(name, value, known[name])}")
        if rest:
            _check_keywords(rest, unpacked, known.get(extra), where)
        for name in body:
            if name in defaults and name not in values:
                values[name] = copy.copy(defaults[name])
        return function(**values)

    call.__signature__ = outer  # type: ignore[attr-defined]
    used = [name for name in defaults if name in outer.parameters]
    call.__public__ = Declared(  # type: ignore[attr-defined]
        {name: fields[name] for name in used}, defaults, command, own, skip, wider
    )
    call.__doc__ = _documented(
        function.__doc__, where, options, defaults, [p.name for p in parameters]
    )
    return call


def _annotation(parameter: Parameter, field: dataclasses.Field) -> Any:
    """The parameter's annotation, else its option's type."""
    return field.type if parameter.annotation is parameter.empty else parameter.annotation


def _close(key: str, names: Sequence[str]) -> bool:
    """Whether `key` reads as a misspelling of one of `names`."""
    return bool(difflib.get_close_matches(key, list(names), n=1, cutoff=0.75))


def _unpacked(hint: Any) -> dict[str, Any] | None:
    """The keywords of `**options: Unpack[SomeTypedDict]` and their hints; None otherwise."""
    if typing.get_origin(hint) is typing.Unpack:
        (typed,) = typing.get_args(hint)
        return {k: resolve(v, typed) for k, v in typing.get_type_hints(typed).items()}
    return None


def _check_keywords(
    values: Mapping[str, Any], unpacked: dict[str, Any] | None, hint: Any, where: str
) -> None:
    """The `**keywords` of a call, by the TypedDict they unpack or their one annotation."""
    for key, value in values.items():
        expected = unpacked.get(key, Any) if unpacked is not None else hint
        unpacking = typing.get_origin(expected) is typing.Unpack
        if expected is not None and not unpacking and not conforms(value, expected):
            raise ProbekitError(f"{where}: {refusal(key, value, expected)}")


def _documented(
    doc: str | None,
    where: str,
    options: dict[str, dataclasses.Field],
    defaults: dict[str, Any],
    order: list[str],
) -> str | None:
    """`doc` with a line per option parameter from its declaration, in its `Args:` section
    (added at the end when there is none)."""
    names = [name for name in order if name in options]
    if not names:
        return doc
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    header = next((i for i, line in enumerate(lines) if SECTION.match(line)), None)
    if header is None:
        lines += ["", "Args:"] if lines else ["Args:"]
        header = len(lines) - 1
    indent = len(SECTION.match(lines[header]).group(1))  # type: ignore[union-attr]
    end = header + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > indent):
        entry = ENTRY.match(lines[end])
        if entry and _indent(lines[end]) == indent + 4 and entry.group(1) in options:
            raise TypeError(
                f"{where}: the docstring describes {entry.group(1)}; its declaration's help "
                "does (leave it out)"
            )
        end += 1
    while end > header + 1 and not lines[end - 1].strip():
        end -= 1
    pad = " " * (indent + 4)
    added = [
        textwrap.fill(
            f"{name}: {python_help(options[name], defaults[name])}",
            width=WIDTH,
            initial_indent=pad,
            subsequent_indent=pad + "    ",
        )
        for name in names
    ]
    return "\n".join(lines[:end] + added + lines[end:])


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def python_help(field: dataclasses.Field, default: Any) -> str:
    """An option's help in Python's words: its flags as keywords, its default as a value."""
    declared = declaration(field)
    shown = "required" if default is REQUIRED else declared.shown(default)
    text = declared.help.replace("%(default)s", shown)
    return re.sub(r"--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"), text)
