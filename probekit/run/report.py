"""`probekit.report` and `probekit report DIR [DIR ...]`: re-write finished runs' metrics,
figures, summary and pages from their `scores.parquet` and `manifest.json` (one run, a folder of
runs as `probekit run` writes them for several probes or models, or several such folders, of one
study or several).

Every run folder gets its `report.html`; the runs' summary and the paper's table across them
(`headlines.*`, `forest.*`: `probekit.reporting.across`) go to `out`, one per study
(`OUT/<study>/`) when the runs mix studies, lens and patching folders among those given are drawn
as curves across models (`curves.*`: `probekit.reporting.curves`), and `OUT/report.html` is the
page across the runs: each model's bias profile and the models side by side per study.

`out` defaults to the one folder given, and for several folders to `combined/` in their common
parent, so that a combined summary never replaces a run's own: an `out` that holds a run is
refused when several runs are reported. The folder is checked (writable, not a run) before any
work. A folder holds one report: `report.json` records the runs a report covers and the files
it wrote there, and the next report into the folder removes those first, so that no summary of
an earlier report stays beside the pages of the next.

`REPORT` is the command (`probekit.run.command.Runner`: no model, no study); the rest is
imported on use.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.io import check_outputs, check_writable, write_text
from probekit.core.kinds import path
from probekit.core.options import REQUIRED, named, option
from probekit.core.public import public
from probekit.core.rundir import RunDir
from probekit.core.shared_options import OutOption
from probekit.run.command import Options, Runner
from probekit.studies.base import Study

COMBINED = "combined"
"""The folder, in the given folders' common parent, of a report across several of them."""
RECORD = "report.json"
"""A report folder's record: the runs its report covers and the files it wrote there."""


@dataclass(frozen=True, kw_only=True)
class ReportOptions(OutOption):
    """Report options: the runs, and where a combined summary goes."""

    dir: list[Path] = option(
        REQUIRED,
        help="the --out folder of a finished run (or several)",
        kind=path,
        positional=True,
        metavar="DIR",
    )


@public(ReportOptions, command="report")
def report(
    runs: str | Path | Sequence[str | Path],
    out: str | Path | None = None,
    studies: Sequence[Study] = (),
) -> pd.DataFrame:
    """Report every finished run under `runs` (a folder or several, e.g. one per model or one
    per study), write each study's summary, the paper's table and forest plot
    (`probekit.reporting.across`) and the pages into `out` (`report_folder`), and return the
    paper's table of every study (a `study` column; `attrs["tier_note"]` where the models'
    precision tiers differ). A run's study is the one its manifest names: one of `studies`
    (`Study` objects, registered or not, as `run_study` takes them), else the registered
    one."""
    from probekit.reporting import load_run, write_run_page, write_runs_page
    from probekit.reporting.across import write_across
    from probekit.reporting.curves import curve_folders, curve_rows, write_curves
    from probekit.studies.base import get_study  # looked up on use

    folders = [Path(runs)] if isinstance(runs, str | Path) else [Path(f) for f in runs]
    if not folders:
        raise ProbekitError(f"no run folder to report; give the {named('out')} folder of a run")
    found = discover_runs(folders)
    curves = [curve_rows(c) for c in sorted({c for f in folders for c in curve_folders(f)})]
    for run in found:  # not blamed on out: each run's figures and page are written in its folder
        try:
            check_writable(run.path)
        except ProbekitError:
            raise ProbekitError(
                f"the run folder {run.path} is not writable, and the report rewrites each run's "
                "figures and page in its own folder; make it writable"
            ) from None
    by_study: dict[str, list[tuple[RunDir, dict[str, Any]]]] = {}
    for run in found:
        manifest = run.manifest
        name = manifest.get("study", manifest.get("probe", {}).get("study"))
        if name is None:
            raise ProbekitError(f"{run.manifest_path} names no study; report it from its own run")
        by_study.setdefault(name, []).append((run, manifest))
    target = report_folder(folders, out, found)
    if len(by_study) > 1:  # each study's summary goes to its own folder in the target
        for name, members in by_study.items():
            refuse_other_runs(target / name, [run for run, _ in members])
    given = {study.name: study for study in studies}
    study_of = {name: given[name] if name in given else get_study(name) for name in by_study}
    own = RunDir(target) in found  # a run re-reported into its own folder
    before = set() if own else clear_report(target)
    pages, tables = [], []
    for name, members in by_study.items():
        study = study_of[name]
        rows: list[dict[str, Any]] = []
        own_pages = []
        for run, manifest in members:
            run_rows = study.summary_rows(run.scores(), run.path, manifest)
            rows += run_rows
            own_pages.append(load_run(run.path, pd.DataFrame(run_rows), study))
        where = target if len(by_study) == 1 else target / name
        study.write_summary(rows, where, runs=[run.path for run, _ in members])
        tables.append(write_across(own_pages, where, study.title))
        pages += own_pages
    for page in pages:
        write_run_page(page)
    drawn = write_curves(curves, target) if curves else None
    if len(pages) == 1 and drawn is None:
        if pages[0].folder.resolve() != target.resolve():
            write_run_page(pages[0], target)
    else:
        write_runs_page(pages, target, drawn)
    if not own:
        write_record(target, [run.path for run in found], report_files(target) - before)
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    table.attrs["tier_note"] = " ".join(t.attrs.get("tier_note", "") for t in tables).strip()
    return table


