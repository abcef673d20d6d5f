"""GIEBench as a registered `Study`: options, the probe over the chosen items, the report, and
the identity-mismatch patching pairs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from probekit.core.errors import ProbekitError
from probekit.core.items import Item
from probekit.core.kinds import Kind, comma_list, int_range, positive_int, text
from probekit.core.options import named, option
from probekit.mechanism.defaults import Contrast, Difference, MechanismDefaults
from probekit.reporting.contract import SAMPLE_DATA
from probekit.studies.base import (
    MECHANISM,
    Context,
    Study,
    mechanism_slice,
    register,
    run_help,
    run_option,
)
from probekit.studies.giebench.judge import OPTIONS as VERDICTS
from probekit.studies.giebench.judge import PROMPT_TYPES, check_prompt_type
from probekit.studies.giebench.probe import MAX_NEW_TOKENS, GIEBenchProbe
from probekit.studies.giebench.sources import Record, resolve_items

prompt_types = Kind(
    "prompt types",
    comma_list.parse,
    lambda value: [check_prompt_type(name) for name in comma_list.check(value)],
)
"""Some of GIEBench's prompt types (raw, id, cot)."""


_ITEMS = "a folder with the official Raw/ID/COT-Prompt.json, a records file, or 'sample'"


@dataclass(frozen=True)
class GIEBenchOptions:
    """giebench options."""

    items: str | None = option(
        None,
        help=run_help(
            f"{_ITEMS} (default: the official files, found or downloaded, else the sample)",
            f"{_ITEMS}; records, which swap identities (default %(default)s)",
        ),
        kind=text,
        defaults={command: "sample" for command in MECHANISM},
    )
    prompt: list[str] = option(
        tuple(PROMPT_TYPES),
        help=run_help(
            "raw,id,cot or a subset (default %(default)s)",
            "id,cot or a subset: the prompt types that name an identity (default %(default)s)",
        ),
        kind=prompt_types,
        defaults={command: ("cot",) for command in MECHANISM},
    )
    orders: int = run_option(
        1, f"cyclic answer orders, 1-{len(VERDICTS)}", int_range(1, len(VERDICTS))
    )
    no_chat_template: bool = option(
        False, help="send the prompt as raw text, as GIEBench's local-model inference does"
    )
    no_mismatch: bool = run_option(False, "skip the identity-mismatch prompts")
    max_new_tokens: int = run_option(
        MAX_NEW_TOKENS,
        "explain/generate: generation budget per prompt (default %(default)s)",
        positive_int,
    )


class GIEBenchStudy(Study):
    name = "giebench"
    title = "GIEBench (Wang et al. 2024): identity-based empathy verdicts over four answers"
    run_views = ("exact", "explain", "generate")
    unit_name = "item"
    interval_columns = ("ci_low", "ci_high")
    pair_within = ("prompt_type",)  # each item with its own identity and the swapped one
    options = GIEBenchOptions

    def check(self, options: GIEBenchOptions, context: Context) -> None:
        if context.command in MECHANISM and "raw" in options.prompt:
            raise ProbekitError(
                f"{context.command} swaps identities: {named('prompt')} takes id and/or cot"
            )

    def probes(self, options: GIEBenchOptions, context: Context) -> list[GIEBenchProbe]:
        probe = self.probe(options, context, view=context.view, orders=options.orders)
        list(probe.items())  # refuse an unparsable official prompt before the model loads
        return [probe]

    def probe(self, options: GIEBenchOptions, context: Context, **given: Any) -> GIEBenchProbe:
        """The probe over the items `--items` names (saying where they came from), with the
        options every command shares and the `given` ones."""
        units, fields = resolve_items(options.items, options.prompt, context.say)
        if context.command == "run":
            given |= {"mismatch": not options.no_mismatch, "max_new_tokens": options.max_new_tokens}
        chat = not options.no_chat_template
        return GIEBenchProbe(units, options.prompt, chat=chat, extra=fields, **given)

    def views(self, view: str) -> list[str]:
        """The run's own view only (its summary rows name it)."""
        return [view]

    def describe_data(self, manifest: Mapping[str, Any]) -> str:
        """GIEBench's items (official or a local file), or probekit's sample records."""
        origin = manifest.get("data_origin")
        if origin == "sample":
            return f"{SAMPLE_DATA} records, not GIEBench"
        return f"GIEBench items ({origin}: {manifest.get('data_path', '?')})"

    def mechanism_defaults(self) -> MechanismDefaults:
        return MechanismDefaults(
            effect=Difference(), contrast=OWN_IDENTITY, spans=("identity",), readout="p_correct"
        )

    def mechanism_items(
        self, options: GIEBenchOptions, context: Context
    ) -> tuple[GIEBenchProbe, list[Item]]:
        """The slice (`mechanism_slice`) of the records that have a mismatch identity, each
        with its own identity and the swapped one, in the exact (prefilled) view of the prompt
        types."""
        probe = self.probe(options, context)
        if not all(isinstance(u, Record) for u in probe.units):
            raise ProbekitError(
                f"{context.command} swaps identities, so it needs item records ({named('items')})"
            )
        probe.units = [u for u in probe.units if u.id in probe.swap]
        if not probe.units:
            raise ProbekitError("no record has another identity of its category to swap in")
        sliced = mechanism_slice(probe, context)
        items = [
            replace(item, key={k: v for k, v in item.key.items() if k != "prompt"})
            for item in sliced.items()
        ]
        return sliced, items  # type: ignore[return-value]


OWN_IDENTITY = Contrast(
    "own identity vs swapped identity",
    "identity",
    lambda probe: lambda e: not e.item.key["mismatch"],
)
"""Each item with its own identity, against the same item with another identity of its
category (the identity-mismatch prompts), at the identity sentence."""

STUDY = register(GIEBenchStudy())
