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
known then. Its prompts go through the run loop (`probekit.run.loop.fill`): one batch a
checksummed part, resumed from the parts found, merged into `lens_by_prompt.parquet` (one row
per prompt, the per-layer values as lists) once every prompt has a row.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from probekit.core.errors import ProbekitError
from probekit.core.io import row_bytes, write_table, write_text
from probekit.core.items import PROMPT_ID, EncodedItem, Item
from probekit.core.options import named
from probekit.core.public import public
from probekit.core.rundir import RowKey, RunDir
from probekit.core.store import INDEX, say
from probekit.engines.base import Engine, ScoreResult
from probekit.engines.options import ModelOptions
from probekit.mechanism.lens import LensOptions, LensResult, logit_lens
from probekit.mechanism.readouts import parse_readout
from probekit.mechanism.sites import layer_indices
from probekit.reporting.contract import describe_model
from probekit.reporting.figures import figure_data
from probekit.reporting.lens import adjust_layers, lens_figure, write_lens_page
from probekit.run.command import Job, StudyRunner
from probekit.run.loop import WHOLE, fill, open_run
from probekit.run.patch import RECORD as PATCH_RECORD
from probekit.run.scoring import Chunk, Scoring, pace_key
from probekit.studies.base import VIEWS, Probe, Study

ROWS = "lens.parquet"
PROMPTS = "lens_by_prompt.parquet"
GAPS = "lens_gaps.csv"
PATCHING, PATCHING_SUMMARY = "patching.parquet", "patching_summary.csv"
SAME_RUN = ("study", "weights", "dtype", "tier", "device", "epsilon", "data_sha256")
"""What a patching run in the lens's folder must share with the lens for its pairs' gaps to be
read in the lens's distributions (its record, `patching/manifest.json`, against the lens's)."""
LAYER_COLUMNS = ("label", "value", "low", "high", "p_value", "interval", "primary", "reference")
LAYER_COLUMNS += ("unit", "n", "note")
"""A layer's headline in `summary.csv` (`primary`: the one that stands for the study)."""
DIFFERENCE = "scorer_difference"
"""A part's column: the largest |difference| of an answer probability between the lens after
the last layer and the scorer, per prompt (NaN when the last layer is not read)."""


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


@public(LensOptions, command="lens")
def lens_study(
    study: str | Study,
    model: str | Path | Engine | ModelOptions = "default",
    *,
    quiet: bool = False,
    out: str | Path = "runs/lens",
    seed: int = 0,
    batch_size: int | None = None,
    limit: int | None = None,
    layers: Sequence[int] | range | None = None,
    **options: Any,
) -> StudyLens:
    """`probekit lens STUDY` as a function. `study`: a registered study's name or a `Study` object
    (used as it is); `model`: a model spec, a `probekit.ModelOptions` (a spec with its loading
    options: dtype, device, ...) or an already loaded model. The keywords are the lens's options
    (below: `layers=[0, 14, -1]`, ...) and the study's (`events=2`), checked as the command line
    checks them (a bad or unknown one is one line of `ProbekitError` naming the keyword, before any
    model work). Writes what the command writes into `out`, resumable. `options`: the study's own
    (`probekit lens STUDY --help`)."""
    return LENS.call(lens_study, dict(locals()))


class LensCommand(StudyRunner):
    """`probekit lens STUDY`: the lens's own lines (its layers, scoring and report)."""

    name, own = "lens", LensOptions
    writes = (*StudyRunner.writes, ROWS, PROMPTS, GAPS, "lens.png", "layers/")
    shows = "lens.parquet, summary.csv, lens.png, report.html"

    def prepare(self, job: Job) -> list[int] | None:
        """The layers known before the model (None where one counts from the end); one line,
        before any work, for a file where a layer's report folder goes (`layers/L0`)."""
        layers = job.folder / "layers"
        for folder in [layers, *layers.glob("L*")]:
            if folder.exists() and not folder.is_dir():
                raise ProbekitError(f"{folder} is a file where the lens writes a folder; remove it")
        return super().prepare(job)

    def own_fields(self, job: Job, model: Engine | None) -> dict[str, Any]:
        """The layers read: those asked for (every layer by default), counted on `model`."""
        layers = job.plan
        if model is not None:
            layers = sorted(set(layer_indices(model, job.own.layers or range(model.n_layers))))
        return {"layers": layers, "hooks": "transformer_lens"}

    def work(self, job: Job, model: Any, manifest: dict[str, Any]) -> StudyLens:
        study, probe, out = job.study, job.probe, job.folder
        layers = manifest["layers"]
        check_patching_record(out, manifest)  # before any scoring
        with open_run(out, WHOLE, manifest):
            manifest = RunDir(out).update_manifest(**{k: manifest[k] for k in self.refreshed})
            key = RowKey.of(manifest, [item.id for item in job.items])
            hint = f"fewer {named('layers')} or fewer prompts"
            start = functools.partial(lens_scoring, model, job, layers)
            merged = fill(lambda: job.items, probe.name, out, key, start, hint=hint, merged=PROMPTS)
        assert merged is not None  # one process: every prompt has its row
        wide = pd.read_parquet(merged)
        table = probe.add_columns(_long(wide))
        write_table(out / ROWS, pa.Table.from_pandas(table, preserve_index=False))
        report = {**probe.manifest(), "model": model.name, "seed": job.own.seed, "view": VIEWS[0]}
        report |= probe.interval_fields(job.items)
        gaps = patching_gaps(out, table, job.items, probe)
        # p adjusted over the layers; no p and no share of the gap at a weak layer
        summary, gaps = adjust_layers(layer_summary(study, table, out, report), gaps)
        write_text(out / "summary.csv", summary.to_csv(index=False))
        if gaps is not None:
            write_text(out / GAPS, gaps.to_csv(index=False))
        recovery = None  # the patching run's recovery per component without a head
        if gaps is not None and (out / PATCHING_SUMMARY).is_file():
            found = pd.read_csv(out / PATCHING_SUMMARY)
            recovery = found[found["head"].isna() & found["recovery"].notna()]
        title = f"{describe_model(manifest)}, {probe.name}"
        figure = lens_figure(summary, gaps, recovery, out / "lens.png", title)
        manifest = RunDir(out).update_manifest(
            figures=figure_data(out, ("lens.png", "layers/*/*.png"))
        )
        difference = float(wide[DIFFERENCE].max()) if wide[DIFFERENCE].notna().any() else None
        data = study.describe_data(manifest)
        page = RunDir(out).report_path
        write_lens_page(page, summary, gaps, figure, title, manifest, data, difference)
        return StudyLens(out, table, summary, gaps)


