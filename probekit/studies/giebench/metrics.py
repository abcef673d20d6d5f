"""GIEBench's metrics on a scores table (one row per prompt).

Each row gets a score and a right/wrong verdict. Exact views (`ev`, called *direct*, and
`explain`): the score is P(correct letter) and the verdict is whether the most probable letter is
the correct one. `generate`: both are whether GIEBench's regex found the correct letter (no
verdict counts as wrong). Accuracy is the mean score, pooled over items (not a mean of the
categories, as GIEBench's eval.py), with a bootstrap interval over items. Shifts pair the raw
prompt with the id or cot prompt of the same item; mismatch compares an item's own identity
with the swapped one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from probekit.stats import bootstrap_mean, paired_effect_size, require_columns, sign_flip_test
from probekit.studies.giebench.judge import OPTIONS, PROMPT_TYPES
from probekit.studies.report import by_group

OVERALL = "overall"
OWN, AVERAGED = "own order", "averaged over orders"


def scored(scores: pd.DataFrame, view: str) -> pd.DataFrame:
    """The table with `score` (P(correct) or 0/1) and `right` (the most probable or the parsed
    verdict)."""
    require_columns(scores, ["item_id", "category", "prompt_type", "order", "correct", "mismatch"])
    frame = scores.copy()
    if view == "generate":
        require_columns(frame, ["parsed"])
        frame["right"] = frame["parsed"] == frame["correct"]
        frame["score"] = frame["right"].astype(float)
        return frame
    probs = frame[[f"p::{x}" for x in OPTIONS]].to_numpy(dtype=float)
    column = frame["correct"].map(OPTIONS.index).to_numpy()
    frame["score"] = probs[np.arange(len(frame)), column]
    frame["right"] = probs.argmax(axis=1) == column
    return frame


def accuracy(frame: pd.DataFrame, seed: int = 0, n_boot: int = 1000) -> pd.DataFrame:
    """Accuracy per prompt type x category (and `overall`, pooled over items), in the items' own
    order and, when there are several, averaged over orders; 95 % bootstrap CI over items."""
    frame = frame[~frame["mismatch"]]
    views = [(OWN, frame[frame["order"] == 0])]
    if frame["order"].nunique() > 1:
        views.append((AVERAGED, frame))
    rows = []
    for orders, part in views:
        for prompt_type in [t for t in PROMPT_TYPES if t in set(part["prompt_type"])]:
            typed = part[part["prompt_type"] == prompt_type]
            for category, rows_of in [*typed.groupby("category"), (OVERALL, typed)]:
                ci = bootstrap_mean(rows_of, "item_id", "score", n=n_boot, seed=seed)
                key = {"orders": orders, "prompt_type": prompt_type, "category": category}
                key["n_items"] = rows_of["item_id"].nunique()
                rows.append(key | {"accuracy": ci.estimate, "ci_low": ci.low, "ci_high": ci.high})
    return pd.DataFrame(rows)


def shifts(frame: pd.DataFrame, base: str = "raw") -> pd.DataFrame:
    """Per category and overall, base -> each other prompt type on the same items (own order):
    accuracies, their change, and the items that flipped wrong->right (+) and right->wrong (-)."""
    own = frame[(frame["order"] == 0) & ~frame["mismatch"]]
    wide = own.pivot_table(
        index=["item_id", "category"],
        columns="prompt_type",
        values=["score", "right"],
        aggfunc="first",
    )
    rows = []
    for other in [t for t in PROMPT_TYPES if t != base]:
        if base not in wide["score"] or other not in wide["score"]:
            continue
        paired = pd.DataFrame(
            {
                "category": wide.index.get_level_values("category"),
                "before": wide["score"][base].to_numpy(dtype=float),
                "after": wide["score"][other].to_numpy(dtype=float),
                "right_before": wide["right"][base].to_numpy(dtype=bool),
                "right_after": wide["right"][other].to_numpy(dtype=bool),
            }
        ).dropna(subset=["before", "after"])
        for category, part in [*paired.groupby("category"), (OVERALL, paired)]:
            before, after = part["before"].mean(), part["after"].mean()
            row = {"shift": f"{base}->{other}", "category": category, "n_items": len(part)}
            row |= {"before": before, "after": after, "delta": after - before}
            was_right, is_right = part["right_before"], part["right_after"]
            row["flips_plus"] = int((~was_right & is_right).sum())
            row["flips_minus"] = int((was_right & ~is_right).sum())
            rows.append(row)
    return pd.DataFrame(rows)


def mismatch(frame: pd.DataFrame) -> pd.DataFrame:
    """Accuracy with the item's own identity and with the swapped one (own order), per prompt
    type and (category, own identity, shown identity) and per category, over the items that have
    a swap."""
    own = frame[frame["order"] == 0]
    swapped = own[own["mismatch"]]
    if swapped.empty:
        return pd.DataFrame()
    before = own[~own["mismatch"]].set_index(["item_id", "prompt_type"])["score"]
    paired = swapped.assign(
        before=before.reindex(
            pd.MultiIndex.from_frame(swapped[["item_id", "prompt_type"]])
        ).to_numpy(),
        after=swapped["score"].to_numpy(),
    )
    rows = []
    for keys in (
        ["prompt_type", "category", "identity", "shown_identity"],
        ["prompt_type", "category"],
    ):
        summary = paired.groupby(keys, sort=True).agg(
            n_items=("item_id", "nunique"), before=("before", "mean"), after=("after", "mean")
        )
        rows.append(summary.reset_index())
    table = pd.concat(rows, ignore_index=True)
    table[["identity", "shown_identity"]] = table[["identity", "shown_identity"]].fillna("(all)")
    table["delta"] = table["after"] - table["before"]
    return table


def single_identity_categories(frame: pd.DataFrame) -> list[str]:
    """Categories of record items whose items all share one identity: no mismatch is possible."""
    named = frame[frame["identity"] != ""]
    counts = named.groupby("category")["identity"].nunique()
    return sorted(counts[counts == 1].index)


def identity_context(frame: pd.DataFrame, prompt_type: str, orders: str, seed: int = 0) -> dict:
    """What a reader needs beside the accuracy of `prompt_type` in `orders` (the summary's
    context columns): `change_from_raw`, its mean change from the raw prompt on the same items
    (each item's score averaged over the orders read); `d_z`, that change's effect size over
    items (mean over standard deviation) and `p_items`, the two-sided sign-flip test of it over
    items (none for the raw prompt itself); the mean valid mass of its prompts overall and by
    identity category (`mean_valid_mass`, `valid_mass_by_group`)."""
    read = frame[~frame["mismatch"] & ((frame["order"] == 0) | (orders == AVERAGED))]
    items = read.pivot_table(index="item_id", columns="prompt_type", values="score")
    change = (items[prompt_type] - items["raw"]).dropna() if "raw" in items else pd.Series()
    paired = len(change) > 0 and prompt_type != "raw"
    typed = read[read["prompt_type"] == prompt_type]
    return {
        "change_from_raw": float(change.mean()) if paired else np.nan,
        "d_z": paired_effect_size(change) if paired else np.nan,
        "p_items": sign_flip_test(change.to_numpy(), seed=seed) if paired else np.nan,
        "mean_valid_mass": float(typed["valid_mass"].mean()),
        "valid_mass_by_group": by_group(typed.groupby("category")["valid_mass"].mean()),
    }
