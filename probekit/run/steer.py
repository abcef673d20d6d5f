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
then. Each α's rows are one checksummed part stamped with those settings and carrying each
row's prompt id (`probekit.core.store`): a finished α is read back, not scored again; a
damaged one is set aside (`*.damaged`) and one scored under other settings (a manifest deleted
and the folder run again otherwise) is set aside (`*.mismatched`), one line each, and scored
again; a damaged `headline.json` is computed again from the rows. Every check of the vector (its
file, its shape, a zero vector, a saturating α) comes before anything is written.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probekit.core.io import write_text
from probekit.core.items import EncodedItem
from probekit.core.options import Command, named
from probekit.core.progress import progress, silenced
from probekit.core.public import public
from probekit.core.rundir import RowKey, RunDir
from probekit.core.signal import is_weak
from probekit.core.store import say, take_rows, write_rows
from probekit.engines import load_engine
from probekit.engines.base import Engine
from probekit.engines.options import ModelOptions
from probekit.mechanism import steering, vectors
from probekit.mechanism.sites import chosen_layers, hook_library
from probekit.mechanism.steering import SteerOptions
from probekit.reporting.contract import describe_model
from probekit.reporting.headline import format_number
from probekit.reporting.steering import steer_figure, write_steer_page
from probekit.run.mechanism import (
    context,
    mechanism_command,
    mechanism_settings,
)
from probekit.run.numerics import keep_resumed_tier
from probekit.run.options import build
from probekit.studies.base import VIEWS, Probe, Study

ROWS = "steer.parquet"
HEADLINE = "headline.json"


def check_steer(parsed: tuple) -> None:
    """The steer options' checks that need neither data nor model: the vector's name or file,
    residual-width sites, and positions the hook library can steer."""
    _, options, _ = parsed
    vectors.check_vector_name(options.vector)
    for name in options.sites:
        steering.steering_site(name)
    steering.check_hooks(options.hooks, options.positions)


def steer_command(study: Study) -> Command:
    """`probekit steer STUDY`'s options: the model's, the steering's and the study's."""
    return mechanism_command("steer", SteerOptions, study, (check_steer,))


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


