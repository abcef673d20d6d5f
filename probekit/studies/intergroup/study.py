"""The intergroup study as a registered `Study`: options, probes over crowd-enVent events,
the per-run report (both views of a generate run), and the in-group/out-group patching pairs."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.datasets.crowd_envent import (
    data_sha256,
    first_events,
    load_crowd_envent,
    resolve_crowd_envent,
    sample_events,
)
from probekit.items import EncodedItem, Item, Pair
from probekit.options import count_or_all
from probekit.stats import empathy_gap, zscore
from probekit.studies.base import Say, Study, register
from probekit.studies.intergroup import report
from probekit.studies.intergroup.metrics import DEFAULT_MIN_VALID_MASS, intensity_matrix
from probekit.studies.intergroup.probe import (
    CATEGORIES,
    SETTINGS,
    IntergroupProbe,
    get_category,
    get_setting,
)

# Events per emotion of the default run: religion's 6 x 6 pairs x 24 events = 864 prompts,
# which fit in 10 minutes on 2 CPU cores with the default model.
DEFAULT_EVENTS = 2


class IntergroupStudy(Study):
    name = "intergroup"
    title = "The intergroup empathy gap (Hou, Daumé III & Rudinger, NAACL 2025): 0–100 intensity"
    default_out = "runs/intergroup"
    unit_name = "event"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--category", default="religion", help="ethnicity, nationality, religion or all"
        )
        parser.add_argument("--setting", default="P0S0T0", help="P0S0T0 (origin), ... or all")
        parser.add_argument(
            "--events", default=str(DEFAULT_EVENTS), help="events per emotion, or all"
        )
        parser.add_argument("--data", default=None, help="data root holding crowd-enVent/")
        parser.add_argument(
            "--authors-input", action="store_true",
            help="tokenize the rendered chat prompt as a string with the tokenizer's special "
            "tokens, as the authors' vLLM did (a second BOS for Llama-3.1 and Mistral)",
        )  # fmt: skip
        parser.add_argument(
            "--min-valid-mass", type=float, default=DEFAULT_MIN_VALID_MASS,
            help="ev mode: an event is excluded when any pair's valid mass is below this",
        )  # fmt: skip

    def probes(self, args: argparse.Namespace, say: Say) -> list[IntergroupProbe]:
        categories = list(CATEGORIES) if args.category == "all" else [args.category]
        settings = list(SETTINGS) if args.setting == "all" else [args.setting]
        categories = [get_category(c) for c in categories]
        settings = [get_setting(s) for s in settings]
        per_emotion = count_or_all(args.events)
        source = resolve_crowd_envent(args.data)
        if source.origin == "sample":
            say("crowd-enVent not found: using probekit's own sample events (NOT crowd-enVent). "
                + source.message)  # fmt: skip
        else:
            say(f"events: crowd-enVent from {source.path} ({source.origin})")
        events = sample_events(load_crowd_envent(source.path), per_emotion, args.seed)
        extra = {
            "data_origin": source.origin,
            "data_path": str(source.path),
            "data_sha256": data_sha256(source.path),
            "min_valid_mass": args.min_valid_mass,
        }
        return [
            IntergroupProbe(
                category, setting, events, extra=extra, authors_input=args.authors_input
            )  # fmt: skip
            for category in categories
            for setting in settings
        ]

    def report(self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]) -> list[dict]:
        """One row per view: a generate run records the exact scores too, so it reports both."""
        mode = manifest["mode"]
        category = get_category(manifest["category"])
        rows = []
        for view in ["generate", "ev"] if mode == "generate" else ["ev"]:
            row = {"model": manifest["model"], "category": category.name,
                   "setting": manifest["setting"]}  # fmt: skip
            row.update(report.report_gap(
                scores, category, view, run_dir, manifest.get("seed", 0),
                manifest.get("min_valid_mass", DEFAULT_MIN_VALID_MASS),
                suffix="" if view == mode else f"_{view}",
            ))  # fmt: skip
            rows.append(row)
        return rows

    def write_summary(self, rows: list[dict[str, Any]], out: Path) -> str:
        return report.summary_markdown(report.write_summary(rows, out))

    def add_mechanism_arguments(self, parser: argparse.ArgumentParser, default_events: int) -> None:
        parser.add_argument("--category", default="religion", choices=CATEGORIES)
        parser.add_argument("--setting", default="P0S0T0", help="prompt setting, e.g. P0S0T0")
        parser.add_argument(
            "--events", type=int, default=default_events,
            help=f"number of events, one per emotion (default {default_events})",
        )  # fmt: skip
        parser.add_argument("--data", help="crowd-enVent root (default $PROBEKIT_DATA, cache)")

    def mechanism_defaults(self) -> dict[str, Any]:
        return {
            "spans": ["experiencer", "perceiver", "from_experiencer"],
            "metric": "ev",
            "direction_span": "experiencer",
            "direction_contrast": _in_group,
            "direction_centre": ["event_id", "perceiver"],
            "direction_statistic": _gap_statistic,
        }

    def mechanism_items(
        self, args: argparse.Namespace, say: Say, purpose: str
    ) -> tuple[IntergroupProbe, list[Item]]:
        """Every perceiver x experiencer prompt of the first `--events` events (one per emotion),
        event-major; `a person` is left out of patching (its pairs are not in-group/out-group)."""
        category, setting = get_category(args.category), get_setting(args.setting)
        events = first_events(args.data, int(args.events), args.seed)
        probe = IntergroupProbe(category, setting, events, named_only=purpose == "patch")
        order = {event: k for k, event in enumerate(events["event_id"].astype(str))}
        items = sorted(probe.items(), key=lambda item: order[item.unit])
        if purpose == "capture":  # the capture index also says which setting and side it is
            items = [replace(item, key={**item.key, "setting": setting.name, "in_group":
                     probe.in_group(item.key["perceiver"], item.key["experiencer"])})
                     for item in items]  # fmt: skip
        return probe, items

    def pairs(self, probe: IntergroupProbe, encoded: Sequence[EncodedItem]) -> list[Pair]:
        """Each in-group prompt (g, g) paired with every out-group prompt (g, h) of its event."""

        inside = _in_group(probe)
        clean = {(e.item.unit, e.item.key["perceiver"]): e for e in encoded if inside(e)}
        return [
            (clean[(e.item.unit, e.item.key["perceiver"])], e)
            for e in encoded
            if not inside(e) and (e.item.unit, e.item.key["perceiver"]) in clean
        ]


def _in_group(probe: IntergroupProbe) -> Callable[[EncodedItem], bool]:
    return lambda e: probe.in_group(e.item.key["perceiver"], e.item.key["experiencer"])


def _gap_statistic(probe: IntergroupProbe) -> Callable[[pd.DataFrame, str], float]:
    """Δ of the named groups (z-scored matrix) from per-prompt values in a column."""
    named, labels = list(probe.category.named), list(probe.category.named_labels)
    return lambda frame, value: empathy_gap(
        zscore(intensity_matrix(frame, named, value=value)), labels
    )


STUDY = register(IntergroupStudy())
