"""A study run as one function call: `run_study("isear", limit=4)` does what `probekit run isear
--limit 4` does (data, probes, engine, the resumable run loop, metrics, figures, summary, the
noise figure, the report page) and returns a `Run` to read the results from.

The command line and the API validate options through the same parser: `run_study` turns its
keyword arguments into the command's options (`events=2` -> `--events 2`, `genders=["man",
"woman"]` -> `--genders man,woman`, a switch `authors_input=True` -> `--authors-input`) and
parses them with the command's own `CommandParser`, so a bad value is the same one line either
way, an unknown keyword is one line with a "did you mean", and nothing is written or loaded
before every option has passed. Then both run `run_parsed`.

Before any model loads, each run folder is checked: writable, its manifest readable, this
shard's lock free, and the settings known so far equal to those of the run it holds (the resume
keys of `probekit.core.rundir`). A SIGTERM during the run releases the shard locks and ends the
run with one line saying that the same command resumes it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.options import (
    CommandParser,
    check_out_dir,
    choice,
    non_negative_float,
    non_negative_int,
    options_from_keywords,
    positive_int,
    shard,
)
from probekit.core.rundir import RESULTS_FORMAT, RunDir, device_kind
from probekit.engines.base import DEFAULT_EPSILON
from probekit.engines.options import add_model_options
from probekit.studies.base import OLD_VIEWS, Probe, Say, Study, check_view, get_study

if TYPE_CHECKING:
    from probekit.engines.base import Engine
    from probekit.run.distributed import Launch

PACKAGES = ("probekit", "torch", "transformers", "transformer-lens", "nnsight", "numpy", "pandas")
LOADED = ("weights", "model_source", "dtype", "device", "device_map", "columns", "vllm_parallel")
"""Manifest fields that only the loaded model gives (unless asked for, e.g. `--dtype`)."""


@dataclass
class Run:
    """A finished (or, on a shard that is not last, unfinished) run of a study on one model.

    `path`: its folder; `summary`: its summary rows (`summary.csv`); `manifests`: each probe's
    manifest by folder (relative to `path`; `.` for a single probe); `report`: its page."""

    path: Path
    summary: pd.DataFrame
    manifests: dict[str, dict[str, Any]]
    report: Path | None
    complete: bool = True
    folders: list[Path] = field(default_factory=list)

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


def add_arguments(parser: argparse.ArgumentParser, study: Study) -> None:
    """The options every study's run shares, then the study's own, and `--out`'s check."""
    add_model_options(parser, several=True, hooks=False)
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="score on Ray actors, one engine each: the cluster at ADDRESS (HOST:PORT; with "
        "token authentication also RAY_AUTH_MODE=token), else $RAY_ADDRESS, else the cluster "
        "`ray start` runs here, else a local instance (./setup.sh --ray)",
    )
    parser.add_argument(
        "--ray-actors",
        type=positive_int,
        default=None,
        help="engines on Ray (default: one per GPU of the cluster, else one per node)",
    )
    views = choice("view", (*study.run_views, *OLD_VIEWS))
    parser.add_argument(
        "--view",
        type=views,
        default="exact",
        help=f"{', '.join(study.run_views)} (default exact: the scores from the logits)",
    )
    parser.add_argument("--mode", type=views, dest="mode", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=study.default_out, help="output directory")
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help="sampling of items and statistics"
    )
    parser.add_argument(
        "--shard", type=shard, default="0/1", help="i/n: run every n-th prompt from the i-th"
    )
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        help="only the first N prompts of the run's order (a quick partial run)",
    )
    parser.add_argument(
        "--numerics",
        type=numerics_sample,
        default="auto",
        help="prompts re-scored in float64 for the noise figure: auto (1 per 200 prompts, at "
        "most 8, none below 200), N, or 0 (skip)",
    )
    parser.add_argument("--batch-size", type=positive_int, default=None)
    parser.add_argument(
        "--epsilon",
        type=non_negative_float,
        default=DEFAULT_EPSILON,
        help="pruning bound: every row's error_bound is at most this (0: exact)",
    )
    study.add_options(parser, "run")
    if isinstance(parser, CommandParser):
        parser.add_check(_settle_view)
        parser.add_check(lambda args: check_out_dir(args.out))
        parser.add_check(_ray_without_device_map)


def _ray_without_device_map(args: argparse.Namespace) -> None:
    """Ray's actors load one engine each with --device and --dtype; a device map or vLLM's
    parallel sizes place one model in one process, which they would silently drop."""
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("device_map", "max_memory", "offload_folder", "tensor_parallel_size")
        if getattr(args, name, None) is not None
    ]
    if getattr(args, "ray", None) is not None and given:
        raise ProbekitError(
            f"--ray loads one engine per actor with --device and --dtype only; drop {given[0]} "
            "(a device map places one model in one process: run without --ray)"
        )


