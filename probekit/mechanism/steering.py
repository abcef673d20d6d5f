"""Steering on the exact readout: add α × a vector to the residual stream while scoring, and
read how every prompt's exact answer distribution moves.

One intervention is one (site, layer): while each prompt is scored, α·v is added to the value at
`blocks.{layer}.{site}` at the chosen positions (through `probekit.mechanism.interventions`, the
same hooks as patching):
- `span`: the tokens of one span of the prompt (default span `answer`, the prompt's last token);
- `from_span`: every prompt token from the span's first on, and every answer token;
- `all`: every prompt token and every answer token.
Answer tokens are the positions of the scorer's trie passes, so an answer of several tokens is
steered at each of its tokens, as the model would be while writing it.

Beside the given vector (`vector` column `steer`) a random direction of the same norm is the
control (`random`; `probekit steer STUDY` steers `--controls` of them, `random`, `random2`,
..., and cross-fits a contrast's vector by units: `probekit.mechanism.vectors`), drawn from
`seed`. α = 0 is plain scoring (no hook at all), and each row
carries its side effects against it: `kl`, the KL divergence KL(P_α ‖ P_0) of the prompt's answer
distribution (normalised over the answer set) from the unsteered one, and `valid_mass_change`,
the valid mass at α minus that at 0.

α multiplies the vector as it is: a contrast's mean difference (`mean_diff`) at α = 1 moves a
prompt by the whole difference between the contrast's two sides, a unit `direction` by one unit
of the residual stream, a file's vector by its own scale. So α = 1 of `mean_diff` means the same
in every study, but how hard that pushes the model depends on the vector's norm against the
residual's (the ISEAR gender contrast's norm at the default model's middle layer is 49.6, the
intergroup example's 14.5): `probekit steer` reports beside each α the vector's `norm`, the
residual's typical norm at the span (`residual_norm`, `residual_norms`) and their ratio
`push` = |α|·norm / residual_norm, the size of the step against what it is added to. Where a
step drives the mean valid mass below `probekit.core.signal.WEAK_SIGNAL_VALID_MASS`, its numbers
describe almost none of the model's output: `weak_steps` names those steps (a warning from
`steer`, a line, a page banner and a `weak_signal` column from `probekit steer`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.core.items import ANSWER, PROMPT_ID, EncodedItem
from probekit.core.kinds import Kind, choice, float_list, non_negative_int
from probekit.core.options import given, option
from probekit.core.progress import progress as track
from probekit.core.progress import silenced
from probekit.core.public import public
from probekit.core.signal import is_weak, weak_under
from probekit.engines.base import ScoreResult
from probekit.engines.options import EpsilonOption, ModelOptions, ScoreOptions
from probekit.mechanism.api import encode_prompts, hookable
from probekit.mechanism.capture import read_spans, site_shorts
from probekit.mechanism.interventions import answer_nodes, score_edited
from probekit.mechanism.options import HookOptions
from probekit.mechanism.pairs import span_positions
from probekit.mechanism.sites import chosen_layers, d_model, hook_library, library, site

POSITIONS: tuple[str, ...] = ("span", "from_span", "all")
STEER, RANDOM = "steer", "random"
Target = tuple[str, int]
"""(site, layer): one intervention."""


def check_alphas(alphas: Any) -> list[float]:
    """The alphas as floats, in the given order; one line for an empty or non-numeric list."""
    if isinstance(alphas, str | bytes) or not isinstance(alphas, Sequence | np.ndarray | range):
        raise ProbekitError(f"alphas must be a list of numbers, got {alphas!r}")
    if not len(alphas):
        raise ProbekitError("no alphas given; give at least one, e.g. [-4, 0, 4]")
    try:
        out = [float(a) for a in alphas]
    except (TypeError, ValueError):
        out = [np.nan]
    if not all(np.isfinite(out)):
        raise ProbekitError(f"alphas must be numbers, and finite, got {list(alphas)!r}")
    return out


@dataclass(frozen=True)
class SteerOptions(HookOptions, EpsilonOption):
    """Steer options: the vector, its strengths and where it is added."""

    alphas: list[float] = option(
        (-4.0, -2.0, 0.0, 2.0, 4.0),
        help="multiples of the vector (default %(default)s)",
        kind=Kind("alphas", float_list.parse, check_alphas),
    )
    positions: str = option(
        "from_span",
        help="span (its tokens), from_span (from the span on, answer tokens included) or all "
        "(every prompt and answer token) (default %(default)s)",
        kind=choice("positions", POSITIONS),
    )
    span: str | None = option(
        None, help="the span steered from (default: the study's contrast span, else answer)"
    )
    controls: int = option(
        3,
        help="random directions of the vector's norm steered beside it, as controls (default "
        "%(default)s; 0: none)",
        kind=non_negative_int,
    )
    vector: str = option(
        "mean_diff",
        help="mean_diff (contrast mean difference at the span), direction (the same, unit "
        "length) or a file (.npy, .pt, .safetensors: [d_model] or [n_layers, d_model])",
    )


def check_hooks(hooks: str, positions: str) -> None:
    """One line, before any scoring, for positions that reach the answer tokens through
    nnsight (its hooks steer the prompt only)."""
    if library(hooks) == "nnsight" and positions != "span":
        raise ProbekitError(
            f"{given('positions', positions)} steers the answer tokens, which needs "
            f"{given('hooks', 'transformer_lens')} (nnsight steers positions span only)"
        )


SATURATED = float(np.sqrt(np.finfo(np.float32).max))
"""The largest norm of α·v steered: beyond it the square a norm layer takes (in float32 at
least) overflows, and the model's answer no longer depends on anything but the vector."""


