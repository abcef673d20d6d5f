"""`probekit steer STUDY` and `probekit.steer_study`: a study's headline as a function of α, with
α·v added to the residual stream while every prompt is scored (`probekit.mechanism.steering`),
beside a random direction of the same norm, and the side effects (valid mass, KL from the
unsteered distribution).

The vector (`vector`): `mean_diff` or `direction`, from the study's contrast, or a file
(`probekit.mechanism.vectors`). Files in `out`: `steer.parquet` (one row per site, layer, vector,
α and prompt: the item's key columns, the score columns, `kl`, `valid_mass_change`),
`summary.csv` (one row per site, layer, vector and α: the study's headline with its interval
and p, computed by the study's own report, and the mean valid mass, valid mass change and KL),
`steer.png`, `report.html` (`probekit.reporting.steering`), `manifest.json`, and
`alphas/<site>-L<layer>-<vector>-a<α>/` (that α's rows, `steer.parquet`, the study's report
files and `headline.json`).

A steering run is a `RunDir` run: its manifest records what changes a number (the study's
probe, the model's weights, dtype and device, the vector's kind and, for a file, the SHA-256 of
its content, the positions, span, sites, layers, hooks and seed), and a folder holding another
run is refused in one line naming the setting, before the model loads where it can be known
then. Each α is a run of the run loop (`probekit.run.loop.fill`) in its folder, its rows merged
into its `steer.parquet`, stamped with those settings and carrying each row's prompt id: a
finished α is read back, not scored again; a damaged one is set aside (`*.damaged`) and one
scored under other settings (a manifest deleted and the folder run again otherwise) is set
aside (`*.mismatched`), one line each, and scored again; more αs later score only the new ones;
a damaged `headline.json` is computed again from the rows. Every check of the vector (its file,
its shape, a zero vector, a saturating α) comes before anything is written.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probekit.core.io import row_bytes, write_text
from probekit.core.options import named
from probekit.core.public import public
from probekit.core.rundir import RowKey, RunDir
from probekit.core.signal import is_weak
from probekit.core.store import INDEX, say, write_rows
from probekit.engines.base import Engine
from probekit.engines.options import ModelOptions
from probekit.mechanism import steering, vectors
from probekit.mechanism.defaults import Contrast
from probekit.mechanism.sites import chosen_layers, hook_library
from probekit.mechanism.steering import SteerOptions
from probekit.reporting.contract import describe_model
from probekit.reporting.figures import figure_data
from probekit.reporting.headline import format_number
from probekit.reporting.steering import steer_figure, write_steer_page
from probekit.run.command import Job, Options, StudyRunner
from probekit.run.loop import WHOLE, fill, open_run
from probekit.run.parts import finished_scores
from probekit.run.scoring import Chunk, Scoring, pace_key
from probekit.studies.base import VIEWS, Study

ROWS = "steer.parquet"
HEADLINE = "headline.json"
NUMBERS = ("value", "low", "high", "p_value")
"""The numbers of a step's headline (`headline.json`; NaN kept as null)."""
Step = tuple[steering.Target, str, Any, float]
"""(target, vector kind, vector, α): one α run, one folder."""


@dataclass(frozen=True, repr=False)
class StudySteer:
    """What `steer_study` wrote: `path`, the folder (`report.html` in it); `table`, every
    steered row (prompt x site x layer x vector kind x α: the score columns, `kl`,
    `valid_mass_change`); `summary`, one row per site, layer, kind and α (`summary.csv`: the
    study's headline `value` with `low`, `high`, `p_value`, and the step's `norm`,
    `residual_norm`, `push`, `mean_valid_mass`, `weak_signal`, `mean_kl`); `data`, the data read
    as the study describes it (probekit's sample says so); `warning`, the weak-signal line
    (None when every step kept its valid mass). Printed, it is one line."""

    path: Path
    table: pd.DataFrame
    summary: pd.DataFrame
    data: str = ""
    warning: str | None = None

    def __repr__(self) -> str:
        alphas = ", ".join(f"{a:g}" for a in sorted(set(self.summary["alpha"])))
        targets = self.summary[["site", "layer"]].drop_duplicates()
        where = ", ".join(f"L{layer} {site}" for site, layer in targets.itertuples(index=False))
        label = self.summary["label"].iloc[0] if "label" in self.summary else "headline"
        weak = int(self.summary["weak_signal"].sum()) if "weak_signal" in self.summary else 0
        return (
            f"StudySteer({str(self.path)!r}: {label} at α = {alphas} on {where}; "
            f"{len(self.table)} rows, {len(self.summary)} in .summary"
            + (f"; weak signal at {weak} steps" if weak else "")
            + (f"; data: {self.data}" if self.data not in ("", "—") else "")
            + ")"
        )


