"""`probekit run STUDY` and `run_study("isear", limit=6)`, one command (`RUN`): data, probes,
engine, the resumable run loop, metrics, figures, summary, the noise figure, the report page;
the function returns a `Run` to read the results from.

Its options are `RunOptions` with the model's (`--model` may be repeated: one folder per model,
the summaries side by side) and the study's, checked before any data is read, anything written
or a model loaded (`probekit.run.command`). Then each run folder is checked before any model
loads: writable, its manifest readable, this shard's lock free, and the settings known so far
equal to those of the run it holds (the resume keys of `probekit.core.rundir`). A SIGTERM
during the run releases the shard locks and ends the run with one line saying that the same
command resumes it.

Every run states its arithmetic and its numeric noise: the precision tier it scores in, chosen
before scoring by the error it was measured to cause (`probekit.run.command.settle_run_precision`,
manifest field `precision`), and how far a seeded sample of its prompts moves when scored again
in a wider dtype (`record_numerics`, manifest field `numerics`; the engine measures it,
`Engine.noise_figure`). `Study.write_summary` adds one line per run to `summary.md`.
"""

from __future__ import annotations

import functools
import inspect
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.options import declaration, given, named, options_of
from probekit.core.progress import duration, echo, is_quiet, note, silenced
from probekit.core.public import public
from probekit.core.rundir import SCORES, RunDir
from probekit.engines import run_in_engine_env
from probekit.engines.base import Engine, ScoreResult
from probekit.engines.options import NOISE_SAMPLE, ModelOptions
from probekit.reporting.headline import Headline
from probekit.reporting.summary import describe_limit
from probekit.run.command import (
    Job,
    Options,
    StudyRunner,
    given_model,
    settle_run_precision,
    stop_on_sigterm,
)
from probekit.run.loop import RunOptions, Shard, prepare_run_dir, run_probe
from probekit.run.parts import merge_if_complete
from probekit.run.ray import RayPool, connect, load_in_tier
from probekit.run.report import report_files, write_record
from probekit.run.scoring import SAMPLE_PROMPTS, EnginePool, Pace, local_scoring
from probekit.studies.base import Context, Probe, Say, Study


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


