"""The figures of activation patching: layer x site, layer x head and position heatmaps of
recovery, one panel per span (drawn on the generic figure helpers of `probekit.reporting`)."""

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from probekit.core.errors import ProbekitError
from probekit.reporting.figures import new_figure, save_figure


def patching_heatmap(
    summary: pd.DataFrame,
    path: str | Path,
    sites: Sequence[str] | None = None,
    spans: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """Save mean recovery as layer x site heatmaps, one panel per span, as a PNG.

    `summary` has columns layer, site (a hook name `blocks.{l}.{site}` or a bare site), span and
    recovery (as from `patching.summarise`). The colour scale is fixed at [-1, 1] (red = the
    clean behaviour restored, blue = pushed the other way) and each cell prints its value, so
    values beyond the scale stay readable; cells without data are grey.
    """
    if summary.empty:
        raise ProbekitError("no patching results to plot")
    data = summary.assign(site=summary["site"].str.rsplit(".", n=1).str[-1])
    sites = list(sites or dict.fromkeys(data["site"]))
    spans = list(spans or dict.fromkeys(data["span"]))
    layers = sorted(data["layer"].unique())
    fig = new_figure(1.2 + 2.4 * len(spans) + 1.2, 1.6 + 0.32 * len(layers))
    for ax, grid in _layer_panels(fig, data, "span", spans, layers, "site", sites, "recovery"):
        for (i, j), value in np.ndenumerate(grid):
            if np.isfinite(value):
                colour = "white" if abs(value) > 0.6 else "black"
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=colour)
        short = [s.removeprefix("hook_") for s in sites]
        ax.set_xticks(range(len(sites)), short, rotation=45, ha="right", rotation_mode="anchor")
    return save_figure(_finish_panels(fig, "mean recovery", title), path)


def head_heatmap(
    summary: pd.DataFrame,
    path: str | Path,
    value: str = "recovery",
    spans: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """Save a per-head value as layer x head heatmaps, one panel per span, as a PNG.

    `summary` has columns layer, head, span and `value` (mean recovery, or the attribution
    estimate as a share of the gap); rows without a head are ignored. Same scale as
    `patching_heatmap`: [-1, 1], red = the clean behaviour restored; missing cells are grey.
    """
    data = summary.dropna(subset=["head"])
    if data.empty:
        raise ProbekitError("no per-head results to plot")
    spans = list(spans or dict.fromkeys(data["span"]))
    layers = sorted(data["layer"].unique())
    heads = list(range(int(data["head"].max()) + 1))
    fig = new_figure(1.2 + (0.9 + 0.3 * len(heads)) * len(spans), 1.6 + 0.25 * len(layers))
    data = data.astype({"head": int})
    for ax, _ in _layer_panels(fig, data, "span", spans, layers, "head", heads, value):
        ax.set_xticks(range(len(heads)), [str(h) for h in heads])
    return save_figure(_finish_panels(fig, value.replace("_", " "), title), path)


def position_heatmap(
    summary: pd.DataFrame,
    path: str | Path,
    value: str = "recovery",
    sites: Sequence[str] = (),
    title: str = "",
) -> Path:
    """Save `position_heatmap_figure` as a PNG."""
    return save_figure(position_heatmap_figure(summary, value, sites, title), path)


def position_heatmap_figure(
    summary: pd.DataFrame, value: str = "recovery", sites: Sequence[str] = (), title: str = ""
) -> Figure:
    """A per-position value as layer x position heatmaps, one panel per (site, span), stacked,
    in the order of `sites` (hook or bare names; others after them).

    `summary` has columns layer, site, span (`<span>@<i>`, a single aligned position, i < 0
    counted from the span's end), `value` and optionally head (a panel per head where set); rows
    of other spans are ignored. Same scale as `patching_heatmap`: [-1, 1], red = the clean
    behaviour restored; missing cells are grey.
    """
    parts = summary["span"].str.extract(r"^(?P<base>.+)@(?P<position>-?\d+)$")
    data = summary.assign(**parts).dropna(subset=["position"]).astype({"position": int})
    if data.empty:
        raise ProbekitError("no per-position results to plot")
    short = data["site"].str.rsplit(".", n=1).str[-1]
    head = data["head"] if "head" in data else pd.Series(pd.NA, index=data.index)
    label = short.str.removeprefix("hook_").where(head.isna(), "H" + head.astype(str))
    rank = {site.rsplit(".", 1)[-1]: i for i, site in enumerate(sites)}
    data = data.assign(
        panel=label + " " + data["base"], order=short.map(rank).fillna(len(rank)), head=head
    ).sort_values(["order", "site", "head", "base"], kind="stable")
    panels = list(dict.fromkeys(data["panel"]))
    layers = sorted(data["layer"].unique())
    positions = sorted(data["position"].unique())
    width = min(16.0, 2.0 + 0.16 * len(positions))
    fig = new_figure(width, len(panels) * (0.9 + 0.18 * len(layers)))
    cells = _layer_panels(fig, data, "panel", panels, layers, "position", positions, value, True)
    for ax, _ in cells:
        ticks = range(0, len(positions), max(1, len(positions) // 12))
        ax.set_xticks(list(ticks), [str(positions[i]) for i in ticks])
    return _finish_panels(fig, value.replace("_", " "), title)


def _layer_panels(
    fig: Figure,
    data: pd.DataFrame,
    panel: str,
    panels: Sequence[str],
    layers: Sequence[int],
    column: str,
    columns: Sequence[Any],
    value: str,
    stacked: bool = False,
) -> Iterator[tuple[Any, np.ndarray]]:
    """One layer x `column` panel per value of `panel` (a span, ...) of the mean `value` on
    [-1, 1] (red = the clean behaviour restored, missing cells grey), side by side or stacked;
    yields each axis and its grid for labelling."""
    if stacked:
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    else:
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    cmap = colormaps["RdBu_r"].with_extremes(bad="lightgrey")
    for ax, name in zip(axes, panels, strict=True):
        grid = (
            data[data[panel] == name]
            .pivot_table(index="layer", columns=column, values=value, aggfunc="mean")
            .reindex(index=layers, columns=columns)
            .to_numpy(dtype=float)
        )
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-1, vmax=1, aspect="auto")
        ax.set_yticks(range(len(layers)), [str(layer) for layer in layers])
        ax.set_title(name)
        if stacked or ax is axes[0]:
            ax.set_ylabel("layer")
        if not stacked or ax is axes[-1]:
            ax.set_xlabel(column)
        yield ax, grid


def _finish_panels(fig: Figure, label: str, title: str) -> Figure:
    """The shared colour bar and title of `_layer_panels`' figure."""
    panels = list(fig.axes)
    fig.colorbar(panels[0].images[0], ax=panels, label=label, shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig
