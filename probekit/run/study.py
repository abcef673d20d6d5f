"""A study run as one function call: `run_study("isear", limit=6)` does what `probekit run isear
--limit 6` does (data, probes, engine, the resumable run loop, metrics, figures, summary, the
noise figure, the report page) and returns a `Run` to read the results from.

The command line and the API read the same declarations (`probekit.run.options.run_command`):
`run_study`'s keywords are the options' fields (`events=2`, `genders=["man", "woman"]`,
`dtype=torch.bfloat16`, `authors_input=True`), checked by the same kinds and checks as `probekit
run`'s flags, so a bad value is the same one line either way (naming the keyword or the flag), an
unknown keyword is one line with a "did you mean", and nothing is written or loaded before every
option has passed. Then both run `run_parsed`.

Before any model loads, each run folder is checked: writable, its manifest readable, this
shard's lock free, and the settings known so far equal to those of the run it holds (the resume
keys of `probekit.core.rundir`). A SIGTERM during the run releases the shard locks and ends the
run with one line saying that the same command resumes it.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.options import declaration, given, named, options_of
from probekit.core.progress import echo, is_quiet, note, silenced
from probekit.core.public import public
from probekit.core.rundir import RESULTS_FORMAT, RunDir, device_kind
from probekit.engines.base import Engine
from probekit.engines.options import ModelOptions
from probekit.reporting.headline import Headline
from probekit.reporting.summary import describe_limit
from probekit.run.options import (
    RunOptions,
    build,
    call_line,
    precision_settings,
    run_command,
    run_context,
)
from probekit.studies.base import Probe, Say, Study

if TYPE_CHECKING:
    from probekit.run.distributed import Launch
    from probekit.run.shards import Shard

PACKAGES = ("probekit", "torch", "transformers", "transformer-lens", "nnsight", "numpy", "pandas")
LOADED = (
    "weights",
    "model_source",
    "dtype",
    "device",
    "device_map",
    "columns",
    "vllm_parallel",
    "tier",
)
"""Manifest fields that only the loaded model gives (unless asked for, e.g. `--dtype`)."""


@public()
@dataclass
class Run:
    """A finished (or, on a shard that is not last, unfinished) run of a study on one model.

    `path`: its folder; `summary`: its summary rows (`summary.csv`); `manifests`: each probe's
    manifest by folder (relative to `path`; `.` for a single probe); `report`: its page;
    `headlines`: the study's headline numbers of its summary (`Study.headlines`), `headline`
    the one that stands for the study."""

    path: Path
    summary: pd.DataFrame
    manifests: dict[str, dict[str, Any]]
    report: Path | None
    complete: bool = True
    folders: list[Path] = field(default_factory=list)
    headlines: list[Headline] = field(default_factory=list)

    @property
    def headline(self) -> Headline:
        """The study's headline in one shape for every study (`probekit.reporting.Headline`):
        `value` in `unit`, its interval `low`, `high`, `p_value`, `meaning`. A run of several
        probes (e.g. `category="all"`) has one each: read `headlines`."""
        primary = [h for h in self.headlines if h.primary] or self.headlines[:1]
        if len(primary) != 1:
            found = f"{len(primary)} headlines" if primary else "no headline"
            raise ProbekitError(f"the run in {self.path} has {found}; read .headlines")
        return primary[0]

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest of a run of one probe (several: see `manifests`)."""
        if len(self.manifests) != 1:
            raise ProbekitError(
                f"the run in {self.path} holds {len(self.manifests)} probes; read .manifests"
            )
        return next(iter(self.manifests.values()))

    @property
    def scores(self) -> pd.DataFrame:
        """Every row of the run (several probes: one after the other, with a column `run`
        naming each one's folder)."""
        if not self.complete:
            raise ProbekitError(f"the run in {self.path} is not finished: other shards are missing")
        frames = [RunDir(folder).scores() for folder in self.folders]
        if len(frames) == 1:
            return frames[0]
        names = [folder.relative_to(self.path).as_posix() for folder in self.folders]
        tagged = [frame.assign(run=name) for frame, name in zip(frames, names, strict=True)]
        return pd.concat(tagged, ignore_index=True)


