"""Components (a site at a layer over a span, or one attention head) and the patching table.

A patch (layer, site, span[, head]) copies the clean run's activation at the TransformerLens hook
`blocks.{layer}.{site}` into the corrupt run at the span's positions. `make_job` aligns one
patch on one pair; `row` writes one row of the patching table that exact patching
(`mechanism.patching`) and attribution patching (`mechanism.attribution`) both return.

Status (the `status` column). A patch is `measured`, unless its result is known by construction:
- `not run`: it writes the values already there (the patched run is the corrupt run): a span
  lying in the prefix both prompts share, at the same positions (a causal model cannot see later
  tokens; intergroup's perceiver in pairs that share it), or at layer 0's `hook_resid_pre` (the
  token embeddings) the same tokens at the same positions. It is not run (`ran` False,
  `m_patched = m_corrupt`) unless asked.
- `trivial`: the patched run is the clean run, so its recovery is 1: at a residual-stream site,
  every position from the first one where the prompts differ to the end, answer positions
  included (`from_<span>` through the answer), or at layer 0's `hook_resid_pre` every token
  that differs. It is run, and left out of rankings like a component not run.

Blocks. Clean and corrupt spans of different token counts have no position-by-position match.
At a residual-stream site (`hook_resid_pre`, `hook_resid_post`) the patched state is still
defined: the corrupt run's states with its span replaced by the clean span's, as a block (the
prompts are equal before the span and, counted from the end, after it). It is computed in the
clean run, into which the corrupt run's states after the span (and at the answer positions,
unless the span runs through them) are written (`Job.block`); what a layer >= l computes depends
on the states at layer l alone, so this is the corrupt run patched with the clean span. The
states after the span sit as many positions later as the clean span is longer. At other sites a
whole span of unequal counts is refused in one line.
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
from probekit.mechanism.pairs import PairSet, aligned_positions, check_pairs, split_position
from probekit.mechanism.readouts import Readout
from probekit.mechanism.sites import HEAD_SITE, layer_indices, n_heads, site

COMPONENT = ["layer", "site", "head", "span"]
"""The columns naming one patched component."""
MEASURED, NOT_RUN, TRIVIAL = "measured", "not run", "trivial"
"""A patch's `status` (see the module)."""
RESIDUAL = ("hook_resid_pre", "hook_resid_post")
"""The residual-stream sites, where a span of unequal token counts is patched as a block."""


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
    if wrong := [p for p in patches if not isinstance(p, Patch)]:
        raise ProbekitError(f"patches must be Patch objects, got a {type(wrong[0]).__name__}")
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
    for i, pair in enumerate(check_pairs(pairs)):  # aligns every span (refusing a whole span
        for patch in patches:  # of unequal token counts off the residual stream)
            make_job(i, pair, patch)


@dataclass(frozen=True)
class Job:
    """One patch on one pair (the pair's index): the span's positions in the clean and corrupt
    prompts, its `status` (see the module), whether the span runs through the answer positions
    (`answer`), and what the run writes: at `target` positions of the host run (the corrupt
    one; the clean one for a `block`), the source run's values at `source` positions, and at
    every answer position too where `nodes` (a block's answer positions are the corrupt run's
    unless the span runs through them)."""

    pair: int
    patch: Patch
    clean_positions: list[int]
    corrupt_positions: list[int]
    status: str
    answer: bool
    source: list[int]
    target: list[int]
    block: bool = False

    @property
    def nodes(self) -> bool:
        return self.answer != self.block


def make_job(i: int, pair: Pair, patch: Patch, through_answer: bool = True) -> Job:
    """The job of `patch` on pair number `i`; with `through_answer`, a span that runs to the
    end of both prompts (`from_<span>`, `answer`; not one position `<span>@<i>`) also patches
    every answer position. Spans of unequal token counts make a block (see the module)."""
    clean_pos, corrupt_pos = aligned_positions(pair, patch.span)
    whole = split_position(patch.span)[1] is None
    # the answer positions continue a span that reaches the last token of both prompts
    ends = [len(p.input_ids) - 1 for p in pair] == [clean_pos[-1], corrupt_pos[-1]]
    answer = through_answer and whole and ends
    if len(clean_pos) != len(corrupt_pos):
        return _block(i, pair, patch, clean_pos, corrupt_pos, answer)
    status = _status(pair, patch, clean_pos, corrupt_pos, answer)
    return Job(i, patch, clean_pos, corrupt_pos, status, answer, clean_pos, corrupt_pos)


def _status(
    pair: Pair, patch: Patch, clean_pos: list[int], corrupt_pos: list[int], answer: bool
) -> str:
    """`not run`, `trivial` or `measured` (see the module)."""
    a, b = pair[0].input_ids, pair[1].input_ids
    if clean_pos != corrupt_pos:
        return MEASURED
    embedding = patch.layer == 0 and patch.site == RESIDUAL[0]
    if embedding:
        same = all(a[k] == b[k] for k in corrupt_pos)
    else:
        same = a[: max(corrupt_pos) + 1] == b[: max(corrupt_pos) + 1]
    if same:
        return NOT_RUN
    if patch.site not in RESIDUAL or len(a) != len(b):
        return MEASURED
    differ = [k for k in range(len(a)) if a[k] != b[k]]
    needed = set(differ) if embedding else set(range(differ[0], len(a)))
    return TRIVIAL if needed <= set(corrupt_pos) and (embedding or answer) else MEASURED


