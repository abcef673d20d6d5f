"""The page and figure of a lens run (`probekit lens STUDY`): the study's headlines as read after
each layer, the mean valid mass the lens puts on the answers, and, where the folder holds a
patching run, the lens's gap of the patched pairs beside patching's recovery of the same pairs,
all against depth. From the run's `summary.csv` (one row per layer and headline) and
`lens_gaps.csv`; rendered from `templates/lens.html`, self-contained.

Each layer's p is adjusted for the family of layers read (`adjust_layers`: Holm's method, per
headline), and a layer whose mean valid mass is below the weak-signal threshold gets no p and no
share of the gap: it is flagged instead. One depth axis: the lens after layer l reads the
residual stream `blocks.l.hook_resid_post`, which is `blocks.(l+1).hook_resid_pre`, so it is drawn
at x = l + 1, where patching at `hook_resid_pre` of layer l + 1 (and at `hook_resid_post` of layer
l) is drawn; a site inside a block (attention, MLP) is drawn half way through it (`depth`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from probekit.core.signal import WEAK_SIGNAL_VALID_MASS, is_weak
from probekit.reporting.figures import new_figure, save_figure
from probekit.reporting.html import write_mechanism_page
from probekit.stats import holm

MEASURED = "measured"
"""The status of a patched component whose result is not known by construction."""

SHOWN = ("study", "model", "weights", "dtype", "device", "layers", "hooks", "seed", "prompts")
SHOWN += ("min_valid_mass",)


def primary(summary: pd.DataFrame) -> pd.DataFrame:
    """The primary headline's row of each layer, by layer."""
    return summary[summary["primary"].astype(bool)].sort_values("layer")


