"""`report.html`: one self-contained page per finished run, and one page across runs.

A run's page shows, from its folder (`manifest.json`, `summary.csv` or the summary rows given,
`scores.parquet`'s size and answer set, every `*.png`) and from its study (the `StudyReport`
contract of `probekit.reporting.contract`, passed in: reporting imports no study): the study
card, the real model and the data as a reader knows them, warnings at the top (probekit's sample
data, a weak signal, a tiny sample), the headline numbers with intervals and p-values, the views
with their valid mass and agreement, every figure (inline, base64 PNG) and the manifest. Every
scale is labelled from the run's own answer set. The page across runs draws each model's
headlines against each study's no-bias value, lists one model's studies together (its bias
profile) and puts several models of one study side by side; runs whose settings differ are shown
apart, with the fields that differ. Pages are rendered with jinja2 from the templates shipped
in `probekit/reporting/templates/`, read through importlib.resources; they load nothing from
the network, so they open from disk or as an attachment.
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
import pyarrow.parquet as pq
from markdown_it import MarkdownIt

from probekit.core.errors import ProbekitError
from probekit.core.io import write_text
from probekit.core.rundir import RunDir
from probekit.core.signal import WEAK_SIGNAL_VALID_MASS, weak_signal
from probekit.reporting.across import (
    KEYS,
    forest_panels,
    headline_table,
    primary_headlines,
    shown,
    write_across,
)
from probekit.reporting.contract import (
    TINY_SAMPLE_UNITS,
    NoStudy,
    RunFacts,
    StudyCard,
    StudyReport,
    describe_model,
    is_sample_data,
    run_answers,
)
from probekit.reporting.figures import headline_figure
from probekit.reporting.headline import (
    Headline,
    ViewFacts,
    format_interval,
    format_number,
    format_p,
    format_rate,
    missing,
)
from probekit.reporting.latex import paper_table
from probekit.reporting.summary import mean_valid_mass

PAGE = "report.html"
# Manifest fields that say which model ran, where and how, not what was measured: runs that
# differ only in these are comparable (models side by side).
MODEL_FIELDS = frozenset(
    ("model", "model_source", "weights", "versions", "command", "data_path", "results_format")
    + ("dtype", "device", "numerics", "engine", "started", "finished", "commit")
)
# Manifest fields shown first, in this order, with their names on the page.
SHOWN_FIELDS = {
    "study": "study",
    "model": "model",
    "model_source": "model source",
    "weights": "weight hash (sha256)",
    "data_origin": "data origin",
    "data_path": "data path",
    "data_sha256": "data hash (sha256)",
    "view": "view",
    "limit": "limit (a smoke run: whole units of every group)",
    "answers": "answers",
    "dtype": "dtype",
    "device": "device",
    "epsilon": "epsilon (pruning bound)",
    "seed": "seed",
    "max_new_tokens": "max new tokens",
    "temperature": "temperature",
    "command": "command",
    "commit": "probekit commit",
}
ROW_KEYS = ("model", *KEYS)  # a summary row's run, in order


@dataclass(frozen=True)
class Figure:
    """One PNG of a run folder, inlined as a data URI."""

    name: str
    caption: str
    uri: str


@dataclass(frozen=True, eq=False)
class RunPage(RunFacts):
    """Everything a page shows about one finished run: its facts, summary rows, study, headlines
    and views."""

    rows: pd.DataFrame = field(default_factory=pd.DataFrame)
    report: StudyReport = NoStudy("")
    headlines: list[Headline] = field(default_factory=list)
    views: list[ViewFacts] = field(default_factory=list)

    @property
    def study(self) -> str:
        return str(self.manifest.get("study") or self.manifest.get("probe", {}).get("study"))

    @property
    def model_text(self) -> str:
        """The model as a reader finds it (the default's hub id and file, never `default`)."""
        return describe_model(self.manifest)

    @property
    def data_text(self) -> str:
        """The data as a reader knows it (`crowd-enVent, SHA-256 verified`)."""
        return self.report.describe_data(self.manifest)

    @property
    def card(self) -> StudyCard:
        return self.report.card()

    @property
    def sample(self) -> bool:
        """True when the run used probekit's own sample data, not the study's data set."""
        return self.manifest.get("data_origin") == "sample" or is_sample_data(self.data_text)

    @property
    def prompts(self) -> int | None:
        path = RunDir(self.folder).scores_path
        return pq.ParquetFile(path).metadata.num_rows if path.is_file() else None

    @property
    def valid_mass(self) -> float | None:
        """The mean valid mass of the run's exact scores."""
        return mean_valid_mass(self.folder)

    @property
    def weak_signal(self) -> str | None:
        """One line when the mean valid mass is below `WEAK_SIGNAL_VALID_MASS`, else None."""
        return weak_signal(self.valid_mass)

    @property
    def tiny(self) -> int | None:
        """The fewest units any headline rests on, when that is below `TINY_SAMPLE_UNITS`."""
        counts = [h.n for h in self.headlines if h.n is not None]
        return min(counts) if counts and min(counts) < TINY_SAMPLE_UNITS else None

    @property
    def settings(self) -> dict[str, Any]:
        """What the run measured, less the model: equal settings make runs comparable."""
        probe = {f"probe.{k}": v for k, v in self.manifest.get("probe", {}).items()}
        top = {k: v for k, v in self.manifest.items() if k not in MODEL_FIELDS | {"probe"}}
        return {**top, **probe}

    @property
    def label(self) -> str:
        """The run's settings in a few words: category, setting, view (what a reader compares)."""
        words = [str(self.manifest[k]) for k in ("category", "setting") if k in self.manifest]
        if "prompt" in self.manifest:
            words.append(f"prompt {self.manifest['prompt']}")
        return ", ".join([*words, f"view {self.view}"])


def load_run(
    folder: str | Path, rows: pd.DataFrame | None = None, study: StudyReport | None = None
) -> RunPage:
    """The run in `folder` with its summary rows (`rows`, else the folder's `summary.csv`, else
    none), its headlines and views as its `study` defines them (none without a study)."""
    folder = Path(folder)
    manifest = RunDir(folder).manifest
    rows = rows if rows is not None else RunDir(folder).summary()
    rows = pd.DataFrame() if rows is None else rows
    page = RunPage(folder, manifest, run_answers(folder, manifest), rows)
    report = study or NoStudy(page.study)
    if not len(rows):
        return replace(page, report=report)
    found = {"headlines": report.headlines(rows, manifest), "views": report.view_facts(rows, page)}
    return replace(page, report=report, **found)


def rows_of_run(rows: pd.DataFrame, folder: Path) -> pd.DataFrame:
    """The summary rows that belong to the run in `folder` among the rows of several runs (a
    `run` column naming its folder, else the model, category, setting, CE prompt and orders of
    its manifest)."""
    if "run" in rows:
        here = folder.resolve()
        return rows[[Path(str(r)).resolve() == here for r in rows["run"]]]
    manifest = RunDir(folder).manifest
    chosen = pd.Series(True, index=rows.index)
    for key in ROW_KEYS:
        if key in rows and key in manifest:
            chosen &= rows[key].astype(str) == str(manifest[key])
    return rows[chosen]


def find_runs(folder: str | Path) -> list[Path]:
    """Every finished run under `folder` (a manifest.json beside scores.parquet), sorted."""
    return [run.path for run in RunDir.discover(folder)]


def write_pages(
    out: str | Path,
    rows: Sequence[dict[str, Any]] | pd.DataFrame,
    study: StudyReport | None = None,
) -> Path:
    """The pages of a finished `probekit run` of `study` in `out` with its summary `rows`:
    `report.html` in every run folder, and, where `out` holds several runs, the page across them
    and the paper's table and forest plot (`write_across`) in `out`. Runs under `out` that
    `rows` do not cover (left there by an earlier command) are left out. Returns the page in
    `out`."""
    out = Path(out)
    frame = pd.DataFrame(rows)
    runs = [load_run(folder, rows_of_run(frame, folder), study) for folder in find_runs(out)]
    runs = [run for run in runs if len(run.rows)]
    for run in runs:
        write_run_page(run)
    if len(runs) == 1 and runs[0].folder.resolve() == out.resolve():
        return out / PAGE
    if runs:
        write_across(runs, out, runs[0].card.title)
    return write_runs_page(runs, out)


def write_run_page(run: RunPage, out: str | Path | None = None) -> Path:
    """Write `run`'s page as `report.html` in `out` (default: the run's folder)."""
    return write_text(Path(out or run.folder) / PAGE, run_page_html(run))


def write_runs_page(
    runs: Sequence[RunPage], out: str | Path, curves: tuple[Path, list[str]] | None = None
) -> Path:
    """Write the page across `runs` as `report.html` in `out`, with `curves` (the figure of
    `probekit.reporting.curves.write_curves` and its notes) where given."""
    return write_text(Path(out) / PAGE, runs_page_html(runs, Path(out), curves))


def run_page_html(run: RunPage) -> str:
    """The HTML of one run's page: the study's views, or the run's own with its valid mass."""
    own_view = f"the run's view, answers {run.scale}"
    return _render(
        "run.html",
        run=run,
        card=card_html(run.card),
        figures=figures(run.folder, run.report.captions),
        summary=summary_table(run.rows),
        manifest=manifest_table(run.manifest),
        extra=manifest_extra(run.manifest),
        views=run.views or [ViewFacts(run.view, own_view, valid_mass=run.valid_mass)],
        threshold=WEAK_SIGNAL_VALID_MASS,
        tiny_units=TINY_SAMPLE_UNITS,
    )


def runs_page_html(
    runs: Sequence[RunPage], out: Path, curves: tuple[Path, list[str]] | None = None
) -> str:
    """The HTML of the page across `runs` (links relative to `out`), with `curves` (the
    curves' figure and its notes) where given."""
    if not runs and curves is None:
        raise ProbekitError("no finished runs to put on one page")
    links = {str(r.folder): Path(os.path.relpath(r.folder / PAGE, out)).as_posix() for r in runs}
    profiles: dict[str, list[tuple[RunPage, Headline]]] = {}
    for run in runs:
        profiles.setdefault(run.model_text, []).extend((run, h) for h in primary_headlines(run))
    cards = {r.study: card_html(r.card) for r in runs}
    tables = {}
    for study in cards:
        table = headline_table([r for r in runs if r.study == study])
        cells = paper_table(shown(table)) if len(table) else pd.DataFrame()
        tables[study] = {**summary_table(cells), "note": table.attrs["tier_note"]}
    return _render(
        "runs.html",
        runs=runs,
        sample_runs=[r for r in runs if r.sample],
        weak_runs=[r for r in runs if r.weak_signal],
        tiny_runs=[r for r in runs if r.tiny is not None],
        profiles=profiles,
        figure=profile_figure(runs),
        groups=[_side_by_side(group) for group in comparable_groups(runs)],
        links=links,
        cards=cards,
        tables=tables,
        curves=None if curves is None else (png_uri(curves[0]), curves[1]),
        threshold=WEAK_SIGNAL_VALID_MASS,
        tiny_units=TINY_SAMPLE_UNITS,
    )


def profile_figure(runs: Sequence[RunPage]) -> str | None:
    """The forest plot of `runs` (`forest_panels`) as a data URI; None when no run has a
    headline value."""
    if not (panels := forest_panels(runs)):
        return None
    png = io.BytesIO()
    headline_figure(panels).savefig(png, format="png")
    return png_uri(png.getvalue())


def comparable_groups(runs: Sequence[RunPage]) -> list[dict[str, Any]]:
    """Runs grouped by study and settings (every manifest field but the model's); each group
    but a study's first says which fields set it apart from that first group."""
    groups: dict[str, dict[str, Any]] = {}
    for run in runs:
        key = json.dumps(run.settings, sort_keys=True, default=str)
        new = {"key": key, "study": run.study, "runs": [], "reason": ""}
        groups.setdefault(key, new)["runs"].append(run)
    first: dict[str, dict[str, Any]] = {}
    for group in groups.values():
        lead = first.setdefault(group["study"], group)
        if lead is not group:
            a, b = lead["runs"][0].settings, group["runs"][0].settings
            differ = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
            group["reason"] = "; ".join(
                f"{k}: {_short(b.get(k))} here, {_short(a.get(k))} there" for k in differ
            )
    return list(groups.values())


def card_html(card: StudyCard) -> dict[str, str]:
    """The study card's parts as HTML: its title, what it measures, its source, the whole card."""
    markdown = MarkdownIt("commonmark", {"html": False}).enable("table")
    parts = {"what": card.what, "source": card.source, "html": card.text}
    rendered = {name: markdown.render(text) if text else "" for name, text in parts.items()}
    return {"name": card.name, "title": card.title, **rendered}


def figures(folder: Path, captions: Mapping[str, str] | None = None) -> list[Figure]:
    """Every PNG in `folder` (not its sub-runs), inlined, in name order."""
    captions = captions or {}
    found = []
    for path in sorted(folder.glob("*.png")):
        stem = path.stem.removesuffix("_exact")
        caption = captions.get(path.name) or captions.get(f"{stem}.png", "")
        if path.stem.endswith("_exact"):
            caption = (caption + " " if caption else "") + "(exact view of a generate run)"
        found.append(Figure(path.name, caption, png_uri(path)))
    return found


def png_uri(png: Path | bytes) -> str:
    """A PNG (a file, or its bytes) as a data URI, to inline in a page."""
    png = png.read_bytes() if isinstance(png, Path) else png
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def summary_table(rows: pd.DataFrame) -> dict[str, list]:
    """`summary.csv` as the page prints it: numbers to three decimals, missing cells as dashes,
    long cells kept whole (the page wraps them)."""
    columns = [c for c in rows.columns if c != "run"]
    body = [[_cell(row[c]) for c in columns] for _, row in rows.iterrows()]
    return {"columns": columns, "rows": body}


def manifest_table(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The manifest's main fields (those present) as (name, text) pairs, in a fixed order."""
    present = {name: manifest.get(key) for key, name in SHOWN_FIELDS.items()}
    present = {name: value for name, value in present.items() if not missing(value)}
    return [(name, v if isinstance(v, str) else json.dumps(v)) for name, v in present.items()]


def manifest_extra(manifest: dict[str, Any]) -> dict[str, str]:
    """The nested parts of the manifest: numerics (noise figure), versions, the probe, the rest."""
    rest = {k: v for k, v in manifest.items() if k not in SHOWN_FIELDS}
    parts = {key: rest.pop(key) for key in ("numerics", "versions", "probe") if key in rest}
    parts |= {"other fields": rest} if rest else {}
    return {name: json.dumps(value, indent=1, default=str) for name, value in parts.items()}


def _side_by_side(group: dict[str, Any]) -> dict[str, Any]:
    """One group of comparable runs as a table: a row per headline, a column per run."""
    runs: list[RunPage] = group["runs"]
    names = [r.model_text for r in runs]
    if len(set(names)) < len(names):  # the same model twice: tell the runs apart by folder
        names = [f"{r.model_text} [{r.folder.name}]" for r in runs]
    keys = list(dict.fromkeys(h.key for r in runs for h in r.headlines))
    cells = [{h.key: h.cell for h in r.headlines} for r in runs]
    table = [[key, *(c.get(key, "—") for c in cells)] for key in keys]
    return {**group, "columns": names, "table": table, "label": runs[0].label}


def _cell(value: Any) -> str:
    if missing(value):
        return "—"
    return format_number(value) if isinstance(value, float) else str(value)


def _short(value: Any) -> str:
    if isinstance(value, list | tuple) and len(value) > 4:
        return f"{len(value)} entries ({', '.join(map(str, value[:3]))}, …)"
    if isinstance(value, str):
        return value
    return "—" if value is None else json.dumps(value, default=str)


def write_mechanism_page(
    path: str | Path,
    template: str,
    shown: Sequence[str],
    summary: pd.DataFrame,
    figure: str | Path,
    title: str,
    manifest: Mapping[str, Any],
    data: str,
    values: Mapping[str, Any],
) -> Path:
    """Write a mechanism run's page (`probekit steer`, `probekit lens`) from
    `templates/<template>` atomically: the `title`, the figure inline (base64 PNG), the
    manifest's `shown` settings, the summary's notes and prompts, the data as the study
    describes it (and whether it is probekit's sample), and the template's own `values`."""
    return _write_page(
        path,
        template,
        manifest,
        shown,
        title=title,
        image=png_uri(Path(figure)),
        notes=list(dict.fromkeys(summary_notes(summary))),
        prompts=int(summary["prompts"].iloc[0]),
        data=data,
        sample=is_sample_data(data),
        **values,
    )


def write_record_page(
    path: str | Path,
    kind: str,
    title: str,
    subtitle: str,
    manifest: Mapping[str, Any],
    shown: Sequence[str],
    data: str,
    table: pd.DataFrame | None = None,
    figures: Sequence[Path] = (),
    notes: Sequence[str] = (),
    weak: str | None = None,
) -> Path:
    """Write the page of a mechanism run that is a record of what it wrote (`probekit patch`,
    `probekit capture`) atomically: what ran (`kind`, `title`, `subtitle`), the manifest's
    `shown` settings, the `table` of its main numbers, its `figures` inline, `notes`, the
    weak-signal line and the manifest's nested parts (versions, the sets)."""
    rows = {"columns": [], "rows": []} if table is None else summary_table(table)
    nested = {k: v for k, v in manifest.items() if isinstance(v, dict | list) and k not in shown}
    return _write_page(
        path,
        "record.html",
        manifest,
        shown,
        kind=kind,
        title=title,
        subtitle=subtitle,
        sample=is_sample_data(data),
        data=data,
        weak=weak,
        table={**rows, "title": "Summary"},
        notes=notes,
        figures=[Figure(f.name, "", png_uri(f)) for f in figures],
        details={k: json.dumps(v, indent=1, default=str) for k, v in nested.items()},
    )


def _write_page(
    path: str | Path, template: str, manifest: Mapping[str, Any], shown: Sequence[str], **values
) -> Path:
    """Write a mechanism run's page from `template` atomically, with the manifest's `shown`
    settings (those it holds)."""
    settings = [(k, manifest[k]) for k in shown if manifest.get(k) is not None]
    return write_text(path, _render(template, settings=settings, **values))


def summary_notes(summary: pd.DataFrame) -> list[str]:
    """The summary's notes in its row order (a lens's: by layer), each after its layer (`L3:`)
    where the summary has one, the empty ones left out."""
    notes = summary.get("note", pd.Series("", index=summary.index))
    layers = summary.get("layer", pd.Series(None, index=summary.index))
    return [
        f"L{int(layer)}: {note}" if pd.notna(layer) else str(note)
        for layer, note in zip(layers, notes, strict=True)
        if isinstance(note, str) and note
    ]


def _render(template: str, **values: Any) -> str:
    """The package's template `template` (jinja2's `PackageLoader`, through importlib) rendered
    with `values`, HTML autoescaped."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("probekit.reporting", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    filters = {"rate": format_rate, "number": format_number, "p": format_p}
    env.filters |= filters | {"interval": format_interval}
    return env.get_template(template).render(**values)
