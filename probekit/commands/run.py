"""`probekit run STUDY`: load each model once, run every probe of the study through the run loop
(shards, resumable parts, merge), then write each run's metrics and figures and one summary of
them all (several models: one folder per model, the summary side by side)."""

from __future__ import annotations

import argparse
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.distributed import detect_launch
from probekit.engines.hf.model import load_model
from probekit.engines.hf.scorer import DEFAULT_EPSILON
from probekit.reporting import write_pages
from probekit.run import Shard, merge_if_complete, run_probe
from probekit.studies.base import Study, check_mode

PACKAGES = ("probekit", "torch", "transformers", "transformer-lens", "nnsight", "numpy", "pandas")


def add_arguments(parser: argparse.ArgumentParser, study: Study) -> None:
    """The options every study's run shares, then the study's own."""
    parser.add_argument(
        "--model", action="append", default=None,
        help="hub id, model dir, .gguf or default (the default); repeat it to run several models, "
        "each into OUT/<model name>, summarised side by side (the paper's tables)",
    )  # fmt: skip
    parser.add_argument(
        "--mode", default="ev", help=f"{' or '.join(study.modes)} (ev: exact, the default)"
    )
    parser.add_argument("--out", default=study.default_out, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="sampling of items and statistics")
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th prompt from the i-th")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON, help="pruning bound")
    parser.add_argument("--device", default=None)
    study.add_arguments(parser)


def execute(study: Study, args: argparse.Namespace) -> pd.DataFrame | None:
    """Run `study` as `args` say; return the summary rows (None on a shard that is not last)."""
    check_mode(args.mode, study.modes)
    shard = Shard.parse(args.shard)
    launch = detect_launch()
    shard = shard.split(launch.rank, launch.world)
    say = print if launch.is_main else (lambda *a, **k: None)
    probes = study.probes(args, say)

    started = time.time()
    models = args.model or ["default"]
    rows: list[dict[str, Any]] = []
    for name in models:
        model = load_model(name, device=launch.device(args.device))
        out = Path(args.out) if len(models) == 1 else Path(args.out) / model_folder(name)
        for probe in probes:
            run_dir = out if len(probes) == 1 else out / probe.subdir
            say(f"{probe.name}: {len(probe)} prompts, model {name} -> {run_dir}")
            manifest = {
                "study": study.name,
                "model": name,
                "model_source": model.source,
                "weights": model.weights_fingerprint(),
                "probe": probe.config(),
                "mode": args.mode,
                "epsilon": args.epsilon,
                "max_new_tokens": probe.max_new_tokens if args.mode != "ev" else None,
                "temperature": probe.temperature if args.mode != "ev" else None,
                "seed": args.seed,
                **probe.manifest(),
                "versions": _versions(),
                "command": " ".join(sys.argv),
            }
            scores_path = run_probe(
                probe, model, run_dir, manifest, mode=args.mode, shard=shard,
                batch_size=args.batch_size, epsilon=args.epsilon,
            )  # fmt: skip
            launch.barrier()
            if launch.is_main and scores_path is None and launch.world > 1:
                scores_path = merge_if_complete(run_dir, len(probe))
            if not launch.is_main:
                continue
            if scores_path is None:
                say(f"{probe.name}: this shard is done; other shards still missing, no summary yet")
                continue
            scores = pd.read_parquet(scores_path)
            study.after_run(probe, model, scores, run_dir, manifest)
            rows += study.report(scores, run_dir, manifest)
        del model
    if not rows:
        return None
    out = Path(args.out)
    markdown = study.write_summary(rows, out)
    write_pages(out, rows)  # report.html in each run folder, and across several runs in out
    say("")
    say(markdown)
    figures = ", ".join(sorted(str(p.relative_to(out)) for p in out.rglob("*.png")))
    say(f"files: {out.resolve()}/ (summary.csv, summary.md, scores.parquet, manifest.json"
        f"{', ' + figures if figures else ''}) — {time.time() - started:.0f} s")  # fmt: skip
    return pd.DataFrame(rows)


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
