"""A study under the mechanism commands (`probekit patch`, `capture`, `steer`, `lens` and their
functions `patch_study`, `capture_study`, `steer_study`, `lens_study`): the options they take
together (the model's, the command's and the study's, checked before any work; their functions'
front is `probekit.run.options.build`), the study's view of them, and the manifest fields their
run folders share (`mechanism_settings`)."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.options import Command, named
from probekit.core.rundir import RESULTS_FORMAT, device_kind
from probekit.engines.options import ModelOptions, check_models
from probekit.run.options import precision_settings
from probekit.studies.base import VIEWS, Context, Study, other_study_option

Check = Any
"""A command's own check of its parsed options: `check(parsed)`, raising one line."""


def mechanism_command(
    name: str, options: type, study: Study, checks: tuple[Check, ...] = ()
) -> Command:
    """A mechanism command's options (`patch`, `capture`, `steer`, `lens`): the model's (a hookable
    engine), the command's `options` and the study's, checked together (`checks`: the
    command's own, after the engine's and the study's)."""

    def check(parsed: tuple) -> None:
        model, own, study_options = parsed
        if model.engine != "hf":
            from probekit.engines.base import hooks_unavailable

            raise ProbekitError(
                f"{named('engine')} {model.engine}: {hooks_unavailable(model.engine)}"
            )
        study.check(study_options, context(name, model, own))

    groups = (ModelOptions, options, study.options)
    elsewhere = functools.partial(other_study_option, study, name)
    return Command(name, groups, {}, (check_models, check, *checks), elsewhere)


def context(name: str, model: ModelOptions, own: Any) -> Context:
    """What the study's methods read of a mechanism command: its seed, device and limit."""
    return Context(name, own.seed, device=model.device, limit=own.limit)


def mechanism_settings(
    study: Study,
    probe: Any,
    ids: list[str],
    seed: int,
    model: Any,
    own: dict[str, Any],
    asked: ModelOptions | None = None,
) -> dict[str, Any]:
    """The manifest of a mechanism run folder (`probekit steer`, `probekit lens`): what changes
    a number, as it reads back from the file (undeclared fields are resume keys, see
    `probekit.core.rundir.MANIFEST_FIELDS`). The study, the probe's configuration (exact view,
    epsilon 0 unless `own` gives the command's), the seed, the command's `own` fields, the prompts
    (their ids' SHA-256, in order) and, from the loaded `model`, the model as given, where it
    was loaded from, its weights, dtype, kind of device, device map and precision record, each
    None before it loads (`model` None, so that `RunDir.check_resume` leaves them for after),
    and the arithmetic's resume keys (`precision_settings`: before the model loads, the
    tolerance `asked` for)."""
    described = model.describe() if model is not None else {}
    manifest = {
        "results_format": RESULTS_FORMAT,
        "study": study.name,
        **{key: described.get(key) for key in ("model", "model_source", "weights", "dtype")},
        "device": device_kind(described.get("device")),
        "device_map": described.get("device_map"),
        "precision": described.get("precision"),
        **precision_settings(asked, described if model is not None else None),
        "engine": "hf",
        "probe": probe.config(),
        "view": VIEWS[0],
        "epsilon": 0.0,
        "seed": seed,
        **own,
        "prompt_ids_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest(),
        "prompts": len(ids),
        **probe.manifest(),
    }
    return json.loads(json.dumps(manifest, default=str))
