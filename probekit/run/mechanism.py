"""A study under the mechanism commands (`probekit patch`, `capture`, `steer` and their
functions `patch_study`, `capture_study`, `steer_study`): the options they take together (the
model's, the command's and the study's, checked before any work), the study's view of them, and
the study given by name or as an object."""

from __future__ import annotations

import functools
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.options import Command, Spell
from probekit.engines.options import ModelOptions, check_models, loaded_engine
from probekit.studies.base import Context, Study, get_study, other_study_option

Check = Any
"""A command's own check of its parsed options: `check(parsed, spell)`, raising one line."""


def mechanism_command(
    name: str, options: type, study: Study, defaults: dict, checks: tuple[Check, ...] = ()
) -> Command:
    """A mechanism command's options (`patch`, `capture`, `steer`): the model's (a hookable
    engine), the command's `options` and the study's, checked together (`checks`: the
    command's own, after the engine's and the study's)."""

    def check(parsed: tuple, spell: Spell) -> None:
        model, own, study_options = parsed
        if model.engine != "hf":
            from probekit.engines.base import hooks_unavailable

            raise ProbekitError(
                f"{spell('engine')} {model.engine}: {hooks_unavailable(model.engine)}"
            )
        study.check(study_options, context(name, model, own, spell))

    groups = (ModelOptions, options, study.options)
    elsewhere = functools.partial(other_study_option, study, name)
    return Command(name, groups, defaults, (check_models, check, *checks), elsewhere)


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


def build(command: Command, study: Study, model: Any, options: dict[str, Any]) -> tuple[Any, tuple]:
    """The loaded engine `model` is (None for a spec) and the options of a call of the command's
    function (`patch_study(study, model, **options)`), checked as the command line checks them
    (one line naming the keyword)."""
    loaded = loaded_engine(model)
    keywords = options if loaded is not None else {**options, "model": model}
    return loaded, command.build(keywords, f"{command.name}_study({study.name!r})")