@public(ModelOptions, RunOptions, command="run", skip=("model",))
def run_study(
    study: str | Study,
    model: str | Path | Engine = "default",
    *,
    dtype: Any = None,
    device: Any = None,
    engine: str = "hf",
    device_map: str | dict[str, Any] | None = None,
    max_memory: str | dict[str, Any] | None = None,
    offload_folder: str | Path | None = None,
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    tolerance: float | None = None,
    quiet: bool = False,
    out: str | Path | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    epsilon: float = 1e-4,
    limit: int | None = None,
    view: str = "exact",
    shard: tuple[int, int] | str = (0, 1),
    numerics: int | str = "auto",
    ray: str | bool | None = None,
    ray_actors: int | None = None,
    **options: Any,
) -> Run:
    """Run `study` on `model` as `probekit run` does, and return the `Run`.

    `study`: a registered study's name or a `Study` object (used as it is, registered or not);
    `model`: a model spec (hub id, folder, .gguf, `default`) or an engine already loaded (not
    loaded again). The keywords are the model's options (`probekit.engines.options.ModelOptions`:
    `dtype=torch.bfloat16`, `device_map={"": "cpu"}`, ...), the run's (`RunOptions`: `out`, the
    study's folder by default; `seed`, the study's; `limit=N`, a smoke run of the whole units of
    every group that fit in N prompts, `Probe.limited`) and, in `options`, the study's own
    (`events=2`, `setting="P0S1T0"`, `genders=["a man", "a woman"]`; `probekit studies`,
    `probekit run STUDY --help`), each checked as the command line checks it: a bad one is one
    line of ProbekitError naming the keyword, before anything is written."""
    arguments = dict(locals())
    found, loaded, parsed = build(run_command, arguments)
    return run_parsed(found, parsed, loaded, call_line(run_study, arguments))[0]


