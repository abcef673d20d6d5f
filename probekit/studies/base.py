"""The study contract, and the registry that the command line reads.

A `Probe` is one study configuration whose items can be enumerated in a fixed order: which
answers count, how a generated response is parsed, and what defines it (for the run manifest).
A `Study` is a folder under `probekit/studies/` that declares its options once (`options`: a
dataclass of `probekit.core.options.option` fields, used by `probekit run`, `patch`, `capture`,
`steer`, `lens` and their functions), its data (`dataset`), and implements what every command needs:
`probes` (from its options), `report_view` (one view of scored rows: metrics, figures, summary
rows) with `headlines` (the numbers of those rows, one primary), and `mechanism_defaults` (its
`Contrast`: the two sides of its gap, and the patch defaults). From these the core gives every
command on every study: `headline` (the primary number of any set of scored rows: what `probekit
steer` reports per α; `probekit lens` reports every headline of each layer's rows),
`mechanism_items` (the probe's items) and `pairs` (each first-side prompt against each
other-side prompt of its unit), which a study may refine. Its methods receive its
options as typed values
and a `Context` (the command, the seed, the view, how options are named to the user). The core
does the rest: parsing and validating options before any work (`check` for those that span
several), finding the data and filling the manifest's data fields (`data_source`), the loop over
a run's views (`report`), the summary files (`write_summary`, one `Summary`); scoring, batching,
sharding, resuming and writing results are the run loop's job (`probekit.run.loop`).

A `Study` is also what the report pages read (`probekit.reporting.contract.StudyReport`):
`headlines(table, manifest)`, `captions` and `view_facts(table, run)` (read from the `report`
module beside the study's, `report_module`), `card()` and `describe_data(manifest)`.

Study modules import no model library at module level: listing the studies and `--help` load
only their light metadata (name, title, options).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import inspect
import sys
from abc import abstractmethod
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib.resources import files
from itertools import accumulate, zip_longest
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.answers import AnswerSet
from probekit.core.errors import Contract, ProbekitError
from probekit.core.items import EncodedItem, Item, Pair
from probekit.core.kinds import path
from probekit.core.kinds import text as text_kind
from probekit.core.options import declaration, given, named, option, options_of, spoken
from probekit.core.progress import echo
from probekit.core.public import public
from probekit.core.shared_options import FIRST_UNITS
from probekit.datasets.locate import Dataset, DataSource
from probekit.mechanism.defaults import MechanismDefaults
from probekit.reporting.contract import SAMPLE_DATA, RunFacts, StudyCard, is_sample_data
from probekit.reporting.headline import INTERVAL_NOTE, Headline, ViewFacts
from probekit.reporting.latex import markdown_table, write_csv
from probekit.studies.report import ReportView

VIEWS = ("exact", "generate", "explain")
"""Every view a run can be in: `exact` (the scores from the logits), `generate` (greedy
generation and the study's parse, exact scores beside them), `explain` (generate up to the
probe's answer cue, then read the answer distribution there exactly)."""
RUN = ("run",)
MECHANISM = ("patch", "capture", "steer", "lens")
COMMANDS = (*RUN, *MECHANISM)
"""The commands that take a study's options (`option(..., commands=RUN)`: `run` only)."""
Say = Callable[..., None]


def data_option(holding: str) -> Any:
    """The `--data ROOT` option of a study whose data root holds `holding` (a folder)."""
    return option(None, help=f"data root holding {holding}", kind=path, metavar="ROOT")


def run_option(default: Any, help: str, kind: Any = text_kind) -> Any:
    """An option that only `probekit run` takes (a switch when `default` is a bool)."""
    kinds = {} if isinstance(default, bool) else {"kind": kind}
    return option(default, help=help, commands=RUN, **kinds)


def run_help(run: str, mechanism: str) -> dict[str, str]:
    """An option's help on `probekit run` and on the mechanism commands."""
    return {"run": run, "": mechanism}


def check_view(view: str, views: Sequence[str] = VIEWS) -> str:
    """`view` if it is one of `views`, else one line naming the choices."""
    if view not in views:
        raise ProbekitError(f"unknown view '{view}'; choose one of {', '.join(views)}")
    return view


@dataclass(frozen=True)
class Context:
    """What a study's methods read besides its own options: the `command` they serve (run,
    patch, capture, steer or lens), the `seed`, the `view` (a run's; the mechanism commands read
    the exact view), the `device` asked for, where to say what happens and a mechanism
    command's `limit` (`Study.mechanism_slice`). (A refusal names an option with
    `probekit.core.options.named`: `--events` on the command line, `events` from Python.)"""

    command: str
    seed: int = 0
    view: str = "exact"
    device: str | None = None
    say: Say = echo
    limit: int | None = None


@dataclass(frozen=True)
class NoOptions:
    """Study options: none."""


@dataclass(frozen=True)
class Summary:
    """What `write_summary` wrote: `summary.csv` as a table and `summary.md` as text."""

    table: pd.DataFrame
    markdown: str


class Probe(Contract):
    """One study configuration: its items in a fixed order, its answer set and parse rule.

    A smoke run (`--limit N`) keeps whole units (`Item.unit`: an event, an item, a sample) so
    that every group the statistics compare (perceivers, genders, prompt types) stays in it:
    `limited(N)` takes units in turn from each `unit_group` (e.g. an event's emotion) while
    their prompts fit in N, and refuses, before any scoring, a limit that fits no whole unit.
    Fewer than `min_units` units run, their headline marked with no interval
    (`interval_fields`)."""

    name: str
    answers: AnswerSet
    key_columns: tuple[str, ...]  # the columns identifying a prompt in the results table
    max_new_tokens: int = 16  # generation budget in generate mode
    temperature: float = 0.0  # generate mode: 0 decodes greedily, > 0 samples (seeded by --seed)
    subdir: str = ""  # where its run goes when a study runs several probes at once
    as_string: bool = False  # tokenize rendered chat prompts as strings (`encode_item`)
    answer_cue: str | None = None  # explain view: the text after which the answer is read
    unit_name: str = "unit"  # what a unit is (event, item, sample), in messages
    min_units: int = 2  # the fewest units the headline's interval needs (an interval: two)
    group_name: str = ""  # what `unit_group` is (emotion, category), in messages

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

    def add_columns(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Columns derived from finished rows of the results table (e.g. GIEBench's
        `p_correct`), added by the run loop before the rows are written; none by default."""
        return frame

    def __len__(self) -> int:
        return sum(1 for _ in self.items())

    def unit_group(self, item: Item) -> Hashable:
        """The group a limited run takes units from in turn (an event's emotion, an item's
        category), so that a few units still cover the study's range; one group by default."""

    def unit_prompts(self) -> str:
        """What one unit's prompts are, for messages (`36 perceiver × experiencer pairs`)."""
        return "its prompts"

    @property
    def whole(self) -> Probe:
        """The probe before any `limited` (itself)."""
        return self

    def interval_fields(self, items: Iterable[Item]) -> dict[str, str]:
        """`{"interval_note": "no interval: N < M <unit>s"}` when `items` (a run's or a
        mechanism command's) cover fewer units than the interval of the study's headline needs
        (`min_units`: an interval over units needs two); else nothing. A run that small still
        scores and reports; its report manifest carries the note, and the study's report empties
        its intervals and says why (`Study.without_interval`)."""
        count = len({item.unit for item in items})
        if count >= self.min_units:
            return {}
        return {INTERVAL_NOTE: f"no interval: {count} < {self.min_units} {self.unit_name}s"}

    def balanced(self) -> tuple[list[str], dict[str, int], int]:
        """Its units in the order a limited run takes them (in turn from each `unit_group`,
        each group in the probe's order), each unit's prompt count, and the number of groups."""
        sizes: dict[str, int] = {}
        groups: dict[Hashable, list[str]] = {}
        for item in self.items():
            if item.unit not in sizes:
                groups.setdefault(self.unit_group(item), []).append(item.unit)
            sizes[item.unit] = sizes.get(item.unit, 0) + 1
        return interleaved(groups.values()), sizes, len(groups)

    def unit_items(self, units: Collection[str]) -> Iterator[Item]:
        """The items of `units`, in the probe's order (`limited`'s); a probe that can make only
        those items overrides it, so that a small slice of a large probe stays cheap."""
        kept = set(units)
        return (item for item in self.items() if item.unit in kept)

    def limited(self, limit: int) -> Probe:
        """This probe on the whole units whose prompts fit in `limit`, taken in turn from each
        `unit_group` in the probe's order (the probe itself when all fit). A limit that fits no
        whole unit is refused with the smallest limit that works (a ProbekitError, before any
        scoring)."""
        order, sizes, groups = self.balanced()
        if limit >= sum(sizes.values()):
            return self
        counts = list(accumulate(sizes[unit] for unit in order))
        kept = sum(1 for count in counts if count <= limit)
        if not kept:
            raise ProbekitError(
                f"{given('limit', limit)} is too small for {self.name}: the smallest balanced "
                f"run is {counts[0]} prompts (1 {self.unit_name}, with {self.unit_prompts()})"
            )
        chosen = set(order[:kept])
        in_order = [unit for unit in sizes if unit in chosen]
        return LimitedProbe(self, in_order, len(sizes), groups, counts[kept - 1])


class LimitedProbe:
    """A probe's prompts on some of its whole units (`Probe.limited`), in the probe's order;
    everything else is the probe's (a `Probe` by registration). `config()` records the units
    kept, so that the manifest says which ones; limiting it again limits its own units."""

    def __init__(
        self, probe: Probe, units: Sequence[str], units_total: int, groups: int, size: int
    ) -> None:
        self.probe, self.units = probe, tuple(units)
        self.units_total, self.groups, self._size = units_total, groups, size

    balanced, limited = Probe.balanced, Probe.limited

    @property
    def whole(self) -> Probe:
        return self.probe

    def items(self) -> Iterator[Item]:
        return self.probe.unit_items(self.units)

    def config(self) -> dict[str, Any]:
        names = ("units_total", "unit_name", "groups", "group_name")
        limit = {"units": list(self.units), **{name: getattr(self, name) for name in names}}
        return {**self.probe.config(), "limit": limit}

    def __len__(self) -> int:
        return self._size

    def __getattr__(self, name: str) -> Any:  # the rest is the probe's (a study's contrast too)
        if "probe" not in self.__dict__:  # not made yet (a copy, a pickle)
            raise AttributeError(name)
        return getattr(self.__dict__["probe"], name)


Probe.register(LimitedProbe)


class Study(Contract):
    """A study: options, probes, the report of a view with its headlines, and its contrast.
    Every command (`run`, `patch`, `capture`, `steer`, `lens`, `report`) works on every study from
    these abstract methods; the rest has defaults."""

    name: str
    title: str  # one line for `probekit studies`
    run_views: tuple[str, ...] = VIEWS[:2]  # the views `probekit run` takes
    default_seed: int = 0  # the default of --seed (items and statistics)
    unit_name: str = "unit"  # what an item's unit is (event, question), in reports
    options: type = NoOptions  # the study's own options (a dataclass of `option` fields)
    dataset: Dataset | None = None  # the data found by `data_source` from --data
    interval_columns: tuple[str, ...] = ("low", "high")  # summary cells of a headline interval
    pair_within: tuple[str, ...] = ()  # item keys the two prompts of a pair share (`pairs`)

    @property
    def default_out(self) -> str:
        """Where a run writes without `--out`: `runs/<name>`."""
        return f"runs/{self.name}"

    def check(self, options: Any, context: Context) -> None:
        """Refuse options that are valid one by one but not together (a ProbekitError naming
        them with `probekit.core.options.named`), before any data is read; nothing by
        default."""

    def data_source(self, root: str | Path | None, say: Say) -> DataSource:
        """The study's `dataset` found from `root` (its `--data`), saying where it came from
        (and loudly when the probekit-written sample stands in); `dataset.manifest(source)`
        gives its fields."""
        if self.dataset is None:
            raise ProbekitError(f"the study '{self.name}' declares no dataset")
        return self.dataset.find(root, say)

    @abstractmethod
    def probes(self, options: Any, context: Context) -> list[Probe]:
        """The probes one `run` covers (several write to `OUT/<probe.subdir>`)."""

    def after_run(
        self, probe: Probe, model: Any, scores: pd.DataFrame, run_dir: Path, manifest: dict
    ) -> None:
        """Extra work on a finished run that needs the loaded model (e.g. free responses), done
        by `probekit run` before `report`; nothing by default."""

    def views(self, view: str) -> list[str]:
        """The views a run in `view` reports: a generate run records the exact scores too, so
        it reports both (its own first)."""
        return [view, "exact"] if view == "generate" else [view]

    def report(self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]) -> list[dict]:
        """Metrics and figures of one finished run in `run_dir`: `report_view` of every view,
        the run's own view unsuffixed, the others' files suffixed `_<view>`."""
        own = run_view(manifest)
        return [
            row
            for view in self.views(own)
            for row in self.report_view(scores, run_dir, manifest, view, f"_{view}" * (view != own))
        ]

    def report_module(self) -> Any:
        """The `report` module beside the study's own (None for a study in a single module),
        imported on first use so that listing the studies stays light: its `report_view(scores,
        view)` (`view` a `ReportView`), `headlines(table, manifest)`, `summary_markdown(table)`,
        `view_facts(table, run)` and its figures' `CAPTIONS`. A study without one overrides
        `report_view` and `headlines`."""
        package = type(self).__module__.rpartition(".")[0]
        if not package or importlib.util.find_spec(f"{package}.report") is None:
            return None
        return importlib.import_module(f"{package}.report")

    @property
    def captions(self) -> Mapping[str, str]:
        """Figure file name -> caption on the report pages (the report module's `CAPTIONS`)."""
        return getattr(self.report_module(), "CAPTIONS", {})

    def report_view(
        self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any], view: str, suffix: str
    ) -> list[dict]:
        """Metrics and figures of one view of scored rows (files in `run_dir` named with
        `suffix`): its summary rows. The rows may be a run's or any other set of the probe's
        scored prompts (`probekit steer`'s rows at one α), with `manifest` the probe's."""
        reported = ReportView(run_dir, manifest, view, suffix, self.describe_data(manifest))
        return self.report_module().report_view(scores, reported)

    def headline(self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]) -> Headline:
        """The study's primary headline on scored rows of the exact view (`report_view` into
        `run_dir`, then `headlines`): the one number, with its interval, that `probekit steer`
        reports at each α."""
        viewed = self.report_view(scores, run_dir, manifest, VIEWS[0], "")
        rows = pd.DataFrame(self.without_interval(viewed, manifest))
        found = self.headlines(rows, manifest)
        if not found:
            raise ProbekitError(f"the study '{self.name}' gives no headline for these rows")
        return next((h for h in found if h.primary), found[0])

    def summary_rows(
        self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]
    ) -> list[dict]:
        """`report`'s rows of one run, each with `data` after its model: the data the run read
        as `describe_data` says it, so that `summary.csv` tells probekit's sample apart. What
        `probekit run` and `probekit report` write; the run's manifest then names
        each figure's data files (`figures`)."""
        from probekit.core.rundir import RunDir
        from probekit.reporting.figures import figure_data

        data = self.describe_data(manifest)
        reported = self.report(scores, run_dir, manifest)
        RunDir(run_dir).update_manifest(figures=figure_data(run_dir))
        rows = []
        for row in self.without_interval(reported, manifest):
            items = list(row.items())  # `data` after `model`, or last
            at = list(row).index("model") + 1 if "model" in row else len(items)
            rows.append(dict([*items[:at], ("data", data), *items[at:]]))
        return rows

    def without_interval(self, rows: list[dict], manifest: Mapping[str, Any]) -> list[dict]:
        """`rows` of a run too small for its headline's interval (the manifest's
        `interval_note`) with their `interval_columns` emptied (NaN) and the note beside them;
        `rows` themselves otherwise."""
        note = manifest.get(INTERVAL_NOTE)
        if not note:
            return rows
        empty = dict.fromkeys(self.interval_columns, float("nan"))
        return [
            {**row, **{k: v for k, v in empty.items() if k in row}, INTERVAL_NOTE: note}
            for row in rows
        ]

    def write_summary(
        self, rows: Sequence[dict[str, Any]], out: Path, runs: Sequence[Path] | None = None
    ) -> Summary:
        """Write `summary.csv` (the rows), `summary.md` (`summary_markdown`, then the sections
        every study shares about `runs`: numeric noise, weak signal) and the study's other
        tables (`write_tables`) in `out`; `runs`: the run folders the rows come from (default:
        every finished run under `out`). The one writer of the summary files: nothing is written
        unless all of it could be made."""
        from probekit.core.io import write_text
        from probekit.core.rundir import RunDir
        from probekit.reporting.html import find_runs
        from probekit.reporting.latex import write_latex
        from probekit.reporting.methods import write_methods
        from probekit.reporting.summary import SAMPLE_LINE, run_name, run_sections

        table = self.summary_table(rows)
        markdown = self.summary_markdown(table)
        if "data" in table and any(is_sample_data(d) for d in table["data"]):
            markdown = SAMPLE_LINE + "\n\n" + markdown
        folders = list(runs) if runs is not None else find_runs(out)
        sections = run_sections(folders, out)
        if sections:
            markdown = markdown.rstrip("\n") + "\n\n" + sections + "\n"
        tables = {"summary": (table, markdown), **self.summary_tables(table)}
        manifests = {run_name(f, out): RunDir(f).read_manifest() or {} for f in folders}
        keys = [k for k in ("model", "run") if k in table]  # the first run's rows
        first = table[(table[keys] == table[keys].iloc[0]).all(axis=1)] if len(table) else table
        headlines = self.headlines(first, next(iter(manifests.values()), {}))
        units = sorted({h.unit for h in headlines if h.unit})
        out.mkdir(parents=True, exist_ok=True)
        for name, (frame, text) in tables.items():
            write_csv(out / f"{name}.csv", frame)
            write_text(out / f"{name}.md", text)
            write_latex(out / f"{name}.tex", frame, f"{self.title}: {name}", units)
        data = {name: self.describe_data(m) for name, m in manifests.items()}
        write_methods(out, self.title, manifests, data, headlines)
        return Summary(table, markdown)

    def summary_table(self, rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
        """`summary.csv` as a table: the rows as they are by default."""
        return pd.DataFrame(list(rows))

    def summary_markdown(self, table: pd.DataFrame) -> str:
        """`summary.md`: the report module's, else the title and the summary table."""
        if self.report_module() is not None:
            return self.report_module().summary_markdown(table)
        cells = [[f"{v:.4g}" if isinstance(v, float) else v for v in row] for row in table.values]
        return f"# {self.title}\n\n{markdown_table(table.columns, cells)}\n"

    def summary_tables(self, table: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, str]]:
        """Further tables beside the summary (name -> (csv table, Markdown)), e.g. a paper's own
        tables with the models side by side; none by default."""
        return {}

    # The report pages (probekit.reporting.contract.StudyReport)

    def card(self) -> StudyCard:
        """The study card: `README.md` beside the study's module (the module's docstring for a
        study in a single module), its `**What it measures.**` and `**Source.**` paragraphs."""
        module = type(self).__module__
        package = module.rpartition(".")[0]
        readme = files(package).joinpath("README.md") if package else None
        if readme is not None and readme.is_file():
            text = readme.read_text(encoding="utf-8")
        else:
            text = inspect.cleandoc(getattr(sys.modules.get(module), "__doc__", None) or "")
        paragraphs = [p.strip() for p in text.split("\n\n")]
        what, source = (
            next((p for p in paragraphs if p.startswith(start)), "")
            for start in ("**What it measures.**", "**Source.**")
        )
        what = what or ("" if package else paragraphs[0])
        return StudyCard(self.name, self.title, what, source, text)

    def headlines(self, table: pd.DataFrame, manifest: Mapping[str, Any]) -> list[Headline]:
        """The headline numbers of one run from its summary rows (`report_view`'s), the one that
        stands for the study marked `primary` (`headline`, `Run.headline`): the report module's,
        each with the rows' `interval_note` (a run too small for an interval) before its own
        note. `row_headlines` (`probekit.reporting.headline`) makes one per row."""
        found = self.report_module().headlines(table, dict(manifest))
        notes = table.get(INTERVAL_NOTE, pd.Series(dtype=object)).dropna()
        if not len(notes):
            return found
        note = str(notes.iloc[0])
        return [replace(h, note="; ".join(filter(None, (note, h.note)))) for h in found]

    def view_facts(self, table: pd.DataFrame, run: RunFacts) -> list[ViewFacts]:
        """The views of one run (valid mass, answers read, agreement): the report module's; with
        none the page shows the run's own view with its mean valid mass."""
        module = self.report_module()
        return [] if module is None else module.view_facts(table, run)

    def describe_data(self, manifest: Mapping[str, Any]) -> str:
        """The data a run read as a reader knows it: the data set's name and whether its files
        are the pinned ones (`data_verified` in the manifest), or probekit's own sample standing in
        for it."""
        origin = manifest.get("data_origin")
        if self.dataset is None:
            return str(origin or "—")
        name, digest = self.dataset.name, manifest.get("data_sha256")
        if origin == "sample" or (digest and digest == _sample_sha256(self.dataset)):
            return f"{SAMPLE_DATA}, not {name}"
        verified = manifest.get("data_verified")
        if verified is True:
            return f"{name}, SHA-256 verified"
        if verified is False:
            return f"{name}, NOT the pinned files (their SHA-256 differs)"
        return f"{name} (SHA-256 {str(digest)[:12]}…, no pinned sum to check it against)"

    def mechanism_items(self, options: Any, context: Context) -> tuple[Probe, list[Item]]:
        """The probe and items the mechanism command `context.command` works on: by default the
        study's one probe (`probes`) and the items of its slice (`mechanism_slice`)."""
        probes = self.probes(options, context)
        if len(probes) != 1:
            raise ProbekitError(
                f"{context.command} works on one probe; the options give the study "
                f"'{self.name}' {len(probes)}"
            )
        probe = mechanism_slice(probes[0], context)
        return probe, list(probe.items())

    def pairs(self, probe: Probe, encoded: Sequence[EncodedItem]) -> list[Pair]:
        """Counterfactual (clean, corrupt) pairs: by default, within each unit (and value of the
        `pair_within` keys), every prompt on the first side of the study's contrast with every
        prompt on the other side."""
        side = self.mechanism_defaults().contrast.side(probe)

        def group(prompt: EncodedItem) -> tuple:
            return (prompt.item.unit, *(prompt.item.key[k] for k in self.pair_within))

        first: dict[tuple, list[EncodedItem]] = {}
        for prompt in encoded:
            if side(prompt):
                first.setdefault(group(prompt), []).append(prompt)
        return [
            (clean, prompt)
            for prompt in encoded
            if not side(prompt)
            for clean in first.get(group(prompt), [])
        ]

    @abstractmethod
    def mechanism_defaults(self) -> MechanismDefaults:
        """The study's contrast and the mechanism commands' defaults (spans, readout,
        direction; see `probekit.mechanism.defaults`)."""


