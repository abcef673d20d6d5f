"""The lens and patching curves of several models on one normalised depth axis (`curves.png`,
`curves.csv` in a report across runs): x is the depth of the residual stream read (`depth`: the
lens after layer l at l + 1, patching at `hook_resid_pre` of l at l) over the model's number of
layers, so 0 is the embeddings and 1 the stream after the last layer, whatever the depth.

A lens folder holds `lens.parquet` and its `summary.csv` (the primary headline per layer, with
its interval where it has one); a patching folder `patching_summary.csv` and its record
`patching/manifest.json` (the recovery per layer, site and span, with its interval over units;
components known by construction or not run are left out). A folder whose rows have no
interval is drawn without one, and the report says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.rundir import RunDir
from probekit.reporting.contract import model_label
from probekit.reporting.figures import CATEGORICAL, new_figure, save_figure
from probekit.reporting.lens import MEASURED, depth, primary

LENS, PATCHING = "lens.parquet", "patching_summary.csv"
PATCH_RECORD = "patching"
"""A patching run's record folder (its `manifest.json`) inside its `--out`."""
COLUMNS = ["model", "folder", "kind", "curve", "layer", "site", "n_layers", "x", "value"]
COLUMNS += ["low", "high"]
KINDS = {"lens": "the lens's headline after each layer", "patching": "patching: recovery"}


def curve_folders(folder: str | Path) -> list[Path]:
    """Every lens or patching run under `folder` (itself included), sorted."""
    found = {p.parent for p in Path(folder).rglob(LENS) if (p.parent / "manifest.json").is_file()}
    found |= {
        p.parent
        for p in Path(folder).rglob(PATCHING)
        if (p.parent / PATCH_RECORD / "manifest.json").is_file()
    }
    return sorted(found)


def curve_rows(folder: Path) -> tuple[pd.DataFrame, list[str]]:
    """The curves of the lens and patching runs in `folder`: a row per curve and layer
    (`model`, `folder`, `kind`, `curve`, `layer`, `n_layers`, `x`, `value`, `low`, `high`), and
    a line for each kind whose rows have no interval."""
    frames, notes = [], []
    for kind, table, manifest in _tables(folder):
        model = model_label(manifest.get("model"))
        n_layers = manifest.get("n_layers")
        if not isinstance(n_layers, int) or n_layers < 1:
            raise ProbekitError(
                f"{folder}: its {kind} manifest records no number of layers (n_layers); run it "
                "again to draw it on the depth axis across models"
            )
        if not {"low", "high"} <= set(table) or table[["low", "high"]].isna().all().all():
            notes.append(
                f"{model} ({folder.name}): the {kind} rows have no interval; drawn without"
            )
            table = table.assign(low=float("nan"), high=float("nan"))
        x = table["layer"].combine(table["site"], depth) / n_layers
        where = {"model": model, "folder": str(folder), "kind": kind, "n_layers": n_layers}
        frames.append(table.assign(**where, x=x)[COLUMNS])
    return pd.concat(frames, ignore_index=True), notes


def _tables(folder: Path) -> list[tuple[str, pd.DataFrame, dict]]:
    """The lens's primary headline per layer and patching's measured recovery per layer, site
    and span (no heads), each with its manifest."""
    found = []
    if (folder / LENS).is_file():
        lens = primary(pd.read_csv(folder / "summary.csv"))
        lens = lens.assign(curve=lens["label"], site="hook_resid_post")
        found.append(("lens", lens, RunDir(folder).manifest))
    if (folder / PATCHING).is_file():
        patched = pd.read_csv(folder / PATCHING)
        patched = patched[patched["head"].isna() & (patched.get("status", MEASURED) == MEASURED)]
        names = patched["site"].str.rsplit(".", n=1).str[-1].str.removeprefix("hook_")
        patched = patched.rename(
            columns={"recovery": "value", "recovery_low": "low", "recovery_high": "high"}
        ).assign(curve=names + " " + patched["span"].astype(str))
        found.append(("patching", patched, RunDir(folder / PATCH_RECORD).manifest))
    return found


def write_curves(
    parts: Sequence[tuple[pd.DataFrame, list[str]]], out: Path
) -> tuple[Path, list[str]]:
    """Draw the curves (`curve_rows` of each folder) on one normalised depth axis into `out`
    (`curves.png`, its numbers in `curves.csv`): a panel per kind, a line per model and curve
    with its interval. Returns the figure's path and the notes of folders drawn without
    intervals."""
    table = pd.concat([rows for rows, _ in parts], ignore_index=True)
    notes = [note for _, found in parts for note in found]
    kinds = list(dict.fromkeys(table["kind"]))
    fig = new_figure(5.0 * len(kinds), 3.8)
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    for ax, kind in zip(axes, kinds, strict=True):
        lines = table[table["kind"] == kind].groupby(["folder", "curve"], sort=False)
        for number, ((where, curve), rows) in enumerate(lines):
            colour = CATEGORICAL[number % len(CATEGORICAL)]
            rows = rows.sort_values("x")
            label = f"{rows['model'].iloc[0]} [{Path(where).name}]: {curve}"
            bars = [rows["value"] - rows["low"], rows["high"] - rows["value"]]
            ax.errorbar(
                rows["x"], rows["value"], bars, marker="o", capsize=2, color=colour, label=label
            )
            ax.fill_between(rows["x"], rows["low"], rows["high"], color=colour, alpha=0.15)
        ax.set_xlim(-0.02, 1.02)
        ax.set_xlabel("depth: layer / number of layers (the residual stream read)")
        ax.set_title(KINDS[kind], fontsize=9, loc="left")
        ax.legend(fontsize=6)
    save_figure(fig, out / "curves.png", table)
    return out / "curves.png", notes