def run_parsed(
    study: Study,
    parsed: tuple[list[ModelOptions], RunOptions, Any],
    engine: Engine | None = None,
    command: str | None = None,
) -> list[Run]:
    """Run `study` as its checked options say (`run_command`'s values: the models, the run's
    options, the study's own), on each model or on `engine`: one `Run` per model (none on a
    process of a distributed launch that is not the main one)."""
    from probekit.engines import load_engine, run_in_engine_env
    from probekit.reporting import write_pages
    from probekit.run.distributed import detect_launch
    from probekit.run.loop import prepare_run_dir
    from probekit.run.shards import Shard

    models, options, own = parsed
    if engine is None:
        run_in_engine_env(models[0].engine, sys.argv)  # vLLM's (./setup.sh --vllm)
    started = time.time()
    launch = detect_launch()
    say: Say = echo if launch.is_main else (lambda *a, **k: None)
    command = command or " ".join(sys.argv)
    probes = study.probes(own, run_context(options, models[0], say))
    if options.limit is not None:  # whole units of every group, or one line before any work
        probes = [probe.limited(options.limit) for probe in probes]
    for probe in probes:
        probe.refuse_too_few_units(probe.items())
    if engine is not None:
        models = [replace(models[0], model=engine.describe()["model"])]
    names = [model.model for model in models]
    shard_ = Shard(*options.shard).split(launch.rank, launch.world)
    out = Path(options.out)
    folders = {name: _model_folder(out, name, len(names)) for name in names}
    for model in models:  # before any model loads: folders, shard locks, parts, resume keys
        for probe in probes:
            where = _probe_folder(folders[model.model], probe, len(probes))
            prepare_run_dir(where, shard_)
            known = settings(study, probe, model, options, None, command, engine is None)
            unknown = [k for k in LOADED if known.get(k) is None]
            unknown += [] if engine is None else ["tolerance"]  # a loaded model's own
            RunDir(where).check_resume(known, unknown)
    if options.ray is not None:
        from probekit.run.ray import connect

        connect(options.ray or None)  # before any model loads: an unreachable address is one line
    runs: list[Run] = []
    rows: list[dict[str, Any]] = []
    with _stop_on_sigterm(out), silenced(models[0].quiet):
        for asked in models:
            name = asked.model
            device = launch.device(asked.device)
            model = engine or load_engine(name, **asked.load_keywords(device=device))
            if len(probes) > 1 and launch.is_main and not is_quiet():  # before any work
                note(_forecast(study, probes, model, options, shard_, folders[name], name))
            run_rows: list[dict[str, Any]] = []
            manifests: dict[str, dict[str, Any]] = {}
            done = True
            for probe in probes:
                where = _probe_folder(folders[name], probe, len(probes))
                found = _run(study, probe, model, asked, where, options, launch, say, command)
                done &= found is not None
                if found is not None:
                    manifests[where.relative_to(folders[name]).as_posix()] = found[0]
                    run_rows += found[1]
            if engine is None:
                del model
            rows += run_rows
            folders_of = [_probe_folder(folders[name], p, len(probes)) for p in probes]
            summary = pd.DataFrame(run_rows)
            runs.append(Run(folders[name], summary, manifests, None, done, folders_of))
    if not launch.is_main:
        return []
    if not rows:
        return runs
    summary = study.write_summary(rows, out)  # with each run's noise, signal and limit
    page = write_pages(out, rows, study)  # report.html in each run folder, and across several
    for run in runs:
        run.report = page if run.path == out else run.path / "report.html"
        if run.path == out:
            run.summary = summary.table
        manifest = next(iter(run.manifests.values()), {})
        run.headlines = study.headlines(run.summary, manifest) if len(run.summary) else []
    figures = ", ".join(sorted(str(p.relative_to(out)) for p in out.rglob("*.png")))
    say(f"\n{summary.markdown}")
    say(
        f"files: {out.resolve()}/ (report.html, summary.csv, summary.md, scores.parquet, "
        f"manifest.json{', ' + figures if figures else ''}) — {time.time() - started:.0f} s"
    )
    return runs


def _model_folder(out: Path, name: str, models: int) -> Path:
    return out if models == 1 else out / model_folder(name)


def _probe_folder(folder: Path, probe: Probe, probes: int) -> Path:
    return folder if probes == 1 else folder / probe.subdir


def _run(
    study: Study,
    probe: Probe,
    model: Engine,
    asked: ModelOptions,
    run_dir: Path,
    options: RunOptions,
    launch: Launch,
    say: Say,
    command: str,
) -> tuple[dict[str, Any], list[dict]] | None:
    """One probe on one model: score (this process's shard), merge, and report when complete:
    its manifest and summary rows (None while other shards are missing)."""
    from probekit.run.loop import run_probe
    from probekit.run.numerics import record_numerics, settle_run_precision
    from probekit.run.parts import merge_if_complete
    from probekit.run.scoring import EnginePool
    from probekit.run.shards import Shard

    settle_run_precision(model, probe, run_dir, options.seed)
    manifest = settings(study, probe, asked, options, model.describe(), command)
    partial = describe_limit(manifest)
    if partial is not None:
        say(partial)
    shard_ = Shard(*options.shard).split(launch.rank, launch.world)
    scorer: Engine | EnginePool = model
    if options.ray is not None:  # the same run loop's parts, scored by Ray actors
        from probekit.run.ray import run_pool

        scorer = run_pool(asked, manifest, options.ray_actors)
    scores_path = run_probe(
        probe,
        scorer,
        run_dir,
        manifest,
        view=options.view,
        shard=shard_,
        batch_size=options.batch_size,
        epsilon=options.epsilon,
        limit=options.limit,
        hint=smaller(study),
    )
    launch.barrier()
    if launch.is_main and scores_path is None and launch.world > 1:
        scores_path = merge_if_complete(run_dir, len(probe))
    if not launch.is_main:
        return None
    if scores_path is None:
        say(f"{probe.name}: this shard is done; other shards still missing, no summary yet")
        return None
    folder = RunDir(run_dir)
    scores = folder.scores()
    manifest["numerics"] = record_numerics(model, probe, scores, folder, options.numerics)
    study.after_run(probe, model, scores, run_dir, manifest)
    rows = study.summary_rows(scores, run_dir, manifest)
    return folder.manifest, rows