@public(ModelOptions, SteerOptions, command="steer", skip=("model",))
def steer_study(
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
    """`probekit steer STUDY` as a function. `study`: a registered study's name or a `Study`
    object (used as it is); `model`: a model spec or an already loaded model. The keywords are
    the steering's options and the model's (below: `alphas=[-4, 0, 4]`, `layers=[15]`,
    `positions="from_span"`, `vector="mean_diff"`, ...) and the study's (`events=2`), checked
    as the command line checks them (a bad or unknown one is one line of `ProbekitError`
    naming the keyword, before any model work). Writes what the command writes into `out`,
    resumable. `options`: the study's own (`probekit steer STUDY --help`)."""
    found, loaded, parsed = build(steer_command, dict(locals()))
    return steer_parsed(found, parsed, loaded, "probekit.steer_study")


def steer_parsed(
    study: Study, parsed: tuple, model: Any = None, command: str = "probekit steer"
) -> StudySteer:
    """The steering run as the checked options `parsed` say (`steer_command`'s values), on
    `model` or the one they name; its manifest records `command`."""
    with silenced(parsed[0].quiet):
        return _steer(study, parsed, model, command)


def _steer(study: Study, parsed: tuple, model: Any, command: str) -> StudySteer:
    asked, args, own = parsed
    alphas = args.alphas if 0.0 in args.alphas else [0.0, *args.alphas]  # side effects vs α = 0
    sites = [steering.steering_site(name) for name in args.sites]
    contrast = study.mechanism_defaults().contrast  # every study declares one
    file = None
    if args.vector not in vectors.VECTORS:
        file = vectors.read_vector_file(args.vector)  # read and checked before any work
    probe, items = study.mechanism_items(own, context("steer", asked, args))
    probe.refuse_too_few_units(items)  # each α's headline has an interval over units
    span = args.span or contrast.span_of(probe)
    run = RunDir(args.out)
    ids = [item.id for item in items]
    asked_for = asked if model is None else None  # a loaded model's tolerance is its own
    known = settings(study, probe, ids, args, alphas, file, span, sites, None, None, asked_for)
    run.check_resume(known, [k for k, v in known.items() if v is None])  # before the model
    if model is None:
        model = load_engine(asked.model, **asked.load_keywords())
    layers = chosen_layers(model, args.layers or None, "steer")
    encoded = [model.encode(item, getattr(probe, "as_string", False)) for item in items]
    if not keep_resumed_tier(model, run.path):  # a resumed run's rows stay in one tier
        model.settle_precision(probe.answers, [p.input_ids for p in encoded])
    for prompt in encoded:
        steering.prompt_positions(prompt, args.positions, span)
    targets = [(name, layer) for layer in layers for name in sites]
    means = steering.span_means(model, encoded, targets, span, args.hooks)
    if file is not None:
        found = vectors.file_vectors(model, file, targets)
    else:
        side = contrast.side(probe)
        found = vectors.contrast_vectors(  # cross-fitted: each prompt's fold's vector
            model, encoded, targets, args.vector, span, side, args.hooks, means, args.seed
        )
    residual = steering.residual_norms(means)  # what each α·v is said against
    rng = np.random.default_rng(args.seed)
    kinds = {  # the vector, and `controls` random directions of its norm
        t: {steering.STEER: v}
        | {steering.control_name(c): steering.random_like(v, rng) for c in range(args.controls)}
        for t, v in found.items()
    }
    steering.check_strength(model.dtype, found, alphas)  # nothing written before this
    manifest = settings(study, probe, ids, args, alphas, file, span, sites, layers, model)
    manifest["command"] = command
    run.start(manifest)  # the first write; a resumed run records what was asked this time
    asked_now = {k: manifest[k] for k in ("alphas", "vector_file", "command")}
    manifest = run.update_manifest(**asked_now)
    key = RowKey.of(manifest, ids)
    report = {**probe.manifest(), "model": model.name, "seed": args.seed, "view": VIEWS[0]}
    steps = [(t, kind, v, a) for t in targets for kind, v in kinds[t].items() for a in alphas]
    hint = f"fewer {named('layers')} or {named('alphas')}, or fewer prompts"
    frames, rows = _alpha_rows(
        study, probe, model, encoded, steps, args, span, run, key, report, hint, residual
    )
    table = pd.concat(frames, ignore_index=True)
    write_rows(run.path / ROWS, table, key)
    summary = pd.DataFrame(rows)
    write_text(run.path / "summary.csv", summary.to_csv(index=False))
    title = f"{describe_model(manifest)}, {probe.name}: vector {args.vector}, {args.positions}"
    title += f" of {span}"
    figure = steer_figure(summary, run.path / "steer.png", title)
    weak = steering.weak_steps(summary)
    if weak:
        print(f"probekit: warning: {weak}", file=sys.stderr)
    data = study.describe_data(manifest)
    write_steer_page(run.report_path, summary, figure, title, manifest, data, weak)
    return StudySteer(run.path, table, summary, data, weak)


Step = tuple[steering.Target, str, Any, float]
"""(target, vector kind, vector, α): one α run, one part."""


def _alpha_rows(
    study: Study,
    probe: Probe,
    model: Any,
    encoded: list[EncodedItem],
    steps: list[Step],
    args: SteerOptions,
    span: str,
    run: RunDir,
    key: RowKey,
    report: dict[str, Any],
    hint: str,
    residual: dict[steering.Target, float],
) -> tuple[list[pd.DataFrame], list[dict[str, Any]]]:
    """Each step's rows and summary row: read back where its part is finished and verifies,
    else scored (the unsteered base first, once) and written as a part."""
    done = {step: _finished(_folder(run.path, *step[:2], step[3]), key) for step in steps}
    resumed = sum(frame is not None for frame in done.values())
    if resumed:
        say(f"{run.path}: {resumed} of {len(steps)} α runs already done, read back")
    scorer = model.scorer(probe.answers, epsilon=args.epsilon, batch_size=args.batch_size)
    todo = sum(done[s] is None and s[3] != 0 for s in steps)
    base: list[Any] | None = None
    unsteered: dict[Any, Path] = {}  # each target's first α = 0 folder
    frames, rows = [], []
    with progress(todo * len(encoded), "prompt", "steering", hint) as bar:
        for step in steps:
            target, kind, vector, alpha = step
            folder = _folder(run.path, target, kind, alpha)
            frame = done[step]
            if frame is None:
                if base is None:
                    with hook_library(model, args.hooks):  # α = 0 on the kernels of the rest
                        base = list(scorer.score([p.input_ids for p in encoded]))
                frame = probe.add_columns(
                    steer_frame(scorer, encoded, base, target, kind, vector, alpha, args, span, bar)
                )
                write_rows(folder / ROWS, frame, key)
            twin = unsteered.get(target) if alpha == 0 else None
            headline = _headline(study, frame, folder, report, twin)
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


def settings(
    study: Study,
    probe: Probe,
    ids: list[str],
    args: SteerOptions,
    alphas: list[float],
    file: vectors.VectorFile | None,
    span: str,
    sites: list[str],
    layers: list[int] | None,
    model: Any,
    asked: ModelOptions | None = None,
) -> dict[str, Any]:
    """What defines a steering run (its manifest; undeclared fields are resume keys, see
    `probekit.core.rundir.MANIFEST_FIELDS`). Before the model loads (`model` None) the fields
    only the loaded model gives, and the layers, are None, the tolerance that `asked` for."""
    own = {
        "epsilon": args.epsilon,
        "vector": "file" if file is not None else args.vector,
        "vector_sha256": file.sha256 if file is not None else "",
        "vector_file": str(file.path) if file is not None else None,
        "positions": args.positions,
        "controls": args.controls,
        "span": span,
        "sites": sites,
        "layers": layers,
        "hooks": args.hooks,
        "alphas": alphas,
    }
    return mechanism_settings(study, probe, ids, args.seed, model, own, asked)


def _folder(out: Path, target: steering.Target, kind: str, alpha: float) -> Path:
    return out / "alphas" / f"{target[0]}-L{target[1]}-{kind}-a{alpha:g}"


def _finished(folder: Path, key: RowKey) -> pd.DataFrame | None:
    """The α's rows when its part holds one row per prompt of the run, in prompt order, scored
    under its settings (`probekit.core.store`); else None, with a damaged or foreign part set
    aside (one line)."""
    found = take_rows(folder / ROWS, key, "its α is scored again", keep=True, complete=True)
    return None if found is None or found.table is None else found.table.to_pandas()


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
    numbers = ("value", "low", "high", "p_value")
    if (
        isinstance(found, dict)
        and isinstance(found.get("label"), str)
        and all(k in found and isinstance(found[k], int | float | None) for k in numbers)
    ):
        return found
    return None


def steer_frame(
    scorer: Any,
    encoded: list[EncodedItem],
    base: list[Any],
    target: steering.Target,
    kind: str,
    vector: Any,
    alpha: float,
    args: SteerOptions,
    span: str,
    bar: Any = None,
) -> pd.DataFrame:
    """One α's rows: the item's key columns, the score columns and the side effects (`bar`,
    the progress, updated per batch)."""
    results = base
    if alpha != 0:
        results = steering.steered_results(
            scorer,
            encoded,
            target,
            alpha * vector,
            args.positions,
            span,
            args.hooks,
            args.batch_size,
            bar,
        )
    columns = {
        "site": target[0],
        "layer": target[1],
        "vector": kind,
        "norm": steering.norm_of(vector),
        "alpha": alpha,
    }
    return pd.DataFrame(steering.steer_rows(encoded, results, base, scorer.answers, columns))


def study_headline(
    study: Study, frame: pd.DataFrame, folder: Path, manifest: dict[str, Any]
) -> dict[str, Any]:
    """The study's primary headline on these scores, from its own report (files in `folder`)."""
    first = study.headline(frame, folder, manifest)
    return {
        "label": first.label,
        "value": _number(first.value),
        "low": _number(first.low),
        "high": _number(first.high),
        "p_value": _number(first.p_value),
        "interval": first.interval,
        "note": first.note,
    }


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


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if np.isnan(value) else value
