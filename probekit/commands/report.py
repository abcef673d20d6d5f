"""`probekit report DIR [DIR ...]`: re-write finished runs' metrics, figures and summary from
their `scores.parquet` and `manifest.json` (one run, a folder of runs as `probekit run` writes
them for several probes or models, or several such folders summarised side by side)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from probekit.errors import ProbekitError
from probekit.studies.base import get_study


def report_runs(folders: str | Path | Sequence[str | Path], out: str | Path | None = None) -> str:
    """Report every finished run under `folders` (one or several, e.g. one per model) and write
    one summary of them all in `out` (default: the first folder); return its Markdown."""
    folders = [Path(folders)] if isinstance(folders, str | Path) else [Path(f) for f in folders]
    runs: list[Path] = []
    for folder in folders:
        if not folder.is_dir():
            raise ProbekitError(f"{folder} is not a folder; give the --out folder of a run")
        found = [p.parent for p in sorted(folder.rglob("manifest.json"))]
        found = [run for run in found if (run / "scores.parquet").is_file()]
        if not found:
            raise ProbekitError(
                f"{folder} holds no finished run (no manifest.json beside scores.parquet)"
            )
        runs += found
    manifests = [json.loads((run / "manifest.json").read_text()) for run in runs]
    names = {m.get("study", m.get("probe", {}).get("study")) for m in manifests}
    if len(names) != 1 or None in names:
        raise ProbekitError(f"the runs mix several studies ({names}); report them apart")
    study = get_study(names.pop())
    rows = []
    for run, manifest in zip(runs, manifests, strict=True):
        rows += study.report(pd.read_parquet(run / "scores.parquet"), run, manifest)
    target = Path(out) if out is not None else folders[0]
    target.mkdir(parents=True, exist_ok=True)
    return study.write_summary(rows, target)
