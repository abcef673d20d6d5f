"""JaEm-ST as a registered `Study`: options, the CE probe over the authors' sampled rows, the
per-run report, and the counterfactual pairs of one social dimension for patching."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pandas as pd

import probekit.studies.jaem_st.metrics as metrics
from probekit.core.errors import ProbekitError
from probekit.core.items import EncodedItem, Item, Pair
from probekit.core.options import (
    EVERY_COMMAND,
    MECHANISM,
    Option,
    comma_list,
    int_range,
    non_negative_int,
    positive_float,
    positive_int,
)
from probekit.mechanism.defaults import MechanismDefaults
from probekit.studies.base import Probe, Say, Study, register, run_view
from probekit.studies.jaem_st.data import JAEM_ST, JaemData, load_jaem
from probekit.studies.jaem_st.probe import N_OPTIONS, JaemProbe, answer_order
from probekit.studies.jaem_st.sampler import TEMPLATE, sample_rows

if TYPE_CHECKING:
    from probekit.reporting.contract import RunFacts
    from probekit.reporting.headline import Headline, ViewFacts

DEFAULT_PATCH_SAMPLES = 2
OPTIONS = (
    Option("--data", "data root holding jaem_st/", commands=EVERY_COMMAND),
    Option("--templates", "a folder of templates (*.txt)", commands=EVERY_COMMAND),
    Option(
        "--dataset-size",
        "rows to reach before the authors' rounding (default: the metadata's 400 -> 486)",
        positive_int,
        commands=EVERY_COMMAND,
    ),
    Option(
        "--uniform",
        "draw the non-evaluated dimensions uniformly, not by the authors' modulo draw",
        commands=EVERY_COMMAND,
        switch=True,
    ),
    Option("--prompt", "CE prompt: 0 (the authors') or 1", non_negative_int, 0, EVERY_COMMAND),
    Option(
        "--samples",
        "run: only the first N rows of the sampled data set (quick runs); patch, capture: the "
        "first N sampled rows, one unit each (default %(default)s)",
        positive_int,
        None,
        EVERY_COMMAND,
        defaults={"patch": DEFAULT_PATCH_SAMPLES, "capture": DEFAULT_PATCH_SAMPLES},
    ),
    Option(
        "--orders",
        f"1: one seeded random answer order per sample; {N_OPTIONS}: also its cyclic shifts",
        int_range(1, N_OPTIONS),
        1,
    ),
    Option(
        "--groups",
        "dimension columns forming the intersectional groups (default gender,pronoun)",
        comma_list,
        list(metrics.DEFAULT_GROUPS),
    ),
    Option(
        "--outlier-z",
        "a group is an outlier beyond this many group standard deviations (default %(default)s)",
        positive_float,
        metrics.DEFAULT_Z,
    ),
    Option(
        "--responses",
        "also generate Carl's free response per sample (greedy) and score it for AE "
        "(--vad-lexicon) and ERA (--era-model)",
        switch=True,
    ),
    Option(
        "--response-tokens",
        "--responses: the greedy budget in new tokens (default: 64, responses.RESPONSE_TOKENS; "
        "end of sequence stops earlier)",
        positive_int,
    ),
    Option(
        "--vad-lexicon",
        "AE: a word<TAB>valence<TAB>arousal<TAB>dominance lexicon (NRC VAD format)",
    ),
    Option(
        "--era-model",
        "ERA: a folder with EPITOME's finetuned_{IP,EX,ER}.pth, or package.module:factory",
    ),
    Option(
        "--dimension",
        "the social dimension varied within a pair (default %(default)s)",
        default="pronoun",
        commands=MECHANISM,
    ),
    Option("--clean", "the clean value (default: the dimension's first)", commands=MECHANISM),
)


class JaemStudy(Study):
    name = "jaem-st"
    title = "JaEm-ST (seed 002): intersectional cognitive empathy, exact A–E choices"
    default_out = "runs/jaem-st"
    unit_name = "sample"

    options = OPTIONS
    dataset = JAEM_ST
    captions = MappingProxyType(
        {
            "groups.png": "CE score per group of the --groups columns (default gender x pronoun) "
            "with 95 % bootstrap intervals over samples, sorted; dashed: the overall mean; "
            "vermillion, with their z beside them: outliers (|z| above --outlier-z, z over the "
            "spread of the group means).",
            "groups_heatmap.png": "Mean CE score per group, the first --groups column (default "
            "gender) in rows and the second (pronoun) in columns; outlined in crimson: outliers.",
            "accuracy_by_group.png": "CE score per value of each dimension that reaches a prompt, "
            "with 95 % bootstrap intervals over samples; dashed: the overall mean.",
        }
    )

    def check(self, args: argparse.Namespace, command: str) -> None:
        if command != "run":
            return
        if not 1 <= len(args.groups) <= 2:
            raise ProbekitError("--groups takes one or two dimension columns, e.g. gender,pronoun")
        if not args.responses and (args.vad_lexicon or args.era_model):
            raise ProbekitError("--vad-lexicon and --era-model score responses; add --responses")

    def probes(self, args: argparse.Namespace, say: Say) -> list[JaemProbe]:
        data = load_jaem(self.data_source(args, say), args.templates)
        say(f"JaEm-ST: {len(data.templates)} templates from {data.folder}")
        rows = _rows(data, args)
        if args.samples is not None:
            if not 1 <= args.samples <= len(rows):
                raise ProbekitError(f"--samples must lie between 1 and {len(rows)}")
            rows = rows.head(args.samples)
        columns = [data.dimension(g).column for g in args.groups]
        extra = {
            "dataset_size": _size(data, args),
            "uniform": args.uniform,
            **JAEM_ST.manifest(data.source, data.sha256),
            "templates_path": str(data.folder),
            "shown_dimensions": {
                t.name: [d.column for d in data.shown_dimensions(t)] for t in data.templates
            },
            "answer_labels": list(data.answer_labels),
            "groups": columns,
            "outlier_z": args.outlier_z,
        }
        if args.responses:
            extra["responses"] = _response_options(args).manifest()
        return [JaemProbe(data, rows, args.prompt, args.orders, args.seed, extra)]

    def after_run(
        self, probe: Probe, model: Any, scores: pd.DataFrame, run_dir: Path, manifest: dict
    ) -> None:
        """Generate the free responses with the run's model (the report scores them)."""
        if manifest.get("responses"):
            import probekit.studies.jaem_st.responses as responses

            responses.generate_missing(scores, run_dir, manifest, print, model)

    def report(self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]) -> list[dict]:
        """Every view's rows; the run's own view also gets its free responses' scores."""
        rows = super().report(scores, run_dir, manifest)
        if manifest.get("responses"):
            import probekit.studies.jaem_st.report as report
            import probekit.studies.jaem_st.responses as responses

            frame = responses.responses_table(scores, run_dir, manifest, print)
            fields = report.report_responses(frame, run_dir, manifest)
            for row in rows:
                if row["view"] == run_view(manifest):
                    row.update(fields.get(row["template"], {}))
        return rows

    def report_view(
        self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any], view: str, suffix: str
    ) -> list[dict]:
        import probekit.studies.jaem_st.report as report

        return report.report_run(scores, run_dir, manifest, view, suffix)

    def summary_table(self, rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
        """One row per (view, template), in the summary's fixed columns."""
        import probekit.studies.jaem_st.report as report

        return pd.DataFrame(list(rows)).reindex(columns=list(report.SUMMARY_COLUMNS))

    def summary_markdown(self, table: pd.DataFrame) -> str:
        import probekit.studies.jaem_st.report as report

        return report.summary_markdown(table)

    def headlines(self, table: pd.DataFrame, manifest: Mapping[str, Any]) -> list[Headline]:
        import probekit.studies.jaem_st.report as report

        return report.headlines(table, dict(manifest))

    def view_facts(self, table: pd.DataFrame, run: RunFacts) -> list[ViewFacts]:
        import probekit.studies.jaem_st.report as report

        return report.view_facts(table, run)

    def mechanism_defaults(self) -> MechanismDefaults:
        return MechanismDefaults(readout="p_correct")  # P(Empathetic): the item's key 'correct'

    def mechanism_items(
        self, args: argparse.Namespace, say: Say, purpose: str
    ) -> tuple[JaemProbe, list[Item]]:
        """For each of the first `--samples` rows whose template shows `--dimension`: one prompt
        (order 0) per value of that dimension, the rest of the row unchanged; each declares one
        span, the dimension's filled mask positions."""
        data = load_jaem(self.data_source(args, say), args.templates)
        dim = data.dimension(args.dimension)
        clean = args.clean if args.clean is not None else dim.values[0]
        if clean not in dim.values:
            raise ProbekitError(f"--clean {clean!r} is not a value of {dim.column}")
        rows = _rows(data, args)
        probe = JaemProbe(data, rows, args.prompt, 1, args.seed)
        items = []
        for sample, row in enumerate(rows.to_dict("records")):
            if dim not in data.shown_dimensions(data.templates[int(row[TEMPLATE])]):
                continue
            if len({i.unit for i in items}) == args.samples:
                break
            order = answer_order(args.seed, sample)
            for value in dim.values:
                values, tag = {**row, dim.column: value}, f"|{dim.column}={value}"
                item = probe.make_item(sample, values, order, 0, tag=tag)
                items.append(replace(item, spans={dim.column: item.spans[dim.column]}))
        if not items:
            raise ProbekitError(f"no template shows the dimension {dim.column}")
        probe.contrast = (dim.column, clean)
        return probe, items

    def pairs(self, probe: JaemProbe, encoded: Sequence[EncodedItem]) -> list[Pair]:
        """Per sample, the clean value's prompt paired with each other value's prompt."""
        column, clean = probe.contrast
        base = {e.item.unit: e for e in encoded if e.item.key[column] == clean}
        others = [e for e in encoded if e.item.key[column] != clean and e.item.unit in base]
        return [(base[e.item.unit], e) for e in others]


def _response_options(args: argparse.Namespace) -> Any:
    """The `--responses` options (`responses.ResponseOptions`), the lexicon read and the ERA
    model checked before any run."""
    import probekit.studies.jaem_st.responses as responses
    from probekit.studies.jaem_st.era import check_spec
    from probekit.studies.jaem_st.vad import read_vad_lexicon

    if args.vad_lexicon:
        read_vad_lexicon(args.vad_lexicon)
    if args.era_model:
        check_spec(args.era_model)
    era_model = _absolute(args.era_model) if _is_folder(args.era_model) else args.era_model
    return responses.ResponseOptions(
        data=_absolute(args.data),
        templates=_absolute(args.templates),
        vad_lexicon=_absolute(args.vad_lexicon),
        era_model=era_model,
        device=args.device,
        max_new_tokens=args.response_tokens or responses.RESPONSE_TOKENS,
    )


def _is_folder(path: str | None) -> bool:
    return path is not None and Path(path).is_dir()


def _absolute(path: str | None) -> str | None:
    """A path as the manifest keeps it, so that `probekit report` finds it from anywhere."""
    return None if path is None else str(Path(path).resolve())


def _rows(data: JaemData, args: argparse.Namespace) -> pd.DataFrame:
    size = _size(data, args)
    return sample_rows(
        len(data.templates), data.dimensions, data.evaluated, size, args.seed, args.uniform
    )


def _size(data: JaemData, args: argparse.Namespace) -> int:
    return data.dataset_size if args.dataset_size is None else args.dataset_size


STUDY = register(JaemStudy())
