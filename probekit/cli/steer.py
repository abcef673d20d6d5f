"""`probekit steer STUDY`: a study's headline as a function of α, with α·v added to the residual
stream while every prompt is scored (probekit.mechanism.steering), beside a random direction of
the same norm, and the side effects (valid mass, KL from the unsteered distribution).

The vector (`--vector`): `mean_diff`, the mean over the study's contrast (intergroup: in-group
prompts) minus the mean over the others of each prompt's activation averaged over the span, at
each (site, layer); `direction`, the same as a unit vector (the contrast direction of
probekit.mechanism.directions); or a file (.npy, .pt, .safetensors) holding one [d_model] vector
or one per layer ([n_layers, d_model]).

Files in `--out`: `steer.parquet` (one row per site, layer, vector, α and prompt: the item's key
columns, the score columns, `kl`, `valid_mass_change`), `summary.csv` (one row per site, layer,
vector and α: the study's headline with its interval and p, computed by the study's own report,
and the mean valid mass, valid mass change and KL), `steer.png`, `report.html`, and
`alphas/<site>-L<layer>-<vector>-a<α>/` (that α's rows, the study's report files and headline).
A run is resumable: a finished α has its folder and is read back, not scored again; a folder
holding a run with other settings is refused.
"""

from __future__ import annotations

import base64
import html
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from probekit.cli.patch import context, mechanism_command, study_object
from probekit.core.errors import ProbekitError
from probekit.core.io import write_parquet, write_text
from probekit.core.items import EncodedItem
from probekit.core.options import Command, Spell, flag, keyword
from probekit.core.progress import progress, silenced
from probekit.engines import load_engine
from probekit.engines.hf.tiers import settle_precision
from probekit.engines.options import loaded_engine
from probekit.mechanism import steering
from probekit.mechanism.directions import diff_of_means
from probekit.mechanism.sites import hook_library, layer_indices
from probekit.mechanism.steering import SteerOptions
from probekit.reporting.figures import new_figure, save_figure
from probekit.reporting.headline import format_number, format_p
from probekit.studies.base import VIEWS, Study

VECTORS = ("mean_diff", "direction")
FILE_TYPES = (".npy", ".pt", ".safetensors")
SETTINGS = ("study", "model", "vector", "positions", "span", "sites", "layers", "seed", "items")


def command(study: Study) -> Command:
    """`probekit steer STUDY`'s options: the model's, the steering's and the study's."""
    return mechanism_command("steer", SteerOptions, study, {"out": "runs/steer"})


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
    loaded = loaded_engine(model)
    keywords = options if loaded is not None else {**options, "model": model}
    parsed = command(found).build(keywords, f"steer_study({found.name!r})")
    with silenced(parsed[0].quiet):
        return _steer(found, parsed, loaded, keyword)


def execute(study: Study, parsed: tuple) -> None:
    start = time.monotonic()
    with silenced(parsed[0].quiet):
        result = _steer(study, parsed, None, flag)
    print(f"wrote {result.path}/steer.parquet, summary.csv, steer.png, report.html")
    print(f"wall time {time.monotonic() - start:.0f} s")