@public(SteerOptions, command="steer")
def steer_study(
    study: str | Study,
    model: str | Path | Engine | ModelOptions = "default",
    *,
    quiet: bool = False,
    out: str | Path = "runs/steer",
    seed: int = 0,
    batch_size: int | None = None,
    limit: int | None = None,
    layers: Sequence[int] | range | None = None,
    sites: Sequence[str] = ("hook_resid_post",),
    hooks: str = "transformer_lens",
    epsilon: float = 0.0,
    alphas: Sequence[float] = (-4.0, -2.0, 0.0, 2.0, 4.0),
    positions: str = "from_span",
    span: str | None = None,
    controls: int = 3,
    vector: str = "mean_diff",
    **options: Any,
) -> StudySteer:
    """`probekit steer STUDY` as a function. `study`: a registered study's name or a `Study` object
    (used as it is); `model`: a model spec, a `probekit.ModelOptions` (a spec with its loading
    options: dtype, device, ...) or an already loaded model. The keywords are the steering's options
    (below: `alphas=[-4, 0, 4]`, `layers=[15]`, `positions="from_span"`, `vector="mean_diff"`, ...)
    and the study's (`events=2`), checked as the command line checks them (a bad or unknown one is
    one line of `ProbekitError` naming the keyword, before any model work). Writes what the command
    writes into `out`, resumable. `options`: the study's own (`probekit steer STUDY --help`)."""
    return STEER.call(steer_study, dict(locals()))


@dataclass(frozen=True)
class SteerPlan:
    """What a steering run settles before the model: its αs (0 among them), sites, contrast,
    vector file (None for the contrast's) and span."""

    alphas: list[float]
    sites: list[str]
    contrast: Contrast
    file: vectors.VectorFile | None
    span: str


