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

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probekit.core.errors import ProbekitError
from probekit.core.io import write_text
from probekit.core.items import EncodedItem
from probekit.core.options import Command, Spell, flag, keyword
from probekit.core.progress import progress, silenced
from probekit.core.rundir import RESULTS_FORMAT, RowKey, RunDir, device_kind
from probekit.core.store import say, take_rows, write_rows
from probekit.engines import load_engine
from probekit.engines.hf.tiers import settle_precision
from probekit.mechanism import steering, vectors
from probekit.mechanism.sites import hook_library, layer_indices
from probekit.mechanism.steering import SteerOptions
from probekit.reporting.headline import format_number
from probekit.reporting.steering import steer_figure, write_steer_page
from probekit.run.mechanism import build, context, mechanism_command, study_object
from probekit.studies.base import VIEWS, Probe, Study

ROWS = "steer.parquet"
HEADLINE = "headline.json"
OLD_SETTINGS = "steer.json"
"""Where steering runs of earlier versions kept their settings (not resumed)."""


def check_steer(parsed: tuple, spell: Spell) -> None:
    """The steer options' checks that need neither data nor model: the vector's name or file,
    and positions the hook library can steer."""
    _, options, _ = parsed
    vectors.check_vector_name(options.vector, spell)
    steering.check_hooks(options.hooks, options.positions, spell)


def steer_command(study: Study) -> Command:
    """`probekit steer STUDY`'s options: the model's, the steering's and the study's."""
    return mechanism_command("steer", SteerOptions, study, {"out": "runs/steer"}, (check_steer,))


@dataclass(frozen=True)
class StudySteer:
    """What `steer_study` wrote: the folder, every steered row (prompt x site x layer x vector
    kind x α) and the summary (per site, layer, kind and α: the study's headline with its
    interval, mean valid mass, mean KL from α = 0)."""

    path: Path
    table: pd.DataFrame
    summary: pd.DataFrame


def steer_study(study: str | Study, model: Any = "default", **options: Any) -> StudySteer:
    """`probekit steer STUDY` as a function. `study`: a registered study's name or a `Study`
    object (used as it is); `model`: a model spec or an already loaded model. `options`: the
    steering's (`probekit.mechanism.steering.SteerOptions`: `alphas=[-4, 0, 4]`, `layers=[15]`,
    `positions="from_span"`, `vector="mean_diff"`, `out`, ...), the model's and the study's
    (`events=2`), checked as the command line checks them (a bad or unknown one is one line of
    `ProbekitError` naming the keyword, before any model work). Writes what the command writes
    into `out` (default `runs/steer`), resumable."""
    found = study_object(study)
    loaded, parsed = build(steer_command(found), found, model, options)
    return steer_parsed(found, parsed, loaded, keyword)


def steer_parsed(study: Study, parsed: tuple, model: Any = None, spell: Spell = flag) -> StudySteer:
    """The steering run as the checked options `parsed` say (`steer_command`'s values), on
    `model` or the one they name."""
    with silenced(parsed[0].quiet):
        return _steer(study, parsed, model, spell)


