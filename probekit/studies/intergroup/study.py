"""The intergroup study as a registered `Study`: options, probes over crowd-enVent events,
the per-run report (both views of a generate run), and the in-group/out-group patching pairs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem, Item
from probekit.core.kinds import Kind, choice, count_or_all, probability, text
from probekit.core.options import named, option
from probekit.datasets.crowd_envent import CROWD_ENVENT, load_crowd_envent, sample_events
from probekit.mechanism.defaults import Contrast, Interaction, MechanismDefaults
from probekit.stats import empathy_gap, zscore
from probekit.studies.base import (
    MECHANISM,
    RUN,
    Context,
    Study,
    data_option,
    register,
    run_help,
    run_option,
)
from probekit.studies.intergroup.metrics import DEFAULT_MIN_VALID_MASS, event_cube
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


def _setting(value: object) -> str:
    """A prompt setting (P0S0T0 ... or the authors' names), or all."""
    name = text.check(value)
    return name if name == "all" else get_setting(name).name


@dataclass(frozen=True)
class IntergroupOptions:
    """intergroup options."""

    category: str = option(
        "religion",
        help=run_help(
            "ethnicity, nationality, religion, or all (default %(default)s)",
            "ethnicity, nationality or religion (default %(default)s)",
        ),
        kind=choice("category", (*CATEGORIES, "all")),
    )
    setting: str = option(
        "P0S0T0",
        help=run_help(
            "P0S0T0 (origin), ..., or all (default %(default)s)",
            "P0S0T0 (origin), ... (default %(default)s)",
        ),
        kind=Kind("setting", str, _setting),
    )
    events: int | None = option(
        DEFAULT_EVENTS,
        help="events per emotion, drawn with the seed, or all (default %(default)s)",
        kind=count_or_all,
    )
    data: Path | None = data_option(
        "crowd-enVent/ (default: $PROBEKIT_DATA, the cache, a download)"
    )
    authors_input: bool = run_option(
        False,
        "tokenize the rendered chat prompt as a string with the tokenizer's special tokens, "
        "as the authors' vLLM did (a second BOS for Llama-3.1 and Mistral)",
    )
    min_valid_mass: float = option(
        DEFAULT_MIN_VALID_MASS,
        help={
            "run": "exact view: an event is excluded when any pair's valid mass is below this "
            "(default %(default)s)",
            "lens": "an event is excluded when any pair's valid mass is below this (default "
            "%(default)s: a layer's valid mass says how much of its lens is on the answers, not "
            "that the model refused)",
        },
        kind=probability,
        commands=(*RUN, "lens"),
        defaults={"lens": 0.0},
    )


class IntergroupStudy(Study):
    name = "intergroup"
    title = "The intergroup empathy gap (Hou, Daumé III & Rudinger, NAACL 2025): rated intensity"
    unit_name = "event"
    interval_columns = ("delta_ci_low", "delta_ci_high", "raw_gap_ci_low", "raw_gap_ci_high")
    pair_within = ("perceiver",)  # each in-group prompt (g, g) with the out-group ones (g, h)
    options = IntergroupOptions
    dataset = CROWD_ENVENT

    def check(self, options: IntergroupOptions, context: Context) -> None:
        if context.command in MECHANISM and "all" in (options.category, options.setting):
            which = f"one {named('category')} and one {named('setting')}"
            raise ProbekitError(f"{context.command} takes {which}, not all")

    def probes(self, options: IntergroupOptions, context: Context) -> list[IntergroupProbe]:
        categories = list(CATEGORIES) if options.category == "all" else [options.category]
        settings = list(SETTINGS) if options.setting == "all" else [options.setting]
        source = self.data_source(options.data, context.say)
        events = sample_events(load_crowd_envent(source.path), options.events, context.seed)
        extra = {**CROWD_ENVENT.manifest(source), "min_valid_mass": options.min_valid_mass}
        named_only = context.command == "patch"  # `a person` has no in-group pairs
        given = (events, named_only, extra, options.authors_input)
        return [
            IntergroupProbe(get_category(c), get_setting(s), *given)
            for c in categories
            for s in settings
        ]

    def summary_tables(self, table: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, str]]:
        """The paper's tables with the models side by side (`paper_tables.csv`/`.md`)."""
        tables = self.report_module().paper_tables(table)
        return {"paper_tables": (tables, self.report_module().paper_tables_markdown(tables))}

    def mechanism_defaults(self) -> MechanismDefaults:
        return MechanismDefaults(
            contrast=IN_GROUP,
            effect=PERCEIVER_BY_EXPERIENCER,
            spans=("experiencer", "perceiver", "from_experiencer"),
            readout="expected",
            direction=IN_GROUP.direction(("event_id", "perceiver"), _gap_statistic),
        )

    def mechanism_items(
        self, options: IntergroupOptions, context: Context
    ) -> tuple[IntergroupProbe, list[Item]]:
        """The study's slice (`mechanism_slice`), event-major; patching leaves `a person` out
        (its pairs are not in-group/out-group); capture's index also says the setting and the
        side of each prompt."""
        probe, items = super().mechanism_items(options, context)
        order = {str(event): k for k, event in enumerate(probe.events["event_id"])}
        items = sorted(items, key=lambda item: order[item.unit])
        if context.command == "capture":

            def key(item: Item) -> dict[str, Any]:
                inside = probe.in_group(item.key["perceiver"], item.key["experiencer"])
                return {**item.key, "setting": probe.setting.name, "in_group": inside}

            items = [replace(item, key=key(item)) for item in items]
        return probe, items  # type: ignore[return-value]


def _in_group(probe: IntergroupProbe) -> Callable[[EncodedItem], bool]:
    return lambda e: probe.in_group(e.item.key["perceiver"], e.item.key["experiencer"])


IN_GROUP = Contrast("in-group vs out-group", "experiencer", _in_group)
"""Prompts whose perceiver and experiencer share a group, against the others, at the
experiencer."""


PERCEIVER_BY_EXPERIENCER = Interaction(
    "perceiver", "experiencer", lambda probe: lambda a, b: probe.in_group(a, b)
)
"""Δ is an interaction: patching reads it on 2x2 sets of two identities of different groups,
perceiver x experiencer on one event (`probekit.mechanism.pairs`)."""


def _gap_statistic(probe: IntergroupProbe) -> Callable[[pd.DataFrame, str], float]:
    """Δ of the named groups (z-scored matrix) from per-prompt values in a column, over the
    frame's `unit`s (the events, relabelled in a bootstrap resample)."""
    named, labels = list(probe.category.named), list(probe.category.named_labels)
    return lambda frame, value: empathy_gap(
        zscore(event_cube(frame.assign(event_id=frame["unit"]), named, value).mean(axis=2)),
        labels,
    )


STUDY = register(IntergroupStudy())