def numerics_sample(text: str) -> int | str:
    """`auto` or a count of prompts (0: no noise figure)."""
    return text if text == "auto" else non_negative_int(text)


def _settle_view(args: argparse.Namespace) -> None:
    """`--mode` (the old name of `--view`) and `ev` (the old name of `exact`): one stderr
    line each."""
    if args.mode is not None:
        print("probekit: note: --mode is now --view", file=sys.stderr)
        args.view = args.mode
    if args.view in OLD_VIEWS:
        print(
            f"probekit: note: view '{args.view}' is now '{OLD_VIEWS[args.view]}'", file=sys.stderr
        )
        args.view = OLD_VIEWS[args.view]
    args.mode = args.view  # studies written before the view vocabulary read `args.mode`


def study_parser(study: Study) -> CommandParser:
    """The parser of `probekit run STUDY`: the run's options and the study's."""
    parser = CommandParser(prog=f"probekit run {study.name}", description=study.title)
    add_arguments(parser, study)
    return parser


def run_study(
    study: str | Study,
    model: str | Engine = "default",
    *,
    view: str = "exact",
    out: str | Path | None = None,
    limit: int | None = None,
    numerics: int | str = "auto",
    **options: Any,
) -> Run:
    """Run `study` on `model` as `probekit run` does, and return the `Run`.

    `study`: a registered study's name or a `Study`; `model`: a model spec (hub id, folder,
    .gguf, `default`) or an engine already loaded (not loaded again); `view`: exact, generate
    or explain; `out`: the run's folder (default: the study's); `limit`: only the first N
    prompts; `numerics`: prompts re-scored in float64 for the noise figure (`auto`: 1 per 200
    prompts, at most 8; 0: none). `options`: the run's and the study's options by their Python
    names (`events=2`, `setting="P0S1T0"`, `dtype="bfloat16"`, `epsilon=0`), checked as the
    command line checks them; a bad one is one line of ProbekitError, before anything is
    written."""
    study = get_study(study) if isinstance(study, str) else study
    engine = None if isinstance(model, str | Path) else model
    if view in OLD_VIEWS:
        view = check_view(view, study.run_views)  # the old name: a FutureWarning
    named = {
        "view": view,
        "out": None if out is None else str(out),
        "limit": limit,
        "numerics": numerics,
        **options,
    }
    parser = study_parser(study)
    args = options_from_keywords(parser, {**named, "model": None if engine else str(model)})
    call = ", ".join([repr(study.name), *(f"{k}={v!r}" for k, v in named.items() if v is not None)])
    return run_parsed(study, args, engine=engine, command=f"probekit.run_study({call})")[0]


