"""`probekit lens STUDY` and `probekit.lens_study`: a study's own headlines as read after each
layer (the logit lens on the exact readout, `probekit.mechanism.lens`), beside the patching
recovery of the same pairs when the folder holds a patching run.

Each layer's rows are shaped like a run's scores (the item's key columns and the score columns
of that layer's answer distributions), and the study's own report reads them
(`Study.report_view`, then `Study.headlines`): intergroup's Δ in z-scores with its interval,
ISEAR's max_diff, GIEBench's accuracies, JaEm-ST's accuracy by group, a new study's whatever it
declares. Intergroup's exclusion by valid mass, `min_valid_mass`, is 0 for the lens (a layer's
lens puts little mass on the answers long before the model would refuse).

Files in `out`: `lens.parquet` (one row per prompt and layer: `prompt_index`, `prompt_id`, the
item's key columns, `layer`, the score columns), `summary.csv` (one row per layer and headline:
the study's headline with its interval and p, and the layer's mean valid mass and error bound),
`lens.png`, `report.html` (`probekit.reporting.lens`), `manifest.json`, `parts/` (the scored
prompts, checksummed) and `layers/L<layer>/` (that layer's study report: its files and
`summary.csv`). When the folder also holds a patching run of the same study (`probekit patch
STUDY --out` the same folder: `patching.parquet`, `patching_summary.csv`), `lens_gaps.csv` holds
the lens's gap of the patched pairs per layer, as a share of the pairs' full gap (the
denominator of patching's recovery), and the figure draws it beside the recovery curves.

A lens run is a `RunDir` run: its manifest records what changes a number (the study's probe, the
model's weights, dtype and device, the layers, the seed, the prompts) and a folder holding
another run is refused in one line naming the setting, before the model loads where it can be
known then. Prompts are scored in batches written as checksummed parts stamped with those
settings and each prompt's id (`probekit.run.parts`): a resumed run reads finished prompts back,
sets a damaged part aside (`*.damaged`) or one scored under other settings (`*.mismatched`), one
line each, and scores their prompts again. The tables, figures and page are made again from the
parts each time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from probekit.core.errors import ProbekitError
from probekit.core.io import write_table, write_text
from probekit.core.items import PROMPT_ID, EncodedItem, Item
from probekit.core.options import Command, named
from probekit.core.progress import progress, silenced
from probekit.core.public import public
from probekit.core.rundir import RowKey, RunDir
from probekit.core.store import INDEX, say, take_rows
from probekit.engines import load_engine
from probekit.engines.base import Engine, ScoreResult
from probekit.engines.options import ModelOptions
from probekit.mechanism.api import hookable
from probekit.mechanism.lens import LensOptions, LensResult, logit_lens
from probekit.mechanism.readouts import parse_readout
from probekit.mechanism.sites import layer_indices
from probekit.reporting.contract import describe_model
from probekit.reporting.lens import adjust_layers, lens_figure, write_lens_page
from probekit.run.mechanism import (
    context,
    mechanism_command,
    mechanism_settings,
)
from probekit.run.numerics import keep_resumed_tier
from probekit.run.options import build
from probekit.run.parts import Compactor, done_mask, scan_parts
from probekit.studies.base import VIEWS, Probe, Study

ROWS = "lens.parquet"
GAPS = "lens_gaps.csv"
PATCHING, PATCHING_SUMMARY = "patching.parquet", "patching_summary.csv"
DIFFERENCE = "scorer_difference"
"""A part's column: the largest |difference| of an answer probability between the lens after
the last layer and the scorer, per prompt (NaN when the last layer is not read)."""


def lens_command(study: Study) -> Command:
    """`probekit lens STUDY`'s options: the model's, the lens's and the study's."""
    return mechanism_command("lens", LensOptions, study)


@dataclass(frozen=True)
class StudyLens:
    """What `lens_study` wrote: the folder, every prompt's distribution after each layer
    (`lens.parquet`), the summary (per layer and headline: the study's headline with its
    interval, the mean valid mass) and, with a patching run in the folder, the lens's gap of
    its pairs per layer (else None)."""

    path: Path
    table: pd.DataFrame
    summary: pd.DataFrame
    gaps: pd.DataFrame | None


@public(ModelOptions, LensOptions, command="lens", skip=("model",))
def lens_study(
    study: str | Study,
    model: str | Path | Engine = "default",
    *,
    dtype: Any = None,
    device: Any = None,
    engine: str = "hf",
    device_map: str | dict[str, Any] | None = None,
    max_memory: str | dict[str, Any] | None = None,
    offload_folder: str | Path | None = None,
    tolerance: float | None = None,
    quiet: bool = False,
    out: str | Path = "runs/lens",
    seed: int = 0,
    batch_size: int | None = None,
    limit: int | None = None,
    layers: Sequence[int] | range | None = None,
    **options: Any,
) -> StudyLens:
    """`probekit lens STUDY` as a function. `study`: a registered study's name or a `Study`
    object (used as it is); `model`: a model spec or an already loaded model. The keywords are
    the lens's options and the model's (below: `layers=[0, 14, -1]`, ...) and
    the study's (`events=2`), checked as the command line checks them (a bad or unknown one is
    one line of `ProbekitError` naming the keyword, before any model work). Writes what the
    command writes into `out`, resumable. `options`: the study's own (`probekit lens STUDY
    --help`)."""
    found, loaded, parsed = build(lens_command, dict(locals()))
    return lens_parsed(found, parsed, loaded, "probekit.lens_study")


def lens_parsed(
    study: Study, parsed: tuple, model: Any = None, command: str = "probekit lens"
) -> StudyLens:
    """The lens run as the checked options `parsed` say (`lens_command`'s values), on `model` or
    the one they name; its manifest records `command`."""
    with silenced(parsed[0].quiet):
        return _lens(study, parsed, model, command)


def _lens(study: Study, parsed: tuple, model: Any, command: str) -> StudyLens:
    asked, args, own = parsed
    probe, items = study.mechanism_items(own, context("lens", asked, args))
    run = RunDir(args.out)
    ids = [item.id for item in items]
    given = args.layers
    layers = sorted(set(given)) if given and min(given) >= 0 else None  # else the model says
    asked_for = asked if model is None else None  # a loaded model's tolerance is its own
    known = settings(study, probe, ids, args, layers, None, asked_for)
    run.check_resume(known, [k for k, v in known.items() if v is None])  # before the model
    if model is None:
        model = load_engine(asked.model, **asked.load_keywords())
    model = hookable(model)
    chosen = range(model.n_layers)
    layers = sorted(set(layer_indices(model, given if given else chosen)))
    encoded = [model.encode(item, probe.as_string) for item in items]
    if not keep_resumed_tier(model, run.path):  # a resumed run's rows stay in one tier
        model.settle_precision(probe.answers, [p.input_ids for p in encoded])
    manifest = settings(study, probe, ids, args, layers, model)
    manifest["command"] = command
    run.make()
    run.start(manifest)  # the first write; a resumed run records what was asked this time
    manifest = run.update_manifest(command=manifest["command"])
    key = RowKey.of(manifest, ids)
    hint = f"fewer {named('layers')} or fewer prompts"
    wide = _scored(run, key, model, probe, encoded, layers, args.batch_size, hint)
    table = probe.add_columns(_long(wide))
    write_table(run.path / ROWS, pa.Table.from_pandas(table, preserve_index=False))
    report = {
        **probe.manifest(),
        "model": model.name,
        "seed": args.seed,
        "view": VIEWS[0],
    }
    gaps = patching_gaps(run.path, table, items, probe)
    # p adjusted over the layers; no p and no share of the gap at a weak layer
    summary, gaps = adjust_layers(layer_summary(study, table, run.path, report), gaps)
    write_text(run.path / "summary.csv", summary.to_csv(index=False))
    if gaps is not None:
        write_text(run.path / GAPS, gaps.to_csv(index=False))
    recovery = _recovery(run.path) if gaps is not None else None
    title = f"{describe_model(manifest)}, {probe.name}"
    figure = lens_figure(summary, gaps, recovery, run.path / "lens.png", title)
    difference = float(wide[DIFFERENCE].max()) if wide[DIFFERENCE].notna().any() else None
    write_lens_page(
        run.report_path,
        summary,
        gaps,
        figure,
        title,
        manifest,
        study.describe_data(manifest),
        difference,
    )
    return StudyLens(run.path, table, summary, gaps)


def settings(
    study: Study,
    probe: Probe,
    ids: list[str],
    args: LensOptions,
    layers: list[int] | None,
    model: Any,
    asked: ModelOptions | None = None,
) -> dict[str, Any]:
    """What defines a lens run (its manifest; undeclared fields are resume keys, see
    `probekit.core.rundir.MANIFEST_FIELDS`). Before the model loads (`model` None) the fields
    only the loaded model gives, and layers counted from the end, are None, the tolerance that
    `asked` for."""
    own = {
        "layers": layers,
        "hooks": "transformer_lens",
    }
    return mechanism_settings(study, probe, ids, args.seed, model, own, asked)


def _scored(
    run: RunDir,
    key: RowKey,
    model: Any,
    probe: Probe,
    encoded: list[EncodedItem],
    layers: list[int],
    batch_size: int | None,
    hint: str,
) -> pd.DataFrame:
    """One row per prompt (per-layer columns as lists): read back from the finished parts, the
    rest scored and written as parts (`parts.Compactor`)."""
    parts = scan_parts(run.path, key)
    done = done_mask(parts, len(encoded))
    if done.any():
        say(f"{run.path}: {int(done.sum())} of {len(encoded)} prompts already read, read back")
    todo = np.flatnonzero(~done)
    if len(todo):
        scorer = model.scorer(probe.answers, epsilon=0.0, batch_size=batch_size)
        compactor = Compactor(run.path, parts, key)
        step = batch_size or scorer.batch_size
        last = layers[-1] == model.n_layers - 1
        with progress(len(todo), "prompt", "lens", hint) as bar:
            for start in range(0, len(todo), step):
                chunk = todo[start : start + step]
                prompts = [encoded[i].input_ids for i in chunk]
                found = logit_lens(scorer, prompts, layers, batch_size, bar)
                rows = [
                    _wide_row(i, encoded[i], lens, probe, last)
                    for i, lens in zip(chunk, found, strict=True)
                ]
                compactor.write(pd.DataFrame(rows))
        parts = scan_parts(run.path, key)
    frames = []
    for part in parts:
        found = take_rows(part.path, key, "its prompts are scored again next time", keep=True)
        if found is None or found.table is None:
            raise ProbekitError(
                f"a part of {run.path} was damaged while the run read it; run the same command "
                "again to read its prompts anew"
            )
        frames.append(found.table.to_pandas())
    wide = pd.concat(frames, ignore_index=True).sort_values(INDEX, kind="stable")
    return wide.reset_index(drop=True)


def _wide_row(
    index: int, prompt: EncodedItem, lens: LensResult, probe: Probe, last: bool
) -> dict[str, Any]:
    """One prompt's part row: its index, id and key columns, then each score column as a list
    over the layers, and its `DIFFERENCE` (`last`: the last layer read is the model's)."""
    per_layer = [result.row(probe.answers) for result in lens.results]
    row: dict[str, Any] = {INDEX: int(index), PROMPT_ID: prompt.id, **prompt.item.key}
    row["layer"] = list(lens.layers)
    row |= {column: [r[column] for r in per_layer] for column in per_layer[0]}
    final = np.abs(lens.results[-1].probs - lens.final.probs).max() if last else np.nan
    row[DIFFERENCE] = float(final)
    return row


def _long(wide: pd.DataFrame) -> pd.DataFrame:
    """The part rows as one row per (prompt, layer), layer-major within each prompt."""
    lists = [c for c in wide.columns if isinstance(wide[c].iloc[0], list | np.ndarray)]
    long = wide.drop(columns=[DIFFERENCE]).explode(lists, ignore_index=True)
    return long.infer_objects().astype({"layer": int})


def layer_summary(
    study: Study, table: pd.DataFrame, out: Path, report: dict[str, Any]
) -> pd.DataFrame:
    """One row per (layer, headline): the study's headlines of that layer's rows, from its own
    report (`report_view` into `out/layers/L<layer>/`, with its `summary.csv`, then
    `headlines`), with the layer's mean valid mass and error bound."""
    rows = []
    for layer, frame in table.groupby("layer", sort=True):
        folder = out / "layers" / f"L{layer}"
        folder.mkdir(parents=True, exist_ok=True)
        scores = frame.reset_index(drop=True)
        viewed = pd.DataFrame(study.report_view(scores, folder, report, VIEWS[0], ""))
        write_text(folder / "summary.csv", viewed.to_csv(index=False))
        base = {
            "layer": int(layer),
            "prompts": len(scores),
            "mean_valid_mass": float(scores["valid_mass"].mean()),
            "mean_error_bound": float(scores["error_bound"].mean()),
        }
        found = study.headlines(viewed, report)
        first = next((h for h in found if h.primary), found[0] if found else None)
        if not found:
            rows.append({**base, "label": "", "value": np.nan, "primary": True})
            rows[-1]["note"] = f"the study '{study.name}' gives no headline for these rows"
        for h in found:
            rows.append(
                {
                    **base,
                    "label": h.label,
                    "value": h.value,
                    "low": h.low,
                    "high": h.high,
                    "p_value": h.p_value,
                    "interval": h.interval,
                    "primary": h is first,
                    "reference": h.reference,
                    "unit": h.unit,
                    "n": h.n,
                    "note": h.note,
                }
            )
    return pd.DataFrame(rows)


def patching_gaps(
    out: Path, table: pd.DataFrame, items: list[Item], probe: Probe
) -> pd.DataFrame | None:
    """With a patching run in `out` (`patching.parquet`): per layer, the mean gap of its pairs
    (readout of the clean prompt minus that of the corrupt one, with the patching run's
    readout, each signed as in its set) in the lens's distributions after that layer, and its
    `share` of the pairs' mean gap in the full model (patching's `gap`, the denominator of its
    recovery). None without a
    patching run, or when none of its pairs are prompts of this run (said in one line)."""
    path = out / PATCHING
    if not path.is_file():
        return None
    columns = ["clean_prompt_id", "corrupt_prompt_id", "readout", "gap", "sign"]
    patched = pd.read_parquet(path, columns=columns)
    pairs = patched.drop_duplicates(columns[:2])
    by_id = {item.id: item for item in items}
    pairs = pairs[pairs[columns[0]].isin(by_id) & pairs[columns[1]].isin(by_id)]
    if pairs.empty:
        say(f"{path} patched other prompts than this run's: no lens gaps of its pairs")
        return None
    readout = parse_readout(str(pairs["readout"].iloc[0]), probe.answers)
    signs = pairs["sign"].to_numpy(float)  # an interaction's set gap is a signed sum
    full = float((pairs["gap"] * signs).mean())
    rows = []
    for layer, frame in table.groupby("layer", sort=True):
        read = {
            row[PROMPT_ID]: ScoreResult.from_row(row, probe.answers)
            for row in frame.to_dict("records")
        }
        gaps = [
            sign
            * (
                readout(read[clean], by_id[clean], read[clean])
                - readout(read[corrupt], by_id[corrupt], read[clean])
            )
            for clean, corrupt, sign in zip(
                pairs[columns[0]], pairs[columns[1]], signs, strict=True
            )
        ]
        gap = float(np.nanmean(gaps))
        rows.append(
            {
                "layer": int(layer),
                "readout": readout.spec,
                "pairs": len(pairs),
                "gap": gap,
                "full_gap": full,
                "share": gap / full if full else np.nan,
            }
        )
    return pd.DataFrame(rows)


def _recovery(out: Path) -> pd.DataFrame | None:
    """The patching run's recovery per component without a head (`patching_summary.csv`)."""
    path = out / PATCHING_SUMMARY
    if not path.is_file():
        return None
    summary = pd.read_csv(path)
    return summary[summary["head"].isna() & summary["recovery"].notna()]
