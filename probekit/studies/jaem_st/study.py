"""JaEm-ST as a registered `Study`: options, the CE probe over the authors' sampled rows, the
per-run report, and the counterfactual pairs of one social dimension for patching."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

import probekit.studies.jaem_st.metrics as metrics
from probekit.core.errors import ProbekitError
from probekit.core.items import Item
from probekit.core.kinds import (
    comma_list,
    int_range,
    non_negative_int,
    path,
    positive_float,
    positive_int,
    text,
)
from probekit.core.options import given, named, option
from probekit.mechanism.defaults import Contrast, Difference, MechanismDefaults
from probekit.reporting.headline import INTERVAL_NOTE
from probekit.studies.base import (
    MECHANISM,
    Context,
    Probe,
    Study,
    data_option,
    register,
    run_option,
)
from probekit.studies.jaem_st.data import JAEM_ST, JaemData, load_jaem
from probekit.studies.jaem_st.probe import N_OPTIONS, JaemProbe, answer_order
from probekit.studies.jaem_st.sampler import TEMPLATE, sample_rows


@dataclass(frozen=True)
class JaemOptions:
    """jaem-st options."""

    data: Path | None = data_option("jaem_st/")
    templates: Path | None = option(
        None, help="a folder of templates (*.txt)", kind=path, metavar="DIR"
    )
    dataset_size: int | None = option(
        None,
        help="rows to reach before the authors' rounding (default: the metadata's 400 -> 486)",
        kind=positive_int,
    )
    uniform: bool = option(
        False, help="draw the non-evaluated dimensions uniformly, not by the authors' modulo draw"
    )
    prompt: int = option(
        0, help="CE prompt: 0 (the authors') or 1 (default %(default)s)", kind=non_negative_int
    )
    samples: int | None = option(
        None,
        help="only the first N rows of the sampled data set, one unit each (default %(default)s)",
        kind=positive_int,
        defaults={command: 2 for command in MECHANISM},
    )
    orders: int = run_option(
        1,
        f"1: one seeded random answer order per sample; {N_OPTIONS}: also its cyclic shifts",
        int_range(1, N_OPTIONS),
    )
    groups: list[str] = run_option(
        tuple(metrics.DEFAULT_GROUPS),
        "dimension columns forming the intersectional groups, one or two (default %(default)s)",
        comma_list,
    )
    outlier_z: float = run_option(
        metrics.DEFAULT_Z,
        "a group is an outlier beyond this many group standard deviations (default %(default)s)",
        positive_float,
    )
    responses: bool = run_option(
        False,
        "also generate Carl's free response per sample (greedy) and score it for AE "
        "(--vad-lexicon) and ERA (--era-model)",
    )
    response_tokens: int | None = run_option(
        None,
        "--responses: the greedy budget in new tokens (default: 64, "
        "responses.RESPONSE_TOKENS; end of sequence stops earlier)",
        positive_int,
    )
    vad_lexicon: Path | None = run_option(
        None,
        "AE: a word<TAB>valence<TAB>arousal<TAB>dominance lexicon (NRC VAD format)",
        path,
    )
    era_model: str | None = run_option(
        None,
        "ERA: a folder with EPITOME's finetuned_{IP,EX,ER}.pth, or package.module:factory",
    )
    dimension: str = option(
        "pronoun",
        help="the social dimension varied within a pair (default %(default)s)",
        kind=text,
        commands=MECHANISM,
    )
    clean: str | None = option(
        None, help="the clean value (default: the dimension's first)", kind=text, commands=MECHANISM
    )


class JaemStudy(Study):
    name = "jaem-st"
    title = "JaEm-ST (seed 002): intersectional cognitive empathy, exact A–E choices"
    unit_name = "sample"
    options = JaemOptions
    dataset = JAEM_ST

    def check(self, options: JaemOptions, context: Context) -> None:
        """The run-only options that go together (the other commands keep their defaults)."""
        if not 1 <= len(options.groups) <= 2:
            raise ProbekitError(
                f"{named('groups')} takes one or two dimension columns, e.g. gender,pronoun"
            )
        if not options.responses and (options.vad_lexicon or options.era_model):
            raise ProbekitError(
                f"{named('vad_lexicon')} and {named('era_model')} score responses; add "
                f"{named('responses')}"
            )

    def probes(self, options: JaemOptions, context: Context) -> list[JaemProbe]:
        data = load_jaem(self.data_source(options.data, context.say), options.templates)
        context.say(f"JaEm-ST: {len(data.templates)} templates from {data.folder}")
        rows = _rows(data, options, context.seed)
        if options.samples is not None:
            if options.samples > len(rows):
                raise ProbekitError(
                    f"{named('samples')} must be between 1 and {len(rows)} (got {options.samples})"
                )
            rows = rows.head(options.samples)
        extra = _manifest(data, options)
        if options.responses:
            extra["responses"] = _response_options(options, context)
        return [JaemProbe(data, rows, options.prompt, options.orders, context.seed, extra)]

    def after_run(
        self, probe: Probe, model: Any, scores: pd.DataFrame, run_dir: Path, manifest: dict
    ) -> None:
        """Generate the free responses with the run's model and score them (the report reads
        them)."""
        if manifest.get("responses"):
            import probekit.studies.jaem_st.responses as responses

            responses.write_responses(model, scores, run_dir, manifest)

    def summary_table(self, rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
        """One row per (view, template), in the summary's fixed columns (and the note of a run
        too small for an interval)."""
        import probekit.studies.jaem_st.report as report

        frame = pd.DataFrame(list(rows))
        return frame.reindex(
            columns=[*report.SUMMARY_COLUMNS, *frame.columns.intersection([INTERVAL_NOTE])]
        )

    def mechanism_defaults(self) -> MechanismDefaults:
        # readout P(Empathetic): the item's key 'correct'
        return MechanismDefaults(effect=Difference(), contrast=CLEAN_VALUE, readout="p_correct")

    def mechanism_items(
        self, options: JaemOptions, context: Context
    ) -> tuple[JaemProbe, list[Item]]:
        """For each of the first `samples` rows whose template shows `dimension` (while their
        prompts fit in the command's `limit`): one prompt (order 0) per value of that
        dimension, the rest of the row unchanged; each declares one span, the dimension's
        filled mask positions."""
        data = load_jaem(self.data_source(options.data, context.say), options.templates)
        dim = data.dimension(options.dimension)
        clean = options.clean if options.clean is not None else dim.values[0]
        if clean not in dim.values:
            raise ProbekitError(f"{given('clean', clean)} is not a value of {dim.column}")
        if context.limit is not None and context.limit < len(dim.values):
            raise ProbekitError(
                f"{given('limit', context.limit)} is too small: a sample has {len(dim.values)} "
                f"prompts, one per value of {dim.column}"
            )
        rows = _rows(data, options, context.seed)
        probe = JaemProbe(data, rows, options.prompt, 1, context.seed, _manifest(data, options))
        items = []
        for sample, row in enumerate(rows.to_dict("records")):
            if dim not in data.shown_dimensions(data.templates[int(row[TEMPLATE])]):
                continue
            full = context.limit is not None and len(items) + len(dim.values) > context.limit
            if len({i.unit for i in items}) == options.samples or full:
                break
            order = answer_order(context.seed, sample)
            for value in dim.values:
                values, tag = {**row, dim.column: value}, f"|{dim.column}={value}"
                item = probe.make_item(sample, values, order, 0, tag=tag)
                items.append(replace(item, spans={dim.column: item.spans[dim.column]}))
        if not items:
            raise ProbekitError(f"no template shows the dimension {dim.column}")
        probe.contrast = (dim.column, clean)
        return probe, items


CLEAN_VALUE = Contrast(
    "the clean value vs the other values of the dimension",
    lambda probe: probe.contrast[0],
    lambda probe: lambda e: e.item.key[probe.contrast[0]] == probe.contrast[1],
)
"""Per sample, the prompt with `--clean`'s value of `--dimension` against the prompts with its
other values, at the dimension's filled masks; the pairs (the core's `Study.pairs`) put the
clean value's prompt against each other value's."""


def _response_options(options: JaemOptions, context: Context) -> dict[str, Any]:
    """What `--responses` needs after the run (the manifest's `responses`), the lexicon read
    and the ERA model checked before any run; paths absolute, so that the run finds them from
    anywhere."""
    import probekit.studies.jaem_st.responses as responses
    from probekit.studies.jaem_st.era import check_spec
    from probekit.studies.jaem_st.vad import read_vad_lexicon

    if options.vad_lexicon:
        read_vad_lexicon(str(options.vad_lexicon))
    if options.era_model:
        check_spec(options.era_model)
    era = options.era_model
    return {
        "data": _absolute(options.data),
        "templates": _absolute(options.templates),
        "vad_lexicon": _absolute(options.vad_lexicon),
        "era_model": _absolute(era) if era is not None and Path(era).is_dir() else era,
        "device": context.device,
        "max_new_tokens": options.response_tokens or responses.RESPONSE_TOKENS,
    }


def _absolute(path: str | Path | None) -> str | None:
    return None if path is None else str(Path(path).resolve())


def _manifest(data: JaemData, options: JaemOptions) -> dict[str, Any]:
    """The manifest fields of a probe on `data` that its report reads (data, templates, the
    dimensions each shows, the groups)."""
    return {
        "dataset_size": options.dataset_size or data.dataset_size,
        "uniform": options.uniform,
        **JAEM_ST.manifest(data.source, data.sha256),
        "templates_path": str(data.folder),
        "shown_dimensions": {
            t.name: [d.column for d in data.shown_dimensions(t)] for t in data.templates
        },
        "answer_labels": list(data.answer_labels),
        "groups": [data.dimension(g).column for g in options.groups],
        "outlier_z": options.outlier_z,
    }


def _rows(data: JaemData, options: JaemOptions, seed: int) -> pd.DataFrame:
    size = options.dataset_size or data.dataset_size
    return sample_rows(
        len(data.templates), data.dimensions, data.evaluated, size, seed, options.uniform
    )


STUDY = register(JaemStudy())
