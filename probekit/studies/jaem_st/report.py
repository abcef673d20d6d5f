"""What a researcher reads after a JaEm-ST run: tables, two figures and the summary.

Per view (a generate run is also reported from its exact scores, as `*_exact`): accuracy per
template, per dimension value (`dimensions*.csv`) and per intersectional group with z and the
outlier flag (`groups*.csv`); `accuracy_by_group*.png` (one panel per dimension that reaches a
prompt, 95 % intervals) and `groups_heatmap*.png` (gender x pronoun, outliers outlined). With
`--responses`: AE and ERA per template (`responses_templates.csv`) and per group with outliers
(`responses_groups.csv`), added to the summary rows of the run's own view.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.patches import Rectangle

import probekit.studies.jaem_st.metrics as metrics
from probekit.reporting import Headline, RunFacts, ViewFacts
from probekit.reporting.contract import describe_model
from probekit.reporting.figures import CATEGORICAL, new_figure, save_figure, wrap_title
from probekit.reporting.headline import SummaryRow, format_number, missing, row_headlines
from probekit.reporting.latex import markdown_table, write_csv
from probekit.studies.base import run_view
from probekit.studies.jaem_st.probe import N_OPTIONS
from probekit.studies.report import ReportView, context_lines, with_interval

SUMMARY_COLUMNS = (
    *("model", "data", "prompt", "orders", "view", "template", "n_samples", "accuracy", "low"),
    *("high", "greedy_accuracy", "parse_rate", "mean_valid_mass", "letter_bias", "answer_types"),
    *("outliers", "highest", "lowest", "group_gap", "eta_squared", "p_samples"),
    *("valid_mass_by_group", "n_responses", "empty_responses", *metrics.RESPONSE_METRICS),
    "response_outliers",
)
_SCORE = {
    False: "the mean exact probability of its letter",
    True: "the share of first letters that are its",
}
VIEW_TEXT = {
    "exact": "exact P(Empathetic) over A-E from the logits",
    "generate": "greedy answer, its first standalone letter",
}
METRIC_NAMES = {
    m: m.replace("vad_", "AE ").replace("era_", "ERA ") for m in metrics.RESPONSE_METRICS
}


CAPTIONS = {
    "groups.png": "CE score per group of the --groups columns (default gender x pronoun) "
    "with 95 % bootstrap intervals over samples, sorted; dashed: the overall mean; "
    "vermillion, with their z beside them: outliers (|z| above --outlier-z, z over the "
    "spread of the group means).",
    "groups_heatmap.png": "Mean CE score per group, the first --groups column (default "
    "gender) in rows and the second (pronoun) in columns; outlined in crimson: outliers.",
    "accuracy_by_group.png": "CE score per value of each dimension that reaches a prompt, "
    "with 95 % bootstrap intervals over samples; dashed: the overall mean.",
}
"""Each figure's caption on the report pages (`Study.captions`), by file name."""


def report_view(scores: pd.DataFrame, out: ReportView) -> list[dict[str, Any]]:
    """Tables and figures of one view of a run; returns one summary row per template and `all`."""
    manifest, view, seed = out.manifest, out.view, out.seed
    shown: dict[str, list[str]] = manifest["shown_dimensions"]
    groups, z = _groups(manifest)
    columns = list(dict.fromkeys([*groups, *(c for cols in shown.values() for c in cols)]))
    samples = metrics.sample_scores(scores, view, columns)
    overall = metrics.interval_table(samples, [], seed).iloc[0]
    per_template = metrics.interval_table(samples, ["template"], seed)
    dims = metrics.dimension_table(samples, shown, seed)

    def group_outliers(subset: pd.DataFrame, mean: float) -> pd.DataFrame:
        return metrics.outliers(metrics.interval_table(subset, groups, seed), mean, z)

    group_table = group_outliers(samples, float(overall["mean"]))
    write_csv(out.path("templates.csv"), per_template)
    write_csv(out.path("dimensions.csv"), dims)
    title = (
        f"JaEm-ST: {describe_model(manifest)}, CE prompt {manifest.get('prompt', 0)}, view {view}, "
        f"N = {int(overall['n'])} samples"
    )
    accuracy_figure(dims, out.path("accuracy_by_group.png"), title, float(overall["mean"]))
    group_figure(group_table, groups, out.path("groups.png"), title, float(overall["mean"]), z)
    if len(groups) == 2:
        group_heatmap(group_table, groups, out.path("groups_heatmap.png"), title, z)
    base = {k: manifest.get(k, d) for k, d in (("model", None), ("prompt", 0), ("orders", 1))}
    labels = manifest.get("answer_labels")
    responded = report_responses(scores, out)
    rows = []
    for name, stats in [("all", overall), *per_template.set_index("template").iterrows()]:
        frame = scores if name == "all" else scores[scores["template"] == name]
        subset = samples if name == "all" else samples[samples["template"] == name]
        # a template's groups against that template's mean
        table = group_table if name == "all" else group_outliers(subset, float(stats["mean"]))
        types = labels or sorted({t for types in frame["answer_types"] for t in types.split(",")})
        row = {**base, "view": view, "template": name, "outliers": _outliers(table, groups)}
        row |= {"n_samples": int(stats["n"]), "accuracy": stats["mean"]}
        row |= {"low": stats["low"], "high": stats["high"]}
        row |= {"mean_valid_mass": float(frame["valid_mass"].mean())}
        row |= metrics.group_context(subset, frame, groups)
        if view == "generate":
            row["parse_rate"] = float(frame["parsed"].notna().mean())
        else:
            row["greedy_accuracy"] = float((frame["greedy"] == frame["empathetic_letter"]).mean())
        row["letter_bias"] = _shares(metrics.letter_bias(frame, view))
        row["answer_types"] = _shares(metrics.answer_type_shares(frame, view, types))
        rows.append(row | responded.get(name, {}))
    return rows


