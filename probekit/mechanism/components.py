"""Components (a site at a layer over a span, or one attention head) and the patching table.

A patch (layer, site, span[, head]) copies the clean run's activation at the TransformerLens hook
`blocks.{layer}.{site}` into the corrupt run at the span's aligned positions. `make_job` aligns one
patch on one pair; `row` writes one row of the patching table that exact patching
(`mechanism.patching`) and attribution patching (`mechanism.attribution`) both return.

No-op patches. A patch lying entirely in the prefix both prompts share, at the same positions,
writes values equal to the corrupt run's own (a causal model cannot see later tokens), so it is
not run: `m_patched = m_corrupt` and `ran = False`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.items import Pair
from probekit.core.public import public
from probekit.mechanism.pairs import aligned_positions, check_pairs, split_position
from probekit.mechanism.readouts import Readout
from probekit.mechanism.sites import HEAD_SITE, layer_indices, n_heads, site

COMPONENT = ["layer", "site", "head", "span"]
"""The columns naming one patched component."""


@public()
@dataclass(frozen=True)
class Patch:
    """Copy the clean activation at hook `blocks.{layer}.{site}` over `span` (at `attn.hook_z`,
    of one `head`, or of every head when it is None)."""

    layer: int
    site: str
    span: str
    head: int | None = None

    @property
    def hook(self) -> str:
        """The full TransformerLens hook name (`blocks.{layer}.{site}`)."""
        return site(self.site).hook(self.layer)

    @property
    def name(self) -> str:
        """`L3 hook_attn_out experiencer`, `L3 H5 experiencer`: for reports."""
        where = self.site if self.head is None else f"H{self.head}"
        return f"L{self.layer} {where} {self.span}"


def grid(
    layers: Iterable[int],
    sites: Iterable[str],
    spans: Iterable[str],
    heads: Sequence[int] = (),
) -> list[Patch]:
    """All (layer, site, span) patches, layer-major, sites by their TransformerLens names; the
    site `attn.hook_z` gives one patch per head in `heads` (one patch of all heads when `heads`
    is empty)."""
    spans, names = list(spans), [site(s).name for s in sites]
    out = []
    for layer in layers:
        for name in names:
            for head in (heads or [None]) if name == HEAD_SITE else [None]:
                out += [Patch(layer, name, span, head) for span in spans]
    return out


def check(model: Any, pairs: Sequence[Pair], patches: Sequence[Patch]) -> None:
    """Raise a ProbekitError for an empty request, a layer out of range, an unknown site or
    span, a head out of range, or a pair whose two prompts are about different units."""
    if not pairs or not patches:
        raise ProbekitError("nothing to patch: give at least one pair and one patch")
    for patch in patches:
        if not isinstance(patch, Patch):
            raise ProbekitError(f"patches must be Patch objects, got a {type(patch).__name__}")
    layers = [patch.layer for patch in patches]
    if layer_indices(model, layers) != layers:
        raise ProbekitError("a Patch takes a layer counted from 0; use grid() for -1 and the like")
    heads = n_heads(model)
    for patch in patches:
        found = site(patch.site)
        if patch.head is not None and not found.per_head:
            raise ProbekitError(f"a head index needs the site {HEAD_SITE}, not {patch.site}")
        if patch.head is not None and not 0 <= patch.head < heads:
            raise ProbekitError(
                f"head {patch.head} is out of range: the model has {heads} heads per layer "
                f"(0 to {heads - 1})"
            )
    check_pairs(pairs, [patch.span for patch in patches])


@dataclass(frozen=True)
class Job:
    """One patch on one pair (the pair's index): the aligned positions it copies between, and
    whether it is a no-op (see the module's docstring)."""

    pair: int
    patch: Patch
    clean_positions: list[int]
    corrupt_positions: list[int]
    noop: bool
    answer: bool = False


def make_job(i: int, pair: Pair, patch: Patch, through_answer: bool = True) -> Job:
    """The job of `patch` on pair number `i`; with `through_answer`, a span that runs to the
    end of both prompts (`from_<span>`, `answer`; not one position `<span>@<i>`) also patches
    every answer position."""
    clean, corrupt = pair
    clean_pos, corrupt_pos = aligned_positions(pair, patch.span)
    last = max(corrupt_pos) + 1
    noop = clean_pos == corrupt_pos and clean.input_ids[:last] == corrupt.input_ids[:last]
    whole = split_position(patch.span)[1] is None
    answer = through_answer and whole and runs_to_end(pair, clean_pos, corrupt_pos)
    return Job(i, patch, clean_pos, corrupt_pos, noop, answer)


def runs_to_end(pair: Pair, clean_positions: list[int], corrupt_positions: list[int]) -> bool:
    """Whether the aligned positions reach the last token of both prompts (where the answer
    starts), so that the answer positions continue them."""
    clean, corrupt = pair
    return (
        clean_positions[-1] == len(clean.input_ids) - 1
        and corrupt_positions[-1] == len(corrupt.input_ids) - 1
    )


def key_columns(pairs: Sequence[Pair]) -> dict[str, bool]:
    """Each key column of the pairs' items, and whether clean and corrupt differ on it in any."""
    columns: dict[str, bool] = {}
    for clean, corrupt in pairs:
        for column in clean.item.key:
            differs = clean.item.key[column] != corrupt.item.key.get(column)
            columns[column] = columns.get(column, False) or differs
    return columns


def row(
    pair: Pair,
    keys: dict[str, bool],
    job: Job,
    readout: Readout,
    m_clean: float,
    m_corrupt: float,
    m_patched: float,
    method: str = "exact",
    estimate: float = np.nan,
) -> dict[str, Any]:
    """One row of the patching table (columns: see `patching.sweep`); `ran` is False until the
    caller sets it."""
    clean, corrupt = pair
    out: dict[str, Any] = {}
    for column, differs in keys.items():
        if differs:
            out[f"clean_{column}"] = clean.item.key[column]
            out[f"corrupt_{column}"] = corrupt.item.key[column]
        else:
            out[column] = clean.item.key[column]
    gap = m_clean - m_corrupt
    m = readout.column
    return {
        **out,
        "clean_prompt_id": clean.id,
        "corrupt_prompt_id": corrupt.id,
        "clean_prompt": clean.text,
        "corrupt_prompt": corrupt.text,
        "layer": job.patch.layer,
        "site": job.patch.site,
        "head": job.patch.head,
        "span": job.patch.span,
        "clean_positions": job.clean_positions,
        "corrupt_positions": job.corrupt_positions,
        f"{m}_clean": m_clean,
        f"{m}_corrupt": m_corrupt,
        f"{m}_patched": m_patched,
        "gap": gap,
        "recovery": (m_patched - m_corrupt) / gap if gap != 0 else np.nan,
        "ran": False,
        "readout": readout.spec,
        "method": method,
        "estimate": estimate,
    }


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The patching table from its rows (`head` as a nullable integer column)."""
    df = pd.DataFrame(rows)
    df["head"] = df["head"].astype("Int64")
    return df


def from_row(record: pd.Series) -> Patch:
    """The patch a table row (or a summary row) names."""
    head = None if pd.isna(record["head"]) else int(record["head"])
    found = site(str(record["site"]))
    if head is not None and not found.per_head:
        raise ProbekitError(f"a head index on the site {found.name}")
    return Patch(int(record["layer"]), found.name, record["span"], head)
