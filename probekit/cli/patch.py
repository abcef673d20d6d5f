"""`probekit patch STUDY`: trace a study's behavioural gap inside the model (patching,
attribution, mediation and the study's direction; see probekit.mechanism.pipeline)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.cli.main import study_parser
from probekit.core.errors import ProbekitError
from probekit.core.options import comma_list, int_list, options_from_keywords
from probekit.core.progress import silenced
from probekit.engines.hf.model import load_model
from probekit.engines.options import add_model_options, load_options
from probekit.mechanism.api import hookable
from probekit.mechanism.pipeline import (
    DEFAULT_LAYERS,
    METHODS,
    PatchRequest,
    check_patch,
    run_patch,
)
from probekit.mechanism.sites import DEFAULT_SITES, HEAD_SITE, HOOK_LIBRARIES, library
from probekit.studies.base import Study


def add_arguments(parser: argparse.ArgumentParser, study: Study) -> None:
    defaults = study.mechanism_defaults()
    spans = ",".join(defaults.spans) if defaults.spans else "every span"
    add = parser.add_argument
    add("--out", default="runs/patch", help="output folder")
    add_model_options(parser)
    add("--seed", type=int, default=0, help="items and the random control")
    add("--pairs", type=int, default=1, help="pairs per unit, largest gap first")
    add(
        "--layers",
        type=int_list,
        help=f"comma-separated layers, -1 the last (default: {DEFAULT_LAYERS} evenly spaced)",
    )
    add(
        "--sites",
        type=comma_list,
        default=list(DEFAULT_SITES),
        help=f"comma-separated TransformerLens sites (short forms such as resid_pre accepted); "
        f"{HEAD_SITE} patches each attention head",
    )
    add("--heads", type=int_list, help=f"heads at {HEAD_SITE} (default: every head)")
    add(
        "--method",
        default="exact",
        choices=METHODS,
        help="exact patching, attribution estimates, or both for the --top-k estimated",
    )
    add("--top-k", type=int, default=20, help="components re-measured by attribution+verify")
    add(
        "--mediation",
        action="store_true",
        help="also the direct effect of each exactly measured component (one more sweep)",
    )
    add("--bootstrap", type=int, default=1000, help="resamples of the pairs for the intervals")
    add(
        "--spans",
        type=comma_list,
        help="span names, from_<span> (everything from the span to the end), <span>@<i> (the "
        f"i-th of its positions; -1 the last); default: {spans}",
    )
    add(
        "--positions",
        action="store_true",
        help="patch each position of each span on its own (span@-k ... span@-1, aligned at the "
        "span's end; a layer x position heatmap per site)",
    )
    add(
        "--readout",
        help="the per-prompt readout (TransformerLens's patching metric): expected, p:<answer>, "
        "p_correct, a difference 'X - Y', or tv (overlap 1 - TV with the pair's clean "
        f"distribution; --method exact only); default: {defaults.readout_help()}",
    )
    add("--metric", dest="readout", action=Renamed, new="--readout", help=argparse.SUPPRESS)
    add(
        "--prompt-only",
        action="store_true",
        help="patch prompt positions only (by default a span that runs to the end, such as "
        "from_<span>, also patches every answer position; nnsight patches the prompt only)",
    )
    add_hooks_option(parser)
    add("--batch-size", type=int, help="prompts per forward pass")
    add("--control", action="store_true", help="also project out a random direction (slower)")
    add("--skip-direction", action="store_true", help="patching (and mediation) only")
    study.add_options(parser, "patch")  # the study's options


def add_hooks_option(parser: argparse.ArgumentParser) -> None:
    """`--hooks`, the hook library (shared with `probekit capture`; `--backend` is its old
    name)."""
    parser.add_argument(
        "--hooks",
        dest="hooks",
        type=_library,
        default="transformer_lens",
        help=f"hook library that reads and writes activations: {' or '.join(HOOK_LIBRARIES)}",
    )
    parser.add_argument(
        "--backend",
        dest="hooks",
        type=_library,
        action=Renamed,
        new="--hooks",
        help=argparse.SUPPRESS,
    )


class Renamed(argparse.Action):
    """An option's old name: it sets the new option, with one line on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"probekit: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _library(name: str) -> str:
    try:
        return library(name)
    except ProbekitError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@dataclass(frozen=True)
class StudyPatch:
    """What `patch_study` wrote: the folder, the files, the patching table (one row per pair x
    component) and its summary (per component over the pairs: effect, recovery with intervals)."""

    path: Path
    files: list[str]
    table: pd.DataFrame
    summary: pd.DataFrame


def patch_study(
    study: str | Study, model: Any = "default", *, out: str | Path | None = None, **options: Any
) -> StudyPatch:
    """`probekit patch STUDY` as a function: the study's options as keywords (`layers=[0, 14]`,
    `sites=["resid_pre"]`, `readout="expected"`, `prompt_only=True`, `pairs=2`, `limit`-like
    study options such as `events=2`...), validated by the command line's own option types (a
    bad or unknown one is one line of `ProbekitError`, before any model work). `model` is a
    model spec or an already loaded model. Writes what the command writes into `out` (default
    `runs/patch`) and returns it."""
    parser, found = _parser(study)
    spec = model if isinstance(model, str) else None
    args = options_from_keywords(parser, {"out": out, "model": spec, **options})
    written = _patch(found, args, None if isinstance(model, str) else model)
    folder = Path(args.out)
    summary = pd.read_csv(folder / "patching_summary.csv")
    return StudyPatch(folder, written, pd.read_parquet(folder / "patching.parquet"), summary)


def _parser(study: str | Study) -> tuple[argparse.ArgumentParser, Study]:
    """The parser of `probekit patch STUDY`, and the study."""
    return study_parser("patch", study if isinstance(study, str) else study.name)


def execute(study: Study, args: argparse.Namespace) -> None:
    start = time.monotonic()
    written = _patch(study, args, None)
    print(f"wrote {args.out}/{', '.join(written)}")
    print(f"wall time {time.monotonic() - start:.0f} s")


def _patch(study: Study, args: argparse.Namespace, model: Any) -> list[str]:
    """The command's work: items, request, checks before the model, the analysis."""
    probe, items = study.mechanism_items(args, print, "patch")
    request = PatchRequest(
        layers=args.layers,
        sites=args.sites,
        spans=args.spans,
        heads=args.heads,
        readout=args.readout,
        method=args.method,
        top_k=args.top_k,
        pairs_per_unit=args.pairs,
        positions=args.positions,
        mediation=args.mediation,
        direction=not args.skip_direction,
        control=args.control,
        bootstrap=args.bootstrap,
        hooks=args.hooks,
        batch_size=args.batch_size,
        seed=args.seed,
        through_answer=False if args.prompt_only else None,
    )
    check_patch(request, items, probe.answers, study.mechanism_defaults())  # before the model
    if model is None:
        model = load_model(args.model, **load_options(args))
    with silenced(args.quiet):
        return run_patch(hookable(model), study, probe, items, request, args.out)