def interleaved(groups: Iterable[Sequence[str]]) -> list[str]:
    """The units of `groups` taken in turn from each group (a limited run's order)."""
    return [unit for turn in zip_longest(*groups) for unit in turn if unit is not None]


def mechanism_slice(probe: Probe, context: Context) -> Probe:
    """The slice of `probe` a mechanism command reads: the smallest balanced slice of
    `context.limit` prompts (`Probe.limited`), else of its command's `FIRST_UNITS` units."""
    if context.limit is not None:
        return probe.limited(context.limit)
    order, sizes, _ = probe.balanced()
    return probe.limited(sum(sizes[unit] for unit in order[: FIRST_UNITS[context.command]]))


def run_view(manifest: Mapping[str, Any]) -> str:
    """The view of the run a manifest describes."""
    return manifest.get("view", "exact")


@functools.cache
def _sample_sha256(dataset: Dataset) -> str | None:
    """The sha256 of the dataset's probekit-written sample (None without one)."""
    if dataset.sample is None or not all((dataset.sample / f).is_file() for f in dataset.files):
        return None
    return dataset.sha256(dataset.sample)


_REGISTRY: dict[str, Study] = {}


def register(study: Study) -> Study:
    """Make `study` available to `probekit studies/run/patch/capture/report`."""
    _REGISTRY[study.name] = study
    return study