class ReportCommand(Runner):
    """`probekit report DIR [DIR ...]`: `report` on the command line, the paper's table
    printed (`headlines.md`)."""

    name, own, models = "report", ReportOptions, False

    def main(self, options: Options, study: Study | None = None) -> None:
        from probekit.reporting.across import headlines_markdown

        print(headlines_markdown(report(options.own.dir, options.own.out)))


REPORT = ReportCommand()


def discover_runs(folders: Sequence[str | Path]) -> list[RunDir]:
    """Every finished run under `folders` (each itself included; `RunDir.discover`), each once;
    one line for a folder that is not one or holds neither a run nor a lens or patching run
    (`curve_folders`)."""
    from probekit.reporting.curves import curve_folders

    runs: list[RunDir] = []
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise ProbekitError(
                f"{folder} is not a folder; give the {named('out')} folder of a run"
            )
        found = RunDir.discover(folder)
        if not found and not curve_folders(folder):
            raise ProbekitError(
                f"{folder} holds no finished run (no manifest.json beside scores.parquet) and "
                "no lens or patching run"
            )
        runs += [run for run in found if run not in runs]
    return runs


def report_folder(folders: Sequence[Path], out: str | Path | None, runs: Sequence[RunDir]) -> Path:
    """Where the summary and page of `runs` go: `out`, else the one folder given (of runs),
    else `combined/` in the folders' common parent. Checked before any work: writable, and not the
    folder of a run other than the one reported (its own summary and page would be replaced)."""
    if out is not None:
        target = Path(out)
    elif len(folders) == 1 and runs:
        target = folders[0]
    else:
        common = Path(os.path.commonpath([f.resolve() for f in folders]))
        target = common / COMBINED
    refuse_other_runs(target, runs)
    return check_outputs(target, ("summary.csv", "summary.md", "report.html"))


def refuse_other_runs(folder: Path, runs: Sequence[RunDir]) -> None:
    """One line when `folder`, where the summary and page of `runs` go, is the folder of a run
    other than the one reported: a run's own files are rewritten only from that run."""
    if RunDir(folder).read_manifest() is None or list(runs) == [RunDir(folder)]:
        return
    what = (
        f"the summary and page of {runs[0].path}"
        if len(runs) == 1
        else f"the combined summary and page of {len(runs)} runs"
    )
    raise ProbekitError(
        f"{folder} holds a run of its own: {what} would replace its own; give another "
        f"{named('out')}"
    )


def write_record(folder: Path, runs: Sequence[Path], files: Iterable[Path]) -> None:
    """`report.json` in `folder`: the `runs` its report covers, the `files` it wrote there
    (relative to it), and each figure among them with the files of its numbers
    (`figure_data`: `forest.png` with `forest.csv`)."""
    from probekit.reporting.figures import figure_data

    names = sorted(Path(p).as_posix() for p in files)
    figures = figure_data(folder, [name for name in names if name.endswith(".png")])
    record = {"runs": [str(run) for run in runs], "files": names, "figures": figures}
    write_text(folder / RECORD, json.dumps(record, indent=1))


def report_files(folder: Path) -> set[Path]:
    """The files under `folder` (relative to it) that are not inside a run folder, nor the
    record: those a report writes there."""
    if not folder.is_dir():
        return set()
    runs = {p.parent for p in folder.rglob("manifest.json")}
    return {
        p.relative_to(folder)
        for p in folder.rglob("*")
        if p.is_file() and p.name != RECORD and not runs.intersection(p.parents)
    }


def clear_report(folder: Path) -> set[Path]:
    """Remove the files the report recorded in `folder` wrote (and the folders they leave
    empty); the report files left after (written by something else, e.g. `probekit run`)."""
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        files = [folder / name for name in record["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        files = []
    for file in files:
        if folder.resolve() not in file.resolve().parents:
            continue  # a record edited to name files elsewhere: left alone
        file.unlink(missing_ok=True)
        for parent in file.parents:
            if parent == folder or not parent.is_dir() or any(parent.iterdir()):
                break
            parent.rmdir()
    return report_files(folder)