def check_strength(
    dtype: torch.dtype, vectors: Mapping[Target, torch.Tensor], alphas: Sequence[float]
) -> None:
    """One line, before any scoring, for an α that saturates the model: α·v (or the random
    control of its norm) with a norm beyond what its dtype holds or a norm layer squares
    (`SATURATED`)."""
    limit = min(SATURATED, float(torch.finfo(dtype).max)) if dtype.is_floating_point else SATURATED
    for (name, layer), vector in vectors.items():
        step = max(abs(a) for a in alphas) * float(vector.norm(dim=-1).max())
        if step > limit:
            raise ProbekitError(
                f"α={max(alphas, key=abs):g} saturates the model: |α·v| at layer {layer} "
                f"({name}) is {step:.3g}, beyond {limit:.3g} (what its layers compute in "
                f"{str(dtype).removeprefix('torch.')}); use a smaller |α|"
            )


def steering_site(name: str) -> str:
    """The TransformerLens name of a residual-width site (one line for an unknown or per-head
    site: a steering vector has the residual stream's width)."""
    found = site(name)
    if found.per_head:
        raise ProbekitError(
            f"steering adds a d_model vector; {found.name} is per attention head: use "
            "hook_resid_pre, hook_resid_mid, hook_attn_out, hook_mlp_out or hook_resid_post"
        )
    return found.name


def as_vectors(model: Any, vector: Any, targets: Sequence[Target]) -> dict[Target, torch.Tensor]:
    """One float64 vector per target: `vector` is one [d_model] array (used at every target) or
    a mapping from a layer, or a (site, layer), to one."""
    width = d_model(model)
    out = {}
    for target in targets:
        value = vector
        if isinstance(vector, Mapping):
            value = vector.get(target, vector.get(target[1]))
            if value is None:
                raise ProbekitError(f"the vectors have none for layer {target[1]} ({target[0]})")
        try:
            tensor = torch.as_tensor(np.asarray(value, dtype=np.float64))
        except (TypeError, ValueError):
            raise ProbekitError(f"the vector must be an array of numbers, got {value!r}") from None
        if tuple(tensor.shape) != (width,):
            raise ProbekitError(
                f"the vector has shape {tuple(tensor.shape)}; steering this model needs "
                f"({width},), one number per residual-stream dimension"
            )
        check_values(tensor.numpy(), f"the vector at layer {target[1]} ({target[0]})")
        out[target] = tensor
    return out


def check_values(values: np.ndarray, what: str) -> None:
    """One line for a vector (`what` names it) whose values are not finite, or all zero."""
    if not np.isfinite(values).all():
        raise ProbekitError(f"{what} has non-finite values (inf or NaN)")
    if not values.any():
        raise ProbekitError(f"{what} is zero; steering along it changes nothing")


@public(HookOptions, command="capture")
def span_means(
    model: Any,
    prompts: Sequence[EncodedItem],
    targets: Sequence[Target],
    span: str,
    hooks: str = "transformer_lens",
    batch_size: int = 8,
) -> dict[Target, np.ndarray]:
    """Each prompt's activation at each target averaged over the tokens of `span`, read by
    `probekit.mechanism.capture` in batches as a capture reads them (float64 [prompts, d_model]
    per target)."""
    layers = sorted({layer for _, layer in targets})
    shorts = site_shorts([name for name, _ in targets])
    acts = read_spans(model, prompts, layers, shorts, [span], hooks, batch_size)
    spans = list(zip(acts.index["row_start"], acts.index["row_stop"], strict=True))
    return {
        (name, layer): np.stack(
            [acts[site(name).hook(layer)][a:b].double().mean(0) for a, b in spans]
        )
        for name, layer in targets
    }