def _groups(manifest: dict[str, Any]) -> tuple[list[str], float]:
    """The run's group columns and its outlier threshold z."""
    groups = list(manifest.get("groups") or metrics.DEFAULT_GROUPS)
    return groups, float(manifest.get("outlier_z", metrics.DEFAULT_Z))


def _outliers(table: pd.DataFrame, groups: Sequence[str]) -> str:
    """The outlier groups of `table`, `gender/pronoun mean (z +z)` each (with their metric's
    name where the table has one), or `none`."""
    hits = table[table["outlier"]] if len(table) else table
    return (
        "; ".join(
            f"{METRIC_NAMES[r['metric']] + ' ' if 'metric' in r else ''}"
            f"{'/'.join(str(r[g]) for g in groups)} {r['mean']:.3f} (z {r['z']:+.2f})"
            for _, r in hits.iterrows()
        )
        or "none"
    )


def report_responses(scores: pd.DataFrame, out: ReportView) -> dict[str, dict[str, Any]]:
    """In the run's own view, the AE and ERA tables of the free responses the run wrote
    (`responses.parquet`, `--responses`); returns the summary fields per template (and `all`):
    response counts, the mean of each metric, and the outlier groups of every metric."""
    import probekit.studies.jaem_st.responses as responses  # torch, through ERA: on use

    manifest = out.manifest
    if not manifest.get("responses") or out.view != run_view(manifest):
        return {}
    frame = responses.read_responses(scores, out.folder, manifest)
    if frame is None:
        return {}
    groups, z = _groups(manifest)
    templates, group_table = metrics.response_tables(frame, groups, z, out.seed)
    write_csv(out.folder / "responses_templates.csv", templates)
    write_csv(out.folder / "responses_groups.csv", group_table)
    outliers = _outliers(group_table, groups)
    fields = {}
    for name, part in [("all", frame), *frame.groupby("template", sort=True)]:
        fields[name] = {
            "n_responses": len(part),
            "empty_responses": int((part["response"].str.strip() == "").sum()),
            "response_outliers": outliers,
        }
        if len(templates):
            means = templates[templates["template"] == name].set_index("metric")["mean"]
            fields[name].update(means.to_dict())
    return fields


def _shares(series: pd.Series) -> str:
    return " ".join(f"{k} {v:.2f}" for k, v in series.items())