class SteerCommand(StudyRunner):
    """`probekit steer STUDY`: the steering's own lines (its vectors, αs and report)."""

    name, own = "steer", SteerOptions
    writes = (*StudyRunner.writes, ROWS, "steer.png", "alphas/")
    shows = "steer.parquet, summary.csv, steer.png, report.html"
    refreshed = ("alphas", "vector_file", *StudyRunner.refreshed)

    def check(self, options: Options, study: Study | None) -> None:
        """With the mechanism's, the checks that need neither data nor model: the vector's name
        or file, residual-width sites, and positions the hook library can steer."""
        super().check(options, study)
        own = options.own
        vectors.check_vector_name(own.vector)
        for name in own.sites:
            steering.steering_site(name)
        steering.check_hooks(own.hooks, own.positions)

    def prepare(self, job: Job) -> SteerPlan:
        own = job.own
        file = None if own.vector in vectors.VECTORS else vectors.read_vector_file(own.vector)
        contrast = job.study.mechanism_defaults().contrast  # every study declares one
        return SteerPlan(
            own.alphas if 0.0 in own.alphas else [0.0, *own.alphas],  # side effects vs α = 0
            [steering.steering_site(name) for name in own.sites],
            contrast,
            file,
            own.span or contrast.span_of(job.probe),
        )

    def own_fields(self, job: Job, model: Engine | None) -> dict[str, Any]:
        own, plan = job.own, job.plan
        file = plan.file
        return {
            "epsilon": own.epsilon,
            "vector": "file" if file is not None else own.vector,
            "vector_sha256": file.sha256 if file is not None else "",
            "vector_file": str(file.path) if file is not None else None,
            "positions": own.positions,
            "controls": own.controls,
            "span": plan.span,
            "sites": plan.sites,
            "layers": None if model is None else chosen_layers(model, own.layers or None, "steer"),
            "hooks": own.hooks,
            "alphas": plan.alphas,
        }

    def work(self, job: Job, model: Any, manifest: dict[str, Any]) -> StudySteer:
        own, plan, probe, out = job.own, job.plan, job.probe, job.folder
        for prompt in job.encoded:
            steering.prompt_positions(prompt, own.positions, plan.span)
        targets = [(name, layer) for layer in manifest["layers"] for name in plan.sites]
        means = steering.span_means(model, job.encoded, targets, plan.span, own.hooks)
        if plan.file is not None:
            found = vectors.file_vectors(model, plan.file, targets)
        else:
            if len({item.unit for item in job.items}) == 1:
                print(f"probekit: warning: {ONE_UNIT}", file=sys.stderr)
            side = plan.contrast.side(probe)
            found = vectors.contrast_vectors(  # cross-fitted: each prompt's fold's vector
                model, job.encoded, targets, own.vector, plan.span, side, own.hooks, means, own.seed
            )
        kinds = steering.with_controls(found, own.controls, own.seed)
        steering.check_strength(model.dtype, found, plan.alphas)  # nothing written before this
        steps = [(t, k, v, a) for t in targets for k, v in kinds[t].items() for a in plan.alphas]
        with open_run(out, WHOLE, manifest):
            manifest = RunDir(out).update_manifest(**{k: manifest[k] for k in self.refreshed})
            key = RowKey.of(manifest, [item.id for item in job.items])
            frames, rows = self.steps(job, model, steps, key, steering.residual_norms(means))
        table = pd.concat(frames, ignore_index=True)
        write_rows(out / ROWS, table, key)
        summary = pd.DataFrame(rows)
        write_text(out / "summary.csv", summary.to_csv(index=False))
        title = f"{describe_model(manifest)}, {probe.name}: vector {own.vector}, {own.positions}"
        title += f" of {plan.span}"
        figure = steer_figure(summary, out / "steer.png", title)
        manifest = RunDir(out).update_manifest(
            figures=figure_data(out, ("steer.png", "alphas/*/*.png"))
        )
        weak = steering.weak_steps(summary)
        if weak:
            print(f"probekit: warning: {weak}", file=sys.stderr)
        data = job.study.describe_data(manifest)
        write_steer_page(RunDir(out).report_path, summary, figure, title, manifest, data, weak)
        return StudySteer(out, table, summary, data, weak)

    def steps(
        self,
        job: Job,
        model: Any,
        steps: list[Step],
        key: RowKey,
        residual: dict[steering.Target, float],
    ) -> tuple[list[pd.DataFrame], list[dict[str, Any]]]:
        """Each step's rows and summary row: read back where its folder holds them, else
        scored by the run loop (the unsteered base first, once)."""
        own, probe, out = job.own, job.probe, job.folder
        folders = {s: out / "alphas" / f"{s[0][0]}-L{s[0][1]}-{s[1]}-a{s[3]:g}" for s in steps}
        done = {step: finished_scores(folders[step], key, ROWS) for step in steps}
        resumed = sum(path is not None for path in done.values())
        if resumed:
            say(f"{out}: {resumed} of {len(steps)} α runs already done, read back")
        scorer = model.scorer(probe.answers, epsilon=own.epsilon, batch_size=own.batch_size)
        pace = pace_key(model.describe(), probe.answers, "steer")
        base: dict[int, Any] = {}  # the unsteered results, scored once
        report = {**probe.manifest(), "model": model.name, "seed": own.seed, "view": VIEWS[0]}
        report |= probe.interval_fields(job.items)
        hint = f"fewer {named('layers')} or {named('alphas')}, or fewer prompts"
        steered = functools.partial(
            fill, lambda: job.items, hint=hint, merged=ROWS, keep_parts=False
        )
        unsteered: dict[Any, Path] = {}  # each target's first α = 0 folder
        frames, rows = [], []
        for step in steps:
            target, kind, _, alpha = step
            folder = folders[step]
            start = functools.partial(steer_scoring, scorer, job, step, base, pace)
            path = done[step] or steered(f"{probe.name} {folder.name}", folder, key, start)
            assert path is not None  # one process: every prompt has its row
            frame = pd.read_parquet(path).drop(columns=INDEX)
            twin = unsteered.get(target) if alpha == 0 else None
            headline = _headline(job.study, frame, folder, report, twin)
            if alpha == 0:
                unsteered.setdefault(target, folder)
            row = {**summary_row(frame, residual[target]), **headline}
            if done[step] is None:
                weak = f"; weak signal: valid mass {row['mean_valid_mass']:.2g}"
                print(
                    f"layer {target[1]} {target[0]}, {kind}, α={alpha:g} (push "
                    f"{row['push']:.2g}): {headline['label']} "
                    f"{format_number(headline['value'], signed=True)}"
                    + (weak if row["weak_signal"] else "")
                )
            frames.append(frame)
            rows.append(row)
        return frames, rows


STEER = SteerCommand()
ONE_UNIT = (
    "one unit: the vector is fitted on the prompts it steers, not cross-fitted on other units; "
    "give two or more for a vector that has not seen the prompts it moves"
)


