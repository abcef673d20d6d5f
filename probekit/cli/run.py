"""`probekit run STUDY`: load each model once, run every probe of the study through the run loop
(shards, resumable parts, merge), then write each run's metrics and figures and one summary of
them all (several models: one folder per model, the summary side by side).

Every option is checked while parsing (`add_arguments`), before any data is read, anything is
written or a model is loaded. The model library is imported by `execute` only, so that
`probekit run STUDY --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import time
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
    positive_int,
    shard,
)
from probekit.engines.base import DEFAULT_EPSILON
from probekit.engines.options import add_model_options, load_options
from probekit.studies.base import Probe, Say, Study

if TYPE_CHECKING:
    from probekit.engines.base import Engine
    from probekit.run.distributed import Launch

PACKAGES = ("probekit", "torch", "transformers", "transformer-lens", "nnsight", "numpy", "pandas")


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
    parser.add_argument(
        "--mode",
        type=choice("mode", study.modes),
        default="ev",
        help=f"{' or '.join(study.modes)} (ev: exact, the default)",
    )
    parser.add_argument("--out", default=study.default_out, help="output directory")
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help="sampling of items and statistics"
    )
    parser.add_argument(
        "--shard", type=shard, default="0/1", help="i/n: run every n-th prompt from the i-th"
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


def execute(study: Study, args: argparse.Namespace) -> pd.DataFrame | None:
    """Run `study` as `args` say; return the summary rows (None on a shard that is not last)."""
    from probekit.engines import load_engine
    from probekit.reporting import write_pages
    from probekit.run.distributed import detect_launch
    from probekit.run.loop import Shard, prepare_run_dir

    if args.engine == "vllm":
        from probekit.engines.vllm import run_in_vllm_env

        run_in_vllm_env(sys.argv)  # vLLM lives in its own environment (./setup.sh --vllm)
    started = time.time()
    launch = detect_launch()
    say: Say = print if launch.is_main else (lambda *a, **k: None)
    probes = study.probes(args, say)
    models = args.model or ["default"]
    shard_ = Shard(*args.shard).split(launch.rank, launch.world)
    for name in models:  # before any model loads: manifests, shard locks, truncated parts
        out = Path(args.out) if len(models) == 1 else Path(args.out) / model_folder(name)
        for probe in probes:
            prepare_run_dir(out if len(probes) == 1 else out / probe.subdir, shard_)
    if args.ray is not None:
        from probekit.run.ray import connect

        connect(args.ray or None)  # before any model loads: an unreachable address is one line
    rows: list[dict[str, Any]] = []
    for name in models:
        options = load_options(args, device=launch.device(args.device))
        model = load_engine(name, engine=args.engine, **options)
        out = Path(args.out) if len(models) == 1 else Path(args.out) / model_folder(name)
        for probe in probes:
            run_dir = out if len(probes) == 1 else out / probe.subdir
            rows += _run(study, probe, model, name, run_dir, args, launch, say)
        del model
    if not rows:
        return None
    out = Path(args.out)
    summary = study.write_summary(rows, out)  # with each run's noise figure and signal
    write_pages(out, rows, study)  # report.html in each run folder, and across several in out
    figures = ", ".join(sorted(str(p.relative_to(out)) for p in out.rglob("*.png")))
    say(f"\n{summary.markdown}")
    say(
        f"files: {out.resolve()}/ (summary.csv, summary.md, scores.parquet, manifest.json"
        f"{', ' + figures if figures else ''}) — {time.time() - started:.0f} s"
    )
    return summary.table


def _run(
    study: Study,
    probe: Probe,
    model: Engine,
    name: str,
    run_dir: Path,
    args: argparse.Namespace,
    launch: Launch,
    say: Say,
) -> list[dict]:
    """One probe on one model: score (this process's shard), merge, and report when complete."""
    from probekit.run.loop import Shard, merge_if_complete, run_probe
    from probekit.run.numerics import record_numerics

    say(f"{probe.name}: {len(probe)} prompts, model {name} -> {run_dir}")
    manifest = run_manifest(study, probe, model, name, args)
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
        mode=args.mode,
        shard=shard_,
        batch_size=args.batch_size,
        epsilon=args.epsilon,
    )
    launch.barrier()
    if launch.is_main and scores_path is None and launch.world > 1:
        scores_path = merge_if_complete(run_dir, len(probe))
    if not launch.is_main:
        return []
    if scores_path is None:
        say(f"{probe.name}: this shard is done; other shards still missing, no summary yet")
        return []
    scores = pd.read_parquet(scores_path)
    record_numerics(model, probe, scores, run_dir, manifest)  # manifest["numerics"], rewritten
    study.after_run(probe, model, scores, run_dir, manifest)
    return study.report(scores, run_dir, manifest)


def run_manifest(
    study: Study, probe: Probe, model: Engine, name: str, args: argparse.Namespace
) -> dict[str, Any]:
    """What defines a run (recorded in manifest.json; some fields are resume keys)."""
    described = model.describe()
    generating = args.mode != "ev"
    return {
        "study": study.name,
        "model": name,
        "model_source": described["model_source"],
        "weights": described["weights"],
        "dtype": described["dtype"],
        "engine": described["engine"],
        **({"columns": described["columns"]} if "columns" in described else {}),
        **{k: described[k] for k in ("device_map", "vllm_parallel") if k in described},
        "probe": probe.config(),
        "mode": args.mode,
        "epsilon": args.epsilon,
        "max_new_tokens": probe.max_new_tokens if generating else None,
        "temperature": probe.temperature if generating else None,
        "seed": args.seed,
        **probe.manifest(),
        "versions": _versions(),
        "command": " ".join(sys.argv),
    }


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
