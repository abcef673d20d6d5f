"""`probekit patch STUDY` and `probekit.patch_study`: a study's items traced inside the model
(patching, attribution, mediation and the study's direction; `probekit.mechanism.pipeline`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.core.options import Command
from probekit.core.progress import silenced
from probekit.core.public import public
from probekit.engines import load_engine
from probekit.engines.base import Engine
from probekit.engines.options import ModelOptions
from probekit.mechanism.api import hookable
from probekit.mechanism.pipeline import PatchOptions, check_patch, check_patch_options, run_patch
from probekit.mechanism.sites import DEFAULT_SITES
from probekit.run.mechanism import context, mechanism_command
from probekit.run.options import build
from probekit.studies.base import Study


def patch_command(study: Study) -> Command:
    """`probekit patch STUDY`'s options: the model's, the patch's and the study's."""
    return mechanism_command("patch", PatchOptions, study, (_check,))


def _check(parsed: tuple) -> None:
    """The patch options that cannot go together, refused while parsing (no data, no model)."""
    check_patch_options(parsed[1])


@dataclass(frozen=True, repr=False)
class StudyPatch:
    """What `patch_study` wrote: `path`, the folder; `files`, the files written there;
    `table`, the patching table (`patching.parquet`: one row per pair x component, see
    `probekit.mechanism.patching.sweep`); `summary`, per component over the pairs
    (`patching_summary.csv`: `status`, `effect`, `recovery` with their intervals over units,
    `p_value`, `p_adjusted`, `pairs`, `mean_valid_mass_patched`, `weak_signal`, the measured
    components first, largest |effect| first). Printed, it is one line."""

    path: Path
    files: list[str]
    table: pd.DataFrame
    summary: pd.DataFrame

    def __repr__(self) -> str:
        pairs = self.table[["clean_prompt_id", "corrupt_prompt_id"]].drop_duplicates()
        top = ""
        measured = self.summary[
            self.summary["status"] == "measured"
        ]  # not those known by construction
        if len(measured) and "recovery" in measured:
            first = measured.iloc[0]
            head = "" if pd.isna(first["head"]) else f" head {int(first['head'])}"
            top = (
                f"; largest effect L{first['layer']} {first['site']}{head} at {first['span']} "
                f"(recovery {first['recovery']:.3g})"
            )
        weak = int(self.summary["weak_signal"].sum()) if "weak_signal" in self.summary else 0
        return (
            f"StudyPatch({str(self.path)!r}: {len(self.summary)} components x {len(pairs)} "
            f"pairs{top}" + (f"; weak signal at {weak} components" if weak else "") + ")"
        )


@public(ModelOptions, PatchOptions, command="patch", skip=("model",))
def patch_study(
    study: str | Study,
    model: str | Path | Engine = "default",
    *,
    dtype: Any = None,
    device: Any = None,
    engine: str = "hf",
    device_map: str | dict[str, Any] | None = None,
    max_memory: str | dict[str, Any] | None = None,
    offload_folder: str | Path | None = None,
    tolerance: float | None = None,
    quiet: bool = False,
    out: str | Path = "runs/patch",
    seed: int = 0,
    batch_size: int | None = None,
    limit: int | None = None,
    layers: Sequence[int] | range | None = None,
    sites: Sequence[str] = DEFAULT_SITES,
    hooks: str = "transformer_lens",
    spans: Sequence[str] | None = None,
    heads: Sequence[int] | None = None,
    readout: str | None = None,
    method: str = "exact",
    top_k: int = 20,
    sets_per_unit: int | None = None,
    per_position: bool = False,
    mediation: bool = False,
    bootstrap: int = 1000,
    prompt_only: bool = False,
    controls: int = 5,
    skip_direction: bool = False,
    **options: Any,
) -> StudyPatch:
    """`probekit patch STUDY` as a function. `study`: a registered study's name or a `Study`
    object (used as it is); `model`: a model spec or an already loaded model. The keywords are
    the patch's options and the model's (below: `layers=[0, 14]`, `sites=["resid_pre"]`,
    `prompt_only=True`, `dtype=torch.bfloat16`, ...) and the study's (`events=2`), checked as
    the command line checks them (a bad or unknown one is one line of `ProbekitError` naming
    the keyword, before any model work). Writes what the command writes into `out` and returns
    it. `options`: the study's own (`probekit patch STUDY --help`)."""
    found, loaded, parsed = build(patch_command, dict(locals()))
    written = patch_parsed(found, parsed, loaded)
    folder = Path(parsed[1].out)
    summary = pd.read_csv(folder / "patching_summary.csv")
    return StudyPatch(folder, written, pd.read_parquet(folder / "patching.parquet"), summary)


def patch_parsed(study: Study, parsed: tuple, model: Any = None) -> list[str]:
    """The patch analysis as the checked options `parsed` say (`patch_command`'s values), on
    `model` or the one they name: items, the checks that need no model, then the analysis; the
    files written."""
    asked, options, own = parsed
    probe, items = study.mechanism_items(own, context("patch", asked, options))
    check_patch(options, items, probe.answers, study.mechanism_defaults())  # no model yet
    if model is None:
        model = load_engine(asked.model, **asked.load_keywords())
    with silenced(asked.quiet):
        return run_patch(hookable(model), study, probe, items, options, options.out)
