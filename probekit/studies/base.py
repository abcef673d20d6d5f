"""What every study provides, and the registry that the command line reads.

A `Probe` is one study configuration whose items can be enumerated in a fixed order: which
answers count, how a generated response is parsed, and what defines it (for the run manifest).
A `Study` is a folder under `probekit/studies/` that builds probes from its command-line options,
summarises a finished run (metrics, figures, summary), and, for the mechanism commands, builds
items and counterfactual (clean, corrupt) pairs. Scoring, batching, sharding, resuming and
writing results are the run loop's job (`probekit.run`), shared by all studies.
"""

from __future__ import annotations

import argparse
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.answers import AnswerSet
from probekit.errors import ProbekitError
from probekit.items import EncodedItem, Item, Pair

MODES = ("ev", "generate")  # exact scores from the logits; greedy generation + parse (+ exact)
Say = Callable[..., None]


def check_mode(mode: str, modes: Sequence[str] = MODES) -> str:
    """`mode` if it is one of `modes`; else one line naming the choices."""
    if mode not in modes:
        raise ProbekitError(f"unknown mode '{mode}'; choose one of {', '.join(modes)}")
    return mode


class Probe(ABC):
    """One study configuration: its items in a fixed order, its answer set and parse rule."""

    name: str
    answers: AnswerSet
    key_columns: tuple[str, ...]  # the columns identifying a prompt in the results table
    max_new_tokens: int = 16  # generation budget in generate mode
    temperature: float = 0.0  # generate mode: 0 decodes greedily, > 0 samples (seeded by --seed)
    subdir: str = ""  # where its run goes when a study runs several probes at once
    as_string: bool = False  # tokenize rendered chat prompts as strings (`encode_item`)

    @abstractmethod
    def items(self) -> Iterator[Item]:
        """Every item, always in the same order."""

    @abstractmethod
    def parse(self, response: str) -> Any:
        """The answer extracted from a generated response (generate mode)."""

    def settled(self, response: str) -> bool:
        """True once no further generated text can change `parse(response)`, so that generate
        mode may stop this row before its budget (end of sequence always stops it)."""
        return False

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """What defines this probe's prompts, recorded in the run manifest."""

    def manifest(self) -> dict[str, Any]:
        """Extra manifest fields (data origin and checksum, study options)."""
        return {}

    def __len__(self) -> int:
        return sum(1 for _ in self.items())


class Study(ABC):
    """A registered study: options, probes, report, and the pairs the mechanism commands use."""

    name: str
    title: str  # one line for `probekit studies`
    modes: tuple[str, ...] = MODES
    default_out: str = "runs/study"
    unit_name: str = "unit"  # what an item's unit is (event, question), in reports

    @abstractmethod
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The study's own options of `probekit run/patch/capture STUDY`."""

    @abstractmethod
    def probes(self, args: argparse.Namespace, say: Say) -> list[Probe]:
        """The probes one `run` covers (several write to `OUT/<probe.subdir>`)."""

    def after_run(
        self, probe: Probe, model: Any, scores: pd.DataFrame, run_dir: Path,
        manifest: dict[str, Any],
    ) -> None:  # fmt: skip
        """Extra work on a finished run that needs the loaded model (e.g. free responses), done
        by `probekit run` before `report`; nothing by default."""
        return None

    @abstractmethod
    def report(self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]) -> list[dict]:
        """Metrics and figures of one finished run in `run_dir`: one summary row per view."""

    @abstractmethod
    def write_summary(self, rows: list[dict[str, Any]], out: Path) -> str:
        """Write `summary.csv` and `summary.md` in `out`; return the Markdown."""

    def add_mechanism_arguments(self, parser: argparse.ArgumentParser, default_events: int) -> None:
        """The study's own options of `probekit capture/patch STUDY` (which items to use)."""
        return None

    def mechanism_items(
        self, args: argparse.Namespace, say: Say, purpose: str
    ) -> tuple[Probe, list[Item]]:
        """The probe and items the mechanism commands work on (`purpose`: capture or patch)."""
        raise ProbekitError(f"the study '{self.name}' does not support capture or patching yet")

    def pairs(self, probe: Probe, encoded: Sequence[EncodedItem]) -> list[Pair]:
        """Counterfactual (clean, corrupt) pairs on the same unit, built by the study."""
        raise ProbekitError(f"the study '{self.name}' builds no patching pairs")

    def mechanism_defaults(self) -> dict[str, Any]:
        """Defaults of the mechanism commands: `spans` to patch and the `metric` spec (or a
        function (probe, encoded prompts, their exact results) -> spec, whose docstring's first
        sentence names it in --help, for a study without a direction); for the
        difference-of-means direction, if the study has one: `direction_span`,
        `direction_contrast(probe)` (a prompt -> bool function), `direction_centre` (the key
        columns a prompt's gap is centred within) and `direction_statistic(probe)` (a
        (frame, value column) -> number function, e.g. the empathy gap)."""
        return {}


_REGISTRY: dict[str, Study] = {}


def register(study: Study) -> Study:
    """Make `study` available to `probekit studies/run/patch/capture/report`."""
    _REGISTRY[study.name] = study
    return study


def get_study(name: str) -> Study:
    """The registered study `name`; an unknown name lists the known ones."""
    _load_studies()
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise ProbekitError(f"unknown study {name!r}; known studies: {known}")
    return _REGISTRY[name]


def list_studies() -> list[Study]:
    """Every registered study, by name."""
    _load_studies()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


@functools.cache
def _load_studies() -> None:
    """Import every study folder once; each registers itself on import."""
    import importlib
    import pkgutil

    import probekit.studies as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg:
            importlib.import_module(f"{package.__name__}.{info.name}")
