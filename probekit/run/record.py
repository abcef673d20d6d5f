"""What every manifest records of the model and of the probekit that wrote it: the model's
fields (as asked before it loads, as loaded after: `model_fields`), the package versions and the
probekit commit (`provenance`), so that a run, a patching run, a capture, a steering run and a
lens run each say what made their numbers."""

from __future__ import annotations

import functools
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import probekit
from probekit.core.rundir import device_kind
from probekit.engines.base import Engine
from probekit.engines.options import ModelOptions

PACKAGES = ("probekit", "torch", "transformers", "transformer-lens", "nnsight", "numpy", "pandas")
LOADED = (
    "model",
    "weights",
    "model_source",
    "dtype",
    "device",
    "device_map",
    "columns",
    "vllm_parallel",
    "tier",
    "layers",
    "d_model",
    "chat_template",
)
"""Manifest fields that only the loaded model may give (None before it loads: not compared)."""


def model_fields(asked: ModelOptions, model: Engine | None, own: bool = False) -> dict[str, Any]:
    """The manifest's model fields: from the loaded `model`, else (None) as `asked`, the fields
    only loading gives None. `own`: the model was given loaded, so its tolerance is its own."""
    described = model.describe() if model is not None else {}
    record = described.get("precision") or {}
    if model is not None:
        tolerance = record.get("tolerance")
    else:
        tolerance = None if own else asked.tolerance_asked
    return {
        "model": asked.model,
        "model_source": described.get("model_source"),
        "weights": described.get("weights"),
        "dtype": described.get("dtype", asked.dtype),
        "device": device_kind(described.get("device", asked.device)),
        "device_map": described.get("device_map"),
        "precision": described.get("precision"),
        "tolerance": tolerance,
        "tier": record.get("tier"),
        "engine": described.get("engine", asked.engine),
        **{k: described[k] for k in ("n_layers", "columns", "vllm_parallel") if k in described},
        **chat_template_field(asked, described),
    }


def chat_template_field(asked: ModelOptions, described: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `chat_template` (what was given and its SHA-256) where the model renders
    its prompts with the one given: known once loaded (None before: a model with a template of
    its own keeps it)."""
    if "chat_template" in described:
        return {"chat_template": described["chat_template"]}
    return {"chat_template": None} if asked.chat_template and not described else {}


def provenance(command: str) -> dict[str, Any]:
    """The manifest's record of what wrote it: the `command` (or call), the package versions
    and the probekit commit."""
    return {"versions": versions(), "commit": commit(), "command": command}


def as_read(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` as it reads back from its file (tuples as lists, paths as text)."""
    return json.loads(json.dumps(manifest, default=str))


@functools.cache
def versions() -> dict[str, str]:
    """The installed versions of probekit and the libraries its numbers depend on."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


@functools.cache
def commit(source: Path | None = None) -> str:
    """The commit of the probekit source in use (`git rev-parse HEAD` of its checkout, read
    from `.git` without running git), or "unknown" where it is not a git checkout."""
    root = source or Path(probekit.__file__).resolve().parent.parent
    try:
        git = root / ".git"
        if git.is_file():  # a worktree: `gitdir: <its folder>`
            git = (root / git.read_text().split(":", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head  # a detached HEAD
        ref = head.split(":", 1)[1].strip()
        common = git / "commondir"
        shared = (git / common.read_text().strip()).resolve() if common.is_file() else git
        for folder in (git, shared):
            if (folder / ref).is_file():
                return (folder / ref).read_text().strip()
        for line in (shared / "packed-refs").read_text().splitlines():
            if line.endswith(f" {ref}"):
                return line.split()[0]
    except (OSError, IndexError):
        pass
    return "unknown"