def accuracy_figure(dims: pd.DataFrame, path: Path, title: str, overall: float) -> None:
    """One panel per dimension: the mean score of each value with its 95 % interval."""
    names = list(dict.fromkeys(dims["dimension"]))
    fig = new_figure(3.2 * len(names), 3.8)
    axes = fig.subplots(1, len(names), sharey=True, squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        part = dims[dims["dimension"] == name]
        x = np.arange(len(part))
        mean = part["mean"].to_numpy()
        err = np.vstack([mean - part["low"].to_numpy(), part["high"].to_numpy() - mean])
        ax.errorbar(x, mean, yerr=err, fmt="o", capsize=3, color=CATEGORICAL[0])
        ax.axhline(overall, color="grey", linestyle="--", linewidth=1)
        labels = part["value"].astype(str)
        ax.set_xticks(x, labels, rotation=60, ha="right", rotation_mode="anchor", fontsize=8)
        ax.set_title(name)
    axes[0].set_ylabel("CE score (95 % CI over samples)")
    fig.suptitle(title)
    save_figure(fig, path, dims)


def group_heatmap(
    table: pd.DataFrame, groups: Sequence[str], path: Path, title: str, z: float
) -> None:
    """Mean score per (row group, column group); cells with |z| > threshold outlined."""
    rows = list(dict.fromkeys(table[groups[0]]))
    cols = list(dict.fromkeys(table[groups[1]]))
    grid, flags = (
        table.pivot(index=groups[0], columns=groups[1], values=v).reindex(rows, columns=cols)
        for v in ("mean", "outlier")
    )
    fig = new_figure(2.5 + 0.9 * len(cols), 1.5 + 0.4 * len(rows))
    ax = fig.add_subplot()
    image = ax.imshow(grid.to_numpy(dtype=float), cmap=colormaps["YlGnBu"], aspect="auto")
    for (i, j), value in np.ndenumerate(grid.to_numpy(dtype=float)):
        colour = "white" if image.norm(value) > 0.6 else "black"
        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=colour)
        if bool(flags.iloc[i, j]):
            ax.add_patch(
                Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="crimson", linewidth=2.5)
            )
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(groups[1])
    ax.set_ylabel(groups[0])
    ax.set_title(wrap_title(f"{title}\noutlined in crimson: outliers, |z| > {z:g}"), fontsize=9)
    fig.colorbar(image, ax=ax, label="CE score")
    save_figure(fig, path, table[[*groups, "mean", "z", "outlier"]])


def group_figure(
    table: pd.DataFrame, groups: Sequence[str], path: Path, title: str, overall: float, z: float
) -> None:
    """The mean score of every group with its 95 % interval, sorted, the overall mean dashed;
    outliers (|z| > the threshold) in vermillion with their z written beside them; the table
    beside it (`groups.csv`)."""
    data, table = table, table.sort_values("mean").reset_index(drop=True)
    names = ["/".join(str(r[g]) for g in groups) for _, r in table.iterrows()]
    fig = new_figure(7.5, 1.4 + 0.22 * len(table))
    ax = fig.add_subplot()
    for i, r in table.iterrows():
        colour = CATEGORICAL[3] if r["outlier"] else CATEGORICAL[0]
        err = [[r["mean"] - r["low"]], [r["high"] - r["mean"]]]
        ax.errorbar(r["mean"], i, xerr=err, fmt="o", color=colour, capsize=2, markersize=4)
        if r["outlier"]:
            place = {"xytext": (4, 0), "textcoords": "offset points", "va": "center"}
            ax.annotate(f"z {r['z']:+.2f}", (r["high"], i), fontsize=8, color=colour, **place)
    ax.axvline(overall, color="grey", linestyle="--", linewidth=1)
    ax.margins(x=0.12)  # room for the z labels
    ax.set_yticks(range(len(table)), names, fontsize=8)
    ax.set_ylim(-0.7, len(table) - 0.3)
    ax.set_xlabel("CE score (95 % CI over samples)")
    ax.set_ylabel(" / ".join(groups))
    ax.set_title(f"{title}\nvermillion: outliers, |z| > {z:g}; dashed: overall mean", fontsize=9)
    save_figure(fig, path, data)


def summary_markdown(frame: pd.DataFrame) -> str:
    """The summary as a Markdown table with a legend."""
    records = frame.to_dict("records")
    cells = [
        [r["model"], r["prompt"], r["orders"], r["view"], r["template"], r["n_samples"]]
        + [with_interval(r["accuracy"], r["low"], r["high"]), format_number(r["greedy_accuracy"])]
        + [format_number(r["parse_rate"]), f"{r['mean_valid_mass']:.3f}", r["letter_bias"]]
        + [r["answer_types"], r["outliers"]]
        for r in records
    ]
    lines = [markdown_table(SUMMARY_HEADER, cells)]
    contexts = context_lines(records, ("model", "view", "template"), context_line)
    lines += ["", *contexts] if contexts else []
    legend = (
        "CE score: exact = mean P(Empathetic) (normalised over A–E), generate = accuracy of the "
        "first standalone letter; per sample averaged over its orders, 95 % bootstrap over "
        "samples. Letter bias: mean P(letter) (exact) or share of parsed letters (generate). "
        "Outliers: groups more than z group-standard-deviations from the overall mean. "
        "Context: the groups with the highest and the lowest CE score and the gap between them "
        "in percentage points; η², the share of the samples' variance between the groups, and "
        "p, the one-way ANOVA F test over samples that all groups score alike; the mean valid "
        "mass of the prompts, overall and by group."
    )
    responses = [r for r in records if not pd.isna(r.get("n_responses"))]
    if responses:
        cells = [
            [r["model"], r["template"], int(r["n_responses"]), int(r["empty_responses"])]
            + [format_number(r.get(m)) for m in metrics.RESPONSE_METRICS]
            + [r["response_outliers"]]
            for r in responses
        ]
        lines += ["", "", markdown_table(RESPONSES_HEADER, cells)]
        legend += (
            " Free responses (--responses): Carl's greedy continuation; AE = mean "
            "|VAD(conversation) − VAD(response)| per dimension (lower is closer; — without "
            "--vad-lexicon); ERA = "
            "mean EPITOME level 0–2 of (Jane's last line, response) (— without --era-model); "
            "intervals and group outliers in responses_templates.csv, responses_groups.csv."
        )
    return "\n".join([*lines, "", legend]) + "\n"


