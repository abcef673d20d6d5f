"""One runner for every command: a command is a `Runner` with its own options (a dataclass of
`probekit.core.options.option` fields) and the few lines that are its own; this module does the
rest once.

Every command's options are read the same way: from argv by the parser generated from their
declarations (`Runner.parse`) or from its function's keywords (`Runner.build`), checked together
before any work, and handed on typed (`Options`: the model's, the command's own, the study's).
A study command (`StudyRunner`: run, patch, capture, steer, lens) then sets up its work in one
order: the data and the checks that need it, each folder's resume check (before any model
loads: `check_resume`), the engine (`load`; a given one is used as it is), the precision tier
(`settle_tier`: a resumed run's kept, else chosen on a seeded sample of its prompts), one
manifest (`manifest`: the same function before loading and after), the command's own work (the
parts loop of `probekit.run.loop`) and its report. `StudyRunner.execute` is that order for
the mechanism commands; `probekit run` loops it over its models and probes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import random
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import probekit
from probekit import engines
from probekit.core.errors import ProbekitError
from probekit.core.io import WriteFailed, check_outputs
from probekit.core.items import EncodedItem, Item
from probekit.core.options import Command, named
from probekit.core.progress import silenced
from probekit.core.rundir import MANIFEST, RESULTS_FORMAT, RunDir, device_kind
from probekit.engines.base import Engine, hooks_unavailable
from probekit.engines.options import NOISE_SAMPLE, ModelOptions, check_models, loaded_engine
from probekit.studies.base import VIEWS, Context, Probe, Study, get_study, other_study_option


@dataclass(frozen=True)
class Options:
    """A command's checked options: the models' (`probekit run` takes several, the others
    one), the command's own and the study's."""

    models: tuple[ModelOptions, ...] = ()
    own: Any = None
    study: Any = None

    @property
    def model(self) -> ModelOptions:
        return self.models[0]


PACKAGES = ("probekit", "torch", "transformers", "transformer-lens", "nnsight", "numpy", "pandas")
LOADED = ("model", "weights", "model_source", "dtype", "device", "device_map", "columns")
LOADED += ("vllm_parallel", "tier", "layers", "d_model", "chat_template")
"""Manifest fields that only the loaded model may give (None before it loads: not compared)."""
LOADED_ONLY = ("n_layers", "columns", "vllm_parallel", "chat_template")
"""The model's fields its manifest records only where the engine describes them."""


def model_fields(asked: ModelOptions, model: Engine | None, own: bool = False) -> dict[str, Any]:
    """The manifest's model fields: from the loaded `model`, else (None) as `asked`, the fields
    only loading gives None. `own`: the model was given loaded, so its tolerance is its own."""
    described = model.describe() if model is not None else {}
    record = described.get("precision") or {}
    asked_tolerance = None if own else asked.tolerance_asked
    tolerance = record.get("tolerance") if model is not None else asked_tolerance
    return {
        "model": asked.model,
        "model_source": described.get("model_source"),
        "weights": described.get("weights"),
        "dtype": described.get("dtype", asked.dtype),
        "device": device_kind(described.get("device", asked.device)),
        "device_map": described.get("device_map"),
        "precision": described.get("precision"),
        "tolerance": tolerance,
        "tier": record.get("tier"),
        "engine": described.get("engine", asked.engine),
        # `chat_template` (what was given and its SHA-256) where the model renders its prompts
        # with the one given: known once loaded (None before: a template of its own is kept)
        **({"chat_template": None} if asked.chat_template and not described else {}),
        **{k: described[k] for k in LOADED_ONLY if k in described},
    }


def provenance(command: str) -> dict[str, Any]:
    """The manifest's record of what wrote it: the `command` (or call), the package versions
    and the probekit commit."""
    return {"versions": versions(), "commit": commit(), "command": command}


