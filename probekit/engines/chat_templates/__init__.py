"""Chat templates probekit ships for checkpoints without one of their own (`gemma`: Gemma's turns,
for Gemma 3 270M base as a GGUF), and the one reader of `--chat-template` / `chat_template=`,
used by a model without a template of its own only (`--model A --model B` may mix the two): a
shipped name or a Jinja file, recorded in the manifest by its SHA-256 so that a run states the
turns its prompts were rendered in (and a resume with other turns is refused)."""

from __future__ import annotations

import hashlib
from importlib.resources import files
from pathlib import Path
from typing import Any

import jinja2

from probekit.core.errors import ProbekitError


def shipped() -> list[str]:
    """The names of the templates shipped with probekit."""
    folder = files(__name__)
    return sorted(
        p.name.removesuffix(".jinja") for p in folder.iterdir() if p.name.endswith(".jinja")
    )


def chat_template_text(spec: Any) -> tuple[str, dict[str, str]]:
    """The Jinja text of chat template `spec` (a shipped name or a file) and its manifest record
    (`given`, `sha256`); one line for neither, or for a template Jinja cannot parse."""
    spec = str(spec)
    own = files(__name__).joinpath(f"{spec}.jinja")
    path = Path(spec).expanduser()
    if own.is_file():
        text = own.read_text(encoding="utf-8")
    elif path.is_file():
        text = path.read_text(encoding="utf-8")
    else:
        raise ProbekitError(
            f"chat template '{spec}' is neither a file nor one shipped with probekit "
            f"({', '.join(shipped())}); give a Jinja file"
        )
    try:  # parsed as transformers renders it, so that a broken template is refused before work
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ProbekitError(
            f"chat template '{spec}' is not a Jinja template: {exc.message} (line {exc.lineno})"
        ) from None
    return text, {"given": spec, "sha256": hashlib.sha256(text.encode()).hexdigest()}


def check_chat_template(spec: Any) -> str:
    """`spec` once it reads as a chat template (the option's check, before any work)."""
    chat_template_text(spec)
    return str(spec)
