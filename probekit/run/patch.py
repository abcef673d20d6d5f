"""`probekit patch STUDY` and `probekit.patch_study`: a study's items traced inside the model
(patching, attribution, mediation and the study's direction; `probekit.mechanism.pipeline`).

Its files go into `out` (`patching.parquet`, `patching_summary.csv`, the figures, ...), and its
record into `out/patching/`: `manifest.json` (the weights' hash, the seed, the sets patched and
how they were chosen, the contrast, the unit resampled, the p values' adjustment, sites, layers,
spans, the options, the package versions and the probekit commit) and `report.html`.

The exact sweep keeps its rows as it measures them, in `out/patching/sweep/` (`SWEEP`: checksummed
parts of whole pairs, the run loop's `probekit.run.loop.fill`, with their own manifest): a patch
cut short (killed, an exception, a write that failed) and run again measures only the rows it
lacks and writes the table an uninterrupted run writes; the same command with another setting is
refused in one line before the model loads. Once every file is written the folder is removed, so
a finished patching run, run again, measures and writes its files and record anew. A lens run of
the same folder (its `manifest.json` at the top) reads its pairs
(`probekit.run.lens.patching_gaps`).
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.io import WriteFailed
from probekit.core.items import PROMPT_ID
from probekit.core.options import option_values
from probekit.core.public import public
from probekit.core.rundir import RowKey, RunDir
from probekit.core.store import INDEX
from probekit.engines.base import Engine
from probekit.engines.options import ModelOptions
from probekit.mechanism import patching
from probekit.mechanism.pipeline import (
    PatchOptions,
    Sweep,
    check_patch,
    check_patch_options,
    run_patch,
)
from probekit.mechanism.sites import DEFAULT_SITES, chosen_layers
from probekit.reporting.contract import describe_model
from probekit.reporting.figures import figure_data
from probekit.reporting.html import write_record_page
from probekit.run.command import Job, Options, StudyRunner
from probekit.run.loop import WHOLE, fill, open_run
from probekit.run.scoring import Chunk, Scoring, pace_key
from probekit.studies.base import Study

RECORD = "patching"
"""The folder of a patching run's record (`manifest.json`, `report.html`) inside `out`."""
SWEEP = f"{RECORD}/sweep"
"""The folder inside `out` that keeps the exact sweep's rows until the run has written its files."""
SHOWN = ("study", "model", "weights", "seed", "readout", "method", "contrast", "selection")
SHOWN += ("resampled", "adjustment", "sites", "layers", "spans", "commit", "command")
"""The settings its page shows first."""


@dataclass(frozen=True, repr=False)
class StudyPatch:
    """What `patch_study` wrote: `path`, the folder; `files`, the files written there;
    `table`, the patching table (`patching.parquet`: one row per pair x component, see
    `probekit.mechanism.patching.sweep`); `summary`, per component over the pairs
    (`patching_summary.csv`: `status`, `effect`, `recovery` with their intervals over units,
    `p_value`, `p_adjusted`, `pairs`, `mean_valid_mass_patched`, `weak_signal`, the measured
    components first, largest |effect| first). Printed, it is one line."""

    path: Path
    files: list[str]
    table: pd.DataFrame
    summary: pd.DataFrame

    def __repr__(self) -> str:
        pairs = self.table[["clean_prompt_id", "corrupt_prompt_id"]].drop_duplicates()
        top = ""
        # the measured components, not those known by construction
        measured = self.summary[self.summary["status"] == "measured"]
        if len(measured) and "recovery" in measured:
            first = measured.iloc[0]
            head = "" if pd.isna(first["head"]) else f" head {int(first['head'])}"
            top = (
                f"; largest effect L{first['layer']} {first['site']}{head} at {first['span']} "
                f"(recovery {first['recovery']:.3g})"
            )
        weak = int(self.summary["weak_signal"].sum()) if "weak_signal" in self.summary else 0
        return (
            f"StudyPatch({str(self.path)!r}: {len(self.summary)} components x {len(pairs)} "
            f"pairs{top}" + (f"; weak signal at {weak} components" if weak else "") + ")"
        )


@public(PatchOptions, command="patch")
def patch_study(
    study: str | Study,
    model: str | Path | Engine | ModelOptions = "default",
    *,
    quiet: bool = False,
    out: str | Path = "runs/patch",
    seed: int = 0,
    batch_size: int | None = None,
    limit: int | None = None,
    layers: Sequence[int] | range | None = None,
    sites: Sequence[str] = DEFAULT_SITES,
    hooks: str = "transformer_lens",
    spans: Sequence[str] | None = None,
    heads: Sequence[int] | None = None,
    readout: str | None = None,
    method: str = "exact",
    top_k: int = 20,
    sets_per_unit: int | None = None,
    per_position: bool = False,
    mediation: bool = False,
    bootstrap: int = 1000,
    prompt_only: bool = False,
    controls: int = 5,
    skip_direction: bool = False,
    **options: Any,
) -> StudyPatch:
    """`probekit patch STUDY` as a function. `study`: a registered study's name or a `Study` object
    (used as it is); `model`: a model spec, a `probekit.ModelOptions` (a spec with its loading
    options: dtype, device, ...) or an already loaded model. The keywords are the patch's options
    (below: `layers=[0, 14]`, `sites=["resid_pre"]`, `prompt_only=True`, ...) and the study's
    (`events=2`), checked as the command line checks them (a bad or unknown one is one line of
    `ProbekitError` naming the keyword, before any model work). Writes what the command writes into
    `out` and returns it, with its record in `out/patching/` (`manifest.json`, `report.html`).
    `options`: the study's own (`probekit patch STUDY --help`)."""
    return PATCH.call(patch_study, dict(locals()))


