"""Capture activations at the identity spans of intergroup-study prompts.

For a few crowd-enVent events and every perceiver x experiencer pair of one category, render the
study's prompts, locate the spans `perceiver`, `experiencer`, `emotion`, `event` and `answer`,
and store `resid_pre`, `attn_out`, `mlp_out` and `resid_post` at the chosen layers as fp16
safetensors shards plus an index parquet (see probekit.capture). Re-running into the same --out
skips prompts already captured.

    python hooks/capture_identity.py --out captures/religion
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import pandas as pd

from probekit.capture import BACKENDS, SITES, CaptureItem, capture
from probekit.cli import add_study_arguments, int_list, run_script
from probekit.datasets.crowd_envent import first_events
from probekit.models import LoadedModel, load_model
from probekit.spans import intergroup_spans, locate
from probekit.studies.intergroup import (
    Category,
    Setting,
    get_category,
    get_setting,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_study_arguments(p, "runs/capture_identity", 3, "number of events (one per emotion)")
    p.add_argument(
        "--layers",
        type=int_list,
        help="comma-separated layer indices (default: first, middle and last layer)",
    )
    p.add_argument(
        "--sites", default=",".join(SITES), help=f"comma-separated sites from {', '.join(SITES)}"
    )
    p.add_argument("--backend", default="bridge", choices=BACKENDS, help="how to read activations")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per forward pass")
    return p.parse_args(argv)


def prompts(
    model: LoadedModel, events: pd.DataFrame, setting: Setting, category: Category
) -> Iterator[CaptureItem]:
    """One CaptureItem per (event, perceiver, experiencer), with the study labels as metadata."""
    groups = list(zip(category.identities, category.labels, strict=True))
    for event in events.itertuples(index=False):
        text = getattr(event, setting.text_column)
        for perceiver, p_label in groups:
            for experiencer, e_label in groups:
                messages, spans = intergroup_spans(
                    setting, perceiver, experiencer, event.emotion, text
                )
                yield CaptureItem(
                    prompt_id=f"{setting.name}|{event.event_id}|{perceiver}|{experiencer}",
                    prompt=locate(model.tokenizer, messages, spans),
                    meta={
                        "setting": setting.name,
                        "event_id": event.event_id,
                        "emotion": event.emotion,
                        "perceiver": perceiver,
                        "experiencer": experiencer,
                        "in_group": p_label == e_label,
                    },
                )


def run(args: argparse.Namespace) -> None:
    setting, category = get_setting(args.setting), get_category(args.category)
    events = first_events(args.data, args.events, args.seed)
    model = load_model(args.model)
    layers = args.layers or sorted({0, model.n_layers // 2, model.n_layers - 1})
    result = capture(
        model,
        prompts(model, events, setting, category),
        args.out,
        layers=layers,
        sites=args.sites.split(","),
        backend=args.backend,
        batch_size=args.batch_size,
    )
    print(
        f"captured {result.captured} prompts ({result.skipped} already there) at layers {layers}\n"
        f"shards: {result.out_dir / 'shards'}\n"
        f"index:  {result.out_dir / 'index'} "
        "(probekit.capture.read_index / load_activations, or pandas.read_parquet)"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_script("capture_identity", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