@functools.cache
def versions() -> dict[str, str]:
    """The installed versions of probekit and the libraries its numbers depend on."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


@functools.cache
def commit(package: Path | None = None) -> str:
    """The commit of the probekit source in use: `git rev-parse HEAD` where the package's own
    files are tracked by git (an editable install of a checkout), else "unknown" (a wheel, even
    one inside another repository; no git). Asks git about the package folder only."""
    folder = str(package or Path(probekit.__file__).resolve().parent)
    try:
        tracked = subprocess.run(
            ["git", "-C", folder, "ls-files", "--error-unmatch", "__init__.py"],
            capture_output=True,
        )
        done = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True)
    except OSError:  # no git
        return "unknown"
    head = done.stdout.decode().strip()
    ok = tracked.returncode == done.returncode == 0 and len(head) == 40
    return head if ok else "unknown"


FIRST_MODEL = "kept from the first model of this run"
"""The note of a precision record kept from the first model of a run of several models."""


def settle_run_precision(
    model: Engine,
    probe: Probe,
    folder: Path,
    seed: int = 0,
    items: Sequence[Item] | None = None,
    resumed: bool = True,
    first: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Before a run of `probe` (or of its `items`, a mechanism command's) scores: the precision tier
    of the run being resumed in `folder` (its manifest's `precision`, kept without measuring so that
    its rows are all scored in one tier, where it was chosen by the tolerance `model` was loaded
    with: else this run chooses anew and its manifest's `tolerance` refuses the resume; not where
    the command is not `resumed`), else the tier of `first` (the precision record of the first model
    of a run of several: one arithmetic for the models compared) where this model's device offers
    it, else the tier `model` chooses on the run's numerics sample: `NOISE_SAMPLE` of its prompts,
    seeded by the run's seed. The record, or None where nothing is chosen (an engine without tiers,
    or a tier chosen already)."""
    if "tier" in (model.precision or {}):
        return None  # chosen already
    earlier = (RunDir(folder).read_manifest() or {}).get("precision") if resumed else None
    tolerance = (model.precision or {}).get("tolerance")
    same = isinstance(earlier, dict) and earlier.get("tolerance") == tolerance
    if same and (kept := model.keep_precision(earlier)):
        return kept
    if first and (kept := model.keep_precision(first, FIRST_MODEL)):
        return kept
    pool = list(probe.items()) if items is None else items
    picked = set(random.Random(seed).sample(range(len(pool)), min(NOISE_SAMPLE, len(pool))))
    found = [item for i, item in enumerate(pool) if i in picked]
    prompts = [model.encode(item, probe.as_string).input_ids for item in found]
    return model.settle_precision(probe.answers, prompts, seed)


MODEL_FIELDS = frozenset(f.name for f in fields(ModelOptions))
"""The loading options a study function takes in its `model` (a `ModelOptions`), not as
keywords."""