class PatchCommand(StudyRunner):
    """`probekit patch STUDY`: the patching analysis, and its record."""

    name, own, resumable, resumes = "patch", PatchOptions, False, SWEEP  # a sweep cut short
    writes = ("patching.parquet", "patching_summary.csv", f"{RECORD}/")

    def check(self, options: Options, study: Study | None) -> None:
        """With the mechanism's, the patch options that cannot go together (no data, no
        model)."""
        super().check(options, study)
        check_patch_options(options.own)

    def prepare(self, job: Job) -> None:
        check_patch(job.own, job.items, job.probe.answers, job.study.mechanism_defaults())

    def wrote(self, result: StudyPatch) -> str:
        return f"{result.path}/{', '.join(result.files)}"

    def own_fields(self, job: Job, model: Engine | None) -> dict[str, Any]:
        layers = None if model is None else chosen_layers(model, job.own.layers or None, "patch")
        return {**option_values(job.own, leave=("out",)), "layers": layers}

    def work(self, job: Job, model: Any, manifest: dict[str, Any]) -> StudyPatch:
        out = job.folder
        sweep = kept_sweep(out / SWEEP, manifest)
        try:
            written, record = run_patch(
                model, job.study, job.probe, job.encoded, job.own, out, sweep=sweep
            )
        except WriteFailed as failed:
            if not (out / SWEEP).is_dir():
                raise
            raise ProbekitError(
                f"{failed.marked}; the measured rows are kept in {out / SWEEP}: once that is "
                "fixed, run the same command again to finish (nothing measured is measured again)"
            ) from None
        figures = figure_data(out, [name for name in written if name.endswith(".png")])
        manifest = {**manifest, **record, "figures": figures}
        RunDir(out / RECORD).write_manifest(manifest)
        summary = pd.read_csv(out / "patching_summary.csv")
        table = pd.read_parquet(out / "patching.parquet")
        pairs = table[["clean_prompt_id", "corrupt_prompt_id"]].drop_duplicates()
        subtitle = (
            f"{manifest['readout']}, {job.own.method}: {len(pairs)} pairs in "
            f"{len(record['sets'])} {record['contrast']} sets on {record['units']} "
            f"{job.study.unit_name}s ({record['selection']}); measured components first, the "
            "largest |effect| first"
        )
        columns = ["layer", "site", "head", "span", "swapped", "status", "effect", "recovery"]
        columns += ["recovery_low", "recovery_high", "p_adjusted", "weak_signal", "reading"]
        write_record_page(
            out / RECORD / "report.html",
            "Activation patching",
            f"{describe_model(manifest)}, {job.probe.name}",
            subtitle,
            manifest,
            SHOWN,
            job.study.describe_data(manifest),
            summary[[c for c in columns if c in summary]].head(20),
            [out / name for name in written if name.endswith(".png")],
            weak=table.attrs.get("weak_signal"),
        )
        shutil.rmtree(out / SWEEP, ignore_errors=True)  # every file written: nothing to resume
        return StudyPatch(
            out, [*written, f"{RECORD}/manifest.json", f"{RECORD}/report.html"], table, summary
        )


def kept_sweep(folder: Path, manifest: dict[str, Any]) -> Sweep:
    """`patching.sweep`, its rows kept in `folder` as they are measured (the run loop's parts,
    `fill`, under `manifest`'s settings): cut short and called again, it measures only the rows
    it lacks, in the chunks an uninterrupted sweep measures, so the table is the same."""

    def sweep(scorer: Any, sets: Any, patches: Any, readout: Any, **options: Any) -> pd.DataFrame:
        ids = [f"{a.id} > {b.id} {p}" for s in sets for a, b in s.pairs for p in patches]
        batch = options.get("batch_size") or scorer.batch_size
        chunk = patching.chunk_rows(len(patches), batch)  # the chunks of an unkept sweep

        def measure(rows: Chunk, bar: Any) -> pd.DataFrame:
            """The rows of a chunk of whole pairs (their positions in the table, their ids)."""
            index = [i for i, _ in rows]
            found = patching.sweep(
                scorer, sets, patches, readout, rows=index, progress=False, **options
            )
            bar.update(len(index))
            return found.assign(**{INDEX: index, PROMPT_ID: [row for _, row in rows]})

        pace = pace_key(scorer.model.describe(), scorer.answers, "patch")
        with open_run(folder, WHOLE, manifest):
            key = RowKey.of(manifest, ids)
            start = functools.partial(Scoring, "patching", chunk, pace, measure)
            merged = fill(
                lambda: ids, "patching", folder, key, start, merged="rows.parquet", keep_parts=False
            )
        assert merged is not None  # one process: every row is measured
        table = patching.in_noise(pd.read_parquet(merged).drop(columns=[INDEX, PROMPT_ID]))
        table.attrs["answers"] = list(scorer.answers.answers)
        return table

    return sweep


PATCH = PatchCommand()
