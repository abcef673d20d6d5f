"""Every run states its arithmetic and its numeric noise: the precision tier it scores in, chosen
before scoring by the error it was measured to cause (`settle_run_precision`, manifest field
`precision`), and how far a seeded sample of its prompts moves when scored again in a wider
dtype (`Engine.noise_figure`, manifest field `numerics`). The engine does both (the engine
protocol's `Precision`); this module picks the run's prompts and keeps the records.
`Study.write_summary` adds one line per run to `summary.md` (`probekit.reporting.summary`).

The sample scales with the run (`sample_size`): one prompt per `PROMPTS_PER_SAMPLE` (200) of the
run, at most `NOISE_SAMPLE` (8), none below 200 prompts. Measured here (intergroup P0S1T0, one
event per emotion: 432 prompts in 590 s on a busy 2-core CPU), 4 prompts took 21 s and 8 took
33 s: about 9 s to widen the weights plus 3 s a prompt, so this run's 2 prompts cost about 15 s
(2.5 %), where the earlier fixed sample of 8 cost 5.6 % (and 33-54 % of runs of a few dozen
prompts). At 200 prompts one
prompt is under 5 %; below that even one would be more, so the figure is skipped and the
manifest says so (`numerics=N` measures N prompts anyway; `numerics=0` always skips)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.items import Item
from probekit.core.rundir import RunDir
from probekit.engines.base import Engine, ScoreResult
from probekit.engines.options import NOISE_SAMPLE
from probekit.studies.base import Probe

FIELD = "numerics"
FIRST_MODEL = "kept from the first model of this run"
"""The note of a precision record kept from the first model of a run of several models."""
PROMPTS_PER_SAMPLE = 200


def sample_size(prompts: int, requested: int | str = "auto") -> int:
    """Prompts to re-score for the noise figure of a run of `prompts`: `requested` (at most
    all of them), or for `auto` one per `PROMPTS_PER_SAMPLE`, at most `NOISE_SAMPLE`."""
    if requested == "auto":
        return min(NOISE_SAMPLE, prompts // PROMPTS_PER_SAMPLE)
    return min(int(requested), prompts)


def settle_run_precision(
    model: Engine,
    probe: Probe,
    folder: Path,
    seed: int = 0,
    items: Sequence[Item] | None = None,
    resumed: bool = True,
    first: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Before a run of `probe` (or of its `items`, a mechanism command's) scores: the precision tier
    of the run being resumed in `folder` (its manifest's `precision`, kept without measuring so that
    its rows are all scored in one tier, where it was chosen by the tolerance `model` was loaded
    with: else this run chooses anew and its manifest's `tolerance` refuses the resume; not where
    the command is not `resumed`), else the tier of `first` (the precision record of the first model
    of a run of several: one arithmetic for the models compared) where this model's device offers
    it, else the tier `model` chooses on the run's numerics sample: `NOISE_SAMPLE` of its prompts,
    seeded by the run's seed. The record, or None where nothing is chosen (an engine without tiers,
    or a tier chosen already)."""
    if "tier" in (model.precision or {}):
        return None  # chosen already
    earlier = (RunDir(folder).read_manifest() or {}).get("precision") if resumed else None
    tolerance = (model.precision or {}).get("tolerance")
    same = isinstance(earlier, dict) and earlier.get("tolerance") == tolerance
    if same and (kept := model.keep_precision(earlier)):
        return kept
    if first and (kept := model.keep_precision(first, FIRST_MODEL)):
        return kept
    total = len(probe) if items is None else len(items)
    picked = set(random.Random(seed).sample(range(total), min(NOISE_SAMPLE, total)))
    found = [
        item for i, item in enumerate(probe.items() if items is None else items) if i in picked
    ]
    prompts = [model.encode(item, probe.as_string).input_ids for item in found]
    return model.settle_precision(probe.answers, prompts, seed)


def record_numerics(
    model: Engine, probe: Probe, scores: pd.DataFrame, folder: RunDir, sample: int | str = "auto"
) -> dict[str, Any]:
    """Measure the run's noise figure on `sample_size` of its prompts (seeded by the run's
    seed), store it in the manifest of the run in `folder` (field `numerics`) and return it.

    The sample's rows are compared with the same prompts (in explain mode with their
    explanation and answer cue) scored again in a wider dtype at the run's epsilon
    (`Engine.noise_figure`, which says why where it gives none); a sample of 0 prompts records
    the dtype and why."""
    manifest = folder.manifest
    count = sample_size(len(scores), sample)
    if count == 0:
        why = "skipped (numerics=0)" if sample != "auto" else "skipped: under 200 prompts"
        figure: dict[str, Any] = {"dtype": str(model.describe().get("dtype")), "note": why}
    else:
        seed = manifest.get("seed", 0)
        indices = sorted(int(i) for i in scores["prompt_index"])
        picked = sorted(random.Random(seed).sample(indices, min(count, len(indices))))
        rows = scores.set_index("prompt_index").loc[picked]
        wanted = set(picked)
        items = [item for i, item in enumerate(probe.items()) if i in wanted]  # in order
        if "explanation" in rows:  # explain mode: the prompt the answer was read after
            cue = getattr(probe, "answer_cue", "")
            items = [
                replace(item, prefill=item.prefill + text + cue)
                for item, text in zip(items, rows["explanation"], strict=True)
            ]
        prompts = [model.encode(item, probe.as_string).input_ids for item in items]
        own = [ScoreResult.from_row(row, probe.answers) for row in rows.to_dict("records")]
        epsilon = float(manifest.get("epsilon", 0.0))
        figure = model.noise_figure(prompts, probe.answers, seed=seed, epsilon=epsilon, own=own)
    folder.update_manifest(**{FIELD: figure})
    return figure
