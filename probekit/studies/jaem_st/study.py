"""JaEm-ST as a registered `Study`: options, the CE probe over the authors' sampled rows, the
per-run report, and the counterfactual pairs of one social dimension for patching."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.errors import ProbekitError
from probekit.items import EncodedItem, Item, Pair
from probekit.studies.base import Probe, Say, Study, register
from probekit.studies.jaem_st import metrics, report, responses
from probekit.studies.jaem_st.data import JaemData, load_jaem
from probekit.studies.jaem_st.era import check_spec
from probekit.studies.jaem_st.probe import JaemProbe, answer_order
from probekit.studies.jaem_st.sampler import TEMPLATE, sample_rows
from probekit.studies.jaem_st.vad import read_vad_lexicon

DEFAULT_PATCH_SAMPLES = 2


class JaemStudy(Study):
    name = "jaem-st"
    title = "JaEm-ST (seed 002): intersectional cognitive empathy, exact A–E choices"
    default_out = "runs/jaem-st"
    unit_name = "sample"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _data_arguments(parser)
        parser.add_argument(
            "--samples", type=int, default=None,
            help="only the first N rows of the sampled data set (quick runs)",
        )  # fmt: skip
        parser.add_argument(
            "--orders", type=int, default=1,
            help="1: one seeded random answer order per sample; 5: also its cyclic shifts",
        )  # fmt: skip
        parser.add_argument(
            "--groups", default=",".join(metrics.DEFAULT_GROUPS),
            help="dimension columns forming the intersectional groups (default gender,pronoun)",
        )  # fmt: skip
        parser.add_argument(
            "--outlier-z", type=float, default=metrics.DEFAULT_Z,
            help="a group is an outlier beyond this many group standard deviations",
        )  # fmt: skip
        parser.add_argument(
            "--responses", action="store_true",
            help="also generate Carl's free response per sample (greedy) and score it for AE "
            "(--vad-lexicon) and ERA (--era-model)",
        )  # fmt: skip
        parser.add_argument(
            "--response-tokens", type=int, default=responses.RESPONSE_TOKENS,
            help=f"--responses: the greedy budget in new tokens (default "
            f"{responses.RESPONSE_TOKENS}; end of sequence stops earlier)",
        )  # fmt: skip
        parser.add_argument(
            "--vad-lexicon", default=None,
            help="AE: a word<TAB>valence<TAB>arousal<TAB>dominance lexicon (NRC VAD format)",
        )  # fmt: skip
        parser.add_argument(
            "--era-model", default=None,
            help="ERA: a folder with EPITOME's finetuned_{IP,EX,ER}.pth, or package.module:factory",
        )  # fmt: skip

    def probes(self, args: argparse.Namespace, say: Say) -> list[JaemProbe]:
        data = load_jaem(args.data, args.templates)
        say(f"JaEm-ST: {len(data.templates)} templates from {data.origin}")
        rows = _rows(data, args)
        if args.samples is not None:
            if not 1 <= args.samples <= len(rows):
                raise ProbekitError(f"--samples must lie between 1 and {len(rows)}")
            rows = rows.head(args.samples)
        groups = [g.strip() for g in args.groups.split(",") if g.strip()]
        columns = [data.dimension(g).column for g in groups]
        if not 1 <= len(columns) <= 2:
            raise ProbekitError("--groups takes one or two dimension columns, e.g. gender,pronoun")
        extra = {
            "dataset_size": _size(data, args),
            "uniform": args.uniform,
            "data_origin": data.origin,
            "data_sha256": data.sha256,
            "shown_dimensions": {
                t.name: [d.column for d in data.shown_dimensions(t)] for t in data.templates
            },
            "answer_labels": list(data.answer_labels),
            "groups": columns,
            "outlier_z": args.outlier_z,
        }
        if args.responses:
            extra["responses"] = _response_options(args).manifest()
        elif args.vad_lexicon or args.era_model:
            raise ProbekitError("--vad-lexicon and --era-model score responses; add --responses")
        return [JaemProbe(data, rows, args.prompt, args.orders, args.seed, extra)]

    def after_run(
        self, probe: Probe, model: Any, scores: pd.DataFrame, run_dir: Path,
        manifest: dict[str, Any],
    ) -> None:  # fmt: skip
        """Generate the free responses with the run's model (the report scores them)."""
        if manifest.get("responses"):
            responses.generate_missing(scores, run_dir, manifest, print, model)

    def report(self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]) -> list[dict]:
        mode = manifest["mode"]
        rows = []
        for view in ["generate", "ev"] if mode == "generate" else ["ev"]:
            suffix = "" if view == mode else f"_{view}"
            rows += report.report_run(scores, run_dir, manifest, view, suffix)
        if manifest.get("responses"):
            frame = responses.responses_table(scores, run_dir, manifest, print)
            fields = report.report_responses(frame, run_dir, manifest)
            for row in rows:
                if row["view"] == mode:
                    row.update(fields.get(row["template"], {}))
        return rows

    def write_summary(self, rows: list[dict[str, Any]], out: Path) -> str:
        return report.summary_markdown(report.write_summary(rows, out))

    def add_mechanism_arguments(self, parser: argparse.ArgumentParser, default_events: int) -> None:
        _data_arguments(parser)
        parser.add_argument(
            "--samples", type=int, default=DEFAULT_PATCH_SAMPLES,
            help=f"the first N sampled rows (default {DEFAULT_PATCH_SAMPLES}), one unit each",
        )  # fmt: skip
        parser.add_argument(
            "--dimension", default="pronoun", help="the social dimension varied within a pair"
        )
        parser.add_argument(
            "--clean", default=None, help="the clean value (default: the dimension's first)"
        )

    def mechanism_defaults(self) -> dict[str, Any]:
        return {"metric": "p_correct"}  # P(Empathetic): the item's key 'correct'

    def mechanism_items(
        self, args: argparse.Namespace, say: Say, purpose: str
    ) -> tuple[JaemProbe, list[Item]]:
        """For each of the first `--samples` rows whose template shows `--dimension`: one prompt
        (order 0) per value of that dimension, the rest of the row unchanged; each declares one
        span, the dimension's filled mask positions."""
        data = load_jaem(args.data, args.templates)
        dim = data.dimension(args.dimension)
        clean = args.clean if args.clean is not None else dim.values[0]
        if clean not in dim.values:
            raise ProbekitError(f"--clean {clean!r} is not a value of {dim.column}")
        if args.samples < 1:
            raise ProbekitError(f"--samples must be at least 1, got {args.samples}")
        rows = _rows(data, args)
        probe = JaemProbe(data, rows, args.prompt, 1, args.seed)
        items = []
        for sample, row in enumerate(rows.to_dict("records")):
            if dim not in data.shown_dimensions(data.templates[int(row[TEMPLATE])]):
                continue
            if len({i.unit for i in items}) == args.samples:
                break
            for value in dim.values:
                item = probe.make_item(sample, {**row, dim.column: value},
                                       answer_order(args.seed, sample), 0,
                                       tag=f"|{dim.column}={value}")  # fmt: skip
                items.append(replace(item, spans={dim.column: item.spans[dim.column]}))
        if not items:
            raise ProbekitError(f"no template shows the dimension {dim.column}")
        probe.contrast = (dim.column, clean)
        return probe, items

    def pairs(self, probe: JaemProbe, encoded: Sequence[EncodedItem]) -> list[Pair]:
        """Per sample, the clean value's prompt paired with each other value's prompt."""
        column, clean = probe.contrast
        base = {e.item.unit: e for e in encoded if e.item.key[column] == clean}
        return [(base[e.item.unit], e) for e in encoded
                if e.item.key[column] != clean and e.item.unit in base]  # fmt: skip