def run_parsed(
    study: Study,
    args: argparse.Namespace,
    engine: Engine | None = None,
    command: str | None = None,
) -> list[Run]:
    """Run `study` as the parsed options `args` say (each `--model`, or `engine`): one `Run` per
    model (none on a process of a distributed launch that is not the main one)."""
    from probekit.engines import load_engine
    from probekit.engines.options import load_options
    from probekit.reporting import write_pages
    from probekit.run.distributed import detect_launch
    from probekit.run.loop import prepare_run_dir
    from probekit.run.shards import Shard

    if args.engine == "vllm" and engine is None:
        from probekit.engines.vllm import run_in_vllm_env

        run_in_vllm_env(sys.argv)  # vLLM lives in its own environment (./setup.sh --vllm)
    started = time.time()
    launch = detect_launch()
    say: Say = print if launch.is_main else (lambda *a, **k: None)
    command = command or " ".join(sys.argv)
    probes = study.probes(args, say)
    names = [engine.describe()["model"]] if engine is not None else args.model or ["default"]
    shard_ = Shard(*args.shard).split(launch.rank, launch.world)
    out = Path(args.out)
    folders = {name: _model_folder(out, name, len(names)) for name in names}
    for name in names:  # before any model loads: folders, shard locks, parts, resume keys
        for probe in probes:
            where = _probe_folder(folders[name], probe, len(probes))
            prepare_run_dir(where, shard_)
            known = settings(study, probe, name, args, None, command)
            unknown = [k for k in LOADED if known.get(k) is None]
            RunDir(where).check_resume(known, unknown)
    if args.ray is not None:
        from probekit.run.ray import connect

        connect(args.ray or None)  # before any model loads: an unreachable address is one line
    runs: list[Run] = []
    rows: list[dict[str, Any]] = []
    with _stop_on_sigterm(out):
        for name in names:
            options = load_options(args, device=launch.device(args.device))
            model = engine or load_engine(name, engine=args.engine, **options)
            run_rows: list[dict[str, Any]] = []
            manifests: dict[str, dict[str, Any]] = {}
            done = True
            for probe in probes:
                where = _probe_folder(folders[name], probe, len(probes))
                found = _run(study, probe, model, name, where, args, launch, say, command)
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
    figures = ", ".join(sorted(str(p.relative_to(out)) for p in out.rglob("*.png")))
    say(f"\n{summary.markdown}")
    say(
        f"files: {out.resolve()}/ (summary.csv, summary.md, scores.parquet, manifest.json"
        f"{', ' + figures if figures else ''}) — {time.time() - started:.0f} s"
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
    name: str,
    run_dir: Path,
    args: argparse.Namespace,
    launch: Launch,
    say: Say,
    command: str,
) -> tuple[dict[str, Any], list[dict]] | None:
    """One probe on one model: score (this process's shard), merge, and report when complete:
    its manifest and summary rows (None while other shards are missing)."""
    from probekit.run.loop import merge_if_complete, prompt_count, run_probe
    from probekit.run.numerics import record_numerics, settle_run_precision
    from probekit.run.shards import Shard

    total = prompt_count(probe, args.limit)
    part = f" (the first {total} of {len(probe)}: --limit)" if total < len(probe) else ""
    say(f"{probe.name}: {total} prompts{part}, model {name} -> {run_dir}")
    settle_run_precision(model, probe, run_dir, args.seed, args.limit)
    manifest = settings(study, probe, name, args, model.describe(), command)
    shard_ = Shard(*args.shard).split(launch.rank, launch.world)
    run = run_probe
    if args.ray is not None:  # the same run loop's parts, scored by Ray actors
        from probekit.run.ray import runner

        run = runner(name, args.engine, args.ray_actors, args.device, args.dtype)
    scores_path = run(
        probe,
        model,
        run_dir,
        manifest,
        view=args.view,
        shard=shard_,
        batch_size=args.batch_size,
        epsilon=args.epsilon,
        limit=args.limit,
    )
    launch.barrier()
    if launch.is_main and scores_path is None and launch.world > 1:
        scores_path = merge_if_complete(run_dir, total)
    if not launch.is_main:
        return None
    if scores_path is None:
        say(f"{probe.name}: this shard is done; other shards still missing, no summary yet")
        return None
    folder = RunDir(run_dir)
    scores = folder.scores()
    manifest["numerics"] = record_numerics(model, probe, scores, folder, args.numerics)
    study.after_run(probe, model, scores, run_dir, manifest)
    try:
        rows = study.report(scores, run_dir, manifest)
    except ProbekitError as error:
        if total == len(probe):
            raise
        raise ProbekitError(
            f"the first {total} prompts (--limit) are too few for the statistics of "
            f"{study.name} ({error}); their scores are in {scores_path}: give a larger --limit "
            "with another --out, or no --limit"
        ) from None
    return folder.manifest, rows


def settings(
    study: Study,
    probe: Probe,
    name: str,
    args: argparse.Namespace,
    described: dict[str, Any] | None,
    command: str,
) -> dict[str, Any]:
    """What defines a run (its manifest; `probekit.core.rundir.SETTINGS` says which fields are
    resume keys). Before the model loads (`described` None) the fields only the loaded model
    can give are None, the dtype and device those asked for."""
    described = described or {
        "weights": None,
        "model_source": None,
        "dtype": args.dtype,
        "device": args.device,
        "engine": args.engine,
    }
    generating = args.view != "exact"
    return {
        "study": study.name,
        "model": name,
        "model_source": described["model_source"],
        "weights": described["weights"],
        "dtype": described["dtype"],
        "device": device_kind(described.get("device")),
        "device_map": described.get("device_map"),
        "precision": described.get("precision"),
        "engine": described["engine"],
        **({"columns": described["columns"]} if "columns" in described else {}),
        **({"vllm_parallel": described["vllm_parallel"]} if "vllm_parallel" in described else {}),
        "probe": probe.config(),
        "view": args.view,
        "epsilon": args.epsilon,
        "max_new_tokens": probe.max_new_tokens if generating else None,
        "temperature": probe.temperature if generating else None,
        "seed": args.seed,
        "limit": args.limit,
        "prompts": len(probe) if args.limit is None else min(len(probe), args.limit),
        "prompts_total": len(probe),
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