def adjust_layers(
    summary: pd.DataFrame, gaps: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The summary with `weak_signal` (the layer's mean valid mass is below the threshold) and
    `p_adjusted` (Holm over the layers of each headline with a p), and no p, p_adjusted or share
    of the gap at a weak layer, whose note says so first; `gaps` without its `share` at weak
    layers."""
    weak = summary["mean_valid_mass"].map(is_weak).astype(bool)
    flag = (
        f"weak signal: the lens's mean valid mass is below {WEAK_SIGNAL_VALID_MASS:.0%}, so "
        "this layer has no p and no share of the gap"
    )
    out = summary.assign(weak_signal=weak)
    if "p_value" in out:
        out["p_value"] = out["p_value"].astype(float).mask(weak)
        out["p_adjusted"] = np.nan
        for _, rows in out.groupby("label", sort=False):
            out.loc[rows.index, "p_adjusted"] = holm(rows["p_value"].to_numpy(float))
    notes = out.get("note", pd.Series("", index=out.index)).fillna("").astype(str)
    out["note"] = notes.mask(weak, (f"{flag}; " + notes).str.removesuffix("; "))
    if gaps is not None:
        weak_layers = set(out.loc[weak, "layer"])
        gaps = gaps.assign(share=gaps["share"].mask(gaps["layer"].isin(weak_layers)))
    return out, gaps


def depth(layer: Any, site: str) -> float:
    """Where `blocks.{layer}.{site}` sits on the depth axis: x = l is the residual stream before
    layer l (`hook_resid_pre` of l, `hook_resid_post` of l - 1); a site inside the block, half
    way through it."""
    name = str(site).rsplit(".", 1)[-1]
    return float(layer) + {"hook_resid_pre": 0.0, "hook_resid_post": 1.0}.get(name, 0.5)


def lens_figure(
    summary: pd.DataFrame,
    gaps: pd.DataFrame | None,
    recovery: pd.DataFrame | None,
    path: str | Path,
    title: str,
) -> Path:
    """Save `lens_figure_of` as a PNG, with its numbers beside it: `lens.layers.csv` (the primary
    headline, the mean valid mass and, with `gaps`, the lens's share of the pairs' gap at each
    layer and its `depth`) and with `recovery` `lens.recovery.csv` (patching's lines)."""
    drawn = ["layer", "label", "value", "low", "high", "mean_valid_mass", "weak_signal"]
    layers = primary(summary).filter(drawn)
    layers.insert(1, "depth", layers["layer"] + 1)
    data = {"layers": layers}
    if gaps is not None:
        data["layers"] = layers.merge(gaps[["layer", "share"]], on="layer", how="left")
    if gaps is not None and recovery is not None:
        where = zip(recovery["layer"], recovery["site"], strict=True)
        data["recovery"] = recovery.assign(depth=[depth(layer, site) for layer, site in where])
    return save_figure(lens_figure_of(summary, gaps, recovery, title), path, data)


def lens_figure_of(
    summary: pd.DataFrame,
    gaps: pd.DataFrame | None,
    recovery: pd.DataFrame | None,
    title: str,
) -> Figure:
    """The primary headline against depth (with its interval), the mean valid mass, and with
    `gaps` the lens's share of the patched pairs' gap beside patching's `recovery` (one line per
    site, span and identity swapped; `patching_summary.csv`'s rows without a head; those known
    by construction grey and dashed), all on one depth axis (`depth`): the lens after layer l at
    l + 1. Weak layers are marked and their share is not drawn."""
    panels = 3 if gaps is not None else 2
    fig = new_figure(4.2 * panels, 3.8)
    axes = fig.subplots(1, panels, sharex=True)
    first = primary(summary)
    x = first["layer"].to_numpy(float) + 1
    headline = axes[0]
    headline.plot(x, first["value"].to_numpy(float), marker="o", label="lens")
    if "low" in first:
        low, high = first["low"].to_numpy(float), first["high"].to_numpy(float)
        headline.fill_between(x, low, high, alpha=0.2, label="interval")
    reference = first["reference"].dropna() if "reference" in first else pd.Series(dtype=float)
    if len(reference):
        headline.axhline(float(reference.iloc[0]), color="black", lw=0.6, ls=":")
    headline.set_ylabel(str(first["label"].iloc[0]) if len(first) else "headline")
    mass = summary.drop_duplicates("layer").sort_values("layer")
    axes[1].semilogy(mass["layer"] + 1, mass["mean_valid_mass"].clip(lower=1e-300), marker="o")
    axes[1].axhline(WEAK_SIGNAL_VALID_MASS, color="grey", lw=0.6, ls="--", label="weak signal")
    axes[1].set_ylabel("mean valid mass of the lens")
    axes[1].legend(fontsize=7)
    weak = mass.loc[mass["mean_valid_mass"].map(is_weak).astype(bool), "layer"] + 1
    if len(weak):
        weak_values = first.set_index("layer").loc[weak - 1, "value"]
        headline.plot(weak, weak_values, "x", color="grey", label="weak signal (no p)")
    headline.legend(fontsize=7)
    if gaps is not None:
        _shares(axes[2], gaps, recovery)
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("depth: the residual stream before layer x")
    fig.suptitle(f"The logit lens on the exact readout: {title}", fontsize=9)
    return fig


def _shares(ax: Any, gaps: pd.DataFrame, recovery: pd.DataFrame | None) -> None:
    """The lens's share of the patched pairs' gap (black) beside patching's recovery per site,
    span and identity swapped, on the depth axis."""
    keys = [k for k in ("site", "span", "swapped") if recovery is not None and k in recovery]
    for key, group in (recovery if recovery is not None else pd.DataFrame()).groupby(
        keys, sort=False
    ):
        where = dict(zip(keys, key, strict=True))
        name = str(where["site"]).rsplit(".", 1)[-1].removeprefix("hook_")
        label = " ".join(
            [name, where["span"], *([f"({where['swapped']})"] if "swapped" in where else [])]
        )
        group = group.sort_values("layer")
        x = [depth(layer, where["site"]) for layer in group["layer"]]
        status = group["status"] if "status" in group else pd.Series(MEASURED, index=group.index)
        if (status == MEASURED).any():
            ax.plot(x, group["recovery"].where(status == MEASURED), lw=0.8, marker=".", label=label)
        if (status != MEASURED).any():
            known = ", ".join(sorted(set(status[status != MEASURED])))
            grey = {"ls": "--", "color": "grey", "label": f"{label}: {known}"}
            ax.plot(x, group["recovery"].where(status != MEASURED), lw=0.8, marker=".", **grey)
    ax.plot(gaps["layer"] + 1, gaps["share"], color="black", lw=2, marker="o", label="lens")
    ax.axhline(0, color="black", lw=0.5)
    ax.axhline(1, color="black", lw=0.5, ls=":")
    ax.set_ylabel("share of the pairs' gap (recovery: ratio of means)")
    ax.legend(fontsize=6)


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
    share = {} if gaps is None else dict(zip(gaps["layer"], gaps["share"], strict=True))
    own = {
        "label": str(first["label"].iloc[0]) if len(first) else "headline",
        "rows": first.assign(share=first["layer"].map(share)).to_dict("records"),
        "headlines": summary.sort_values(["layer"], kind="stable").to_dict("records"),
        "several": summary.groupby("layer").size().max() > 1,
        "gaps": gaps is not None,
        "readout": str(gaps["readout"].iloc[0]) if gaps is not None else "",
        "pairs": int(gaps["pairs"].iloc[0]) if gaps is not None else 0,
        "difference": None if difference is None else f"{difference:.1e}",
    }
    return write_mechanism_page(
        path, "lens.html", SHOWN, summary, figure, title, manifest, data, own
    )
