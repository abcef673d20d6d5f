"""`probekit report DIR [DIR ...]`: re-write finished runs' metrics, figures, summary and pages
from their `scores.parquet` and `manifest.json` (one run, a folder of runs as `probekit run`
writes them for several probes or models, or several such folders, of one study or several).

Every run folder gets its `report.html`; the runs' summary goes to `--out`, one per study
(`OUT/<study>/`) when the runs mix studies, and `OUT/report.html` is the page across the runs:
each model's bias profile and the models side by side per study.

`--out` defaults to the one folder given, and for several folders to `combined/` in their common
parent, so that a combined summary never replaces a run's own: an `--out` that holds a run is
refused when several runs are reported. The folder is checked (writable, not a run) before any
work.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.io import check_writable
from probekit.core.rundir import RunDir
from probekit.reporting import load_run, write_run_page, write_runs_page
from probekit.studies.base import Study, get_study


def report_runs(
    folders: str | Path | Sequence[str | Path],
    out: str | Path | None = None,
    studies: Sequence[Study] = (),
) -> str:
    """Report every finished run under `folders` (one or several, e.g. one per model or one per
    study), write each study's summary and the pages into `out` (`report_folder`); return the
    summaries' Markdown. A run's study is the one its manifest names: one of `studies` (`Study`
    objects, registered or not, as `run_study` takes them), else the registered one."""
    folders = [Path(folders)] if isinstance(folders, str | Path) else [Path(f) for f in folders]
    runs: list[RunDir] = []
    for folder in folders:
        if not folder.is_dir():
            raise ProbekitError(f"{folder} is not a folder; give the --out folder of a run")
        found = RunDir.discover(folder)
        if not found:
            raise ProbekitError(
                f"{folder} holds no finished run (no manifest.json beside scores.parquet)"
            )
        runs += [run for run in found if run not in runs]
    by_study: dict[str, list[tuple[RunDir, dict[str, Any]]]] = {}
    for run in runs:
        manifest = run.manifest
        name = manifest.get("study", manifest.get("probe", {}).get("study"))
        if name is None:
            raise ProbekitError(f"{run.manifest_path} names no study; report it from its own run")
        by_study.setdefault(name, []).append((run, manifest))
    target = report_folder(folders, out, runs)
    given = {study.name: study for study in studies}
    pages, markdown = [], []
    for name, members in by_study.items():
        study = given[name] if name in given else get_study(name)
        rows: list[dict[str, Any]] = []
        for run, manifest in members:
            run_rows = study.summary_rows(run.scores(), run.path, manifest)
            rows += run_rows
            pages.append(load_run(run.path, pd.DataFrame(run_rows), study))
        where = target if len(by_study) == 1 else target / name
        folders = [run.path for run, _ in members]
        markdown.append(study.write_summary(rows, where, runs=folders).markdown)
    for page in pages:
        write_run_page(page)
    if len(pages) == 1:
        if pages[0].folder.resolve() != target.resolve():
            write_run_page(pages[0], target)
    else:
        write_runs_page(pages, target)
    return "\n".join(markdown)


COMBINED = "combined"
"""The folder, in the given folders' common parent, of a report across several of them."""


def report_folder(folders: Sequence[Path], out: str | Path | None, runs: Sequence[RunDir]) -> Path:
    """Where the summary and page of `runs` go: `out`, else the one folder given, else
    `combined/` in the folders' common parent. Checked before any work: writable, and not the
    folder of a run other than the one reported (its own summary and page would be replaced)."""
    if out is not None:
        target = Path(out)
    elif len(folders) == 1:
        target = folders[0]
    else:
        common = Path(os.path.commonpath([f.resolve() for f in folders]))
        target = common / COMBINED
    if RunDir(target).read_manifest() is not None and (len(runs) > 1 or runs[0] != RunDir(target)):
        what = (
            f"the combined summary and page of {len(runs)} runs"
            if len(runs) > 1
            else (f"the summary and page of {runs[0].path}")
        )
        raise ProbekitError(
            f"{target} holds a run of its own: {what} would replace its own; give another --out"
        )
    check_writable(target)
    return target
