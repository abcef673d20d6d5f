"""`probekit patch STUDY` and `probekit.patch_study`: a study's items traced inside the model
(patching, attribution, mediation and the study's direction; `probekit.mechanism.pipeline`).

Its files go into `out` (`patching.parquet`, `patching_summary.csv`, the figures, ...), and its
record into `out/patching/`: `manifest.json` (the weights' hash, the seed, the sets patched and
how they were chosen, the contrast, the unit resampled, the p values' adjustment, sites, layers,
spans, the options, the package versions and the probekit commit) and `report.html`. A patching
run is not resumed: run again, it writes its files and record anew. A lens run of the same
folder (its `manifest.json` at the top) reads its pairs (`probekit.run.lens.patching_gaps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.options import option_values
from probekit.core.public import public
from probekit.core.rundir import RunDir
from probekit.engines.base import Engine
from probekit.engines.options import ModelOptions
from probekit.mechanism.pipeline import PatchOptions, check_patch, check_patch_options, run_patch
from probekit.mechanism.sites import DEFAULT_SITES, chosen_layers
from probekit.reporting.contract import describe_model
from probekit.reporting.figures import figure_data
from probekit.reporting.html import write_record_page
from probekit.run.command import Job, MechanismRunner, Options
from probekit.studies.base import Study

RECORD = "patching"
"""The folder of a patching run's record (`manifest.json`, `report.html`) inside `out`."""
SHOWN = (
    "study",
    "model",
    "weights",
    "seed",
    "readout",
    "method",
    "contrast",
    "selection",
    "resampled",
    "adjustment",
    "sites",
    "layers",
    "spans",
    "commit",
    "command",
)
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
        measured = self.summary[
            self.summary["status"] == "measured"
        ]  # not those known by construction
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


@public(ModelOptions, PatchOptions, command="patch", skip=("model",))
def patch_study(
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
    """`probekit patch STUDY` as a function. `study`: a registered study's name or a `Study`
    object (used as it is); `model`: a model spec or an already loaded model. The keywords are
    the patch's options and the model's (below: `layers=[0, 14]`, `sites=["resid_pre"]`,
    `prompt_only=True`, `dtype=torch.bfloat16`, ...) and the study's (`events=2`), checked as
    the command line checks them (a bad or unknown one is one line of `ProbekitError` naming
    the keyword, before any model work). Writes what the command writes into `out` and returns
    it, with its record in `out/patching/` (`manifest.json`, `report.html`). `options`: the
    study's own (`probekit patch STUDY --help`)."""
    return PATCH.call(patch_study, dict(locals()))


class PatchCommand(MechanismRunner):
    """`probekit patch STUDY`: the patching analysis, and its record."""

    name, own, resumable = "patch", PatchOptions, False
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
        written, record = run_patch(model, job.study, job.probe, job.encoded, job.own, out)
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
        return StudyPatch(
            out, [*written, f"{RECORD}/manifest.json", f"{RECORD}/report.html"], table, summary
        )


PATCH = PatchCommand()
