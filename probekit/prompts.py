"""Prompt files for `probekit score`: JSONL records of chat messages or raw text, validated and
rendered into token ids."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from probekit.errors import ProbekitError
from probekit.models import LoadedModel

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Prompt:
    """One scoring request: chat `messages` (rendered with the chat template) or raw `text`."""

    id: str
    messages: tuple[dict[str, str], ...] | None = None
    text: str | None = None

    def render(self, model: LoadedModel, prefill: str = "") -> str:
        """The exact text the model reads, with `prefill` forced at the start of the response."""
        body = self.text if self.messages is None else model.render(list(self.messages))
        return body + prefill


def read_prompts(path: str | Path) -> Iterator[Prompt]:
    """Yield prompts from a JSONL file, checking each line and rejecting duplicate ids."""
    path = Path(path)
    if not path.is_file():
        raise ProbekitError(f"prompt file '{path}' does not exist")
    seen: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            prompt = parse_prompt_line(line, f"{path}:{number}")
            if prompt.id in seen:
                raise ProbekitError(f"{path}:{number}: duplicate id '{prompt.id}'")
            seen.add(prompt.id)
            yield prompt


def parse_prompt_line(line: str, where: str) -> Prompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ProbekitError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise ProbekitError(f"{where}: expected a JSON object")
    if "id" not in record:
        raise ProbekitError(f"{where}: missing 'id'")
    pid = str(record["id"])
    if "messages" in record:
        return Prompt(pid, messages=_check_messages(record["messages"], where))
    if "text" in record:
        if not isinstance(record["text"], str):
            raise ProbekitError(f"{where}: 'text' must be a string")
        return Prompt(pid, text=record["text"])
    raise ProbekitError(f"{where}: id '{pid}' has neither 'messages' nor 'text'")


def _check_messages(messages: object, where: str) -> tuple[dict[str, str], ...]:
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
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)


def encode(model: LoadedModel, prompt: Prompt, prefill: str = "") -> list[int]:
    """Token ids of a rendered prompt, refusing prompts that do not fit the model's context.

    Chat prompts carry their special tokens from the template; raw text gets whatever the
    tokenizer adds by default (a BOS token for most base models)."""
    where = f"id '{prompt.id}'"
    text = prompt.render(model, prefill)
    ids = model.tokenizer.encode(text, add_special_tokens=prompt.messages is None)
    if len(ids) + 8 > model.context_length:
        raise ProbekitError(
            f"{where}: prompt has {len(ids)} tokens, longer than the model's context "
            f"({model.context_length}) minus room for the answer"
        )
    return ids