def _data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, help="data root holding jaem_st/")
    parser.add_argument("--templates", default=None, help="a folder of templates (*.txt)")
    parser.add_argument(
        "--dataset-size", type=int, default=None,
        help="rows to reach before the authors' rounding (default: the metadata's 400 -> 486)",
    )  # fmt: skip
    parser.add_argument(
        "--uniform", action="store_true",
        help="draw the non-evaluated dimensions uniformly, not by the authors' modulo draw",
    )  # fmt: skip
    parser.add_argument("--prompt", type=int, default=0, help="CE prompt: 0 (the authors') or 1")


def _response_options(args: argparse.Namespace) -> responses.ResponseOptions:
    """The `--responses` options, the lexicon read and the ERA model checked before any run."""
    if args.response_tokens < 1:
        raise ProbekitError(f"--response-tokens must be at least 1, got {args.response_tokens}")
    if args.vad_lexicon:
        read_vad_lexicon(args.vad_lexicon)
    if args.era_model:
        check_spec(args.era_model)
    return responses.ResponseOptions(
        data=_absolute(args.data), templates=_absolute(args.templates),
        vad_lexicon=_absolute(args.vad_lexicon),
        era_model=_absolute(args.era_model) if _is_folder(args.era_model) else args.era_model,
        device=args.device, max_new_tokens=args.response_tokens,
    )  # fmt: skip


def _is_folder(path: str | None) -> bool:
    return path is not None and Path(path).is_dir()


def _absolute(path: str | None) -> str | None:
    """A path as the manifest keeps it, so that `probekit report` finds it from anywhere."""
    return None if path is None else str(Path(path).resolve())


def _rows(data: JaemData, args: argparse.Namespace) -> pd.DataFrame:
    return sample_rows(
        len(data.templates), data.dimensions, data.evaluated, _size(data, args), args.seed,
        args.uniform,
    )  # fmt: skip


def _size(data: JaemData, args: argparse.Namespace) -> int:
    return data.dataset_size if args.dataset_size is None else args.dataset_size


STUDY = register(JaemStudy())
