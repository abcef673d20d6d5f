"""`probekit capture STUDY`: activations at the spans of a study's items, as fp16 safetensors
shards plus an index parquet whose `prompt_id` joins the run's scores (see mechanism.capture)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from probekit.cli.main import study_parser
from probekit.cli.patch import add_hooks_option
from probekit.core.options import comma_list, int_list, options_from_keywords
from probekit.core.progress import silenced
from probekit.engines.hf.model import load_model
from probekit.engines.options import add_model_options, load_options
from probekit.mechanism.api import hookable
from probekit.mechanism.capture import Activations, read_activations
from probekit.mechanism.pipeline import CaptureRequest, check_capture, run_capture
from probekit.mechanism.sites import DEFAULT_SITES
from probekit.studies.base import Study


def add_arguments(parser: argparse.ArgumentParser, study: Study) -> None:
    parser.add_argument("--out", default="runs/capture", help="output folder (resumable)")
    add_model_options(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed for the items")
    parser.add_argument(
        "--layers",
        type=int_list,
        help="comma-separated layers, -1 the last (default: first, middle, last)",
    )
    parser.add_argument(
        "--sites",
        type=comma_list,
        default=list(DEFAULT_SITES),
        help="comma-separated TransformerLens sites (short forms such as resid_pre accepted)",
    )
    parser.add_argument(
        "--spans", type=comma_list, default=None, help="span names (default: every span)"
    )
    add_hooks_option(parser)
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per forward pass")
    study.add_options(parser, "capture")  # the study's options


def capture_study(
    study: str | Study, model: Any = "default", *, out: str | Path | None = None, **options: Any
) -> Activations:
    """`probekit capture STUDY` as a function: the study's options as keywords (`layers=[0,
    -1]`, `sites=["resid_post"]`, `spans=["experiencer"]`, study options...), validated by the
    command line's own option types (a bad or unknown one is one line of `ProbekitError`, before
    any model work). `model` is a model spec or an already loaded model. Writes the resumable
    shards into `out` (default `runs/capture`) and returns everything captured there."""
    parser, found = study_parser("capture", study if isinstance(study, str) else study.name)
    spec = model if isinstance(model, str) else None
    args = options_from_keywords(parser, {"out": out, "model": spec, **options})
    _capture(found, args, None if isinstance(model, str) else model)
    return read_activations(args.out)


def execute(study: Study, args: argparse.Namespace) -> None:
    _capture(study, args, None)


def _capture(study: Study, args: argparse.Namespace, model: Any) -> None:
    """The command's work: items, request, checks before the model, the capture."""
    probe, items = study.mechanism_items(args, print, "capture")
    request = CaptureRequest(args.layers, args.sites, args.spans, args.hooks, args.batch_size)
    check_capture(request, items)  # before any model work
    if model is None:
        model = load_model(args.model, **load_options(args))
    with silenced(args.quiet):
        run_capture(hookable(model), probe, items, request, args.out)