LENS = LensCommand()


def lens_scoring(model: Any, job: Job, layers: list[int]) -> Scoring:
    """The lens's chunks (one batch each) read after each of `layers` (`logit_lens`)."""
    probe, batch_size = job.probe, job.own.batch_size
    scorer = model.scorer(probe.answers, epsilon=0.0, batch_size=batch_size)
    batch_size = batch_size or scorer.batch_size
    last = layers[-1] == model.n_layers - 1

    def score(chunk: Chunk, bar: Any) -> pd.DataFrame:
        prompts = [job.encoded[i] for i, _ in chunk]
        found = logit_lens(scorer, [p.input_ids for p in prompts], layers, batch_size, bar)
        rows = zip(chunk, prompts, found, strict=True)
        return pd.DataFrame([_wide_row(i, p, lens, probe, last) for (i, _), p, lens in rows])

    key = pace_key(model.describe(), probe.answers, "lens")
    size = len(layers) * row_bytes(len(probe.answers.answers))
    return Scoring("lens", batch_size, key, score, batch_size, size)


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
        viewed = study.report_view(scores, folder, report, VIEWS[0], "")
        viewed = pd.DataFrame(study.without_interval(viewed, report))
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
            row = {k: h is first if k == "primary" else getattr(h, k) for k in LAYER_COLUMNS}
            rows.append({**base, **row})
    return pd.DataFrame(rows)


def check_patching_record(out: Path, manifest: dict[str, Any]) -> None:
    """A patching run in `out` is read beside the lens only where its record says it was made
    on the lens's study, weights, dtype, tier, device, ε and data (`SAME_RUN`): one line
    otherwise, and where it has no record, before the lens scores anything."""
    if not (out / PATCHING).is_file():
        return
    record = RunDir(out / PATCH_RECORD).read_manifest()
    if record is None:
        raise ProbekitError(
            f"{out / PATCHING} has no record ({out / PATCH_RECORD / 'manifest.json'}): the lens "
            f"cannot check that it patched this model and data; move it away or patch again"
        )
    for key in SAME_RUN:
        if record.get(key) != manifest.get(key):
            raise ProbekitError(
                f"{out / PATCHING} was made with a different {key} ({record.get(key)!r}, this "
                f"lens {manifest.get(key)!r}): its pairs' gaps are not this run's; give the lens "
                f"another {named('out')}, or patch again into {out}"
            )


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

    def gap(read: dict[str, ScoreResult], clean: str, corrupt: str) -> float:
        """A pair's readout gap, both prompts read against the clean one's distribution."""
        corrupted = readout(read[corrupt], by_id[corrupt], read[clean])
        return readout(read[clean], by_id[clean], read[clean]) - corrupted

    rows = []
    for layer, frame in table.groupby("layer", sort=True):
        records = frame.to_dict("records")
        read = {row[PROMPT_ID]: ScoreResult.from_row(row, probe.answers) for row in records}
        signed = zip(pairs[columns[0]], pairs[columns[1]], signs, strict=True)
        mean = float(np.nanmean([sign * gap(read, a, b) for a, b, sign in signed]))
        share = mean / full if full else np.nan
        rows.append((int(layer), readout.spec, len(pairs), mean, full, share))
    return pd.DataFrame(rows, columns=["layer", "readout", "pairs", "gap", "full_gap", "share"])
