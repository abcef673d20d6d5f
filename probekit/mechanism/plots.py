"""The figures of activation patching: layer x site, layer x head and position heatmaps of
recovery, one panel per span (and per identity swapped, where the pairs swap several), drawn on
the generic figure helpers of `probekit.reporting`.

Every value is on the colour scale: it runs symmetrically to the largest |value| shown, at least
[-1, 1] (red: the clean behaviour restored; blue: pushed the other way). A component whose result
is known by construction (`status` not run or trivial, `probekit.mechanism.components`) is
hatched and marked, not coloured as a finding; cells without data are grey.
"""

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from probekit.core.errors import ProbekitError
from probekit.reporting.figures import new_figure, save_figure

LABELS = {
    "recovery": "recovery: mean effect / mean gap over the sets",
    "estimated_recovery": "estimated recovery: mean estimate / mean gap over the sets",
}
"""The colour bar's label of each value: what is averaged, and how."""
MARKS = {"not run": "n/r", "trivial": "triv"}
"""How a cell known by construction is marked."""


def patching_heatmap(
    summary: pd.DataFrame,
    path: str | Path,
    sites: Sequence[str] | None = None,
    spans: Sequence[str] | None = None,
    title: str = "",
    value: str = "recovery",
) -> Path:
    """Save `value` (as from `patching.summarise`) as layer x site heatmaps, one panel per span
    (and identity swapped) in the order of `spans`, as a PNG; each cell prints its value."""
    if summary.empty:
        raise ProbekitError("no patching results to plot")
    data = _panels(summary.assign(site=summary["site"].str.rsplit(".", n=1).str[-1]), "span")
    sites = list(sites or dict.fromkeys(data["site"]))
    panels = _order(data["panel"], spans)
    layers = sorted(data["layer"].unique())
    fig = new_figure(1.2 + 2.4 * len(panels) + 1.2, 1.6 + 0.32 * len(layers))
    for ax, grid in _layer_panels(fig, data, panels, layers, "site", sites, value):
        for (i, j), cell in np.ndenumerate(grid):
            if np.isfinite(cell):
                ax.text(j, i, f"{cell:.2f}", ha="center", va="center", fontsize=7)
        short = [s.removeprefix("hook_") for s in sites]
        ax.set_xticks(range(len(sites)), short, rotation=45, ha="right", rotation_mode="anchor")
    return save_figure(_finish_panels(fig, value, title), path, _drawn(data, "site", value))


