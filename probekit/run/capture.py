"""`probekit capture STUDY` and `probekit.capture_study`: activations at the spans of a study's
items, as fp16 safetensors shards plus an index whose `prompt_id` joins the run's scores
(`probekit.mechanism.capture`; resumable)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from probekit.core.options import Command
from probekit.core.progress import silenced
from probekit.core.public import public
from probekit.engines import load_engine
from probekit.engines.base import Engine
from probekit.engines.options import ModelOptions
from probekit.mechanism.api import hookable
from probekit.mechanism.capture import (
    STORAGE_DTYPE,
    Activations,
    CaptureResult,
    capture_manifest,
    check_capture_folder,
    read_activations,
    site_shorts,
)
from probekit.mechanism.pipeline import CaptureOptions, check_capture, run_capture
from probekit.mechanism.sites import DEFAULT_SITES
from probekit.run.mechanism import context, mechanism_command
from probekit.run.options import build
from probekit.studies.base import Study


def capture_command(study: Study) -> Command:
    """`probekit capture STUDY`'s options: the model's, the capture's and the study's."""
    return mechanism_command("capture", CaptureOptions, study, (_check,))


def _check(parsed: tuple) -> None:
    """The capture's sites, known by name while parsing (no data, no model)."""
    site_shorts(parsed[1].sites)


@public(ModelOptions, CaptureOptions, command="capture", skip=("model",))
def capture_study(
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
    object (used as it is); `model`: a model spec or an already loaded model. The keywords are
    the capture's options and the model's (below: `layers=[0, -1]`, `sites=["resid_post"]`,
    `spans=["experiencer"]`, ...) and the study's, checked as the command line checks them (a
    bad or unknown one is one line of `ProbekitError` naming the keyword, before any model
    work). Writes the resumable shards into `out` and returns everything captured there.
    `options`: the study's own (`probekit capture STUDY --help`)."""
    found, loaded, parsed = build(capture_command, dict(locals()))
    capture_parsed(found, parsed, loaded)
    return read_activations(parsed[1].out)


def capture_parsed(study: Study, parsed: tuple, model: Any = None) -> CaptureResult:
    """The capture as the checked options `parsed` say (`capture_command`'s values), on `model`
    or the one they name: items, the checks that need no model, then the capture."""
    asked, options, own = parsed
    probe, items = study.mechanism_items(own, context("capture", asked, options))
    check_capture(options, items)  # before any model work
    given = options.layers
    layers = sorted(set(given)) if given and min(given) >= 0 else None  # else the model says
    shorts = site_shorts(options.sites)
    storage = str(STORAGE_DTYPE).removeprefix("torch.")
    known = capture_manifest(None, layers, shorts, options.spans, options.hooks, storage)
    check_capture_folder(options.out, known)
    if model is None:
        model = load_engine(asked.model, **asked.load_keywords())
    with silenced(asked.quiet):
        return run_capture(hookable(model), probe, items, options, options.out)