class Runner:
    """A command: its options (those of the model when `models`, its `own`, a study's) and what
    the command line does with them (`main`)."""

    name: str = ""
    own: type | None = None
    models: bool = True

    def check(self, options: Options, study: Study | None) -> None:
        """The command's checks that span several options (one line each); none by default."""

    def defaults(self, study: Study | None) -> dict[str, Any]:
        """The command's own defaults (e.g. a study's output folder)."""
        return {}

    def elsewhere(self, name: str) -> str | None:
        """Where an option this command does not take belongs, as one line (or None)."""
        return None

    def options(
        self, study: Study | None = None, defaults: Mapping[str, Any] | None = None
    ) -> Command:
        """The command's options on `study` (with other `defaults`, e.g. a script's): the parser
        and keyword checks they generate."""
        groups = [ModelOptions] if self.models else []
        groups += [self.own] if self.own else []
        groups += [study.options] if study is not None else []
        elsewhere = self.elsewhere
        if study is not None:
            elsewhere = functools.partial(other_study_option, study, self.name)

        def check(values: tuple) -> None:
            self.check(self.typed(values, study), study)

        own = {**self.defaults(study), **(defaults or {})}
        return Command(self.name, tuple(groups), own, (check_models, check), elsewhere)

    def typed(self, values: Sequence[Any], study: Study | None) -> Options:
        """The values of `options(study)`, one per group, as `Options`."""
        rest = list(values)
        models: tuple[ModelOptions, ...] = ()
        if self.models:
            first = rest.pop(0)
            models = tuple(first) if isinstance(first, list) else (first,)
        own = rest.pop(0) if self.own else None
        return Options(models, own, rest.pop(0) if study is not None else None)

    def parse(
        self,
        argv: Sequence[str] | None,
        prog: str,
        study: Study | None = None,
        help: str | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> Options:
        """The command line `argv`, read and checked (a refusal is one line naming the flag)."""
        return self.typed(self.options(study, defaults).parse(argv, prog, help), study)

    def build(self, keywords: Mapping[str, Any], where: str, study: Study | None = None) -> Options:
        """The same from a function's keywords (a refusal is one line naming the keyword)."""
        return self.typed(self.options(study).build(keywords, where), study)

    def main(self, options: Options, study: Study | None = None) -> None:
        """What the command line does with the checked options (prints its result)."""
        raise NotImplementedError


@dataclass
class Job:
    """One folder's work on one model: the `study`, the model `asked` for (`given`: loaded
    already), the probe and, for a mechanism command, its items (encoded once the model is
    there), the `folder`, the command as the manifest records it (`call`), its `own` options,
    and `plan`, what the command settled before the model (its own type)."""

    study: Study
    asked: ModelOptions
    probe: Probe
    folder: Path
    call: str
    own: Any = None
    items: list[Item] = field(default_factory=list)
    given: bool = False
    encoded: list[EncodedItem] = field(default_factory=list)
    plan: Any = None


class StudyRunner(Runner):
    """A command on a study: the set-up every one of them shares (see the module). By default a
    mechanism command (patch, capture, steer, lens: the study's items on the hookable engine,
    exact, one folder); `probekit run` has its own `execute`."""

    resumable: bool = True
    """Whether a folder holding this command's run is resumed (checked before any model)."""
    resumes: str | None = "."
    """The folder (in the command's) of the run it resumes, checked before any model (None:
    none)."""
    later: tuple[str, ...] = ("model",)
    """Manifest fields compared once the model is loaded, not before (a mechanism command's
    model as loaded names it; the other settings are said first)."""
    writes: tuple[str, ...] = (MANIFEST, "parts/", "summary.csv", "report.html")
    """What the command writes in its folder (a folder when it ends in "/"), each checked before
    any work (`probekit.core.io.check_outputs`)."""
    refreshed: tuple[str, ...] = ("command", "versions", "commit")
    """Manifest fields that a resumed run records as asked this time."""
    settles: bool = True
    """Whether the command scores (its precision tier is settled before it does)."""
    shows: str | None = ""
    """The files the command line says the command wrote in its folder (None: it says none)."""

    def call(self, function: Any, arguments: Mapping[str, Any]) -> Any:
        """The command's function (`run_study(study, model, **options)`, ...) on its
        `arguments` (its `locals()` before any other line): the options checked as the command
        line checks them (one line naming the keyword), then the command's work. `study` is a
        registered study's name or a `Study` object (used as it is, registered or not); `model`
        a spec, a `ModelOptions` (a spec with its loading options) or an engine loaded
        already."""
        study = arguments["study"]
        if isinstance(study, str):
            study = get_study(study)
        elif not isinstance(study, Study):
            raise ProbekitError(
                f"study must be a Study or a registered study's name, not {study!r}"
            )
        where = f"{function.__name__}({study.name!r})"
        model, extra = arguments["model"], dict(arguments["options"])
        keywords = {k: v for k, v in arguments.items() if k not in ("study", "model", "options")}
        moved = {name: extra.pop(name) for name in list(extra) if name in MODEL_FIELDS}
        engine = None
        if isinstance(model, ModelOptions):
            keywords |= {
                f.name: v for f in fields(model) if (v := getattr(model, f.name)) != f.default
            }
            keywords["model"] = model.model
        elif (engine := loaded_engine(model, **moved)) is None:
            keywords["model"] = model
        if moved and engine is None:  # with a loaded model, only at their defaults (dropped)
            name = next(iter(moved))
            raise ProbekitError(
                f"{where}: {name} is a model option: give model=ModelOptions(..., {name}=...)"
            )
        options = self.build({**keywords, **extra}, where, study)
        return self.finish(study, options, engine, self.recorded(function, arguments))

    def finish(
        self, study: Study, options: Options, engine: Engine | None = None, call: str = ""
    ) -> Any:
        """`execute`, where a write that fails says what is kept and how to finish (a resumable
        command's finished parts and files: the same command again)."""
        try:
            return self.execute(study, options, engine, call)
        except WriteFailed as failed:
            if not self.resumable:
                raise
            raise ProbekitError(
                f"{failed.marked}; what was finished is kept in {options.own.out}: once that is "
                "fixed, run the same command again to finish (nothing finished is redone)"
            ) from None

    def recorded(self, function: Any, arguments: Mapping[str, Any]) -> str:
        """The call as the manifest records it: `probekit.lens_study`."""
        return f"probekit.{function.__name__}"

    def main(self, options: Options, study: Study | None = None) -> None:
        assert study is not None
        start = time.monotonic()
        result = self.finish(study, options, call=f"probekit {self.name}")
        if self.shows is not None:
            print(f"wrote {self.wrote(result)}")
            print(f"wall time {time.monotonic() - start:.0f} s")

    def wrote(self, result: Any) -> str:
        """What `result` wrote, as the command line says it."""
        return f"{result.path}/{self.shows}"

    def manifest(self, job: Job, model: Engine | None) -> dict[str, Any]:
        """The one manifest of `job`, before the model loads (`model` None: the fields only
        loading gives are None) and after, as it reads back from its file (tuples as lists,
        paths as text)."""
        manifest = {**self.fields(job, model), **provenance(job.call)}
        return json.loads(json.dumps(manifest, default=str))

    def check_resume(self, job: Job) -> None:
        """Before any model loads: refuse, in one line naming the setting, a folder holding
        another run than `job` (the fields only loading gives are left for after), and a
        folder where the command cannot write what it `writes`."""
        check_outputs(job.folder, self.writes)
        if self.resumes is None:
            return
        known = self.manifest(job, None)
        unknown = [k for k in LOADED if known.get(k) is None] + list(self.later)
        given = ["tolerance", "engine"] if job.given else []  # a given engine's, known later
        RunDir(job.folder / self.resumes).check_resume(known, unknown + given)

    def load(self, asked: ModelOptions, engine: Engine | None, device: str | None = None) -> Any:
        """The engine of `asked` (`load_engine`), or `engine` as it is."""
        if engine is not None:
            return engine
        return engines.load_engine(asked.model, **asked.load_keywords(device=device))

    def check(self, options: Options, study: Study | None) -> None:
        assert study is not None
        if options.model.engine != "hf":
            engine = options.model.engine
            raise ProbekitError(f"{named('engine')} {engine}: {hooks_unavailable(engine)}")
        study.check(options.study, self.context(options))

    def context(self, options: Options) -> Context:
        """What the study's methods read of the command: its seed, device and limit."""
        own = options.own
        return Context(self.name, own.seed, device=options.model.device, limit=own.limit)

    def prepare(self, job: Job) -> Any:
        """The command's checks that need the items, before any model; its `plan`: by default
        the layers known before the model (None where one counts from the end)."""
        given = job.own.layers
        return sorted(set(given)) if given and min(given) >= 0 else None

    def fields(self, job: Job, model: Engine | None) -> dict[str, Any]:
        """What defines a run of any command (its manifest; `probekit.core.rundir.RECORDED_ONLY`
        says which fields are resume keys): the study, the model, the probe in its exact view
        (`probekit run`: the view asked), the seed, the command's `own_fields` and the prompts
        (their number and their ids' SHA-256, in order)."""
        return {
            "results_format": RESULTS_FORMAT,
            "study": job.study.name,
            **model_fields(job.asked, model, job.given),
            "probe": job.probe.config(),
            "view": VIEWS[0],
            "epsilon": 0.0,
            "seed": job.own.seed,
            **self.own_fields(job, model),
            **prompt_fields(job.items),
            **job.probe.manifest(),
        }

    def own_fields(self, job: Job, model: Engine | None) -> dict[str, Any]:
        """The command's own manifest fields (`model` None: before it loads)."""
        return {}

    def execute(
        self, study: Study, options: Options, engine: Engine | None = None, call: str = ""
    ) -> Any:
        """The command's work on checked `options`, on `engine` or the model they name."""
        asked = given_model(options.model, engine)
        folder = Path(options.own.out)
        stops = stop_on_sigterm(folder) if self.resumable else contextlib.nullcontext()
        with silenced(asked.quiet), stops:
            probe, items = study.mechanism_items(options.study, self.context(options))
            job = Job(study, asked, probe, folder, call, options.own, items, engine is not None)
            job.plan = self.prepare(job)
            self.check_resume(job)
            model = self.load(asked, engine).hookable()
            job.encoded = [model.encode(item, probe.as_string) for item in items]
            if self.settles:
                settle_run_precision(model, probe, job.folder, job.own.seed, items, self.resumable)
            return self.work(job, model, self.manifest(job, model))

    def work(self, job: Job, model: Any, manifest: dict[str, Any]) -> Any:
        """The command's own work and report, once the model is there."""
        raise NotImplementedError


def prompt_fields(items: Sequence[Item]) -> dict[str, Any]:
    """A run's prompts as its manifest records them: their number, their ids' SHA-256 in
    order."""
    ids = "\n".join(item.id for item in items)
    return {"prompt_ids_sha256": hashlib.sha256(ids.encode()).hexdigest(), "prompts": len(items)}


def given_model(asked: ModelOptions, engine: Engine | None) -> ModelOptions:
    """The model options of a command on `engine` (a model loaded already: its own name), else
    `asked`."""
    return asked if engine is None else replace(asked, model=engine.describe()["model"])


@contextmanager
def stop_on_sigterm(out: Path) -> Iterator[None]:
    """While a run goes on, a SIGTERM releases this process's shard locks and ends the run
    with one line saying that the same command resumes it (a ProbekitError: exit status 2)."""

    def stop(signum: int, frame: Any) -> None:
        RunDir.release_all()
        if not Path(out).is_dir():
            raise ProbekitError(
                f"stopped by SIGTERM before {out} was made: run the same command again to start "
                "the run"
            )
        raise ProbekitError(
            f"stopped by SIGTERM; the finished parts are kept in {out}: run the same command "
            "again to resume the run"
        )

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