def residual_norms(means: Mapping[Target, np.ndarray]) -> dict[Target, float]:
    """The residual's typical norm at each target: the mean over prompts of the norm of their
    span means (`span_means`), what the size of a steering vector α·v is said against."""
    return {target: float(np.linalg.norm(m, axis=1).mean()) for target, m in means.items()}


def weak_steps(table: pd.DataFrame) -> str | None:
    """One line when the mean valid mass of a (site, layer, vector kind, α) of a steering table
    (`steer`'s rows, or one summary row each) fell below the weak-signal threshold, naming them,
    the lowest mean and the unsteered one; None otherwise."""
    column = "mean_valid_mass" if "mean_valid_mass" in table else "valid_mass"
    steps = table.groupby(["site", "layer", "vector", "alpha"], sort=False)[column].mean()
    weak = steps[[is_weak(m) for m in steps]]
    names = [f"α={a:g} ({kind}, L{layer} {name})" for name, layer, kind, a in weak.index]
    unsteered = steps[steps.index.get_level_values("alpha") == 0]
    reference = f"{unsteered.mean():.3g} unsteered" if len(unsteered) else ""
    return weak_under("steering at", names, float(weak.min()) if len(weak) else 0, reference)


def random_like(vector: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """A random direction (Gaussian, so uniform on the sphere) with the norm of `vector` (of
    each row of a [prompts, d_model] vector: its fold's, `vectors.contrast_vectors`)."""
    draw = torch.as_tensor(rng.standard_normal(vector.shape[-1]))
    return draw * (vector.norm(dim=-1, keepdim=True) / draw.norm())


def with_controls(
    vectors: dict[Any, torch.Tensor], controls: int, seed: int
) -> dict[Any, dict[str, torch.Tensor]]:
    """Each target's vector (`steer`) and `controls` random directions of its norm (`random`,
    `random2`, ...), drawn from `seed`: what `steer` and `probekit steer STUDY` steer along."""
    rng = np.random.default_rng(seed)
    return {
        t: {STEER: v}
        | {f"{RANDOM}{c + 1}" if c else RANDOM: random_like(v, rng) for c in range(controls)}
        for t, v in vectors.items()
    }


def norm_of(vector: torch.Tensor) -> float:
    """A vector's norm; of a [prompts, d_model] vector (one per fold), the mean of its rows'."""
    return float(vector.norm(dim=-1).mean())


def prompt_positions(prompt: EncodedItem, positions: str, span: str) -> list[int]:
    """The prompt positions `positions` steers in this prompt (answer tokens aside)."""
    declared = span_positions(prompt, span)
    if positions == "span":
        return declared
    return list(range(0 if positions == "all" else min(declared), len(prompt.input_ids)))


def steered_results(
    scorer: Any,
    prompts: Sequence[EncodedItem],
    target: Target,
    added: torch.Tensor,
    positions: str,
    span: str,
    hooks: str = "transformer_lens",
    batch_size: int | None = None,
    progress: Any = None,
) -> list[ScoreResult]:
    """Every prompt's result with `added` summed into `blocks.{layer}.{site}` at `positions`
    (`added`: one [d_model] vector, or one row per prompt, [prompts, d_model]: each group of
    prompts with one row is steered on its own; `progress`, if given, is updated per batch).
    One line for steered scores that are not finite (the activations overflowed)."""
    groups = [(added, list(range(len(prompts))))]
    if added.dim() == 2:
        rows, which = torch.unique(added, dim=0, return_inverse=True)
        groups = [(row, torch.nonzero(which == k).flatten().tolist()) for k, row in enumerate(rows)]
    answer = [] if positions == "span" else answer_nodes(scorer)
    model, out = scorer.model, [None] * len(prompts)
    for vector, chosen in groups:
        delta = vector.to(model.device, model.dtype)
        found = score_edited(
            scorer,
            [prompts[i] for i in chosen],
            site(target[0]).hook(target[1]),
            lambda p: [*prompt_positions(p, positions, span), *answer],
            lambda old, delta=delta: old + delta,
            hooks,
            batch_size,
            progress,
        )
        for i, result in zip(chosen, found, strict=True):
            out[i] = result
    bad = sum(not np.isfinite([r.valid_mass, *np.asarray(r.probs, dtype=float)]).all() for r in out)
    if bad:
        raise ProbekitError(
            f"steering at layer {target[1]} ({target[0]}): the scores of {bad} of {len(out)} "
            "prompts are not finite (the steered activations overflow); use a smaller |α|"
        )
    return out


def kl_divergence(steered: ScoreResult, base: ScoreResult) -> float:
    """KL(P_steered ‖ P_base) in nats over the answer set (normalised); NaN when either has no
    valid mass."""
    if steered.valid_mass <= 0 or base.valid_mass <= 0:
        return float("nan")
    p, q = np.asarray(steered.probs, dtype=float), np.asarray(base.probs, dtype=float)
    on = p > 0
    if np.any(q[on] <= 0):
        return float("inf")
    return float(max(np.sum(p[on] * np.log(p[on] / q[on])), 0.0))


def steer_rows(
    prompts: Sequence[EncodedItem],
    results: Sequence[ScoreResult],
    base: Sequence[ScoreResult],
    answers: AnswerSet,
    columns: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """One row per prompt: its id and key columns, `columns`, the score columns and the side
    effects against its unsteered result (`kl`, `valid_mass_change`)."""
    return [
        {PROMPT_ID: prompt.id, **prompt.item.key, **columns, **result.row(answers)}
        | {
            "kl": kl_divergence(result, zero),
            "valid_mass_change": result.valid_mass - zero.valid_mass,
        }
        for prompt, result, zero in zip(prompts, results, base, strict=True)
    ]


@public(SteerOptions, ScoreOptions, ModelOptions, command="steer", skip=("vector", "model"))
def steer(
    model: Any,
    prompts: Any,
    vector: Any,
    *,
    answers: AnswerSet | str | Sequence[str | float],
    sites: Sequence[str] = ("hook_resid_post",),
    layers: Sequence[int] | range | None = None,
    alphas: Sequence[float] = (-4.0, -2.0, 0.0, 2.0, 4.0),
    positions: str = "from_span",
    span: str | None = None,
    hooks: str = "transformer_lens",
    controls: int = 3,
    seed: int = 0,
    epsilon: float = 0.0,
    batch_size: int | None = None,
    quiet: bool = False,
) -> pd.DataFrame:
    """Score `prompts` with α·`vector` added at each (site, layer), for every α.

    Parameters:
        model: a loaded model or a model spec (`"default"`, a Hugging Face id, ...).
        prompts: one string, a list of strings, chat-message lists, `Item`s or encoded prompts,
            or a prompts JSONL path (as `probekit.score` takes them).
        vector: one [d_model] array (numpy, torch or a list), or a mapping from a layer (or a
            (site, layer)) to one. Each (site, layer) is steered on its own; without `span`
            the span steered from is `answer` (the prompt's last token).
        controls: how many random directions of the same norm to steer along beside it, as
            controls (`vector` = `random`, `random2`, ...; 0: none), drawn from `seed`.

    Returns one row per (site, layer, vector kind, α, prompt): `prompt_id`, `site`, `layer`,
    `vector` (`steer`, `random`, `random2`, ...), `norm`, `alpha`, `positions`, `span`, the
    score columns of `probekit.score` (`valid_mass`, `greedy`, ..., `p::<answer>`), `kl` (KL of
    the answer distribution from the unsteered one, nats) and `valid_mass_change`.
    """
    names = [steering_site(name) for name in sites]
    check_hooks(hooks, positions)
    model = hookable(model)
    targets = [(name, layer) for layer in chosen_layers(model, layers, "steer") for name in names]
    vectors = as_vectors(model, vector, targets)
    check_strength(model.dtype, vectors, alphas)
    encoded = encode_prompts(model, prompts, "steer")
    span = ANSWER if span is None else span
    for prompt in encoded:  # one line for a missing span, before any scoring
        prompt_positions(prompt, positions, span)
    model.settle_precision(answers, [e.input_ids for e in encoded])
    scorer = model.scorer(answers, epsilon=epsilon, batch_size=batch_size)
    kinds = with_controls(vectors, controls, seed)
    steps = [(t, kind, w, a) for t in vectors for kind, w in kinds[t].items() for a in alphas]
    rows = []
    # every row, α = 0 included, on the same kernels; the model is left as it was found
    with silenced(quiet), hook_library(model, hooks):
        base = list(scorer.score([p.input_ids for p in encoded]))
        total = sum(a != 0 for *_, a in steps) * len(encoded)
        with track(total, "prompt", "steering", "fewer layers, alphas or prompts") as bar:
            for (name, layer), kind, w, alpha in steps:
                steered = (scorer, encoded, (name, layer), alpha * w, positions, span, hooks)
                results = steered_results(*steered, batch_size, bar) if alpha != 0 else base
                columns = {"site": name, "layer": layer, "vector": kind, "norm": float(w.norm())}
                columns |= {"alpha": float(alpha), "positions": positions, "span": span}
                rows += steer_rows(encoded, results, base, scorer.answers, columns)
    table = pd.DataFrame(rows)
    if weak := weak_steps(table):
        warnings.warn(weak, UserWarning, stacklevel=3)  # the caller of @public
    return table
