"""`probekit capture STUDY` and `probekit.capture_study`: activations at the spans of a study's
items, as fp16 safetensors shards plus an index whose `prompt_id` joins the run's scores
(`probekit.mechanism.capture`; resumable), with the capture's `manifest.json` (its settings,
the package versions and the probekit commit) and `report.html`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.progress import echo
from probekit.core.public import public
from probekit.core.rundir import RunDir
from probekit.engines.base import Engine
from probekit.engines.options import ModelOptions
from probekit.mechanism.capture import (
    STORAGE_DTYPE,
    Activations,
    CaptureResult,
    capture_manifest,
    read_activations,
    site_shorts,
)
from probekit.mechanism.pipeline import CaptureOptions, check_capture, run_capture
from probekit.mechanism.sites import DEFAULT_SITES
from probekit.reporting.contract import describe_model
from probekit.reporting.html import write_record_page
from probekit.run.command import Job, Options, StudyRunner, prompt_fields, provenance
from probekit.studies.base import Study

SHOWN = ("model", "weights", "dtype", "layers", "sites", "spans", "hooks", "storage_dtype")
SHOWN += ("selection", "commit", "command")


class CaptureCommand(StudyRunner):
    """`probekit capture STUDY`: the capture's own lines (its manifest is the capture's)."""

    name, own, settles, shows = "capture", CaptureOptions, False, None
    writes = (*StudyRunner.writes, "shards/", "index/")

    def check(self, options: Options, study: Study | None) -> None:
        """With the mechanism's, the capture's sites, known by name (no data, no model)."""
        super().check(options, study)
        site_shorts(options.own.sites)

    def prepare(self, job: Job) -> list[int] | None:
        check_capture(job.own, job.items)
        return super().prepare(job)

    def fields(self, job: Job, model: Any) -> dict[str, Any]:
        """The capture's manifest (`probekit.mechanism.capture.capture_manifest`)."""
        own, storage = job.own, str(STORAGE_DTYPE).removeprefix("torch.")
        layers = job.plan if model is None else None
        shorts = site_shorts(own.sites)
        return capture_manifest(model, layers, shorts, own.spans, own.hooks, storage)

    def work(self, job: Job, model: Any, manifest: dict[str, Any]) -> CaptureResult:
        result = run_capture(model, job.probe, job.encoded, job.own, job.folder, say=echo)
        own, folder = job.own, job.folder
        selection = {"study": job.study.name, "seed": own.seed, "limit": own.limit}
        selection |= prompt_fields(job.items)
        manifest = RunDir(folder).update_manifest(**provenance(job.call), selection=selection)
        counts = {"prompts captured": result.captured, "prompts already there": result.skipped}
        counts["shards written"] = len(result.shards)
        subtitle = (
            f"activations at layers {manifest['layers']} of {', '.join(manifest['sites'])}, "
            f"stored as {manifest['storage_dtype']}: read them with "
            f"probekit.read_activations('{folder}')"
        )
        title = f"{describe_model(manifest)}, {job.probe.name}"
        index = pd.DataFrame(list(counts.items()), columns=["", "count"])
        data = job.study.describe_data(manifest)
        write_record_page(
            folder / "report.html", "Activations", title, subtitle, manifest, SHOWN, data, index
        )
        return result


CAPTURE = CaptureCommand()


@public(CaptureOptions, command="capture")
def capture_study(
    study: str | Study,
    model: str | Path | Engine | ModelOptions = "default",
    *,
    quiet: bool = False,
    out: str | Path = "runs/capture",
    seed: int = 0,
    batch_size: int | None = 8,
    limit: int | None = None,
    layers: Sequence[int] | range | None = None,
    sites: Sequence[str] = DEFAULT_SITES,
    hooks: str = "transformer_lens",
    spans: Sequence[str] | None = None,
    **options: Any,
) -> Activations:
    """`probekit capture STUDY` as a function. `study`: a registered study's name or a `Study`
    object (used as it is); `model`: a model spec, a `probekit.ModelOptions` (a spec with its
    loading options: dtype, device, ...) or an already loaded model. The keywords are the capture's
    options (below: `layers=[0, -1]`, `sites=["resid_post"]`, `spans=["experiencer"]`, ...) and the
    study's, checked as the command line checks them (a bad or unknown one is one line of
    `ProbekitError` naming the keyword, before any model work). Writes the resumable shards into
    `out` and returns everything captured there. `options`: the study's own (`probekit capture STUDY
    --help`)."""
    CAPTURE.call(capture_study, dict(locals()))
    return read_activations(out)
