"""`probekit capture STUDY`: activations at the spans of a study's items, as fp16 safetensors
shards plus an index parquet whose `prompt_id` joins the run's scores (see mechanism.capture)."""

from __future__ import annotations

import argparse

from probekit.engines.hf.model import load_model
from probekit.items import check_span_names
from probekit.mechanism.capture import BACKENDS, SITES, capture
from probekit.options import comma_list, int_list
from probekit.studies.base import Study


def add_arguments(parser: argparse.ArgumentParser, study: Study) -> None:
    parser.add_argument("--out", default="runs/capture", help="output folder (resumable)")
    parser.add_argument("--model", default="default", help="hub id, model dir, .gguf or default")
    parser.add_argument("--seed", type=int, default=0, help="seed for the items")
    parser.add_argument(
        "--layers", type=int_list, help="comma-separated layers (default: first, middle, last)"
    )
    parser.add_argument(
        "--sites", type=comma_list, default=list(SITES), help=f"from {', '.join(SITES)}"
    )
    parser.add_argument(
        "--spans", type=comma_list, default=None, help="span names (default: every span)"
    )
    parser.add_argument("--backend", default="bridge", choices=BACKENDS, help="how to read")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per forward pass")
    study.add_mechanism_arguments(parser, default_events=3)


def execute(study: Study, args: argparse.Namespace) -> None:
    probe, items = study.mechanism_items(args, print, "capture")
    if args.spans:  # before any model work
        check_span_names(items, args.spans)
    model = load_model(args.model)
    layers = args.layers or sorted({0, model.n_layers // 2, model.n_layers - 1})
    encoded = [model.encode(item) for item in items]
    result = capture(
        model, encoded, args.out, layers=layers, sites=args.sites, spans=args.spans,
        backend=args.backend, batch_size=args.batch_size,
    )  # fmt: skip
    print(
        f"captured {result.captured} prompts ({result.skipped} already there) of {probe.name} at "
        f"layers {layers}\nshards: {result.out_dir / 'shards'}\nindex:  {result.out_dir / 'index'} "
        "(probekit.mechanism.capture.read_index / load_activations, or pandas.read_parquet)"
    )
