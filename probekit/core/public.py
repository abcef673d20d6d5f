"""Every public function and class of probekit checks its call before any work, in one line
naming the keyword as the Python caller wrote it (`public`).

The signature is the function's own, defaults written in the source (a test holds each option's
default equal to its declaration's). `public(*groups, command=..., skip=...)` reads it once and
checks each call: an unknown keyword is one line with a "did you mean"; a missing or surplus
argument one line naming it; a parameter named as an option of `groups` (as `command` takes it,
except those in `skip`, which take it in another form) is checked by the option's kind, the
command line's rule, and the body gets the checked value (an `AnswerSet` for `answers="0-10"`,
a `Path` for a str; None leaves it at its default); any other argument is checked by its
annotation (`probekit.core.typecheck`).
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, TypeVar

from probekit.core.errors import ProbekitError
from probekit.core.options import check_option, declaration, options_of, unknown_keyword
from probekit.core.typecheck import checker, refusal, resolve

T = TypeVar("T")
Parameter = inspect.Parameter


def public(*groups: type, command: str | None = None, skip: Sequence[str] = ()) -> Callable[[T], T]:
    """Check every call of a public function or class (its constructor; see the module)."""

    def wrap(target: Any) -> Any:
        if not isinstance(target, type):
            return _checked(target, f"{target.__qualname__}()", groups, command, skip, target)
        own = vars(target)
        name = "__new__" if "__new__" in own and "__init__" not in own else "__init__"
        found = inspect.getattr_static(target, name)
        function = getattr(found, "__func__", found)
        checked = _checked(function, f"{target.__name__}()", groups, command, skip, target)
        setattr(target, name, staticmethod(checked) if isinstance(found, staticmethod) else checked)
        return target

    return wrap


def _checked(
    function: Callable[..., Any],
    where: str,
    groups: Sequence[type],
    command: str | None,
    skip: Sequence[str],
    owner: Any,
) -> Callable[..., Any]:
    signature = inspect.signature(function)
    body = signature.parameters
    fields = {  # the parameters that are options, checked by their kinds
        f.name: f
        for group in groups
        for f in options_of(group)
        if f.name in body and f.name not in skip and declaration(f).takes(command)
    }
    first = next(iter(body), None) if owner is not function else None  # self / cls
    extra = next((p.name for p in body.values() if p.kind is p.VAR_KEYWORD), None)
    listed = [n for n in body if n not in (first, extra)]
    required = [n for n in listed if body[n].default is body[n].empty]

    @functools.cache
    def annotations() -> tuple[dict[str, Any], dict[str, Any]]:
        """Each parameter's hint and its check, made on the first call (every module is loaded
        by then)."""
        resolved = {
            n: resolve(p.annotation, owner) for n, p in body.items() if p.annotation is not p.empty
        }
        if isinstance(owner, type):  # a dataclass's fields, a named tuple's
            for name, value in getattr(owner, "__annotations__", {}).items():
                resolved.setdefault(name, resolve(value, owner))
        resolved.pop(extra, None)
        return resolved, {name: checker(hint) for name, hint in resolved.items()}

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        known, checks = annotations()
        for key, value in kwargs.items():
            if key not in listed:
                missing = [n for n in required if n not in kwargs]
                if extra is None or difflib.get_close_matches(key, missing, 1, 0.75):
                    raise unknown_keyword(key, listed, where)
            elif key in fields and value is not None:  # the caller's words before any other
                kwargs[key] = check_option(fields[key], value, key)
        try:  # a call its signature does not take: one line, as `Signature.bind` words it
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise ProbekitError(f"{where}: {error}") from None
        values = bound.arguments
        for name, value in values.items():
            if name in fields:
                if value is None and body[name].default is body[name].empty:
                    raise ProbekitError(f"{where} needs {name}")
                if value is None:
                    values[name] = body[name].default
                elif name not in kwargs:
                    values[name] = check_option(fields[name], value, name)
            elif name != first and name in checks and not checks[name](value):
                raise ProbekitError(f"{where}: {refusal(name, value, known[name])}")
        return function(*bound.args, **bound.kwargs)

    # what the tests read: the option fields of its parameters, the command of their defaults
    call.__public__ = SimpleNamespace(fields=fields, command=command)  # type: ignore[attr-defined]
    return call
