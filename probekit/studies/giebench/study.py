"""GIEBench as a registered `Study`: options, the probe over the chosen items, the report, and
the identity-mismatch patching pairs."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.errors import ProbekitError
from probekit.items import EncodedItem, Item, Pair
from probekit.options import comma_list
from probekit.studies.base import Say, Study, register
from probekit.studies.giebench import report
from probekit.studies.giebench.judge import PROMPT_TYPES, check_prompt_type
from probekit.studies.giebench.probe import MAX_NEW_TOKENS, GIEBenchProbe
from probekit.studies.giebench.sources import Record, resolve_items


class GIEBenchStudy(Study):
    name = "giebench"
    title = "GIEBench (Wang et al. 2024): identity-based empathy verdicts over four answers"
    modes = ("ev", "explain", "generate")
    default_out = "runs/giebench"
    unit_name = "item"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--items", default=None,
            help="a folder with the official Raw/ID/COT-Prompt.json, a records file, or "
            "'sample' (default: the official files, found or downloaded, else the sample)",
        )  # fmt: skip
        parser.add_argument(
            "--prompt", type=comma_list, default=list(PROMPT_TYPES), help="raw,id,cot or a subset"
        )
        parser.add_argument("--orders", type=int, default=1, help="cyclic answer orders, 1-4")
        parser.add_argument(
            "--no-chat-template", action="store_true",
            help="send the prompt as raw text, as GIEBench's local-model inference does",
        )  # fmt: skip
        parser.add_argument(
            "--no-mismatch", action="store_true", help="skip the identity-mismatch prompts"
        )
        parser.add_argument(
            "--max-new-tokens", type=int, default=MAX_NEW_TOKENS,
            help="explain/generate: generation budget per prompt",
        )  # fmt: skip

    def probes(self, args: argparse.Namespace, say: Say) -> list[GIEBenchProbe]:
        prompt_types = [check_prompt_type(t) for t in args.prompt]
        if args.max_new_tokens < 1:
            raise ProbekitError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
        source = resolve_items(args.items, prompt_types)
        if source.origin == "sample":
            say("items: probekit's own sample records (NOT GIEBench). " + source.message)
        else:
            say(f"items: {source.origin} from {source.path}")
        probe = GIEBenchProbe(
            source.units, prompt_types, mode=args.mode, orders=args.orders,
            chat=not args.no_chat_template, mismatch=not args.no_mismatch,
            max_new_tokens=args.max_new_tokens,
            extra={"items_origin": source.origin, "items_path": str(source.path)},
        )  # fmt: skip
        for _ in probe.items():  # refuse an unparsable official prompt before the model loads
            pass
        return [probe]

    def report(self, scores: pd.DataFrame, run_dir: Path, manifest: dict[str, Any]) -> list[dict]:
        rows = report.report_run(scores, run_dir, manifest["mode"], manifest.get("seed", 0))
        return [{"model": manifest["model"], **row} for row in rows]

    def write_summary(self, rows: list[dict[str, Any]], out: Path) -> str:
        return report.write_summary(rows, out)

    def add_mechanism_arguments(self, parser: argparse.ArgumentParser, default_events: int) -> None:
        parser.add_argument("--items", default="sample", help="a records file, or 'sample'")
        parser.add_argument("--prompt", default="cot", choices=("id", "cot"))
        parser.add_argument(
            "--events", type=int, default=default_events,
            help=f"number of records with a mismatch identity (default {default_events})",
        )  # fmt: skip
        parser.add_argument("--no-chat-template", action="store_true")

    def mechanism_defaults(self) -> dict[str, Any]:
        return {"spans": ["identity"], "metric": "p_correct"}

    def mechanism_items(
        self, args: argparse.Namespace, say: Say, purpose: str
    ) -> tuple[GIEBenchProbe, list[Item]]:
        """The first `--events` records that have a mismatch identity, each with its own
        identity and the swapped one, in the direct (prefilled) view of one prompt type."""
        source = resolve_items(args.items, [args.prompt])
        if not all(isinstance(u, Record) for u in source.units):
            raise ProbekitError("patching swaps identities, so it needs item records (--items)")
        probe = GIEBenchProbe(source.units, [args.prompt], chat=not args.no_chat_template)
        units = [u for u in source.units if u.id in probe.swap][: max(args.events, 1)]
        if not units:
            raise ProbekitError("no record has another identity of its category to swap in")
        probe.units = units
        items = [replace(item, key={k: v for k, v in item.key.items() if k != "prompt"})
                 for item in probe.items()]  # fmt: skip
        return probe, items

    def pairs(self, probe: GIEBenchProbe, encoded: Sequence[EncodedItem]) -> list[Pair]:
        """Each item with its own identity (clean) and with the swapped one (corrupt)."""
        own = {(e.item.unit, e.item.key["prompt_type"]): e for e in encoded
               if not e.item.key["mismatch"]}  # fmt: skip
        return [(own[(e.item.unit, e.item.key["prompt_type"])], e)
                for e in encoded if e.item.key["mismatch"]]  # fmt: skip


STUDY = register(GIEBenchStudy())