def _steer(study: Study, parsed: tuple, model: Any, spell: Spell) -> StudySteer:
    asked, args, own = parsed
    alphas = args.alphas if 0.0 in args.alphas else [0.0, *args.alphas]  # side effects vs α = 0
    positions = args.positions
    sites = [steering.steering_site(name) for name in args.sites]
    contrast = study.mechanism_defaults().contrast
    check_vector(args.vector)
    probe, items = study.mechanism_items(own, context("steer", asked, args, spell))
    model = model if model is not None else load_engine(asked.model, **asked.load_keywords())
    layers = layer_indices(model, args.layers) if args.layers else [model.n_layers // 2]
    span = args.span or contrast.span_of(probe)
    out = Path(args.out)
    settings = {
        "study": study.name,
        "model": model.name,
        "vector": args.vector,
        "positions": positions,
        "span": span,
        "sites": sites,
        "layers": layers,
        "seed": args.seed,
        "items": [item.id for item in items],
        **{k: v for k, v in probe.manifest().items() if isinstance(v, str | int | float)},
    }
    resume(out, settings)
    encoded = [model.encode(item, getattr(probe, "as_string", False)) for item in items]
    settle_precision(model, probe.answers, [p.input_ids for p in encoded])
    for prompt in encoded:
        steering.prompt_positions(prompt, positions, span)
    targets = [(name, layer) for layer in layers for name in sites]
    side = contrast.side(probe)
    vectors = make_vectors(model, encoded, targets, args.vector, span, side, args.hooks)
    scorer = model.scorer(probe.answers, epsilon=0.0, batch_size=args.batch_size)
    with hook_library(model, args.hooks):  # α = 0 on the same kernels as the rest
        base = list(scorer.score([p.input_ids for p in encoded]))
    rng = np.random.default_rng(args.seed)
    manifest = {**probe.manifest(), "model": model.name, "seed": args.seed, "view": VIEWS[0]}
    frames, rows = [], []
    runs = len(vectors) * 2 * sum(alpha != 0 for alpha in alphas)
    bar = progress(runs * len(encoded), "prompt", "steering", "fewer --layers, --alphas or events")
    for target, vector in vectors.items():
        kinds = {steering.STEER: vector, steering.RANDOM: steering.random_like(vector, rng)}
        for kind, v in kinds.items():
            for alpha in alphas:
                folder = out / "alphas" / f"{target[0]}-L{target[1]}-{kind}-a{alpha:g}"
                if (folder / "headline.json").is_file():
                    frame = pd.read_parquet(folder / "steer.parquet")
                    headline = json.loads((folder / "headline.json").read_text())
                    print(f"resumed {folder.name}")
                else:
                    frame = steer_frame(
                        scorer, encoded, base, target, kind, v, alpha, positions, span, args, bar
                    )
                    frame = probe.add_columns(frame)
                    folder.mkdir(parents=True, exist_ok=True)
                    write_parquet(folder / "steer.parquet", frame)
                    headline = study_headline(study, frame, folder, manifest)
                    write_text(folder / "headline.json", json.dumps(headline, indent=1))
                    print(
                        f"layer {target[1]} {target[0]}, {kind}, α={alpha:g}: "
                        f"{headline['label']} {format_number(headline['value'], signed=True)}"
                    )
                frames.append(frame)
                rows.append({**summary_row(frame), **headline})
    bar.close()
    table = pd.concat(frames, ignore_index=True)
    write_parquet(out / "steer.parquet", table)
    summary = pd.DataFrame(rows)
    write_text(out / "summary.csv", summary.to_csv(index=False))
    title = f"{model.name}, {probe.name}: --vector {args.vector}, {positions} of {span}"
    plot(summary, out / "steer.png", title)
    write_report(out / "report.html", summary, out / "steer.png", title, settings)
    return StudySteer(out, table, summary)


def check_vector(vector: str) -> None:
    """One line for a vector that is neither a known kind (every study declares its contrast)
    nor a readable file."""
    if vector in VECTORS:
        return
    path = Path(vector)
    if path.suffix not in FILE_TYPES:
        raise ProbekitError(
            f"--vector {vector!r}: give mean_diff, direction or a {', '.join(FILE_TYPES)} file"
        )
    if not path.is_file():
        raise ProbekitError(f"--vector: no file {vector}")


def resume(out: Path, settings: dict[str, Any]) -> None:
    """Write `steer.json` with the settings, or check that a previous run's match them."""
    path = out / "steer.json"
    if path.is_file():
        old = json.loads(path.read_text())
        for key in SETTINGS:
            if old.get(key) != settings.get(key):
                raise ProbekitError(
                    f"{out} holds a steering run with another {key} ({old.get(key)!r} vs "
                    f"{settings.get(key)!r}); use another --out or delete it"
                )
        return
    out.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(settings, indent=1))


def make_vectors(
    model: Any,
    encoded: Sequence[EncodedItem],
    targets: list[steering.Target],
    vector: str,
    span: str,
    contrast: Any,
    hooks: str,
) -> dict[steering.Target, torch.Tensor]:
    """The vector at each target: the contrast's mean difference (or its unit direction) at the
    span, or the file's."""
    if vector in VECTORS:
        side = [bool(contrast(p)) for p in encoded]
        means = steering.span_means(model, encoded, targets, span, hooks)
        if vector == "mean_diff":
            found = {t: steering.mean_difference(means[t], side) for t in targets}
        else:
            found = {t: diff_of_means(means[t], np.asarray(side)) for t in targets}
        return steering.as_vectors(model, found, targets)
    loaded = load_vector(Path(vector))
    if loaded.ndim == 2:
        if loaded.shape[0] != model.n_layers:
            raise ProbekitError(
                f"--vector {vector}: a 2-D file needs one row per layer ({model.n_layers}), "
                f"got shape {tuple(loaded.shape)}"
            )
        return steering.as_vectors(model, {t: loaded[t[1]] for t in targets}, targets)
    return steering.as_vectors(model, loaded, targets)


