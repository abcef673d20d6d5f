"""Generic figures: a masked matrix heatmap with separators and outlined blocks, a 2-D t-SNE
map of labelled rows, and the headlines of several runs against each study's no-bias value (the
patching heatmaps are `probekit.mechanism.plots`). Studies pass their own labels, titles and
separators.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot), so plotting never touches
the global backend or needs a display. Every figure is saved with the numbers it draws beside it
(`save_figure`), which the manifests name (`figure_data`).
"""

import itertools
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from probekit.core.errors import ProbekitError
from probekit.core.io import atomic_write
from probekit.reporting.latex import write_csv

DPI = 100
TITLE_WIDTH = 48
"""Characters per line of a figure's title (the heatmaps are ~6 inches wide)."""
# Okabe & Ito's colour-blind-safe palette (blue, orange, bluish green, vermillion, reddish
# purple, sky blue, yellow, black): categorical colours of probekit's own figures.
CATEGORICAL = ("#0072B2", "#E69F00", "#009E73", "#D55E00")
CATEGORICAL += ("#CC79A7", "#56B4E9", "#F0E442", "#000000")

Blocks = Sequence[tuple[int, int]] | Sequence[str]
OUTLINE = "crimson"  # the outline of a heatmap's blocks


@dataclass(frozen=True)
class HeadlineRow:
    """One model's (or run's) headline in a panel of `headline_figure`."""

    name: str
    value: float | None
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class HeadlinePanel:
    """One study's headline across models: its rows, axis label and no-bias value."""

    title: str
    axis: str
    rows: Sequence[HeadlineRow]
    reference: float | None = None
    reference_label: str = ""


def wrap_title(title: str, width: int = TITLE_WIDTH) -> str:
    """`title` with each of its lines wrapped at `width` characters, so that a long model name
    stays inside the figure instead of being cut at its edges."""
    return "\n".join(textwrap.fill(line, width) or line for line in title.split("\n"))


