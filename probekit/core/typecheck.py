"""Does a value fit a type hint: the check `probekit.core.public` gives every argument of a public
name that is not an option (an option has its kind, `probekit.core.kinds`).

The check is of what a caller can get wrong in one call, read from the annotations the code
already has: the outer type (a list where a string is expected, a string where a list is, an
int where an `Item` is) and the elements of a list or mapping (the first `ELEMENTS` of them).
Each hint's check is made once (`checker`) and is a few `isinstance` calls per argument. It
is lenient where Python is: an int is a number, a `str` is a path, any list or tuple is a
sequence (a `tuple[...]` hint is met by a list), a numpy array is an array-like. A hint it cannot
resolve (a name imported for type checking only, a type variable, a protocol that cannot be
checked at run time) accepts anything; so does `Any`.
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
SEQUENCES = (list, tuple, abc.Sequence, abc.MutableSequence, abc.Collection, abc.Container)
SETS = (set, frozenset, abc.Set, abc.MutableSet)
MAPPINGS = (dict, abc.Mapping, abc.MutableMapping)
ITERABLES = (abc.Iterable, abc.Iterator, abc.Generator)
SINGULAR = {
    int: "an integer",
    float: "a number",
    str: "a str",
    bool: "True or False",
    bytes: "bytes",
}
PLURAL = {int: "integers", float: "numbers", str: "strings", bool: "booleans", bytes: "bytes"}


def resolve(annotation: Any, owner: Any) -> Any:
    """The hint an annotation names (a string under `from __future__ import annotations` is
    evaluated in the module of `owner`); `Any` where it cannot be (a name imported for type
    checking only). The members of a union are resolved one by one, so one unknown member
    makes only the union accept anything."""
    if isinstance(annotation, typing.ForwardRef):
        annotation = annotation.__forward_arg__
    if not isinstance(annotation, str):
        return annotation
    module = sys.modules.get(getattr(owner, "__module__", ""), None)
    names = {**vars(typing), **(vars(module) if module else {})}
    try:
        return eval(annotation, names)  # the package's own annotations
    except Exception:  # an unresolvable name: the hint says nothing we can check
        return Any


def hints(function: Callable[..., Any], owner: Any = None) -> dict[str, Any]:
    """Each parameter's resolved hint (`resolve`), by name; a class's dataclass fields give
    the hints of its generated `__init__`."""
    found: dict[str, Any] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.annotation is not parameter.empty:
            found[name] = resolve(parameter.annotation, owner or function)
    return found


Check = Callable[[Any], bool]


def conforms(value: Any, hint: Any) -> bool:
    """Whether `value` fits `hint` (see the module)."""
    return checker(hint)(value)


def checker(hint: Any) -> Check:
    """The check of `hint`, made once per hint: a public constructor runs it on every call."""
    try:
        return _cached(hint)
    except TypeError:  # an unhashable hint
        return _made(hint)


@functools.cache
def _cached(hint: Any) -> Check:
    return _made(hint)


def _anything(value: Any) -> bool:
    return True


def _made(hint: Any) -> Check:
    if hint is Any or hint is inspect.Parameter.empty or isinstance(hint, typing.TypeVar):
        return _anything
    if hint is None or hint is type(None):
        return lambda value: value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return checker(args[0])
    if origin in (typing.Union, types.UnionType):
        members = [checker(arg) for arg in args]
        if _anything in members:
            return _anything
        return lambda value: any(member(value) for member in members)
    if origin is typing.Literal:
        return lambda value: value in args
    if origin is type:
        return lambda value: isinstance(value, type)
    if origin is abc.Callable or hint is abc.Callable:
        return callable
    if origin is not None:
        return _generic(origin, args)
    return _plain(hint)


def _generic(origin: Any, args: tuple[Any, ...]) -> Check:
    if origin in MAPPINGS:
        key, item = (checker(a) for a in (args if len(args) == 2 else (Any, Any)))

        def mapping(value: Any) -> bool:
            if type(value) is not dict and not isinstance(value, abc.Mapping):
                return False
            return all(key(k) and item(v) for k, v in islice(value.items(), ELEMENTS))

        return mapping
    if origin in SEQUENCES or origin in SETS:
        sets = origin in SETS
        if origin is tuple and args and args[-1] is not Ellipsis:  # a fixed-length tuple
            fixed = [checker(a) for a in args]
            return lambda value: (
                _sequence_like(value, sets)
                and len(value) == len(fixed)
                and all(check(v) for check, v in zip(fixed, value, strict=True))
            )
        element = checker(args[0] if args else Any)
        return lambda value: (
            _sequence_like(value, sets) and all(element(v) for v in islice(value, ELEMENTS))
        )
    if origin in ITERABLES:
        return _iterable
    return _plain(origin)


def _iterable(value: Any) -> bool:
    return hasattr(value, "__iter__") and not isinstance(value, str | bytes)


def _plain(hint: Any) -> Check:
    if not isinstance(hint, type):
        return _anything  # a NewType, a ParamSpec, ...: nothing to check
    if hint is bool:
        return lambda value: isinstance(value, bool) or type(value).__name__ == "bool_"
    if hint in (int, float, complex):
        number = {int: numbers.Integral, float: numbers.Real, complex: numbers.Number}[hint]
        exact = {int: (int,), float: (float, int), complex: (complex, float, int)}[hint]
        return lambda value: (
            type(value) in exact or (isinstance(value, number) and not isinstance(value, bool))
        )
    if issubclass(hint, PurePath) or hint is os.PathLike:
        return lambda value: isinstance(value, str | os.PathLike)
    if hint in SEQUENCES or hint in SETS:
        sets = hint in SETS
        return lambda value: _sequence_like(value, sets)
    if hint in MAPPINGS or typing.is_typeddict(hint):
        return lambda value: isinstance(value, abc.Mapping)
    if hint in ITERABLES:
        return _iterable
    if _named_tuple(hint):  # any tuple of its length stands for it (a pair of prompts)
        return lambda value: _sequence_like(value, False) and len(value) == len(hint._fields)
    if getattr(hint, "_is_protocol", False):
        if not getattr(hint, "_is_runtime_protocol", False):
            return _anything
        return lambda value: isinstance(value, hint)
    if hint.__module__ == "numpy" and hint.__name__ == "ndarray":
        return lambda value: isinstance(value, hint) or _sequence_like(value, False)
    return lambda value: isinstance(value, hint)


def _sequence_like(value: Any, sets: bool) -> bool:
    if type(value) in (list, tuple):
        return True
    if isinstance(value, str | bytes):
        return False
    if sets:
        return isinstance(value, abc.Set | abc.Sequence)
    return isinstance(value, abc.Sequence) or type(value).__name__ == "ndarray"


def _named_tuple(hint: type) -> bool:
    return issubclass(hint, tuple) and hasattr(hint, "_fields")


def described(hint: Any) -> str:
    """What a value of `hint` is, in words: `an integer`, `a str`, `a list of strings`,
    `an Item or None`."""
    return _words(hint, plural=False)


def _words(hint: Any, plural: bool) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is None or hint is type(None):
        return "None"
    if origin is typing.Annotated:
        return _words(args[0], plural)
    if origin in (typing.Union, types.UnionType):
        words = list(dict.fromkeys(_words(arg, plural) for arg in args))
        return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is abc.Callable or hint is abc.Callable:
        return "functions" if plural else "a function"
    if origin in MAPPINGS or hint in MAPPINGS:
        return "dicts" if plural else "a dict"
    if origin in SEQUENCES or hint in SEQUENCES or origin in SETS or hint in SETS:
        element = args[0] if args else Any
        of = "" if element is Any else f" of {_words(element, plural=True)}"
        return ("lists" if plural else "a list") + of
    if origin in ITERABLES or hint in ITERABLES:
        return "iterables" if plural else "an iterable (a list)"
    if origin is not None:
        return _words(origin, plural)
    if isinstance(hint, type):
        if hint in PLURAL:
            return PLURAL[hint] if plural else SINGULAR[hint]
        name = "Path" if issubclass(hint, PurePath) else hint.__name__
        return f"{name}s" if plural else _article(name)
    return str(hint)


def _article(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def shown(value: Any) -> str:
    """A value as a refusal shows it: its repr when short and plain, else its type."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return reprlib.repr(value)
    if isinstance(value, list | tuple | dict | set) and len(repr(value)) <= 40:
        return repr(value)
    return _article(type(value).__name__)


def refusal(name: str, value: Any, hint: Any) -> str:
    """The phrase refusing `value` for the argument `name`: `item must be an Item (got 5)`."""
    return f"{name} must be {described(hint)} (got {shown(value)})"
