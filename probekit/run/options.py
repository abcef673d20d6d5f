"""The options of a study run (`probekit run STUDY`, `probekit.run_study`), declared once
(`probekit.core.options`): `RunOptions`, and `run_command`, the command that takes them with the
model's options and the study's own, and checks them together before any work; `build`, the
front every study command's function shares (the study by name or as an object, the model
loaded or a spec, the keywords checked as the command line checks them)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.kinds import Kind, int_value, non_negative_int, positive_int, refuse, text
from probekit.core.options import Command, named, option
from probekit.core.shared_options import BatchSizeOption, LimitOption, OutOption, SeedOption
from probekit.engines.base import Engine
from probekit.engines.options import EpsilonOption, ModelOptions, check_models, loaded_engine
from probekit.studies.base import Context, Study, get_study, other_study_option


def _shard_value(value: Any) -> tuple[int, int]:
    if isinstance(value, str):
        try:
            value = [int(x) for x in value.split("/")]
        except ValueError:
            refuse(f"'{value}' must look like i/n, e.g. 0/4")
    if not isinstance(value, Sequence) or len(value) != 2:
        refuse(f"{value!r} must look like i/n, e.g. 0/4 (or a pair (i, n))")
    index, count = (int_value(x) for x in value)
    if count < 1 or not 0 <= index < count:
        refuse(f"'{index}/{count}': need 0 <= i < n")
    return index, count


shard_kind = Kind("shard", str, _shard_value)
"""`i/n` (or a pair from Python): every n-th prompt from the i-th (0 <= i < n)."""


def _numerics(value: Any) -> int | str:
    return value if value == "auto" else non_negative_int.check(value)


numerics_sample = Kind(
    "numerics", lambda value: value if value == "auto" else non_negative_int.parse(value), _numerics
)
"""`auto` or a count of prompts (0: no noise figure)."""


def _ray(value: Any) -> str:
    return "" if value is True else text.check(value)


ray_address = Kind("address", str, _ray)
"""A Ray cluster's address (`HOST:PORT`), or "" (True from Python): the one found here."""


@dataclass(frozen=True)
class RunOptions(LimitOption, EpsilonOption, BatchSizeOption, SeedOption, OutOption):
    """Run options: the view, which prompts, how they are scored, where."""

    view: str = option(
        "exact",
        help="exact (the scores from the logits, the default), generate (the authors' "
        "generation and parse, exact scores beside them) or explain (giebench)",
        kind=text,
    )
    shard: tuple[int, int] = option(
        (0, 1), help="i/n: run every n-th prompt from the i-th (default 0/1)", kind=shard_kind
    )
    numerics: int | str = option(
        "auto",
        help="prompts re-scored in float64 for the noise figure: auto (1 per 200 prompts, at "
        "most 8, none below 200), N, or 0 (skip)",
        kind=numerics_sample,
    )
    ray: str | None = option(
        None,
        help="score on Ray actors, one engine each: the cluster at ADDRESS (HOST:PORT; with "
        "token authentication also RAY_AUTH_MODE=token), else $RAY_ADDRESS, else the cluster "
        "`ray start` runs here, else a local instance (./setup.sh --ray)",
        kind=ray_address,
        const="",
        metavar="ADDRESS",
    )
    ray_actors: int | None = option(
        None,
        help="engines on Ray (default: one per GPU of the cluster, else one per node)",
        kind=positive_int,
        metavar="N",
    )


def run_command(study: Study) -> Command:
    """`probekit run STUDY`'s options: the models', the run's and the study's, with the study's
    output folder and seed as defaults, and the checks that span them."""

    def check(parsed: tuple) -> None:
        models, run, own = parsed
        if run.view not in study.run_views:
            choices = ", ".join(study.run_views)
            raise ProbekitError(
                f"{named('view')}: unknown view '{run.view}'; choose one of {choices}"
            )
        placed = [name for model in models for name in model.placed]
        if run.ray is not None and placed:  # Ray's actors load one engine each
            raise ProbekitError(
                f"{named('ray')} loads one engine per actor with {named('device')} and "
                f"{named('dtype')} only; drop {named(placed[0])} (a device map places one model "
                f"in one process: run without {named('ray')})"
            )
        study.check(own, run_context(run, models[0]))

    return Command(
        "run",
        (ModelOptions, RunOptions, study.options),
        defaults={"out": study.default_out, "seed": study.default_seed},
        checks=(check_models, check),
        elsewhere=functools.partial(other_study_option, study, "run"),
    )


def precision_settings(
    asked: ModelOptions | None, described: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The resume keys of a run's arithmetic (`probekit.core.rundir.MANIFEST_FIELDS`): `tolerance`,
    by which the hf engine picks its precision tier (None where a dtype forces it or another engine
    scores), and `tier`, the one picked. From the loaded model's `described` precision record;
    before it loads (`described` None) the tolerance `asked` for (None for a model loaded already,
    `asked` None: its own is known once described) and no tier yet."""
    if described is None:
        return {"tolerance": None if asked is None else asked.tolerance_asked, "tier": None}
    record = described.get("precision") or {}
    return {"tolerance": record.get("tolerance"), "tier": record.get("tier")}


def run_context(run: RunOptions, model: ModelOptions, say: Any = print) -> Context:
    """What the study's methods read of a run: its seed, view and device."""
    return Context("run", run.seed, run.view, model.device, say)


def study_object(study: str | Study) -> Study:
    """A registered study's name or a `Study` object (used as it is, registered or not)."""
    if isinstance(study, str):
        return get_study(study)
    if not isinstance(study, Study):
        raise ProbekitError(f"study must be a Study or a registered study's name, not {study!r}")
    return study


def build(
    command: Callable[[Study], Command], arguments: Mapping[str, Any]
) -> tuple[Study, Engine | None, tuple]:
    """The front of a study command's function (`run_study`, `patch_study(study, model,
    **options)`, ...) from its `arguments` (its `locals()` before any other line: `study`, `model`,
    its own options and the study's `options`): the study `study` names (`study_object`), the
    loaded engine `model` is (None for a spec) and the options of the call, checked by
    `command(study)` as the command line checks them (one line naming the keyword)."""
    keywords = {k: v for k, v in arguments.items() if k not in ("study", "options")}
    found, loaded = study_object(arguments["study"]), loaded_engine(arguments["model"])
    if loaded is not None:
        del keywords["model"]
    asked = command(found)
    where = f"{asked.name}_study({found.name!r})"
    return found, loaded, asked.build({**keywords, **arguments["options"]}, where)


def call_line(function: Callable[..., Any], arguments: Mapping[str, Any]) -> str:
    """A study function's call as its run records it (`probekit.run_study('isear', limit=6)`):
    the study, each keyword not at its default and the study's options."""
    defaults = {n: p.default for n, p in inspect.signature(function).parameters.items()}
    keywords = {
        k: v for k, v in arguments.items() if k not in ("study", "options") and v != defaults[k]
    }
    study = arguments["study"]
    shown = [repr(getattr(study, "name", study))]
    shown += [f"{k}={v!r}" for k, v in {**keywords, **arguments["options"]}.items()]
    return f"probekit.{function.__name__}({', '.join(shown)})"
