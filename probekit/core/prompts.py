"""Prompt files for `probekit score`: JSONL records of chat messages or raw text, validated and
read as items (tokenized by the one encoder, `LoadedModel.encode`), each id once (`unique_ids`,
the rule for prompts given in Python too)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from decimal import Decimal
from pathlib import Path

from probekit.core.errors import ProbekitError
from probekit.core.items import Item, parse_messages
from probekit.core.text import BOM, not_utf8, refuse_lone_surrogate


def read_prompts(path: str | Path, prefill: str = "") -> Iterator[Item]:
    """Yield items from a JSONL file (UTF-8; a byte-order mark is dropped; lines end in `\\n`,
    `\\r\\n` or `\\r`), checking each line and rejecting duplicate ids (compared as the JSON
    values they are: `1` and `1.0` are one id) and lone surrogates in one line naming the file,
    line and id; `prefill` is forced at the start of every response."""
    path = Path(path)
    if not path.is_file():
        raise ProbekitError(
            f"prompt file '{path}' {'is a folder' if path.is_dir() else 'does not exist'}"
        )
    yield from unique_ids(_records(path, prefill), f"{path}:{{}}", "line {}")


def _records(path: Path, prefill: str) -> Iterator[tuple[int, Item]]:
    """Each record of the file with its line number, read a line at a time (flat memory)."""
    number = 0
    with path.open("rb") as lines:
        for raw in lines:
            for piece in raw.removesuffix(b"\n").removesuffix(b"\r").split(b"\r"):
                number += 1
                try:
                    line = piece.decode("utf-8").removeprefix(BOM)  # a BOM: files joined
                except UnicodeDecodeError as exc:
                    raise not_utf8(f"{path}:{number}", piece[exc.start], exc.start + 1) from None
                if line.strip():
                    yield number, parse_prompt_line(line, f"{path}:{number}", prefill)


def unique_ids(
    numbered: Iterable[tuple[int, Item]], place: str = "prompt {}", first: str = "prompt {}"
) -> Iterator[Item]:
    """The items, each id once, from a file or a Python list alike: a repeated id would be two
    rows under one `prompt_id`, so it is refused in one line naming where the item is (`place`
    formatted with its number) and where the id came first (`first`)."""
    seen: dict[str, int] = {}
    for number, item in numbered:
        if item.id in seen:
            at = first.format(seen[item.id])
            raise ProbekitError(f"{place.format(number)}: duplicate id '{item.id}' ({at} has it)")
        seen[item.id] = number
        yield item


def parse_prompt_line(line: str, where: str, prefill: str = "") -> Item:
    """One JSONL record as an item: `id`, and `messages` or `text` (one of them)."""
    try:
        record = json.loads(line, parse_float=Decimal)  # a number id as written
    except json.JSONDecodeError as exc:
        raise ProbekitError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise ProbekitError(f"{where}: expected a JSON object")
    if "id" not in record:
        raise ProbekitError(f"{where}: missing 'id'")
    pid = prompt_id(record["id"], where)
    refuse_lone_surrogate(pid, f"{where}: 'id'")
    given = [name for name in ("messages", "text") if name in record]
    if len(given) != 1:
        has = "both 'messages' and 'text'; give one" if given else "neither 'messages' nor 'text'"
        raise ProbekitError(f"{where}: id '{pid}' has {has}")
    where = f"{where}: id {pid!r}"
    if given == ["messages"]:
        messages = parse_messages(record["messages"], where)
        for number, message in enumerate(messages):
            refuse_lone_surrogate(message["content"], f"{where}: message {number}")
        return Item(pid, unit=pid, messages=messages, prefill=prefill)
    if not isinstance(text := record["text"], str):
        raise ProbekitError(f"{where}: 'text' must be a string")
    refuse_lone_surrogate(text, f"{where}: 'text'")
    if not (text + prefill).strip():
        raise ProbekitError(f"{where}: the prompt is empty ('text' is blank)")
    return Item(pid, unit=pid, text=text, prefill=prefill)


def prompt_id(value: object, where: str) -> str:
    """A prompt's id as text: a non-empty string, or a number written as the exact value the
    JSON text gives (`1`, `1.0` and `1e0` are the id `1`; `2.5` is `2.5`; `1e300` is 1 and 300
    zeros, never a float's binary digits), so that one JSON value is one id; `null`,
    true/false, NaN, infinities, lists and objects are refused (a null id would become the text
    "None" and clash with the next)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
        kind = "a " + ("list" if isinstance(value, list) else type(value).__name__)
        shown = json.dumps(value) if value is None or isinstance(value, bool) else kind
        raise ProbekitError(f"{where}: 'id' is {shown}; give a string or a number")
    if isinstance(value, float):  # NaN or an infinity: every other number is a Decimal
        raise ProbekitError(f"{where}: 'id' is {value}; give a string or a finite number")
    if isinstance(value, Decimal):
        whole = value == value.to_integral_value()
        value = int(value) if whole else format(value.normalize(), "f")
    if not (text := str(value)).strip():
        raise ProbekitError(f"{where}: 'id' is empty; give a string or a number")
    return text
