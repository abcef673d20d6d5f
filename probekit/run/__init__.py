"""Running probekit's commands: one runner for every command (`probekit.run.command`; each
command a module: `study` runs a study, `patch`, `capture`, `steer` and `lens` trace it inside
the model, `report` reports finished runs again, `plain` holds those without a study; `command`
also holds what every manifest records), the resumable run loop (`loop`, with its shards and
options; one loop for one process and Ray: `scoring`, `ray`), the run folder's parts, and the
time a run takes (`scoring`).

`COMMANDS` is the registry the command line reads: a command's name, where its runner is and
its one line of help (a new command is one module and one line here)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Entry:
    """A command in the registry: its runner (`module:NAME`), its help, whether it takes a
    study (`probekit NAME STUDY`)."""

    target: str
    help: str
    study: bool = False


COMMANDS = {
    "studies": Entry("probekit.run.plain:STUDIES", "list the registered studies, one line each"),
    "run": Entry(
        "probekit.run.study:RUN",
        "run a study: exact scores or generation, resumable, then its report",
        study=True,
    ),
    "patch": Entry(
        "probekit.run.patch:PATCH",
        "activation patching of a study's counterfactual pairs, and its direction",
        study=True,
    ),
    "capture": Entry(
        "probekit.run.capture:CAPTURE",
        "activations at the spans of a study's prompts, to safetensors + parquet",
        study=True,
    ),
    "steer": Entry(
        "probekit.run.steer:STEER",
        "a study's headline with α x a vector added while scoring, beside a random control",
        study=True,
    ),
    "lens": Entry(
        "probekit.run.lens:LENS",
        "a study's headlines read after each layer (the logit lens on the exact readout)",
        study=True,
    ),
    "report": Entry(
        "probekit.run.report:REPORT",
        "re-write a run's summary and figures from its results; several folders (e.g. one per "
        "model) are summarised together",
    ),
    "score": Entry(
        "probekit.run.plain:SCORE",
        "score prompts against a finite answer set from the logits (no sampling)",
    ),
    "setup": Entry(
        "probekit.run.plain:SETUP",
        "convert the default model once and cache it (later loads take seconds)",
    ),
    "plan": Entry(
        "probekit.run.plain:PLAN",
        "the memory plan of a model on some devices (weights, KV cache, batch, placement)",
    ),
}


def runner(name: str) -> Any:
    """The runner of the command `name` (`probekit.run.command.Runner`; its module imported on
    use)."""
    module, _, found = COMMANDS[name].target.partition(":")
    return getattr(importlib.import_module(module), found)