def _block(
    i: int, pair: Pair, patch: Patch, clean_pos: list[int], corrupt_pos: list[int], answer: bool
) -> Job:
    """The block job of spans of unequal token counts (see the module); one line where it
    cannot be done."""
    clean, corrupt = pair
    a, b = clean.input_ids, corrupt.input_ids
    where = (
        f"'{patch.span}' has {len(clean_pos)} tokens in {clean.id} and {len(corrupt_pos)} in "
        f"{corrupt.id}"
    )
    if patch.site not in RESIDUAL:
        raise ProbekitError(
            f"{where}: at {patch.site} a whole span of unequal token counts has no "
            "position-by-position match; patch it at the residual stream (resid_pre, "
            "resid_post: as a block), one position (<span>@-1), or pairs of equal token counts"
        )
    after_clean, after_corrupt = clean_pos[-1] + 1, corrupt_pos[-1] + 1
    if a[: clean_pos[0]] != b[: corrupt_pos[0]] or a[after_clean:] != b[after_corrupt:]:
        raise ProbekitError(
            f"{where}, and the prompts differ outside it, so the span cannot be patched as a block"
        )
    source, target = list(range(after_corrupt, len(b))), list(range(after_clean, len(a)))
    status = TRIVIAL if not source and answer else MEASURED
    return Job(i, patch, clean_pos, corrupt_pos, status, answer, source, target, True)


def pair_columns(sets: list[PairSet]) -> tuple[list[Pair], list[dict[str, Any]]]:
    """The sets' pairs, flat, and each pair's columns of the table: its items' key columns (a
    column on which clean and corrupt differ in some pair twice, as `clean_<col>` and
    `corrupt_<col>`), its unit, set, sign in the set, the key column(s) it swaps, the contrast
    the set reads, and its prompts' ids and texts."""
    pairs = [pair for found in sets for pair in found.pairs]
    differ = {c for a, b in pairs for c in a.item.key if a.item.key[c] != b.item.key.get(c)}
    about = []
    for found in sets:
        for (clean, corrupt), sign in zip(found.pairs, found.signs, strict=True):
            keys: dict[str, Any] = {}
            for column, value in clean.item.key.items():
                if column in differ:
                    other = corrupt.item.key[column]
                    keys |= {f"clean_{column}": value, f"corrupt_{column}": other}
                else:
                    keys[column] = value
            keys |= {"unit": found.unit, "set": found.name, "sign": sign}
            keys |= {"swapped": found.swapped, "contrast": found.contrast}
            keys |= {"clean_prompt_id": clean.id, "corrupt_prompt_id": corrupt.id}
            about.append(keys | {"clean_prompt": clean.text, "corrupt_prompt": corrupt.text})
    return pairs, about


def row(
    job: Job, readout: Readout, m_clean: float, m_corrupt: float, m_patched: float, about: dict
) -> dict[str, Any]:
    """One row of the patching table (columns: see `patching.sweep`; `about`, the pair's from
    `pair_columns`) of exact patching (`method`, `estimate`: the caller's where it estimates);
    `ran` is False until the caller sets it."""
    gap = m_clean - m_corrupt
    m = readout.column
    return {
        **about,
        "layer": job.patch.layer,
        "site": job.patch.site,
        "head": job.patch.head,
        "span": job.patch.span,
        "clean_positions": job.clean_positions,
        "corrupt_positions": job.corrupt_positions,
        "alignment": "block" if job.block else "position",
        "status": job.status,
        f"{m}_clean": m_clean,
        f"{m}_corrupt": m_corrupt,
        f"{m}_patched": m_patched,
        "gap": gap,
        "recovery": (m_patched - m_corrupt) / gap if gap != 0 else np.nan,
        "ran": False,
        "readout": readout.spec,
        "method": "exact",
        "estimate": np.nan,
    }


def exact_effect(df: pd.DataFrame) -> pd.Series:
    """Each row's exact effect m_patched - m_corrupt where it was measured (ran, or exact
    patching's row), else NaN."""
    patched = next(c for c in df.columns if c.endswith("_patched") and c != "valid_mass_patched")
    effect = df[patched] - df[patched.removesuffix("_patched") + "_corrupt"]
    return effect.where(df["ran"] | (df["method"] == "exact"))


def from_row(record: pd.Series) -> Patch:
    """The patch a table row (or a summary row) names."""
    head = None if pd.isna(record["head"]) else int(record["head"])
    return Patch(int(record["layer"]), site(str(record["site"])).name, record["span"], head)