@public(RunOptions, command="run")
def run_study(
    study: str | Study,
    model: str | Path | Engine | ModelOptions = "default",
    *,
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
    `model`: a model spec (hub id, folder, .gguf, `default`), a `probekit.ModelOptions` (the spec
    with its loading options: `ModelOptions("default", dtype=torch.bfloat16)`) or an engine already
    loaded (not loaded again). The keywords are `quiet`, the run's (`RunOptions`: `out`, the study's
    folder by default; `seed`, the study's; `limit=N`, a smoke run of the whole units of every group
    that fit in N prompts, `Probe.limited`) and, in `options`, the study's own (`events=2`,
    `setting="P0S1T0"`, `genders=["a man", "a woman"]`; `probekit studies`, `probekit run STUDY
    --help`), each checked as the command line checks it: a bad one is one line of ProbekitError
    naming the keyword, before anything is written."""
    return RUN.call(run_study, dict(locals()))[0]


class RunCommand(StudyRunner):
    """`probekit run STUDY`: every probe of the study on each model, in one folder each."""

    name, own, later = "run", RunOptions, ()
    writes = (*StudyRunner.writes, SCORES, "summary.md")

    def defaults(self, study: Study | None) -> dict[str, Any]:
        assert study is not None
        return {"out": study.default_out, "seed": study.default_seed}

    def check(self, options: Options, study: Study | None) -> None:
        assert study is not None
        run = options.own
        if run.view not in study.run_views:
            choices = ", ".join(study.run_views)
            raise ProbekitError(
                f"{named('view')}: unknown view '{run.view}'; choose one of {choices}"
            )
        placed = [name for model in options.models for name in model.placed]
        if run.ray is not None and placed:  # Ray's actors load one engine each
            raise ProbekitError(
                f"{named('ray')} loads one engine per actor with {named('device')} and "
                f"{named('dtype')} only; drop {named(placed[0])} (a device map places one model "
                f"in one process: run without {named('ray')})"
            )
        study.check(options.study, self.context(options))

    def context(self, options: Options, say: Say = echo) -> Context:
        """What the study's methods read of a run: its seed, view and device."""
        run = options.own
        return Context("run", run.seed, run.view, options.model.device, say)

    def recorded(self, function: Any, arguments: Mapping[str, Any]) -> str:
        """The call as the run records it (`probekit.run_study('isear', limit=6)`): the study,
        each keyword not at its default and the study's options."""
        defaults = {n: p.default for n, p in inspect.signature(function).parameters.items()}
        keywords = {
            k: v for k, v in arguments.items() if k not in ("study", "options") and v != defaults[k]
        }
        shown = [repr(getattr(arguments["study"], "name", arguments["study"]))]
        shown += [f"{k}={v!r}" for k, v in {**keywords, **arguments["options"]}.items()]
        return f"probekit.{function.__name__}({', '.join(shown)})"

    def main(self, options: Options, study: Study | None = None) -> None:
        assert study is not None
        self.finish(study, options, call=" ".join(sys.argv))

    def own_fields(self, job: Job, model: Engine | None) -> dict[str, Any]:
        """A run's own manifest fields: its view and ε, the generation budget of a generating
        view, its limit, the prompts in the study's configuration and an interval note."""
        run, probe = job.own, job.probe
        generating = run.view != "exact"
        return {
            "view": run.view,
            "epsilon": run.epsilon,
            "max_new_tokens": probe.max_new_tokens if generating else None,
            "temperature": probe.temperature if generating else None,
            "limit": run.limit,
            "prompts_total": len(probe.whole),
            **probe.interval_fields(job.items),
        }

    def execute(
        self, study: Study, options: Options, engine: Engine | None = None, call: str = ""
    ) -> list[Run]:
        """Run `study` as its checked `options` say, on each model or on `engine`: one `Run`
        per model (none on a process of a distributed launch that is not the main one)."""
        from probekit.reporting import write_pages

        run = options.own
        if engine is None:
            run_in_engine_env(options.model.engine, sys.argv)  # vLLM's (./setup.sh --vllm)
        started = time.time()
        launch = detect_launch()
        say: Say = echo if launch.is_main else (lambda *a, **k: None)
        probes = study.probes(options.study, self.context(options, say))
        if run.limit is not None:  # whole units of every group, or one line before any work
            probes = [probe.limited(run.limit) for probe in probes]
        models = [given_model(options.model, engine)] if engine else list(options.models)
        shard = Shard(*run.shard).split(launch.rank, launch.world)
        out = Path(run.out)  # a folder per model when several, in it a folder per probe
        tops = {m.model: out if len(models) == 1 else out / model_folder(m.model) for m in models}
        subdirs = [probe.subdir if len(probes) > 1 else "" for probe in probes]
        prompts = [list(probe.items()) for probe in probes]
        jobs = [
            Job(study, m, probe, tops[m.model] / subdir, call, run, items, engine is not None)
            for m in models
            for probe, items, subdir in zip(probes, prompts, subdirs, strict=True)
        ]
        for job in jobs:  # before any model loads
            prepare_run_dir(job.folder, shard)
            self.check_resume(job)
        if run.ray is not None:
            connect(run.ray or None)  # before any model loads: an unreachable address is one line
        runs: list[Run] = []
        rows: list[dict[str, Any]] = []
        first: dict[str, Any] | None = None  # the first model's tier, kept by the others
        with stop_on_sigterm(out), silenced(options.model.quiet):
            for asked in models:
                model = self.load(asked, engine, asked.device or launch.device)
                found = [job for job in jobs if job.asked is asked]
                top = tops[asked.model]
                if len(probes) > 1 and launch.is_main and not is_quiet():  # before any work
                    # in the tier the run scores in (chosen first, or `first`'s kept): its pace
                    settle_run_precision(model, probes[0], found[0].folder, run.seed, first=first)
                    settings = {"epsilon": run.epsilon, "batch_size": run.batch_size}
                    held = forecast_runs(probes, model, run.view, shard, seed=run.seed, **settings)
                    note(f"{study.name}: {held}, model {asked.model} -> {top}")
                manifests: dict[str, dict[str, Any]] = {}
                model_rows: list[dict[str, Any]] = []
                for job in found:
                    done = self.run_probe(job, model, shard, launch, say, first)
                    if done is not None:
                        manifests[job.folder.relative_to(top).as_posix()] = done[0]
                        model_rows += done[1]
                first = first or model.precision
                del model  # before the next one loads
                rows += model_rows
                complete, paths = len(manifests) == len(found), [job.folder for job in found]
                runs.append(Run(top, pd.DataFrame(model_rows), manifests, None, complete, paths))
        if not launch.is_main:
            return []
        if not rows:
            return runs
        summary = study.write_summary(rows, out)  # with each run's noise, signal and limit
        page = write_pages(out, rows, study)  # report.html in each run folder, and across several
        if RunDir(out).read_manifest() is None:  # several runs: the record of what `out` holds
            write_record(out, [path for run in runs for path in run.folders], report_files(out))
        for found_run in runs:
            found_run.report = page if found_run.path == out else found_run.path / "report.html"
            if found_run.path == out:
                found_run.summary = summary.table
            manifest = next(iter(found_run.manifests.values()), {})
            if len(found_run.summary):
                found_run.headlines = study.headlines(found_run.summary, manifest)
        figures = ", ".join(sorted(str(p.relative_to(out)) for p in out.rglob("*.png")))
        say(f"\n{summary.markdown}")
        say(
            f"files: {out.resolve()}/ (report.html, summary.csv, summary.md, scores.parquet, "
            f"manifest.json{', ' + figures if figures else ''}) — {time.time() - started:.0f} s"
        )
        return runs

    def run_probe(
        self,
        job: Job,
        model: Engine,
        shard: Any,
        launch: Any,
        say: Say,
        first: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], list[dict]] | None:
        """One probe on one model, in the tier of `first` (the precision record of the run's
        first model) where its device offers it: score (this process's shard), merge, and
        report when complete: its manifest and summary rows (None while other shards are
        missing)."""
        run = job.own
        settle_run_precision(model, job.probe, job.folder, run.seed, first=first)
        manifest = self.manifest(job, model)
        if (partial := describe_limit(manifest)) is not None:
            say(partial)
        scorer: Engine | EnginePool = model
        if run.ray is not None:  # the same run loop's parts, scored by Ray actors
            asked, tier = job.asked, manifest.get("precision") or {}  # the tier chosen here
            load = (asked.model, asked.engine, asked.device, asked.dtype, tier)
            scorer = RayPool(functools.partial(load_in_tier, *load), run.ray_actors)
        scores_path = run_probe(
            job.probe,
            scorer,
            job.folder,
            manifest,
            view=run.view,
            shard=shard,
            batch_size=run.batch_size,
            epsilon=run.epsilon,
            limit=run.limit,
            hint=smaller(job.study),
        )
        launch.barrier()
        if launch.is_main and scores_path is None and launch.world > 1:
            scores_path = merge_if_complete(job.folder, len(job.probe))
        if not launch.is_main:
            return None
        if scores_path is None:
            say(f"{job.probe.name}: this shard is done; other shards still missing, no summary yet")
            return None
        folder = RunDir(job.folder)
        scores = folder.scores()
        manifest["numerics"] = record_numerics(model, job.probe, scores, folder, run.numerics)
        job.study.after_run(job.probe, model, scores, job.folder, manifest)
        rows = job.study.summary_rows(scores, job.folder, manifest)  # names its figures' data
        return folder.manifest, rows