def load_vector(path: Path) -> np.ndarray:
    """The array in a .npy, .pt or .safetensors file (the file's only tensor)."""
    try:
        if path.suffix == ".npy":
            return np.asarray(np.load(path, allow_pickle=False), dtype=np.float64)
        if path.suffix == ".pt":
            value = torch.load(path, map_location="cpu", weights_only=True)
        else:
            from safetensors.torch import load_file

            tensors = load_file(path)
            if len(tensors) != 1:
                raise ProbekitError(
                    f"--vector {path}: the file holds {len(tensors)} tensors; give one"
                )
            (value,) = tensors.values()
    except (OSError, ValueError, RuntimeError) as error:
        raise ProbekitError(f"--vector {path}: not readable ({error})".splitlines()[0]) from None
    if not isinstance(value, torch.Tensor):
        raise ProbekitError(f"--vector {path}: the file holds a {type(value).__name__}")
    return value.double().numpy()


def steer_frame(
    scorer: Any,
    encoded: Sequence[EncodedItem],
    base: list[Any],
    target: steering.Target,
    kind: str,
    vector: torch.Tensor,
    alpha: float,
    positions: str,
    span: str,
    args: SteerOptions,
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
            positions,
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


def plot(summary: pd.DataFrame, path: Path, title: str) -> Path:
    """The headline against α (steer and the random control, with intervals) and the side
    effects (mean valid mass, mean KL), one line per (site, layer, vector)."""
    fig = new_figure(10, 4)
    headline, effects = fig.subplots(1, 2)
    kl = effects.twinx()
    for (site, layer, kind), group in summary.groupby(["site", "layer", "vector"], sort=False):
        group = group.sort_values("alpha")
        style = "-" if kind == steering.STEER else "--"
        label = f"L{layer} {site} {kind}"
        x = group["alpha"].to_numpy(float)
        y = group["value"].to_numpy(float)
        line = headline.plot(x, y, style, marker="o", label=label)[0]
        low, high = group["low"].to_numpy(float), group["high"].to_numpy(float)
        headline.fill_between(x, low, high, color=line.get_color(), alpha=0.15)
        effects.plot(x, group["mean_valid_mass"], style, marker="o", label=f"{label} mass")
        kl.plot(x, group["mean_kl"], style, marker="x", color="grey", label=f"{label} KL")
    headline.axhline(0, color="black", lw=0.5)
    headline.set_xlabel("α")
    headline.set_ylabel(str(summary["label"].iloc[0]))
    headline.legend(fontsize=7)
    effects.set_xlabel("α")
    effects.set_ylabel("mean valid mass (o)")
    kl.set_ylabel("mean KL from α = 0, nats (x, grey)")
    effects.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


def write_report(
    path: Path, summary: pd.DataFrame, figure: Path, title: str, settings: dict[str, Any]
) -> Path:
    """`report.html`: the figure and the summary table (self-contained)."""
    image = base64.b64encode(figure.read_bytes()).decode("ascii")
    head = ["site", "layer", "vector", "α", "headline", "95% interval", "p", "valid mass", "KL"]
    body = []
    for r in summary.to_dict("records"):
        cells = [
            r["site"],
            r["layer"],
            r["vector"],
            f"{r['alpha']:g}",
            format_number(r["value"], signed=True),
            f"[{format_number(r['low'], signed=True)}, {format_number(r['high'], signed=True)}]",
            format_p(r["p_value"]),
            format_number(r["mean_valid_mass"]),
            format_number(r["mean_kl"], 4),
        ]
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    shown = {k: v for k, v in settings.items() if k != "items"}
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:2px 8px;text-align:right}}
table{{border-collapse:collapse}}tr:nth-child(even){{background:#f4f4f4}}</style></head><body>
<h1>Steering: {html.escape(title)}</h1>
<p>{html.escape(str(summary["label"].iloc[0]))} at each α, along the vector (steer) and a random
direction of the same norm (random); side effects: the mean valid mass and the mean KL divergence
of each prompt's answer distribution from the unsteered one (α = 0).</p>
<img src="data:image/png;base64,{image}" style="max-width:100%">
<table><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>
{chr(10).join(body)}</table>
<h2>Settings</h2><pre>{html.escape(json.dumps(shown, indent=1))}</pre>
<p>{len(settings["items"])} prompts.</p></body></html>
"""
    return write_text(path, page)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if np.isnan(value) else value
