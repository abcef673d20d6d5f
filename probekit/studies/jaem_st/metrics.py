"""CE accuracy of a JaEm-ST run: per template, per dimension value, per intersectional group.

A prompt's score is P(Empathetic) in the exact view (the normalised probability of the letter
carrying the Empathetic answer: the expected accuracy of a model sampling its letter) and 1 or 0
in the generate view (the parsed letter is the Empathetic one; no letter counts as wrong). A
sample's score is the mean over its orders; intervals are 95 % percentile bootstraps over samples.
Outliers: groups whose score lies more than `z` standard deviations of the group scores from the
overall mean (probekit's rule; the paper reports one outlier without giving one).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from probekit.core.choices import position_bias
from probekit.stats import bootstrap_mean, require_columns
from probekit.studies.jaem_st.probe import LETTERS, N_OPTIONS
from probekit.studies.report import by_group, group_name

SCORE = "score"
DEFAULT_Z = 2.0
DEFAULT_GROUPS = ("gender", "pronoun")
RESPONSE_METRICS = ("vad_valence", "vad_arousal", "vad_dominance", "era_IP", "era_EX", "era_ER")


def prompt_scores(scores: pd.DataFrame, view: str) -> pd.Series:
    """Each prompt's CE score in `view` (exact or generate)."""
    if view == "generate":
        require_columns(scores, ["parsed", "empathetic_letter"])
        return (scores["parsed"] == scores["empathetic_letter"]).astype(float)
    require_columns(scores, ["empathetic_letter", *(f"p::{x}" for x in LETTERS)])
    probs = scores[[f"p::{x}" for x in LETTERS]].to_numpy(dtype=float)
    column = scores["empathetic_letter"].map({x: i for i, x in enumerate(LETTERS)}).to_numpy()
    return pd.Series(probs[np.arange(len(scores)), column], index=scores.index)


def sample_scores(scores: pd.DataFrame, view: str, columns: Sequence[str]) -> pd.DataFrame:
    """One row per sample: its template, its dimension `columns`, and its mean score over orders."""
    frame = scores.assign(**{SCORE: prompt_scores(scores, view)})
    keys = ["sample", "template", *columns]
    return frame.groupby(keys, sort=False)[SCORE].mean().reset_index()


def interval_table(
    samples: pd.DataFrame, by: Sequence[str], seed: int = 0, n: int = 1000
) -> pd.DataFrame:
    """Mean sample score per group of `by` with its bootstrap 95 % interval and `n` samples."""
    rows = []
    for key, group in samples.groupby(list(by), sort=True) if by else [((), samples)]:
        boot = bootstrap_mean(group, "sample", SCORE, n=n, seed=seed)  # a row per sample
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        rows.append(
            row | {"n": len(group), "mean": boot.estimate, "low": boot.low, "high": boot.high}
        )
    return pd.DataFrame(rows)


def dimension_table(
    samples: pd.DataFrame, shown: dict[str, Sequence[str]], seed: int = 0
) -> pd.DataFrame:
    """Per value of every dimension, over the samples of the templates whose prompt shows it
    (`shown[template]` = its dimension columns); a long table (dimension, value, n, mean, ...)."""
    tables = []
    dims = dict.fromkeys(c for cols in shown.values() for c in cols)
    for dim in dims:
        templates = [t for t, cols in shown.items() if dim in cols]
        table = interval_table(samples[samples["template"].isin(templates)], [dim], seed)
        tables.append(table.rename(columns={dim: "value"}).assign(dimension=dim))
    columns = ["dimension", "value", "n", "mean", "low", "high"]
    return pd.concat(tables, ignore_index=True)[columns] if tables else pd.DataFrame()


def outliers(table: pd.DataFrame, overall: float, z: float = DEFAULT_Z) -> pd.DataFrame:
    """`table` (a `mean` per group) with `z` = (mean - overall) / std of the group means
    (population std) and `outlier` = |z| > the threshold."""
    spread = float(table["mean"].std(ddof=0))
    scores = (table["mean"] - overall) / spread if spread > 0 else table["mean"] * 0.0
    return table.assign(z=scores, outlier=scores.abs() > z)


