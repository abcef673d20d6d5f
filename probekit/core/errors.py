"""The one exception type users see: a single line saying what is wrong and what to do, naming an
option in the caller's words (`named`, `given`)."""

import os
from abc import ABC
from typing import Any

MARK = "\u2060"
"""Around an option's name in a message (`named`, `given`): an invisible word joiner, so that the
message reads in Python's words as it is (`events`, `device='cuda:3'`) and the command line's edge
can write the flags instead (`probekit.core.options.as_flags`)."""


def named(name: str) -> str:
    """The option `name` in a message: `events` from Python, `--events` on the command line."""
    return f"{MARK}{name}{MARK}"


def given(name: str, value: Any, placeholder: bool = False) -> str:
    """The option `name` with a value in a message: `device='cuda:3'` from Python, `--device
    cuda:3` on the command line (a `placeholder` such as `N` is not quoted: `limit=N`)."""
    value = os.fspath(value) if isinstance(value, os.PathLike) else value
    return f"{MARK}{name}={value if placeholder else repr(value)}{MARK}"


class ProbekitError(Exception):
    """A user-facing error. The CLI prints its message on one line (options named as flags) and
    exits with status 2; `str()` names them as Python keywords."""

    def __str__(self) -> str:
        return self.marked.replace(MARK, "")

    @property
    def marked(self) -> str:
        """The message with its options marked, for the command line to word as flags."""
        return super().__str__()


class StatisticsError(ProbekitError):
    """The scores hold too little for a statistic (too few units, a group or a pair missing, a
    constant matrix): what a partial run (`--limit`) meets, as distinct from a bad input or a
    failed write."""


class Contract(ABC):  # noqa: B024 (its subclasses declare the abstract methods)
    """A declared contract (`Probe`, `Study`): making one whose methods are still abstract is one
    line naming them and the class to subclass, not Python's TypeError."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if missing := sorted(getattr(cls, "__abstractmethods__", ())):
            base = next(c for c in cls.__mro__ if Contract in c.__bases__).__name__
            raise ProbekitError(
                f"cannot make a {cls.__name__}: {', '.join(missing)} not defined; subclass "
                f"{base} and define {'it' if len(missing) == 1 else 'them'}"
            )
        return super().__new__(cls)
