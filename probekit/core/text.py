"""Text from users' files and strings, refused in one line where it cannot be used: bytes that are
not UTF-8 and lone surrogates (a JSON `"\\ud800"` escape: half of a UTF-16 pair, no character,
which a tokenizer cannot encode), each named by file, line and column (and by the prompt's id
where there is one). A UTF-8 byte-order mark at the start of a file (what some editors write) is
dropped: it is no part of the text."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from probekit.core.errors import ProbekitError

BOM = "\ufeff"
_SURROGATE_ESCAPE = re.compile(
    r"(?<!\\)(?:\\\\)*\\u(?P<high>[dD][89abAB][0-9a-fA-F]{2})(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<!\\)(?:\\\\)*(?<![dD][89abAB][0-9a-fA-F]{2})\\u(?P<low>[dD][c-fC-F][0-9a-fA-F]{2})"
)
"""A JSON `\\uXXXX` escape of a surrogate that is not one half of a pair (an escaped backslash
before the `u` is no escape)."""
_HALF = (
    "half of a UTF-16 pair, which is no character; remove it, or write the whole pair "
    "(\\ud83d\\ude00 is one emoji)"
)


def refuse_lone_surrogate(value: str, what: str) -> None:
    """One line for a string that holds a lone surrogate (`what` names it: its file and line,
    the prompt's id and field), naming the character it is at."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        found = f"\\u{ord(value[err.start]):04x} at character {err.start + 1}"
        raise ProbekitError(f"{what} holds a lone surrogate {found}: {_HALF}") from None


def _line_and_column(data: str | bytes, at: int) -> tuple[int, int]:
    newline = b"\n" if isinstance(data, bytes) else "\n"
    return data.count(newline, 0, at) + 1, at - data.rfind(newline, 0, at)  # type: ignore[arg-type]


def not_utf8(where: str, byte: int, column: int) -> ProbekitError:
    """One line for a byte that is not UTF-8 at `where` (a file and line) and `column`."""
    return ProbekitError(
        f"{where}: not UTF-8 (byte {byte:#04x} at column {column}); save the file as UTF-8"
    )


def read_text(path: str | Path) -> str:
    """The text of the UTF-8 file `path`, a byte-order mark at its start dropped and line endings
    read as Python's text files read them (`\r\n` and `\r` as `\n`); one line for a file that
    cannot be read, or for bytes that are not UTF-8 (naming the line and column)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ProbekitError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line, column = _line_and_column(data, err.start)
        raise not_utf8(f"{path}:{line}", data[err.start], column) from None
    return text.removeprefix(BOM).replace("\r\n", "\n").replace("\r", "\n")


def read_json(path: str | Path) -> Any:
    """The JSON in the UTF-8 file `path` (`read_text`); invalid JSON and a lone surrogate's
    escape are refused in one line naming the line and column."""
    text = read_text(path)
    if found := _SURROGATE_ESCAPE.search(text):
        name = found.group("high") or found.group("low")
        line, column = _line_and_column(text, text.index("\\u" + name, found.start()))
        raise ProbekitError(
            f"{path}:{line}: the escape \\u{name.lower()} at column {column} is a lone "
            f"surrogate: {_HALF}"
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ProbekitError(
            f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})"
        ) from None