def response_tables(
    frame: pd.DataFrame, groups: Sequence[str], z: float = DEFAULT_Z, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """For every response metric present (AE distance per dimension, ERA level per dimension):
    its mean per template and overall (`template` = all), and per group with z and the outlier
    flag, each with a bootstrap interval over samples. A sample without a value (no lexicon
    word, or an empty response for ERA) is left out of that metric."""
    per_template, per_group = [], []
    for metric in [m for m in RESPONSE_METRICS if m in frame]:
        samples = frame[["sample", "template", *groups, metric]].dropna(subset=[metric])
        samples = samples.rename(columns={metric: SCORE})
        if samples.empty:
            continue
        overall = interval_table(samples, [], seed).assign(template="all")
        templates = interval_table(samples, ["template"], seed)
        per_template.append(pd.concat([overall, templates]).assign(metric=metric))
        table = interval_table(samples, groups, seed)
        per_group.append(outliers(table, float(overall["mean"].iloc[0]), z).assign(metric=metric))
    if not per_template:
        return pd.DataFrame(), pd.DataFrame()
    first = ["metric", "template", "n", "mean", "low", "high"]
    return (
        pd.concat(per_template, ignore_index=True)[first],
        pd.concat(per_group, ignore_index=True)[
            ["metric", *groups, "n", "mean", "low", "high", "z", "outlier"]
        ],
    )


def answer_type_shares(scores: pd.DataFrame, view: str, labels: Sequence[str]) -> pd.Series:
    """Share of each answer type chosen: mean P(type) in the exact view; share of parsed letters
    in the generate view (plus `none` for responses without a letter)."""
    types = scores["answer_types"].str.split(",")
    if view == "generate":
        chosen = [
            t[LETTERS.index(p)] if isinstance(p, str) and p in LETTERS else "none"
            for t, p in zip(types, scores["parsed"], strict=True)
        ]
        shares = pd.Series(chosen).value_counts(normalize=True)
        return shares.reindex([*labels, "none"], fill_value=0.0)
    probs = scores[[f"p::{x}" for x in LETTERS]].to_numpy(dtype=float)
    names = np.array(types.tolist())
    return pd.Series({label: probs[names == label].sum() for label in labels}) / len(scores)


def letter_bias(scores: pd.DataFrame, view: str) -> pd.Series:
    """The model's preference for letters: mean P(letter) (exact) or the share of each parsed
    letter (generate); 0.2 each without a preference."""
    if view == "generate":
        return scores["parsed"].value_counts(normalize=True).reindex(list(LETTERS), fill_value=0.0)
    return position_bias(scores, N_OPTIONS)


def group_context(samples: pd.DataFrame, scores: pd.DataFrame, groups: Sequence[str]) -> dict:
    """What a reader needs beside the CE score (the summary's context columns): the groups of
    `groups` with the highest and the lowest mean sample score and the gap between them
    (`highest`, `lowest`, `group_gap`); η², the share of the samples' variance between the
    groups, and `p_samples`, the one-way ANOVA's F test over samples that the groups' means are
    equal (all groups at once, so the gap's two groups are not selected for the test); the mean
    valid mass of the prompts by group (`valid_mass_by_group`)."""
    from scipy import stats  # on use: scipy is slow to import

    means = samples.groupby(list(groups))[SCORE].mean()
    values = [g[SCORE].to_numpy(float) for _, g in samples.groupby(list(groups))]
    between = sum(len(v) * (v.mean() - samples[SCORE].mean()) ** 2 for v in values)
    total = float(((samples[SCORE] - samples[SCORE].mean()) ** 2).sum())
    tested = len(values) > 1 and len(samples) > len(values) and total > 0
    return {
        "highest": group_name(means.idxmax()),
        "lowest": group_name(means.idxmin()),
        "group_gap": float(means.max() - means.min()),
        "eta_squared": between / total if tested else np.nan,
        "p_samples": float(stats.f_oneway(*values).pvalue) if tested else np.nan,
        "valid_mass_by_group": by_group(scores.groupby(list(groups))["valid_mass"].mean()),
    }
