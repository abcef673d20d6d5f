"""Steering on the exact readout (probekit.mechanism.steering): checked against an independent
hook (a plain PyTorch forward hook on the transformers decoder layer of a separately loaded,
unbridged model) and the brute-force answer distribution of probekit.testing.reference."""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
import pytest
import torch

import probekit
from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.engines.score import as_items
from probekit.mechanism.steering import kl_divergence, random_like, steer
from probekit.testing.reference import brute_force

ANSWERS = AnswerSet.parse("0-10")
PROMPTS = [
    "I am a Muslim. How sad am I, 0-10? Answer with a number.",
    "My neighbour, who is a Jew, lost his job. How sad is he, 0-10?",
]
LAYER = 12
TOL = 1e-5  # float32 noise on probabilities


@pytest.fixture(scope="module")
def vector(model):
    v = np.random.default_rng(7).standard_normal(model.hf.config.hidden_size)
    return 3.0 * v / np.linalg.norm(v)


@pytest.fixture(scope="module")
def plain():
    """A second default model that never gets the TransformerLens bridge: the reference."""
    from probekit.engines.hf.model import load_model

    return load_model("default")


@contextlib.contextmanager
def added(plain_model, layer: int, delta: torch.Tensor, start: int | list[int]):
    """α·v added to the output of decoder layer `layer` at positions `start`... (an int: from
    there to the end, answer tokens included) or at the listed positions."""

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden.clone()
        where = slice(start, None) if isinstance(start, int) else start
        hidden[:, where] += delta.to(hidden.dtype)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = plain_model.hf.model.layers[layer].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def reference(plain_model, prompt_ids, delta, start) -> tuple[np.ndarray, float]:
    """The normalised answer distribution and valid mass, brute force under the hook."""
    with added(plain_model, LAYER, delta, start):
        raw = brute_force(plain_model, prompt_ids, ANSWERS)
    return raw / raw.sum(), float(raw.sum())


@pytest.mark.parametrize("positions", ["span", "from_span", "all"])
def test_steered_rows_equal_an_independent_hook_and_brute_force(model, plain, vector, positions):
    alpha = 2.5
    df = steer(
        model,
        PROMPTS,
        vector,
        layers=[LAYER],
        alphas=[alpha],
        answers=ANSWERS,
        positions=positions,
        control=False,
    )
    assert len(df) == len(PROMPTS) and (df["alpha"] == alpha).all()
    delta = torch.as_tensor(alpha * vector)
    columns = [f"p::{a}" for a in ANSWERS.answers]
    moved = 0.0
    for k, item in enumerate(as_items(PROMPTS)):
        ids = plain.encode(item).input_ids
        last = len(ids) - 1  # the default span, `answer`: the prompt's last token
        start = {"span": [last], "from_span": last, "all": 0}[positions]
        probs, mass = reference(plain, ids, delta, start)
        row = df.iloc[k]
        assert np.abs(row[columns].to_numpy(float) - probs).max() <= TOL
        assert abs(row["valid_mass"] - mass) <= TOL * max(mass, 1.0)
        assert abs(row["expected"] - probs @ ANSWERS.values) <= 1e-4
        base, _ = reference(plain, ids, torch.zeros_like(delta), 0)
        moved = max(moved, np.abs(probs - base).max())
    assert moved > 1e-3  # the vector does move the answer


def test_alpha_zero_is_plain_scoring_and_has_no_side_effects(model, vector):
    df = steer(model, PROMPTS, vector, layers=[LAYER], alphas=[-2, 0, 2], answers="0-10")
    plain_scores = probekit.score(model, PROMPTS, "0-10", epsilon=0.0)
    for kind in ("steer", "random"):
        zero = df[(df["alpha"] == 0) & (df["vector"] == kind)].reset_index(drop=True)
        shared = [c for c in plain_scores.columns if c != "id"]
        pd.testing.assert_frame_equal(zero[shared], plain_scores[shared], check_exact=True)
        assert (zero["kl"] == 0).all() and (zero["valid_mass_change"] == 0).all()
    steered = df[df["alpha"] != 0]
    assert (steered["kl"] > 0).all()
    assert len(df) == 2 * 3 * len(PROMPTS)
    assert set(df["vector"]) == {"steer", "random"} and (df["layer"] == LAYER).all()
    assert (df["site"] == "hook_resid_post").all()


def test_random_control_has_the_vectors_norm(model, vector):
    v = torch.as_tensor(vector)
    one = random_like(v, np.random.default_rng(0))
    again = random_like(v, np.random.default_rng(0))
    assert abs(float(one.norm()) - float(v.norm())) <= 1e-12
    assert torch.equal(one, again)  # drawn from the seed
    assert abs(float(one @ v) / float(v.norm()) ** 2) < 0.2  # another direction
    df = steer(model, PROMPTS[:1], vector, layers=[LAYER], alphas=[1.0], answers="0-10")
    norms = df.groupby("vector")["norm"].first()
    assert norms["random"] == pytest.approx(norms["steer"], rel=1e-12)
    assert norms["steer"] == pytest.approx(3.0, rel=1e-12)


def test_kl_divergence_is_the_kl_of_the_normalised_distributions():
    from probekit.engines.base import ScoreResult

    p = np.array([0.5, 0.25, 0.25])
    q = np.array([0.25, 0.25, 0.5])
    steered = ScoreResult(probs=p, valid_mass=0.3, error_bound=0.0, argmax="0", mode="0")
    base = ScoreResult(probs=q, valid_mass=0.6, error_bound=0.0, argmax="2", mode="2")
    assert kl_divergence(steered, base) == pytest.approx(0.5 * np.log(2) + 0.25 * np.log(0.5))
    assert kl_divergence(base, base) == 0.0
    empty = ScoreResult(probs=q, valid_mass=0.0, error_bound=0.0, argmax=None, mode=None)
    assert np.isnan(kl_divergence(empty, base))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vector": np.ones(7)}, "the vector has shape (7,)"),
        ({"sites": ["hook_resid_side"]}, "unknown site 'hook_resid_side'"),
        ({"sites": ["attn.hook_z"]}, "per attention head"),
        ({"alphas": []}, "no alphas given"),
        ({"alphas": ["x"]}, "alphas must be numbers"),
        ({"positions": "everywhere"}, "unknown positions 'everywhere'"),
        ({"span": "identity"}, "unknown span 'identity'"),
        ({"layers": [99]}, "layer 99 is out of range"),
        ({"hooks": "nnsight", "positions": "all"}, "needs hooks='transformer_lens'"),
        ({"vector": {3: np.ones(576)}}, "the vectors have none for layer 12"),
    ],
)
def test_bad_input_is_one_line(model, vector, change, message):
    kwargs = {
        "vector": vector,
        "layers": [LAYER],
        "alphas": [1.0],
        "answers": "0-10",
        **change,
    }
    with pytest.raises(ProbekitError) as error:
        steer(model, PROMPTS[:1], kwargs.pop("vector"), **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)