RUN = RunCommand()


@dataclass(frozen=True)
class Launch:
    """Process layout under `torchrun` / `accelerate launch`: rank, world size, the device of
    this process (one GPU per local process when launched on GPUs, else None: what was asked),
    barrier."""

    rank: int = 0
    world: int = 1
    device: str | None = None
    barrier: Callable[[], None] = lambda: None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def detect_launch() -> Launch:
    """A distributed launch sets WORLD_SIZE; accelerate's PartialState then joins the process
    group (NCCL on GPUs, gloo on CPU) so that processes can wait for each other."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Launch()
    import torch
    from accelerate import PartialState

    gpus = torch.cuda.is_available()
    state = PartialState(cpu=not gpus)
    if state.device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    device = f"cuda:{state.local_process_index}" if gpus else None
    return Launch(state.process_index, state.num_processes, device, state.wait_for_everyone)


PROMPTS_PER_SAMPLE = 200
"""A run's prompts per prompt of its noise figure's sample (`sample_size`), at most
`NOISE_SAMPLE` (8), none below 200 prompts. Measured here (intergroup P0S1T0, one event per
emotion: 432 prompts in 590 s on a busy 2-core CPU), 4 prompts took 21 s and 8 took 33 s: about
9 s to widen the weights plus 3 s a prompt, so this run's 2 prompts cost about 15 s (2.5 %),
where a fixed sample of 8 cost 5.6 % (and 33-54 % of runs of a few dozen prompts). At 200
prompts one prompt is under 5 %; below that even one would be more, so the figure is skipped
and the manifest says so (`numerics=N` measures N prompts anyway; `numerics=0` always
skips)."""


def sample_size(prompts: int, requested: int | str = "auto") -> int:
    """Prompts to re-score for the noise figure of a run of `prompts`: `requested` (at most
    all of them), or for `auto` one per `PROMPTS_PER_SAMPLE`, at most `NOISE_SAMPLE`."""
    if requested == "auto":
        return min(NOISE_SAMPLE, prompts // PROMPTS_PER_SAMPLE)
    return min(int(requested), prompts)


def record_numerics(
    model: Engine, probe: Probe, scores: pd.DataFrame, folder: RunDir, sample: int | str = "auto"
) -> dict[str, Any]:
    """Measure the run's noise figure on `sample_size` of its prompts (seeded by the run's
    seed), store it in the manifest of the run in `folder` (field `numerics`) and return it.

    The sample's rows are compared with the same prompts (in explain mode with their
    explanation and answer cue) scored again in a wider dtype at the run's epsilon
    (`Engine.noise_figure`, which says why where it gives none); a sample of 0 prompts records
    the dtype and why."""
    manifest = folder.manifest
    count = sample_size(len(scores), sample)
    if count == 0:
        why = "skipped (numerics=0)" if sample != "auto" else "skipped: under 200 prompts"
        figure: dict[str, Any] = {"dtype": str(model.describe().get("dtype")), "note": why}
    else:
        seed = manifest.get("seed", 0)
        indices = sorted(int(i) for i in scores["prompt_index"])
        picked = sorted(random.Random(seed).sample(indices, min(count, len(indices))))
        rows = scores.set_index("prompt_index").loc[picked]
        wanted = set(picked)
        items = [item for i, item in enumerate(probe.items()) if i in wanted]  # in order
        if "explanation" in rows:  # explain mode: the prompt the answer was read after
            cue = getattr(probe, "answer_cue", "")
            items = [
                replace(item, prefill=item.prefill + text + cue)
                for item, text in zip(items, rows["explanation"], strict=True)
            ]
        prompts = [model.encode(item, probe.as_string).input_ids for item in items]
        own = [ScoreResult.from_row(row, probe.answers) for row in rows.to_dict("records")]
        epsilon = float(manifest.get("epsilon", 0.0))
        figure = model.noise_figure(prompts, probe.answers, seed=seed, epsilon=epsilon, own=own)
    folder.update_manifest(numerics=figure)
    return figure


def forecast_runs(
    probes: Sequence[Probe], model: Engine, view: str, shard: Shard, **settings: Any
) -> str:
    """How many prompts the runs of `probes` (this `shard` of each) hold and how long they will
    take on this device, in one phrase: each probe at the pace `Scoring.expected_pace`
    gives for its answer set (measured once per answer set where none is recorded); `settings`:
    the scorer's, as `local_scoring` takes them."""
    paces: dict[AnswerSet, Pace] = {}
    prompts, seconds = 0, 0.0
    for probe in probes:
        count = int(shard.mask(len(probe)).sum())
        if probe.answers not in paces:
            scoring = local_scoring(probe, model, view, **settings)
            size = scoring.batch_size or SAMPLE_PROMPTS
            first = list(islice(enumerate(probe.items()), max(1, size)))
            paces[probe.answers] = scoring.expected_pace(first)
        prompts += count
        seconds += paces[probe.answers].seconds(count)
    sources = sorted({pace.source for pace in paces.values()})
    return (
        f"{prompts} prompts in {len(probes)} runs, about {duration(seconds)} on this device "
        f"(at the pace {'; '.join(sources)})"
    )


def smaller(study: Study) -> str:
    """How to make a run of `study` smaller, said with the estimate before it scores."""
    name = f"{study.unit_name}s"
    fields = options_of(study.options)
    takes = any(f.name == name and declaration(f).takes("run") for f in fields)
    limit = given("limit", "N", placeholder=True)
    return f"fewer {named(name)}, or {limit}" if takes else limit


def model_folder(name: str) -> str:
    """A folder name for a model: the last part of its id or path (`org/Model-7B` -> Model-7B)."""
    return Path(name.rstrip("/")).name.removesuffix(".gguf") or "model"