def new_figure(width: float, height: float) -> Figure:
    """A figure of `width` x `height` inches with its own canvas (no pyplot state)."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


FigureData = pd.DataFrame | Mapping[str, pd.DataFrame]
"""The numbers a figure draws: one table, or several by name (a heatmap's matrix and mask)."""


def save_figure(fig: Figure, path: str | Path, data: FigureData) -> Path:
    """Write `fig` as a PNG atomically (parent folders created) and the numbers it draws beside
    it, so that a reader can check it without reading pixels: `data` as `<stem>.csv`, or each
    named table as `<stem>.<name>.csv` (`figure_data` lists them); return the PNG's path."""
    path = Path(path)
    tables = {"": data} if isinstance(data, pd.DataFrame) else data
    for name, table in tables.items():
        csv = path.with_name(".".join(filter(None, (path.stem, name, "csv"))))
        write_csv(csv, table)
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


def figure_data(folder: str | Path, patterns: Iterable[str] = ("*.png",)) -> dict[str, list[str]]:
    """Each figure in `folder` that `patterns` match (globs relative to it: its PNGs by default,
    `layers/*/*.png` for a lens run's layer reports) with the files of its numbers that
    `save_figure` wrote beside it, as paths relative to `folder`: the manifest's `figures`
    field."""
    folder = Path(folder)
    found = {}
    for png in sorted({p for pattern in patterns for p in folder.glob(pattern)}):
        tables = [
            p for glob in (f"{png.stem}.csv", f"{png.stem}.*.csv") for p in png.parent.glob(glob)
        ]
        found[png.relative_to(folder).as_posix()] = sorted(
            p.relative_to(folder).as_posix() for p in tables
        )
    return found


def _block_ranges(blocks: Blocks | None, n: int) -> list[tuple[int, int]]:
    """Index ranges to outline, from ranges or from labels of all or of the named identities."""
    if not blocks:
        return []
    if all(isinstance(b, str) for b in blocks):
        if len(blocks) not in (n, n - 1):
            raise ProbekitError(f"got {len(blocks)} block labels for {n} identities")
        sizes = [len(list(group)) for _, group in itertools.groupby(blocks)]  # runs of a label
        ends = np.cumsum(sizes) + n - len(blocks)  # a label per row, or per row after the first
        return [(int(end - size), int(end)) for size, end in zip(sizes, ends, strict=True)]
    ranges = [(int(start), int(stop)) for start, stop in blocks]
    if any(not 0 <= start < stop <= n for start, stop in ranges):
        raise ProbekitError(f"block ranges must lie within 0..{n} with start < stop: {ranges}")
    return ranges


def heatmap_figure(
    Z: np.ndarray,
    labels: Sequence[str],
    mask: np.ndarray | None = None,
    blocks: Blocks | None = None,
    title: str = "",
    separators: Sequence[int] = (),
    axis_labels: tuple[str, str] = ("perceiver", "experiencer"),
    mask_label: str = "hidden: not significant (Bonferroni)",
    block_label: str = "blocks",
) -> Figure:
    """Draw the square matrix Z (rows and columns both named by `labels`) in YlGnBu, the
    paper's colour map (sequential, colour-blind safe).

    `mask` is True where a cell is shown (as from `stats.shown_mask`); other cells are white,
    and a legend under the figure says what white means (`mask_label`), so that a hidden cell
    does not read as missing data. A grid of at most 10 x 10 has each shown cell's value written
    in it. A black line is drawn before each index in `separators` (e.g. 1
    sets off a reference group in the first row and column). `blocks` outlines blocks in
    crimson, single cells too: (start, stop) index ranges, or one label per row (or per row
    after the first), consecutive equal labels forming a block; the legend says what they are
    (`block_label`). `axis_labels` name the rows and the columns; the colour bar reads z-scores.
    """
    Z = np.asarray(Z, dtype=float)
    n = len(labels)
    if Z.shape != (n, n):
        raise ProbekitError(f"Z has shape {Z.shape} but there are {n} labels")
    hidden = np.zeros((n, n), dtype=bool) if mask is None else ~np.asarray(mask, dtype=bool)
    if hidden.shape != (n, n):
        raise ProbekitError(f"mask has shape {hidden.shape} but Z has shape {Z.shape}")
    side = 3 + 0.35 * n
    fig = new_figure(side + 1.5, side + 0.4 * (hidden.any() + bool(blocks)))
    ax = fig.add_subplot()
    cmap = colormaps["YlGnBu"].with_extremes(bad="white")
    image = ax.imshow(np.ma.masked_array(Z, hidden), cmap=cmap)
    if n <= 10:
        for (i, j), value in np.ndenumerate(Z):
            if not hidden[i, j] and np.isfinite(value):
                colour = "white" if image.norm(value) > 0.6 else "black"
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=colour)
    legend = []
    if hidden.any():
        legend.append(Patch(facecolor="white", edgecolor="grey", label=f"white: {mask_label}"))
    for at in separators:
        ax.axhline(at - 0.5, color="black", linewidth=2)
        ax.axvline(at - 0.5, color="black", linewidth=2)
    ranges = _block_ranges(blocks, n)
    for start, stop in ranges:
        corner, size = (start - 0.5, start - 0.5), stop - start
        outline = Rectangle(corner, size, size, fill=False, edgecolor=OUTLINE, linewidth=2)
        outline.set_clip_on(False)
        ax.add_patch(outline)
    if ranges:
        legend.append(Patch(fill=False, edgecolor=OUTLINE, label=f"outlined: {block_label}"))
    if legend:
        fig.legend(handles=legend, loc="outside lower center", fontsize=8, frameon=False)
    ax.set_xticks(range(n), labels, rotation=60, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(n), labels)
    ax.set_ylabel(axis_labels[0])
    ax.set_xlabel(axis_labels[1])
    ax.set_title(wrap_title(title))
    fig.colorbar(image, ax=ax, label="z-score", shrink=0.8)
    return fig


