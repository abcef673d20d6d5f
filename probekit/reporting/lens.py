"""The page and figure of a lens run (`probekit lens STUDY`): the study's headlines as read after
each layer, the mean valid mass the lens puts on the answers, and, where the folder holds a
patching run, the lens's gap of the patched pairs beside patching's recovery of the same pairs,
all against depth. From the run's `summary.csv` (one row per layer and headline) and
`lens_gaps.csv`; rendered from `templates/lens.html`, self-contained."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from probekit.reporting.figures import new_figure, save_figure
from probekit.reporting.headline import format_number, format_p
from probekit.reporting.html import write_mechanism_page

SHOWN = ("study", "model", "weights", "dtype", "device", "layers", "hooks", "seed", "prompts")
SHOWN += ("min_valid_mass",)


def primary(summary: pd.DataFrame) -> pd.DataFrame:
    """The primary headline's row of each layer, by layer."""
    return summary[summary["primary"].astype(bool)].sort_values("layer")


def lens_figure(
    summary: pd.DataFrame,
    gaps: pd.DataFrame | None,
    recovery: pd.DataFrame | None,
    path: str | Path,
    title: str,
) -> Path:
    """The primary headline against the layer read (with its interval), the mean valid mass,
    and with `gaps` the lens's share of the patched pairs' gap beside patching's `recovery`
    (one line per site and span; `patching_summary.csv`'s rows without a head)."""
    panels = 3 if gaps is not None else 2
    fig = new_figure(4.2 * panels, 3.8)
    axes = fig.subplots(1, panels)
    first = primary(summary)
    x = first["layer"].to_numpy(float)
    headline = axes[0]
    headline.plot(x, first["value"].to_numpy(float), marker="o", label="lens")
    if "low" in first:
        low, high = first["low"].to_numpy(float), first["high"].to_numpy(float)
        headline.fill_between(x, low, high, alpha=0.2, label="interval")
    reference = first["reference"].dropna() if "reference" in first else pd.Series(dtype=float)
    if len(reference):
        headline.axhline(float(reference.iloc[0]), color="black", lw=0.6, ls=":")
    headline.set_xlabel("layer read")
    headline.set_ylabel(str(first["label"].iloc[0]) if len(first) else "headline")
    headline.legend(fontsize=7)
    mass = summary.drop_duplicates("layer").sort_values("layer")
    axes[1].semilogy(mass["layer"], mass["mean_valid_mass"].clip(lower=1e-300), marker="o")
    axes[1].set_xlabel("layer read")
    axes[1].set_ylabel("mean valid mass of the lens")
    if gaps is not None:
        share = axes[2]
        for (site, span), group in (recovery if recovery is not None else pd.DataFrame()).groupby(
            ["site", "span"], sort=False
        ):
            group = group.sort_values("layer")
            name = str(site).rsplit(".", 1)[-1].removeprefix("hook_")
            share.plot(
                group["layer"], group["recovery"], lw=0.8, marker=".", label=f"{name} {span}"
            )
        share.plot(gaps["layer"], gaps["share"], color="black", lw=2, marker="o", label="lens")
        share.axhline(0, color="black", lw=0.5)
        share.axhline(1, color="black", lw=0.5, ls=":")
        share.set_xlabel("layer")
        share.set_ylabel("share of the pairs' gap")
        share.legend(fontsize=6)
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"The logit lens on the exact readout: {title}", fontsize=9)
    return save_figure(fig, path)


def _interval(row: Mapping[str, Any]) -> str:
    low, high = (
        format_number(row.get("low"), signed=True),
        format_number(row.get("high"), signed=True),
    )
    return "—" if low == "—" else f"[{low}, {high}]"


def lens_rows(summary: pd.DataFrame, gaps: pd.DataFrame | None) -> list[dict[str, str]]:
    """The page's table: one row per layer, the primary headline with its interval and p, the
    mean valid mass and error bound, and the lens's share of the patched pairs' gap."""
    share = {} if gaps is None else dict(zip(gaps["layer"], gaps["share"], strict=True))
    return [
        {
            "layer": str(int(row["layer"])),
            "value": format_number(row["value"], signed=True),
            "interval": _interval(row),
            "p": format_p(row.get("p_value")),
            "mass": format_number(row["mean_valid_mass"], 4),
            "bound": format_number(row["mean_error_bound"], 4),
            "share": format_number(share.get(row["layer"], np.nan)),
        }
        for row in primary(summary).to_dict("records")
    ]


def headline_rows(summary: pd.DataFrame) -> list[dict[str, str]]:
    """Every headline of every layer (the study may report several)."""
    return [
        {
            "layer": str(int(row["layer"])),
            "label": str(row["label"]),
            "value": format_number(row["value"], signed=True),
            "interval": _interval(row),
            "p": format_p(row.get("p_value")),
        }
        for row in summary.sort_values(["layer"], kind="stable").to_dict("records")
    ]


def write_lens_page(
    path: str | Path,
    summary: pd.DataFrame,
    gaps: pd.DataFrame | None,
    figure: str | Path,
    title: str,
    manifest: Mapping[str, Any],
    data: str,
    difference: float | None,
) -> Path:
    """Write the lens run's page (`report.html`) atomically (`data`: the data as the study
    describes it; `difference`: the largest |difference| of an answer probability between the
    lens after the last layer and the scorer, None when the last layer was not read)."""
    first = primary(summary)
    own = {
        "label": str(first["label"].iloc[0]) if len(first) else "headline",
        "rows": lens_rows(summary, gaps),
        "headlines": headline_rows(summary),
        "several": summary.groupby("layer").size().max() > 1,
        "gaps": gaps is not None,
        "readout": str(gaps["readout"].iloc[0]) if gaps is not None else "",
        "pairs": int(gaps["pairs"].iloc[0]) if gaps is not None else 0,
        "difference": None if difference is None else f"{difference:.1e}",
    }
    return write_mechanism_page(
        path, "lens.html", SHOWN, summary, figure, title, manifest, data, own
    )