def steer_scoring(scorer: Any, job: Job, step: Step, base: dict[int, Any], key: str) -> Scoring:
    """One α step's prompts in one chunk, steered by α·v (at α = 0 unsteered), each beside its
    unsteered result (`base`: scored once, on the first step that needs it, and kept)."""
    own, plan, encoded = job.own, job.plan, job.encoded
    target, kind, vector, alpha = step

    def score(chunk: Chunk, bar: Any) -> pd.DataFrame:
        index = [i for i, _ in chunk]
        prompts = [encoded[i] for i in index]
        if missing := [i for i in index if i not in base]:
            with hook_library(scorer.model, own.hooks):  # on the kernels of the rest
                ids = [encoded[i].input_ids for i in missing]
                found = scorer.score(ids, progress=bar if alpha == 0 else None)
                base.update(zip(missing, found, strict=True))
        elif alpha == 0 and bar is not None:
            bar.update(len(index))
        unsteered = [base[i] for i in index]
        results = unsteered
        if alpha != 0:
            added = alpha * (vector[index] if vector.dim() == 2 else vector)
            where = (own.positions, plan.span, own.hooks)
            results = steering.steered_results(
                scorer, prompts, target, added, *where, own.batch_size, bar
            )
        columns = {"site": target[0], "layer": target[1], "vector": kind}
        columns |= {"norm": steering.norm_of(vector), "alpha": alpha}
        rows = steering.steer_rows(prompts, results, unsteered, scorer.answers, columns)
        return job.probe.add_columns(pd.DataFrame(rows).assign(**{INDEX: index}))

    desc = f"steering {target[0]} L{target[1]} {kind} α={alpha:g}"
    size = 2 * row_bytes(len(job.probe.answers.answers))  # steered and not
    return Scoring(desc, len(job.items), key, score, row_bytes=size)


def _headline(
    study: Study, frame: pd.DataFrame, folder: Path, report: dict[str, Any], twin: Path | None
) -> dict:
    """The α's headline: `headline.json` when it is whole; else, at α = 0, the report of
    `twin` (another vector's α = 0 folder: the same unsteered scores) copied; else the study's
    report on the rows (written again)."""
    found = _whole_headline(folder)
    if found is not None:
        return found
    if twin is not None and (found := _whole_headline(twin)) is not None:
        # the headline last: a copy cut short is made again on resuming
        for path in sorted(twin.iterdir(), key=lambda p: p.name == HEADLINE):
            if path.is_dir():
                shutil.copytree(path, folder / path.name, dirs_exist_ok=True)
            elif path.name != ROWS:
                shutil.copyfile(path, folder / path.name)
        return found
    headline = study_headline(study, frame, folder, report)
    write_text(folder / HEADLINE, json.dumps(headline, indent=1))
    return headline


def _whole_headline(folder: Path) -> dict | None:
    """`folder`'s `headline.json` when it is whole, else None."""
    try:
        found = json.loads((folder / HEADLINE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("label"), str):
        return None
    numbers = [found.get(k, "") for k in NUMBERS]  # "" where one is missing: not whole
    return found if all(isinstance(n, int | float | None) for n in numbers) else None


def study_headline(
    study: Study, frame: pd.DataFrame, folder: Path, manifest: dict[str, Any]
) -> dict[str, Any]:
    """The study's primary headline on these scores, from its own report (files in `folder`)."""
    first = study.headline(frame, folder, manifest)
    found = {name: getattr(first, name) for name in ("label", *NUMBERS, "interval", "note")}
    numbers = {name: found[name] for name in NUMBERS}  # NaN as None (null in its JSON)
    return found | {k: None if v is None or np.isnan(v) else float(v) for k, v in numbers.items()}


def summary_row(frame: pd.DataFrame, residual_norm: float) -> dict[str, Any]:
    """One α's size and side effects: the vector's norm, the residual's typical norm at the
    span and the push |α|·norm / residual_norm; the mean valid mass, its change, whether it is
    a weak signal, and the mean KL."""
    first = frame.iloc[0]
    mass = float(frame["valid_mass"].mean())
    norm, alpha = float(first["norm"]), float(first["alpha"])
    return {
        "site": first["site"],
        "layer": int(first["layer"]),
        "vector": first["vector"],
        "alpha": alpha,
        "norm": norm,
        "residual_norm": residual_norm,
        "push": abs(alpha) * norm / residual_norm if residual_norm > 0 else float("nan"),
        "mean_valid_mass": mass,
        "mean_valid_mass_change": float(frame["valid_mass_change"].mean()),
        "weak_signal": is_weak(mass),
        "mean_kl": float(frame["kl"].mean()),
        "prompts": len(frame),
    }
