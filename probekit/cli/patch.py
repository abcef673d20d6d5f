"""`probekit patch STUDY`: trace a study's behavioural gap inside the model (patching,
attribution, mediation and the study's direction; see probekit.mechanism.pipeline)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.options import Command, Spell, flag, keyword
from probekit.core.progress import silenced
from probekit.engines import load_engine
from probekit.engines.options import ModelOptions, loaded_engine
from probekit.mechanism.api import hookable
from probekit.mechanism.pipeline import PatchOptions, check_patch, run_patch
from probekit.studies.base import Context, Study, get_study


def command(study: Study) -> Command:
    """`probekit patch STUDY`'s options: the model's, the patch's and the study's."""
    return mechanism_command("patch", PatchOptions, study, {"out": "runs/patch"})


def mechanism_command(name: str, options: type, study: Study, defaults: dict) -> Command:
    """A mechanism command's options (`patch`, `capture`, `steer`): the model's (a hookable
    engine), the command's `options` and the study's, checked together."""

    def check(parsed: tuple, spell: Spell) -> None:
        model, own, study_options = parsed
        if model.engine != "hf":
            from probekit.engines.base import hooks_unavailable

            raise ProbekitError(
                f"{spell('engine')} {model.engine}: {hooks_unavailable(model.engine)}"
            )
        study.check(study_options, context(name, model, own, spell))

    return Command(name, (ModelOptions, options, study.options), defaults, (check,))


def context(name: str, model: ModelOptions, own: Any, spell: Spell) -> Context:
    """What the study's methods read of a mechanism command: its seed and device."""
    return Context(name, own.seed, device=model.device, spell=spell)


def study_object(study: str | Study) -> Study:
    """A registered study's name or a `Study` object (used as it is, registered or not)."""
    if isinstance(study, str):
        return get_study(study)
    if not isinstance(study, Study):
        raise ProbekitError(f"study must be a Study or a registered study's name, not {study!r}")
    return study


@dataclass(frozen=True)
class StudyPatch:
    """What `patch_study` wrote: the folder, the files, the patching table (one row per pair x
    component) and its summary (per component over the pairs: effect, recovery with intervals)."""

    path: Path
    files: list[str]
    table: pd.DataFrame
    summary: pd.DataFrame


def patch_study(study: str | Study, model: Any = "default", **options: Any) -> StudyPatch:
    """`probekit patch STUDY` as a function. `study`: a registered study's name or a `Study`
    object (used as it is); `model`: a model spec or an already loaded model. `options`: the
    patch's (`probekit.mechanism.pipeline.PatchOptions`: `layers=[0, 14]`,
    `sites=["resid_pre"]`, `readout="expected"`, `prompt_only=True`, `pairs_per_unit=2`,
    `out`, ...),
    the model's (`dtype=torch.bfloat16`, `device_map={...}`, ...) and the study's (`events=2`),
    checked as the command line checks them (a bad or unknown one is one line of
    `ProbekitError` naming the keyword, before any model work). Writes what the command writes
    into `out` (default `runs/patch`) and returns it."""
    found = study_object(study)
    loaded = loaded_engine(model)
    keywords = options if loaded is not None else {**options, "model": model}
    parsed = command(found).build(keywords, f"patch_study({found.name!r})")
    written = _patch(found, parsed, loaded, keyword)
    folder = Path(parsed[1].out)
    summary = pd.read_csv(folder / "patching_summary.csv")
    return StudyPatch(folder, written, pd.read_parquet(folder / "patching.parquet"), summary)


def execute(study: Study, parsed: tuple) -> None:
    start = time.monotonic()
    written = _patch(study, parsed, None, flag)
    print(f"wrote {parsed[1].out}/{', '.join(written)}")
    print(f"wall time {time.monotonic() - start:.0f} s")


def _patch(study: Study, parsed: tuple, model: Any, spell: Spell) -> list[str]:
    """The command's work: items, checks before the model, the analysis."""
    asked, options, own = parsed
    probe, items = study.mechanism_items(own, context("patch", asked, options, spell))
    check_patch(options, items, probe.answers, study.mechanism_defaults(), spell)  # no model yet
    if model is None:
        model = load_engine(asked.model, **asked.load_keywords())
    with silenced(asked.quiet):
        return run_patch(hookable(model), study, probe, items, options, options.out, spell=spell)