SUMMARY_HEADER = [
    *("model", "CE prompt", "orders", "view", "template", "samples", "CE score [95% CI]"),
    *("greedy acc.", "letter found", "valid mass", "letter bias", "answer types chosen"),
    "outliers (gender/pronoun)",
]
RESPONSES_HEADER = ["model", "template", "responses", "empty", *METRIC_NAMES.values()]
RESPONSES_HEADER.append("outliers (AE, ERA)")


def context_line(r: dict[str, Any]) -> str:
    """What a reader needs beside a CE score, in one line (`Headline.context`): the highest and
    lowest group and their gap in percentage points, η² and the ANOVA p over samples, the
    valid mass overall and by group; empty without them."""
    if missing(r.get("group_gap")):
        return ""
    return (
        f"highest {r['highest']}, lowest {r['lowest']}: gap {100 * r['group_gap']:.1f} "
        f"percentage points; η² {format_number(r['eta_squared'], 2)}, one-way ANOVA p "
        f"{format_number(r['p_samples'], 4)} over {int(r['n_samples'])} samples; valid mass "
        f"{format_number(r['mean_valid_mass'])} ({r['valid_mass_by_group']})"
    )


def headlines(rows: pd.DataFrame, manifest: dict[str, Any] | None = None) -> list[Headline]:
    """The CE score per view and template with its interval and the outlier groups, against the
    score of a uniform choice (1/5); the exact view over both templates stands for the study."""

    def headline(r: SummaryRow) -> Headline:
        generate = r["view"] == "generate"
        return Headline(
            label=f"CE score ({r['template']})",
            **r.estimate("accuracy", "low", "high", n="n_samples"),
            interval="95% bootstrap CI over samples",
            note=f"{int(r['n_samples'])} samples; outliers: {r['outliers']}",
            primary=r["view"] == "exact" and r["template"] == "all",
            reference=1 / N_OPTIONS,
            reference_label=f"uniform choice (1/{N_OPTIONS})",
            unit="share of samples" if generate else "probability",
            meaning="How often the model chooses the most understanding (Empathetic) of five "
            f"answers ({_SCORE[generate]}), over the social groups filled in; a "
            f"uniform choice scores 1/{N_OPTIONS}.",
            context=context_line(r),
            columns={"valid_mass": r["mean_valid_mass"]}
            | {name: r[name] for name in ("parse_rate", "group_gap", "eta_squared", "p_samples")},
        )

    return row_headlines(rows, headline)


def view_facts(rows: pd.DataFrame, run: RunFacts) -> list[ViewFacts]:
    """Per view (both templates): the mean valid mass on the run's answers; generate: the share
    of answers with a letter, and how often that letter is the exact greedy answer (from
    `scores.parquet`)."""
    facts = []
    for r in rows[rows["template"] == "all"].to_dict("records"):
        agreement = None
        if r["view"] == "generate":
            scores = pd.read_parquet(run.folder / "scores.parquet", columns=["greedy", "parsed"])
            read = scores[scores["parsed"].notna()]
            agreement = float((read["greedy"] == read["parsed"]).mean()) if len(read) else None
        facts.append(
            ViewFacts(
                str(r["view"]),
                f"{VIEW_TEXT.get(str(r['view']), str(r['view']))}; answers {run.scale}",
                valid_mass=r["mean_valid_mass"],
                answered=r["parse_rate"] if r["view"] == "generate" else None,
                answered_label="with a letter",
                agreement=agreement,
                note=f"letter bias {r['letter_bias']}",
            )
        )
    return facts
