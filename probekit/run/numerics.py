"""Every run states its numeric noise: the dtype its exact scores were computed in, and how far
a seeded sample of its prompts moves when re-scored in a wider dtype
(`probekit.engines.hf.precision.noise_figure`). `probekit run` records it in each run's
`manifest.json` (field `numerics`); `Study.write_summary` adds one line per run to `summary.md`
(`probekit.reporting.summary`)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probekit.core.io import write_text
from probekit.engines.base import ScoreResult
from probekit.engines.hf.model import LoadedModel
from probekit.engines.hf.precision import (
    NOISE_SAMPLE,
    dtype_name,
    noise_figure,
    reference_dtype,
)
from probekit.studies.base import Probe

FIELD = "numerics"


def record_numerics(
    model: Any, probe: Probe, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]
) -> dict[str, Any]:
    """Measure the run's noise figure on `NOISE_SAMPLE` of its prompts (seeded by the run's
    seed), store it as `manifest[FIELD]` and in `run_dir/manifest.json`, and return it.

    The sample's rows are compared with the same prompts (in explain mode with their
    explanation and answer cue) scored in `reference_dtype` at the run's epsilon. An engine
    without a transformers model for its exact view, or a float64 reference the device lacks
    (MPS), records the dtype and why no figure is given."""
    exact = model if isinstance(model, LoadedModel) else getattr(model, "exact", None)
    if not isinstance(exact, LoadedModel):
        figure: dict[str, Any] = {
            "dtype": str(model.describe().get("dtype")),
            "note": "not measured",
        }
    elif exact.device.type == "mps" and reference_dtype(exact.dtype).itemsize == 8:
        figure = {"dtype": dtype_name(exact.dtype), "note": "MPS has no float64 to measure against"}
    else:
        rows = scores.set_index("prompt_index").loc[_sample(scores, manifest.get("seed", 0))]
        wanted = set(rows.index)
        items = [item for i, item in enumerate(probe.items()) if i in wanted]  # index order
        rows = rows.sort_index()
        if "explanation" in rows:  # explain mode: the prompt the answer was read after
            cue = getattr(probe, "answer_cue", "")
            items = [
                replace(item, prefill=item.prefill + text + cue)
                for item, text in zip(items, rows["explanation"], strict=True)
            ]
        prompts = [exact.encode(item, probe.as_string).input_ids for item in items]
        own = [_result(row, probe) for row in rows.to_dict("records")]
        epsilon = float(manifest.get("epsilon", 0.0))
        figure = noise_figure(exact, prompts, probe.answers, epsilon=epsilon, own=own)
        figure["fp32_parts"] = exact.meta.get("fp32_parts", [])
    manifest[FIELD] = figure
    path = run_dir / "manifest.json"
    stored = json.loads(path.read_text()) if path.is_file() else dict(manifest)
    stored[FIELD] = figure
    write_text(path, json.dumps(stored, indent=1, default=str))
    return figure


def _result(row: dict[str, Any], probe: Probe) -> ScoreResult:
    """A run's row back as the `ScoreResult` it was written from."""
    probs = np.array([row[f"p::{a}"] for a in probe.answers.answers], dtype=float)
    return ScoreResult(
        probs=probs,
        valid_mass=float(row["valid_mass"]),
        error_bound=float(row["error_bound"]),
        argmax=row["argmax"],
        mode=row["mode"],
        expected=row.get("expected"),
    )


def _sample(scores: pd.DataFrame, seed: int) -> list[int]:
    """Seeded prompt indices of the run (at most `NOISE_SAMPLE`)."""
    indices = sorted(int(i) for i in scores["prompt_index"])
    return random.Random(seed).sample(indices, min(NOISE_SAMPLE, len(indices)))