@public()
def get_study(name: str) -> Study:
    """The registered study `name`; an unknown name is one line with the nearest study and the
    known ones."""
    _load_studies()
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        near = difflib.get_close_matches(str(name), list(_REGISTRY), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}? " if near else ""
        raise ProbekitError(f"unknown study {name!r}; {hint}the studies are {known}")
    return _REGISTRY[name]


def other_study_option(study: Study, command: str, name: str) -> str | None:
    """One line when `name` is an option of another study and not of `study` (`--category` to
    isear): whose it is, and the options `study` takes in `command`; None otherwise. What the
    study commands say of an option they do not take (`probekit.core.options.Command`)."""
    if any(field.name == name for field in options_of(study.options)):
        return None
    owners = [s.name for s in list_studies() if any(f.name == name for f in options_of(s.options))]
    if not owners:
        return None
    own = [named(f.name) for f in options_of(study.options) if declaration(f).takes(command)]
    takes = f"takes {', '.join(own)}" if own else "has no options of its own"
    return f"{named(name)} is an option of {spoken(owners)}; {study.name} {takes}"


@public()
def list_studies() -> list[Study]:
    """Every registered study, by name."""
    _load_studies()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


@functools.cache
def _load_studies() -> None:
    """Import every study folder once (found through importlib.resources, as installed); each
    registers itself on import."""
    for entry in sorted(files("probekit.studies").iterdir(), key=lambda e: e.name):
        if entry.is_dir() and entry.joinpath("__init__.py").is_file():
            importlib.import_module(f"probekit.studies.{entry.name}")