def heatmap(Z: np.ndarray, labels: Sequence[str], *, path: str | Path, **options: Any) -> Path:
    """Save the heatmap of `heatmap_figure` (its options as keywords: `mask`, `blocks`, ...)
    as a PNG at `path`, with its cells beside it in long form (row, column, value, and `shown`:
    False where the mask hides the cell)."""
    fig = heatmap_figure(Z, labels, **options)  # checks the shapes
    Z, n, mask = np.asarray(Z, dtype=float), len(labels), options.get("mask")
    shown = np.ones_like(Z, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    cells = {"row": np.repeat(labels, n), "column": np.tile(labels, n), "value": Z.ravel()}
    return save_figure(fig, path, pd.DataFrame(cells | {"shown": shown.ravel()}))


def embed_rows(Z_rows: np.ndarray, seed: int = 0, perplexity: float | None = None) -> np.ndarray:
    """2-D t-SNE coordinates of the rows of a matrix (scikit-learn's TSNE, PCA initialisation).

    `perplexity` defaults to min(5, (n − 1) / 3): t-SNE needs it well below the number of
    points, and 5 keeps local neighbourhoods meaningful for ~21 rows.
    """
    rows = np.asarray(Z_rows, dtype=float)
    if rows.ndim != 2 or len(rows) < 3:
        raise ProbekitError(f"t-SNE needs a matrix of at least 3 rows, got shape {rows.shape}")
    if perplexity is None:
        perplexity = min(5.0, (len(rows) - 1) / 3)
    if not 0 < perplexity < len(rows):
        raise ProbekitError(f"t-SNE perplexity {perplexity} must lie in (0, {len(rows)})")
    from sklearn.manifold import TSNE  # on use: scikit-learn takes ~1 s to import

    tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed)
    return tsne.fit_transform(rows)


def embedding_plot(
    Z_rows: np.ndarray,
    names: Sequence[str],
    groups: Sequence[str],
    path: str | Path,
    seed: int = 0,
    title: str = "perceivers by their row of Z (t-SNE)",
    legend: str = "cultural region",
    perplexity: float | None = None,
) -> Path:
    """Save a t-SNE map of the rows of a matrix, coloured by group, as PNG.

    `names` label the points as given; short names (the country alone) read best.
    """
    if not len(Z_rows) == len(names) == len(groups):
        raise ProbekitError(f"got {len(Z_rows)} rows, {len(names)} names and {len(groups)} groups")
    points = embed_rows(Z_rows, seed, perplexity)
    fig = new_figure(10, 6.5)
    ax = fig.add_subplot()
    colours = colormaps["tab10"]
    for k, group in enumerate(dict.fromkeys(groups)):
        members = [i for i, g in enumerate(groups) if g == group]
        ax.scatter(*points[members].T, color=colours(k % 10), label=group, s=50)
    for (x, y), name in zip(points, names, strict=True):
        ax.annotate(name, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.margins(0.15)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(wrap_title(title))
    ax.legend(title=legend, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    data = pd.DataFrame({"name": names, "group": groups, "x": points[:, 0], "y": points[:, 1]})
    return save_figure(fig, path, data)


def headline_figure(panels: Sequence[HeadlinePanel]) -> Figure:
    """One panel per study (its own scale): a row per model (or run) with its headline value and
    interval, the study's no-bias value as a dashed line, so that bias profiles compare at a
    glance."""
    if not panels:
        raise ProbekitError("no headlines to draw")
    heights = [max(len(p.rows), 1) for p in panels]
    fig = new_figure(8.5, 1.1 * len(panels) + 0.38 * sum(heights))
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, panel in zip(axes, panels, strict=True):
        y = np.arange(len(panel.rows))[::-1]
        for yi, row in zip(y, panel.rows, strict=True):
            if row.value is None:
                ax.text(0.5, yi, "no value", transform=ax.get_yaxis_transform(), va="center")
                continue
            if row.low is not None and row.high is not None:
                ax.hlines(yi, row.low, row.high, color=CATEGORICAL[0], linewidth=2)
            ax.plot(row.value, yi, "o", color=CATEGORICAL[0], markersize=6)
        if panel.reference is not None:
            ax.axvline(panel.reference, color="black", linestyle="--", linewidth=1)
            label = panel.reference_label or f"no bias ({panel.reference:g})"
            where = {"xycoords": ("data", "axes fraction"), "textcoords": "offset points"}
            ax.annotate(label, (panel.reference, 1), xytext=(3, -2), va="top", fontsize=8, **where)
        ax.set_yticks(y, [row.name for row in panel.rows], fontsize=8)
        ax.set_ylim(-0.7, len(panel.rows) - 0.3)
        ax.margins(x=0.08)
        ax.set_title(panel.title, fontsize=9, loc="left")
        lines = [textwrap.fill(line, 110) for line in panel.axis.splitlines()]
        ax.set_xlabel("\n".join(lines), fontsize=8)
    return fig
