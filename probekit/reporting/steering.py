"""The page and figure of a steering run (`probekit steer STUDY`): the study's headline at each
α along the vector and along the random controls of the same norm (`random`, `random2`, ...:
their mean and range), side by side, with the side effects (mean valid mass, mean KL from α =
0) and the figure, from the run's summary rows (`summary.csv`: one row per site, layer, vector
kind and α). Rendered from the package's templates (`templates/steer.html`) like the run pages,
self-contained."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.reporting.figures import new_figure, save_figure
from probekit.reporting.html import write_mechanism_page

STEER, RANDOM = "steer", "random"
"""The `vector` column's kinds: the vector given, and (as a prefix) the random controls."""
SHOWN = ("study", "model", "weights", "dtype", "device", "vector", "vector_file", "vector_sha256")
SHOWN += ("positions", "span", "sites", "layers", "hooks", "seed", "alphas", "controls", "prompts")
SHOWN += ("tolerance", "tier", "data_sha256")


def steer_figure(summary: pd.DataFrame, path: str | Path, title: str) -> Path:
    """The headline against α (the vector and the random control, with intervals) and the side
    effects (mean valid mass, mean KL), one line per (site, layer, vector kind)."""
    fig = new_figure(10, 4)
    headline, effects = fig.subplots(1, 2)
    kl = effects.twinx()
    for (site, layer, kind), group in summary.groupby(["site", "layer", "vector"], sort=False):
        group = group.sort_values("alpha")
        style = "-" if kind == STEER else "--"
        label = f"L{layer} {site} {kind}"
        x = group["alpha"].to_numpy(float)
        grey = {} if kind == STEER else {"color": "grey"}
        line = headline.plot(
            x, group["value"].to_numpy(float), style, marker="o", label=label, **grey
        )[0]
        low, high = group["low"].to_numpy(float), group["high"].to_numpy(float)
        headline.fill_between(x, low, high, color=line.get_color(), alpha=0.15)
        effects.plot(x, group["mean_valid_mass"], style, marker="o", label=f"{label} mass")
        kl.plot(x, group["mean_kl"], style, marker="x", color="grey", label=f"{label} KL")
    headline.axhline(0, color="black", lw=0.5)
    headline.set_xlabel("α")
    headline.set_ylabel(str(summary["label"].iloc[0]))
    headline.legend(fontsize=7)
    effects.set_xlabel("α")
    effects.set_ylabel("mean valid mass (o)")
    kl.set_ylabel("mean KL from α = 0, nats (x, grey)")
    effects.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=9)
    drawn = ["site", "layer", "vector", "alpha", "value", "low", "high", "mean_valid_mass"]
    return save_figure(fig, path, summary[[*drawn, "mean_kl"]])


_POOLED = ("value", "push", "mean_valid_mass", "mean_kl")
"""The cells of the random controls shown as their mean."""


def steer_rows(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """The page's table: one row per (site, layer, α) with the vector's cells and the random
    controls' beside them (their mean; the interval from the lowest to the highest control)."""
    rows = []
    for (site, layer, alpha), group in summary.groupby(["site", "layer", "alpha"], sort=True):
        kinds = {r["vector"]: r for r in group.to_dict("records")}
        controls = group[group["vector"].str.startswith(RANDOM)]
        pooled = None
        if len(controls):
            mean = {k: controls[k].astype(float).mean() for k in _POOLED if k in controls}
            pooled = mean | {
                "low": controls["value"].astype(float).min(),
                "high": controls["value"].astype(float).max(),
                "p_value": float("nan"),
                "weak_signal": bool(controls["weak_signal"].any()),
            }
        rows.append(
            {
                "site": site,
                "layer": int(layer),
                "alpha": f"{alpha:g}",
                "steer": kinds.get(STEER),
                "random": pooled,
                "controls": len(controls),
            }
        )
    return rows


def write_steer_page(
    path: str | Path,
    summary: pd.DataFrame,
    figure: str | Path,
    title: str,
    manifest: Mapping[str, Any],
    data: str,
    weak: str | None = None,
) -> Path:
    """Write the steering run's page (`report.html`) atomically (`data`: the data as the study
    describes it; `weak`: the weak-signal line, shown as a banner)."""
    own = {"label": str(summary["label"].iloc[0]), "rows": steer_rows(summary), "weak": weak}
    return write_mechanism_page(
        path, "steer.html", SHOWN, summary, figure, title, manifest, data, own
    )