def _steer(study: Study, parsed: tuple, model: Any, spell: Spell) -> StudySteer:
    asked, args, own = parsed
    alphas = args.alphas if 0.0 in args.alphas else [0.0, *args.alphas]  # side effects vs α = 0
    sites = [steering.steering_site(name) for name in args.sites]
    contrast = study.mechanism_defaults().contrast  # every study declares one
    file = None
    if args.vector not in vectors.VECTORS:
        file = vectors.read_vector_file(args.vector, spell)  # read and checked before any work
    probe, items = study.mechanism_items(own, context("steer", asked, args, spell))
    span = args.span or contrast.span_of(probe)
    run = RunDir(args.out)
    refuse_old_folder(run.path)
    ids = [item.id for item in items]
    known = settings(study, probe, ids, args, alphas, file, span, sites, None, None)
    run.check_resume(known, [k for k, v in known.items() if v is None])  # before the model
    if model is None:
        model = load_engine(asked.model, **asked.load_keywords())
    layers = layer_indices(model, args.layers) if args.layers else [model.n_layers // 2]
    encoded = [model.encode(item, getattr(probe, "as_string", False)) for item in items]
    settle_precision(model, probe.answers, [p.input_ids for p in encoded])
    for prompt in encoded:
        steering.prompt_positions(prompt, args.positions, span)
    targets = [(name, layer) for layer in layers for name in sites]
    if file is not None:
        found = vectors.file_vectors(model, file, targets, spell)
    else:
        side = contrast.side(probe)
        found = vectors.contrast_vectors(
            model, encoded, targets, args.vector, span, side, args.hooks
        )
    rng = np.random.default_rng(args.seed)
    kinds = {
        t: {steering.STEER: v, steering.RANDOM: steering.random_like(v, rng)}
        for t, v in found.items()
    }
    steering.check_strength(model.dtype, found, alphas)  # nothing written before this
    manifest = settings(study, probe, ids, args, alphas, file, span, sites, layers, model)
    manifest["command"] = "probekit steer" if spell is flag else "probekit.steer_study"
    run.start(manifest)  # the first write; a resumed run records what was asked this time
    asked_now = {k: manifest[k] for k in ("alphas", "vector_file", "command")}
    manifest = run.update_manifest(**asked_now)
    key = RowKey.of(manifest, ids)
    report = {**probe.manifest(), "model": model.name, "seed": args.seed, "view": VIEWS[0]}
    steps = [(t, kind, v, a) for t in targets for kind, v in kinds[t].items() for a in alphas]
    hint = f"fewer {spell('layers')} or {spell('alphas')}, or fewer prompts"
    frames, rows = _alpha_rows(
        study, probe, model, encoded, steps, args, span, run, key, report, hint
    )
    table = pd.concat(frames, ignore_index=True)
    write_rows(run.path / ROWS, table, key)
    summary = pd.DataFrame(rows)
    write_text(run.path / "summary.csv", summary.to_csv(index=False))
    title = f"{model.name}, {probe.name}: vector {args.vector}, {args.positions} of {span}"
    figure = steer_figure(summary, run.path / "steer.png", title)
    write_steer_page(
        run.report_path, summary, figure, title, manifest, study.describe_data(manifest)
    )
    return StudySteer(run.path, table, summary)


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
) -> tuple[list[pd.DataFrame], list[dict[str, Any]]]:
    """Each step's rows and summary row: read back where its part is finished and verifies,
    else scored (the unsteered base first, once) and written as a part."""
    done = {step: _finished(_folder(run.path, *step[:2], step[3]), key) for step in steps}
    resumed = sum(frame is not None for frame in done.values())
    if resumed:
        say(f"{run.path}: {resumed} of {len(steps)} α runs already done, read back")
    scorer = model.scorer(probe.answers, epsilon=0.0, batch_size=args.batch_size)
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
            if done[step] is None:
                print(
                    f"layer {target[1]} {target[0]}, {kind}, α={alpha:g}: "
                    f"{headline['label']} {format_number(headline['value'], signed=True)}"
                )
            frames.append(frame)
            rows.append({**summary_row(frame), **headline})
    return frames, rows


def refuse_old_folder(out: Path) -> None:
    """One line for a folder of a steering run of an earlier probekit (`steer.json`, no
    manifest): its files stay readable, it is not resumed."""
    if (out / OLD_SETTINGS).is_file() and not (out / "manifest.json").is_file():
        raise ProbekitError(
            f"{out} holds a steering run of an earlier probekit ({OLD_SETTINGS}), which this one "
            "does not resume; its steer.parquet, summary.csv and report.html stay readable: give "
            "another --out, or delete the folder to run it again"
        )


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
) -> dict[str, Any]:
    """What defines a steering run (its manifest; undeclared fields are resume keys, see
    `probekit.core.rundir.SETTINGS`). Before the model loads (`model` None) the fields only the
    loaded model gives, and the layers, are None."""
    described = model.describe() if model is not None else {}
    manifest = {
        "results_format": RESULTS_FORMAT,
        "study": study.name,
        "model": described.get("model"),
        "model_source": described.get("model_source"),
        "weights": described.get("weights"),
        "dtype": described.get("dtype"),
        "device": device_kind(described.get("device")),
        "device_map": described.get("device_map"),
        "precision": described.get("precision"),
        "engine": "hf",
        "probe": probe.config(),
        "view": VIEWS[0],
        "epsilon": 0.0,
        "seed": args.seed,
        "vector": "file" if file is not None else args.vector,
        "vector_sha256": file.sha256 if file is not None else "",
        "vector_file": str(file.path) if file is not None else None,
        "positions": args.positions,
        "span": span,
        "sites": sites,
        "layers": layers,
        "hooks": args.hooks,
        "prompt_ids_sha256": _ids_digest(ids),
        "prompts": len(ids),
        "alphas": alphas,
        **probe.manifest(),
    }
    return json.loads(json.dumps(manifest, default=str))  # as it reads back from the file


def _ids_digest(ids: list[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


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
        "norm": float(vector.norm()),
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


def summary_row(frame: pd.DataFrame) -> dict[str, Any]:
    """The side effects of one α: mean valid mass, its change and the mean KL."""
    first = frame.iloc[0]
    return {
        "site": first["site"],
        "layer": int(first["layer"]),
        "vector": first["vector"],
        "alpha": float(first["alpha"]),
        "norm": float(first["norm"]),
        "mean_valid_mass": float(frame["valid_mass"].mean()),
        "mean_valid_mass_change": float(frame["valid_mass_change"].mean()),
        "mean_kl": float(frame["kl"].mean()),
        "prompts": len(frame),
    }


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if np.isnan(value) else value
