"""Prompt files for `probekit score`: JSONL records of chat messages or raw text, validated and
read as items (tokenized by the one encoder, `LoadedModel.encode`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

from probekit.core.errors import ProbekitError
from probekit.core.items import Item
from probekit.core.text import BOM, refuse_lone_surrogate

ROLES = ("system", "user", "assistant")


def read_prompts(path: str | Path, prefill: str = "") -> Iterator[Item]:
    """Yield items from a JSONL file (UTF-8; a byte-order mark is dropped), checking each line
    and rejecting duplicate ids (compared as the JSON values they are: `1` and `1.0` are one id)
    and lone surrogates in one line naming the file, line and id; `prefill` is forced at the
    start of every response."""
    path = Path(path)
    if not path.is_file():
        raise ProbekitError(f"prompt file '{path}' does not exist")
    seen: dict[str, int] = {}
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ProbekitError(
                    f"{path}:{number}: not UTF-8 (byte {raw[exc.start]:#04x} at column "
                    f"{exc.start + 1}); save the file as UTF-8"
                ) from None
            line = line.removeprefix(BOM)  # an editor's mark (files joined: on any line), no text
            if not line.strip():
                continue
            prompt = parse_prompt_line(line, f"{path}:{number}", prefill)
            if prompt.id in seen:
                raise ProbekitError(
                    f"{path}:{number}: duplicate id '{prompt.id}' (line {seen[prompt.id]} has it)"
                )
            seen[prompt.id] = number
            yield prompt


def parse_prompt_line(line: str, where: str, prefill: str = "") -> Item:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ProbekitError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise ProbekitError(f"{where}: expected a JSON object")
    if "id" not in record:
        raise ProbekitError(f"{where}: missing 'id'")
    pid = prompt_id(record["id"], where)
    refuse_lone_surrogate(pid, f"{where}: 'id'")
    if "messages" in record:
        messages = parse_messages(record["messages"], where)
        for number, message in enumerate(messages):
            refuse_lone_surrogate(message["content"], f"{where}: id {pid!r}: message {number}")
        return Item(pid, key={}, unit=pid, messages=messages, prefill=prefill)
    if "text" in record:
        if not isinstance(record["text"], str):
            raise ProbekitError(f"{where}: 'text' must be a string")
        refuse_lone_surrogate(record["text"], f"{where}: id {pid!r}: 'text'")
        if not (record["text"] + prefill).strip():
            raise ProbekitError(f"{where}: id '{pid}': the prompt is empty ('text' is blank)")
        return Item(pid, key={}, unit=pid, text=record["text"], prefill=prefill)
    raise ProbekitError(f"{where}: id '{pid}' has neither 'messages' nor 'text'")


def prompt_id(value: object, where: str) -> str:
    """A prompt's id as text: a non-empty string, or a number written as JSON writes the value
    (`1`, `1.0` and `1e0` are the id `1`; `2.5` is `2.5`), so that one JSON value is one id;
    `null`, true/false, NaN, infinities, lists and objects are refused (a null id would become
    the text "None" and clash with the next)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        shown = (
            json.dumps(value)
            if value is None or isinstance(value, bool)
            else "a " + ("list" if isinstance(value, list) else type(value).__name__)
        )
        raise ProbekitError(f"{where}: 'id' is {shown}; give a string or a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProbekitError(f"{where}: 'id' is {value}; give a string or a finite number")
        value = int(value) if value.is_integer() else value
    text = str(value)
    if not text.strip():
        raise ProbekitError(f"{where}: 'id' is empty; give a string or a number")
    return text


def parse_messages(messages: object, where: str) -> tuple[dict[str, str], ...]:
    """Checked chat messages (a non-empty list of {role, content}); `where` prefixes errors."""
    if not isinstance(messages, list) or not messages:
        raise ProbekitError(f"{where}: 'messages' must be a non-empty list")
    for message in messages:
        if (
            not isinstance(message, dict)
            or message.get("role") not in ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise ProbekitError(
                f"{where}: each message needs a role in {ROLES} and a string content"
            )
    if not any(m["content"].strip() for m in messages):
        raise ProbekitError(f"{where}: the prompt is empty (no message has any content)")
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)