def head_heatmap(
    summary: pd.DataFrame,
    path: str | Path,
    value: str = "recovery",
    spans: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """Save a per-head value as layer x head heatmaps, one panel per span (and identity
    swapped), as a PNG; rows without a head are ignored."""
    data = summary.dropna(subset=["head"])
    if data.empty:
        raise ProbekitError("no per-head results to plot")
    data = _panels(data.astype({"head": int}), "span")
    panels = _order(data["panel"], spans)
    layers = sorted(data["layer"].unique())
    heads = list(range(int(data["head"].max()) + 1))
    fig = new_figure(1.2 + (0.9 + 0.3 * len(heads)) * len(panels), 1.6 + 0.25 * len(layers))
    for ax, _ in _layer_panels(fig, data, panels, layers, "head", heads, value):
        ax.set_xticks(range(len(heads)), [str(h) for h in heads])
    return save_figure(_finish_panels(fig, value, title), path, _drawn(data, "head", value))


def position_heatmap(
    summary: pd.DataFrame,
    path: str | Path,
    value: str = "recovery",
    sites: Sequence[str] = (),
    title: str = "",
) -> Path:
    """Save `position_heatmap_figure` as a PNG, with its cells beside it."""
    cells = _drawn(_position_panels(summary, sites), "position", value)
    return save_figure(position_heatmap_figure(summary, value, sites, title), path, cells)


def position_heatmap_figure(
    summary: pd.DataFrame, value: str = "recovery", sites: Sequence[str] = (), title: str = ""
) -> Figure:
    """A per-position value as layer x position heatmaps, one panel per (site, span, identity
    swapped), stacked, in the order of `sites` (hook or bare names; others after them).

    `summary` has columns layer, site, span (`<span>@<i>`, a single aligned position, i < 0
    counted from the span's end), `value` and optionally head (a panel per head where set); rows
    of other spans are ignored."""
    data = _position_panels(summary, sites)
    panels = list(dict.fromkeys(data["panel"]))
    layers = sorted(data["layer"].unique())
    positions = sorted(data["position"].unique())
    width = min(16.0, 2.0 + 0.16 * len(positions))
    fig = new_figure(width, len(panels) * (0.9 + 0.18 * len(layers)))
    cells = _layer_panels(fig, data, panels, layers, "position", positions, value, True)
    for ax, _ in cells:
        ticks = range(0, len(positions), max(1, len(positions) // 12))
        ax.set_xticks(list(ticks), [str(positions[i]) for i in ticks])
    return _finish_panels(fig, value, title)


def _position_panels(summary: pd.DataFrame, sites: Sequence[str]) -> pd.DataFrame:
    """The per-position rows of `summary` with their `position` and `panel`, in panel order."""
    parts = summary["span"].str.extract(r"^(?P<base>.+)@(?P<position>-?\d+)$")
    data = summary.assign(**parts).dropna(subset=["position"]).astype({"position": int})
    if data.empty:
        raise ProbekitError("no per-position results to plot")
    short = data["site"].str.rsplit(".", n=1).str[-1]
    head = data["head"] if "head" in data else pd.Series(pd.NA, index=data.index)
    label = short.str.removeprefix("hook_").where(head.isna(), "H" + head.astype(str))
    rank = {site.rsplit(".", 1)[-1]: i for i, site in enumerate(sites)}
    data = _panels(data.assign(base=label + " " + data["base"]), "base")
    return data.assign(order=short.map(rank).fillna(len(rank)), head=head).sort_values(
        ["order", "site", "head", "panel"], kind="stable"
    )


def _panels(data: pd.DataFrame, column: str) -> pd.DataFrame:
    """`data` with a `panel` column: `column`'s value, and the identity swapped where the rows
    swap several (`experiencer, perceiver swapped`)."""
    swapped = data["swapped"] if "swapped" in data else pd.Series("", index=data.index)
    several = swapped.nunique() > 1
    return data.assign(panel=data[column] + (", " + swapped + " swapped" if several else ""))


def _drawn(data: pd.DataFrame, column: str, value: str) -> pd.DataFrame:
    """The cells a layer x `column` figure draws: the mean `value` per panel, layer and `column`,
    with the status (a component known by construction is drawn hatched, not by its value)."""
    keys = ["panel", "layer", column]
    cells = data.assign(status=data.get("status", "measured")).groupby(keys, sort=False)
    return cells.agg(**{value: (value, "mean"), "status": ("status", "first")}).reset_index()


def _order(panels: pd.Series, spans: Sequence[str] | None) -> list[str]:
    """The panels in the order of their spans in `spans` (then as found)."""
    found = list(dict.fromkeys(panels))
    rank = {span: i for i, span in enumerate(spans or [])}
    return sorted(found, key=lambda p: rank.get(p.split(", ")[0], len(rank)))


def _layer_panels(
    fig: Figure,
    data: pd.DataFrame,
    panels: Sequence[str],
    layers: Sequence[int],
    column: str,
    columns: Sequence[Any],
    value: str,
    stacked: bool = False,
) -> Iterator[tuple[Any, np.ndarray]]:
    """One layer x `column` panel per value of `data["panel"]` of the mean `value`, side by side
    or stacked, on one symmetric colour scale holding every value; cells whose status is known
    by construction hatched and marked. Yields each axis and its grid for labelling."""
    if stacked:
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    else:
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    status = data["status"] if "status" in data else pd.Series("measured", index=data.index)
    known = status.isin(list(MARKS))
    shown = data[value].where(~known)
    top = max(1.0, float(np.nanmax(np.abs(shown.to_numpy(float)), initial=0.0)))
    cmap = colormaps["RdBu_r"].with_extremes(bad="lightgrey")
    for ax, name in zip(axes, panels, strict=True):
        inside = data["panel"] == name
        grid = (
            data[inside]
            .assign(shown=shown[inside])
            .pivot_table(index="layer", columns=column, values="shown", aggfunc="mean")
            .reindex(index=layers, columns=columns)
            .to_numpy(dtype=float)
        )
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-top, vmax=top, aspect="auto")
        for row in data[inside & known].itertuples():
            i, j = layers.index(row.layer), list(columns).index(getattr(row, column))
            box = Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", lw=0)
            ax.add_patch(box)
            ax.text(j, i, MARKS[row.status], ha="center", va="center", fontsize=6)
        ax.set_yticks(range(len(layers)), [str(layer) for layer in layers])
        ax.set_title(name, fontsize=8)
        if stacked or ax is axes[0]:
            ax.set_ylabel("layer")
        if not stacked or ax is axes[-1]:
            ax.set_xlabel(column)
        yield ax, grid


def _finish_panels(fig: Figure, value: str, title: str) -> Figure:
    """The shared colour bar (labelled with what is averaged), the legend of the cells known by
    construction, and the title of `_layer_panels`' figure."""
    panels = list(fig.axes)
    label = LABELS.get(value, value.replace("_", " "))
    fig.colorbar(panels[0].images[0], ax=panels, label=label, shrink=0.8)
    legend = [
        Patch(fill=False, hatch="///", label="n/r: not run (identical activations)"),
        Patch(fill=False, hatch="///", label="triv: trivial (the clean run by construction)"),
    ]
    fig.legend(handles=legend, loc="lower left", fontsize=6, frameon=False)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig
