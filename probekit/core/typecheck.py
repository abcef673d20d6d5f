"""Does a value fit a type hint: the check `probekit.core.public` gives every argument of a public
name that is not an option (an option has its kind, `probekit.core.kinds`).

The check is of what a caller can get wrong in one call, read from the annotations the code
already has: the outer type (a list where a string is expected, a string where a list is, an
int where an `Item` is) and the first `ELEMENTS` elements of a list or mapping. Each hint's
check is made once (`checker`). It is lenient where Python is: an int is a number, a `str` is a
path, any list or tuple is a sequence (a `tuple[...]` hint is met by a list), a numpy array is an
array-like. A hint it cannot resolve (a name imported for type checking only, a type variable, a
protocol that cannot be checked at run time) accepts anything; so does `Any`.
"""

from __future__ import annotations

import collections.abc as abc
import functools
import inspect
import numbers
import os
import reprlib
import sys
import types
import typing
from collections.abc import Callable
from itertools import islice
from pathlib import PurePath
from typing import Any

ELEMENTS = 4
"""Elements of a list or mapping checked (the first ones): a wrong list is wrong from its start,
and a public constructor (an `EncodedItem` of a long prompt) must stay cheap."""
SEQUENCES = (list, tuple, abc.Sequence, abc.MutableSequence, abc.Collection)
MAPPINGS = (dict, abc.Mapping, abc.MutableMapping)
ITERABLES = (abc.Iterable, abc.Iterator, abc.Generator)
UNIONS = (typing.Union, types.UnionType)
WORDS = {
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a str", "strings"),
    bool: ("True or False", "booleans"),
}
Check = Callable[[Any], bool]


def resolve(annotation: Any, owner: Any) -> Any:
    """The hint an annotation names (a string under `from __future__ import annotations` is
    evaluated in the module of `owner`); `Any` where it cannot be (a name imported for type
    checking only)."""
    if isinstance(annotation, typing.ForwardRef):
        annotation = annotation.__forward_arg__
    if not isinstance(annotation, str):
        return annotation
    module = sys.modules.get(getattr(owner, "__module__", ""), None)
    try:
        return eval(annotation, {**vars(typing), **(vars(module) if module else {})})
    except Exception:  # an unresolvable name: the hint says nothing we can check
        return Any


def _anything(value: Any) -> bool:
    return True


@functools.cache
def checker(hint: Any) -> Check:
    """The check of `hint`, made once per hint: a public constructor runs it on every call."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (Any, inspect.Parameter.empty) or isinstance(hint, typing.TypeVar):
        return _anything
    if hint is None or hint is type(None):
        return lambda value: value is None
    if origin in UNIONS:
        members = [checker(arg) for arg in args]
        return _anything if _anything in members else lambda v: any(m(v) for m in members)
    if abc.Callable in (origin, hint):
        return callable
    if origin in MAPPINGS:
        key, item = (checker(a) for a in (args or (Any, Any)))
        return lambda v: (
            isinstance(v, abc.Mapping)
            and all(key(k) and item(x) for k, x in islice(v.items(), ELEMENTS))
        )
    if origin is tuple and args and args[-1] is not Ellipsis:  # a fixed-length tuple
        fixed = [checker(a) for a in args]
        return lambda v: (
            _sequence(v)
            and len(v) == len(fixed)
            and all(c(x) for c, x in zip(fixed, v, strict=True))
        )
    if origin in SEQUENCES:
        element = checker(args[0] if args else Any)
        return lambda v: _sequence(v) and all(map(element, islice(v, ELEMENTS)))
    return _plain(origin or hint)


def _plain(hint: Any) -> Check:
    protocol = getattr(hint, "_is_protocol", False)
    if not isinstance(hint, type) or (protocol and not getattr(hint, "_is_runtime_protocol", 0)):
        return _anything  # a NewType, a ParamSpec, a protocol: nothing to check
    if hint is bool:
        return lambda value: isinstance(value, bool) or type(value).__name__ == "bool_"
    if hint in (int, float):
        number = numbers.Integral if hint is int else numbers.Real
        return lambda value: isinstance(value, number) and not isinstance(value, bool)
    if issubclass(hint, PurePath) or hint is os.PathLike:
        return lambda value: isinstance(value, str | os.PathLike)
    if hint in SEQUENCES:
        return _sequence
    if hint in MAPPINGS:
        return lambda value: isinstance(value, abc.Mapping)
    if hint in ITERABLES:
        return lambda value: hasattr(value, "__iter__") and not isinstance(value, str | bytes)
    if issubclass(hint, tuple) and hasattr(hint, "_fields"):  # any tuple of its length will do
        return lambda value: _sequence(value) and len(value) == len(hint._fields)
    if hint.__module__ == "numpy" and hint.__name__ == "ndarray":
        return lambda value: isinstance(value, hint) or _sequence(value)
    return lambda value: isinstance(value, hint)


def _sequence(value: Any) -> bool:
    if isinstance(value, str | bytes):
        return False
    return isinstance(value, list | tuple | abc.Sequence) or type(value).__name__ == "ndarray"


def described(hint: Any, plural: bool = False) -> str:
    """What a value of `hint` is, in words: `an integer`, `a str`, `a list of strings`,
    `an Item or None`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is None or hint is type(None):
        return "None"
    if origin in UNIONS:
        words = list(dict.fromkeys(described(arg, plural) for arg in args))
        return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]
    if abc.Callable in (origin, hint):
        return "functions" if plural else "a function"
    if origin in MAPPINGS or hint in MAPPINGS:
        return "dicts" if plural else "a dict"
    if origin in SEQUENCES or hint in SEQUENCES:
        of = "" if not args or args[0] is Any else f" of {described(args[0], plural=True)}"
        return ("lists" if plural else "a list") + of
    if origin in ITERABLES or hint in ITERABLES:
        return "iterables" if plural else "an iterable (a list)"
    if origin is not None:
        return described(origin, plural)
    if hint in WORDS:
        return WORDS[hint][plural]
    name = getattr(hint, "__name__", str(hint))
    name = "Path" if isinstance(hint, type) and issubclass(hint, PurePath) else name
    return f"{name}s" if plural else _article(name)


def _article(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def refusal(name: str, value: Any, hint: Any) -> str:
    """The phrase refusing `value` for the argument `name`: `item must be an Item (got 5)`; the
    value shown by its repr when short and plain, else by its type."""
    plain = value is None or isinstance(value, bool | int | float | str | bytes)
    if plain or (isinstance(value, list | tuple | dict | set) and len(repr(value)) <= 40):
        shown = reprlib.repr(value) if plain else repr(value)
    else:
        shown = _article(type(value).__name__)
    return f"{name} must be {described(hint)} (got {shown})"