def _forecast(
    study: Study,
    probes: list[Probe],
    model: Engine,
    options: RunOptions,
    shard: Shard,
    folder: Path,
    name: str,
) -> str:
    """The first line of a run of several probes: how many prompts it holds and how long they
    will take on this device (`probekit.run.scoring.forecast_runs`), in the precision tier the
    run will score in (chosen first: it decides the pace)."""
    from probekit.run.numerics import settle_run_precision
    from probekit.run.scoring import forecast_runs

    settle_run_precision(
        model, probes[0], _probe_folder(folder, probes[0], len(probes)), options.seed
    )
    held = forecast_runs(
        probes,
        model,
        options.view,
        shard,
        epsilon=options.epsilon,
        batch_size=options.batch_size,
        seed=options.seed,
    )
    return f"{study.name}: {held}, model {name} -> {folder}"


def smaller(study: Study) -> str:
    """How to make a run of `study` smaller, said with the estimate before it scores."""
    name = f"{study.unit_name}s"
    fields = options_of(study.options)
    takes = any(f.name == name and declaration(f).takes("run") for f in fields)
    limit = given("limit", "N", placeholder=True)
    return f"fewer {named(name)}, or {limit}" if takes else limit


def settings(
    study: Study,
    probe: Probe,
    asked: ModelOptions,
    options: RunOptions,
    described: dict[str, Any] | None,
    command: str,
    asked_for: bool = True,
) -> dict[str, Any]:
    """What defines a run (its manifest; `probekit.core.rundir.MANIFEST_FIELDS` says which fields
    are resume keys). Before the model loads (`described` None) the fields only the loaded model
    can give are None, the dtype, device and tolerance those asked for (`asked_for`; False: a
    model loaded already, whose tolerance is its own)."""
    arithmetic = precision_settings(asked if asked_for else None, described)
    described = described or {
        "weights": None,
        "model_source": None,
        "dtype": asked.dtype,
        "device": asked.device,
        "engine": asked.engine,
    }
    generating = options.view != "exact"
    return {
        "study": study.name,
        "model": asked.model,
        "model_source": described["model_source"],
        "weights": described["weights"],
        "dtype": described["dtype"],
        "device": device_kind(described.get("device")),
        "device_map": described.get("device_map"),
        "precision": described.get("precision"),
        **arithmetic,
        "engine": described["engine"],
        **({"columns": described["columns"]} if "columns" in described else {}),
        **({"vllm_parallel": described["vllm_parallel"]} if "vllm_parallel" in described else {}),
        "probe": probe.config(),
        "view": options.view,
        "epsilon": options.epsilon,
        "max_new_tokens": probe.max_new_tokens if generating else None,
        "temperature": probe.temperature if generating else None,
        "seed": options.seed,
        "limit": options.limit,
        "prompts": len(probe) if options.limit is None else min(len(probe), options.limit),
        "prompts_total": len(probe.whole),
        "results_format": RESULTS_FORMAT,
        **probe.manifest(),
        "versions": _versions(),
        "command": command,
    }


@contextmanager
def _stop_on_sigterm(out: Path) -> Iterator[None]:
    """While the run goes on, a SIGTERM releases this process's shard locks and ends the run
    with one line saying how to resume it (a ProbekitError: exit status 2)."""

    def stop(signum: int, frame: Any) -> None:
        RunDir.release_all()
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


def model_folder(name: str) -> str:
    """A folder name for a model: the last part of its id or path (`org/Model-7B` -> Model-7B)."""
    return Path(name.rstrip("/")).name.removesuffix(".gguf") or "model"


def _versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found
