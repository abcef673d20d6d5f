"""Steering on the exact readout (probekit.mechanism.steering): checked against an independent
hook (a plain PyTorch forward hook on the transformers decoder layer of a second, unbridged
copy of the model) and the brute-force answer distribution of probekit.testing.reference, on the
tiny model: steering's mechanics need no trained weights."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from minimal_study import MinimalProbe, MinimalStudy

import probekit
from probekit.core.answers import AnswerSet
from probekit.core.errors import ProbekitError
from probekit.engines.score import as_items
from probekit.mechanism.steering import kl_divergence, random_like, steer
from probekit.mechanism.vectors import contrast_vectors, file_vectors, read_vector_file
from probekit.reporting.headline import Headline
from probekit.testing.reference import brute_force
from probekit.testing.synthetic import tiny_model

ANSWERS = AnswerSet.parse("0-10")
PROMPTS = [
    "I am a Muslim. How sad am I, 0-10? Answer with a number.",
    "My neighbour, who is a Jew, lost his job. How sad is he, 0-10?",
]
LAYER = 2  # of the tiny model's 4
TOL = 1e-5  # float32 noise on probabilities
MODEL = "tiny_bridged"  # the tiny model with its TransformerLens bridge


@pytest.fixture(scope="module")
def vector(model):
    v = np.random.default_rng(7).standard_normal(model.hf.config.hidden_size)
    return 3.0 * v / np.linalg.norm(v)


@pytest.fixture(scope="module")
def plain(tiny):
    """A second tiny model (the same seed, the same weights) that never gets the
    TransformerLens bridge: the reference."""
    return tiny_model()


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
        controls=0,
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
    kinds = ("steer", "random", "random2", "random3")  # the vector and three controls (default)
    plain_scores = probekit.score(model, PROMPTS, "0-10", epsilon=0.0)
    for kind in kinds:
        zero = df[(df["alpha"] == 0) & (df["vector"] == kind)].reset_index(drop=True)
        shared = [c for c in plain_scores.columns if c != "id"]
        pd.testing.assert_frame_equal(zero[shared], plain_scores[shared], check_exact=True)
        assert (zero["kl"] == 0).all() and (zero["valid_mass_change"] == 0).all()
    steered = df[df["alpha"] != 0]
    assert (steered["kl"] > 0).all()
    assert len(df) == len(kinds) * 3 * len(PROMPTS)
    assert set(df["vector"]) == set(kinds) and (df["layer"] == LAYER).all()
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
    steered = ScoreResult(probs=p, valid_mass=0.3, error_bound=0.0, greedy="0", most_probable="0")
    base = ScoreResult(probs=q, valid_mass=0.6, error_bound=0.0, greedy="2", most_probable="2")
    assert kl_divergence(steered, base) == pytest.approx(0.5 * np.log(2) + 0.25 * np.log(0.5))
    assert kl_divergence(base, base) == 0.0
    empty = ScoreResult(probs=q, valid_mass=0.0, error_bound=0.0, greedy=None, most_probable=None)
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
        ({"vector": {3: np.ones(64)}}, "the vectors have none for layer 2"),
        ({"vector": np.zeros(64)}, "the vector at layer 2 (hook_resid_post) is zero"),
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


# ---------------------------------------------------------------------- the command
@pytest.fixture
def steer_cli(monkeypatch):
    """`steer_cli(model, *ARGS)`: the exit status of `probekit steer ARGS` on `model`."""
    from probekit import cli

    def run(model, *argv: str) -> int:
        monkeypatch.setattr("probekit.engines.load_engine", lambda *a, **k: model)
        return cli.main(["steer", *argv])

    return run


def data_args() -> list[str]:
    from conftest import reference_data_root

    root = reference_data_root()
    return ["--data", str(root)] if root else []


def test_the_command_writes_every_file_and_resumes(model, steer_cli, tmp_path, capsys, monkeypatch):
    out = tmp_path / "steer"
    np.save(tmp_path / "v.npy", np.random.default_rng(3).standard_normal(64))
    argv = ["intergroup", "--events", "2", "--alphas=0,2", "--layers", "3", "--out", str(out)]
    argv += ["--setting", "P0S1T0", "--vector", str(tmp_path / "v.npy")]  # 0-10: quick to score
    argv += ["--controls", "1"]
    assert steer_cli(model, *argv, *data_args()) == 0
    for name in ("steer.parquet", "summary.csv", "steer.png", "report.html", "manifest.json"):
        assert (out / name).is_file(), name
    rows = pd.read_parquet(out / "steer.parquet")
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 4 and set(summary["vector"]) == {"steer", "random"}
    assert {"perceiver", "experiencer", "event_id", "kl", "valid_mass_change"} <= set(rows)
    assert summary["label"].str.startswith("Δ, empathy gap").all()
    norms = summary.groupby("vector")["norm"].first()
    assert norms["random"] == pytest.approx(norms["steer"], rel=1e-12)
    zero = rows[rows["alpha"] == 0]
    assert (zero["kl"] == 0).all()
    manifest = json.loads((out / "manifest.json").read_text())  # what made these numbers
    assert manifest["weights"] == model.describe()["weights"] and manifest["seed"] == 0
    assert (manifest["sites"], manifest["layers"]) == (["hook_resid_post"], [3])
    assert manifest["versions"]["torch"] == torch.__version__
    assert re.fullmatch("[0-9a-f]{40}|unknown", manifest["commit"])
    steered = rows[rows["alpha"] == 2]
    assert (steered["kl"] > 0).all()
    alphas = out / "alphas"
    assert_same_reports(
        alphas / "hook_resid_post-L3-steer-a0", alphas / "hook_resid_post-L3-random-a0"
    )
    means = summary.set_index(["vector", "alpha"])["mean_kl"]
    assert means[("steer", 2.0)] == pytest.approx(
        steered[steered["vector"] == "steer"]["kl"].mean()
    )
    # a re-run reads every finished α back: nothing is scored again
    capsys.readouterr()
    monkeypatch.setattr("probekit.mechanism.steering.steered_results", _no_scoring)
    assert steer_cli(model, *argv, *data_args()) == 0
    assert "4 of 4 α runs already done" in capsys.readouterr().err
    pd.testing.assert_frame_equal(pd.read_parquet(out / "steer.parquet"), rows)
    # other settings in the same folder are refused, before any model is loaded
    other = [*argv, "--positions", "span"]
    assert steer_cli(None, *other, *data_args()) == 2
    assert "a different positions ('from_span', now 'span')" in capsys.readouterr().err


def _no_scoring(*args, **kwargs):
    raise AssertionError("a finished α was scored again")


def test_mean_diff_and_direction_are_the_contrast_of_captured_span_means(model):
    """Cross-fitted: each unit's prompts get the contrast of the other units' span means; the
    prompts of one unit, their own."""
    from probekit.core.items import Item

    texts = PROMPTS + ["I am a Christian. How sad?", "My aunt, a Hindu, lost her cat. How sad?"]
    items = [Item(f"p{i}", {}, f"u{i // 2}", text=t) for i, t in enumerate(texts)]
    encoded = [model.encode(item) for item in items]
    side = [True, False, True, False]  # each unit has both sides
    targets = [("hook_resid_post", 1), ("hook_mlp_out", 3)]
    args = (encoded, targets)
    diff = contrast_vectors(model, *args, "mean_diff", "answer", lambda p: side[encoded.index(p)])
    unit = contrast_vectors(model, *args, "direction", "answer", lambda p: side[encoded.index(p)])
    first = encoded[:2]  # one unit: no other to fit on, so its own contrast (a first try)
    own = contrast_vectors(model, first, targets, "mean_diff", "answer", lambda p: p is first[0])
    acts = probekit.capture(
        model, encoded, sites=["hook_resid_post", "hook_mlp_out"], layers=[1, 3]
    )
    for name, layer in targets:
        last = acts[f"blocks.{layer}.{name}"].double().numpy()  # one row per prompt: its last token
        held_out = {0: last[2] - last[3], 1: last[0] - last[1]}  # the other unit's contrast
        for i in range(4):
            expected = held_out[i // 2]
            assert np.allclose(diff[(name, layer)][i].numpy(), expected, atol=1e-5)
            found = unit[(name, layer)][i].numpy()
            assert np.allclose(found, expected / np.linalg.norm(expected), atol=1e-5)
        for i in range(2):
            assert np.allclose(own[(name, layer)][i].numpy(), last[0] - last[1], atol=1e-5)


def test_a_vector_file_is_read_per_layer(model, tmp_path):
    width, layers = model.hf.config.hidden_size, model.n_layers
    rows = np.random.default_rng(0).standard_normal((layers, width))
    np.save(tmp_path / "v.npy", rows)
    torch.save(torch.as_tensor(rows[3]), tmp_path / "v.pt")
    targets = [("hook_resid_post", 1), ("hook_mlp_out", 3)]
    per_layer = file_vectors(model, read_vector_file(tmp_path / "v.npy"), targets)
    assert np.allclose(per_layer[targets[1]].numpy(), rows[3])
    one = file_vectors(model, read_vector_file(tmp_path / "v.pt"), targets)
    assert all(np.array_equal(v.numpy(), rows[3]) for v in one.values())
    np.save(tmp_path / "bad.npy", rows[:2])
    with pytest.raises(ProbekitError, match="one row per layer"):
        file_vectors(model, read_vector_file(tmp_path / "bad.npy"), targets)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vector", "v.txt"], "give mean_diff, direction or a"),
        (["--vector", "missing.npy"], "no file missing.npy"),
        (["--alphas="], "no alphas given"),
        (["--positions", "nowhere"], "unknown positions 'nowhere'"),
        (["--sites", "attn.hook_z"], "per attention head"),
    ],
)
def test_bad_options_are_one_line(steer_cli, capsys, tmp_path, args, message):
    """Checked before any data or model is read."""
    out = ["--out", str(tmp_path / "x")]
    assert steer_cli(None, "intergroup", "--events", "1", *out, *args, *data_args()) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"alphaz": [1]}, "unknown keyword alphaz for steer_study('intergroup'); did you mean"),
        ({"batch_size": 0}, "batch_size must be at least 1 (got 0)"),
        ({"layers": "x"}, "layers must be a list of integers (got 'x')"),
        ({"positions": "nowhere"}, "positions: unknown positions 'nowhere'"),
    ],
)
def test_steer_study_refuses_bad_options_in_one_line(options, message):
    """The command as a function: its keywords checked by the command line's own types."""
    import probekit

    with pytest.raises(ProbekitError, match=re.escape(message)):
        probekit.steer_study("intergroup", **options)


# ---------------------------------------------------------------------- hostile state and input
class Days(MinimalStudy):
    """The docs' minimal study with what steering reads: its items and a headline (the gap)."""

    name = "days"

    def mechanism_items(self, options, context):
        probe = MinimalProbe(options.days)
        return probe, list(probe.items())

    def headlines(self, table, manifest):
        return [Headline("gap", "exact", float(table["gap"].iloc[0]), primary=True)]


DAYS = Days()


def steer_days(model, out, **options):
    """A steering run of `DAYS` (4 prompts, α 0 and 2, the vector and one control: 4 parts)."""
    options = {"layers": [LAYER], "alphas": [2], "controls": 1, "quiet": True, **options}
    return probekit.steer_study(DAYS, model, out=out, **options)


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_a_refused_vector_writes_nothing_and_the_corrected_run_goes_on(model, tmp_path):
    out, path = tmp_path / "steer", tmp_path / "v.npy"
    for values, message in [
        (np.zeros(64), "the vector is zero"),
        (np.full(64, np.nan), "non-finite values"),
        (np.ones((2, 3, 4)), "give one [d_model] vector"),
    ]:  # read before any model loads: the spec names no model
        np.save(path, values)
        with pytest.raises(ProbekitError) as error:
            steer_days("no/such-model", out, vector=str(path))
        assert message in one_line(error)
    np.save(path, np.ones(7))  # a shape only the loaded model refuses
    with pytest.raises(ProbekitError) as error:
        steer_days(model, out, vector=str(path))
    assert "has shape (7,)" in one_line(error)
    assert not out.exists()
    np.save(path, np.ones(64))
    with pytest.raises(ProbekitError) as error:
        steer_days(model, out, vector=str(path), alphas=[1e30])
    assert "α=1e+30 saturates the model" in one_line(error)
    assert not out.exists()
    done = steer_days(model, out, vector=str(path))
    assert len(done.summary) == 4 and (out / "manifest.json").is_file()


def test_steering_resumes_by_the_vectors_content_not_its_path(model, tmp_path, monkeypatch, capsys):
    out = tmp_path / "steer"
    values = np.random.default_rng(5).standard_normal(64)
    np.save(tmp_path / "v.npy", values)
    first = steer_days(model, out, vector=str(tmp_path / "v.npy"))
    np.save(tmp_path / "same.npy", values)
    monkeypatch.setattr("probekit.mechanism.steering.steered_results", _no_scoring)
    capsys.readouterr()
    again = steer_days(model, out, vector=str(tmp_path / "same.npy"))
    assert "4 of 4 α runs already done" in capsys.readouterr().err
    pd.testing.assert_frame_equal(again.table, first.table)
    np.save(tmp_path / "v.npy", 2 * values)  # the same path, other numbers
    with pytest.raises(ProbekitError) as error:
        steer_days(model, out, vector=str(tmp_path / "v.npy"))
    assert "a different vector_sha256" in one_line(error)


def test_the_unsteered_report_is_made_once_per_target(model, tmp_path, monkeypatch):
    """α = 0 scores the same rows for the vector and its control: the study reports them once
    and the control's α = 0 folder gets a copy of every report file and the headline."""
    from probekit.run import steer as run_steer

    made = []
    real = run_steer.study_headline
    monkeypatch.setattr(
        run_steer, "study_headline", lambda *args: made.append(args[2].name) or real(*args)
    )
    np.save(tmp_path / "v.npy", np.random.default_rng(8).standard_normal(64))
    done = steer_days(model, tmp_path / "steer", vector=str(tmp_path / "v.npy"))
    assert sorted(made) == sorted(
        f"hook_resid_post-L{LAYER}-{kind}-a{alpha}"
        for kind, alpha in (("steer", 0), ("steer", 2), ("random", 2))
    )
    alphas = tmp_path / "steer" / "alphas"
    assert_same_reports(
        alphas / f"hook_resid_post-L{LAYER}-steer-a0",
        alphas / f"hook_resid_post-L{LAYER}-random-a0",
    )
    at_zero = done.summary[done.summary["alpha"] == 0].set_index("vector")
    assert at_zero.loc["random", "value"] == at_zero.loc["steer", "value"]


def assert_same_reports(made: Path, copy: Path) -> None:
    """Every report file of `made` (all but its rows) is in `copy`, byte for byte."""
    reports = {p.name for p in made.iterdir()} - {"steer.parquet"}
    assert "headline.json" in reports
    for name in reports:
        assert (copy / name).read_bytes() == (made / name).read_bytes(), name


def test_damaged_parts_are_set_aside_and_scored_again(model, tmp_path, capsys):
    out = tmp_path / "steer"
    np.save(tmp_path / "v.npy", np.random.default_rng(6).standard_normal(64))
    vector = str(tmp_path / "v.npy")
    first = steer_days(model, out, vector=vector)
    part = out / "alphas" / f"hook_resid_post-L{LAYER}-steer-a2" / "steer.parquet"
    part.write_bytes(part.read_bytes()[:-40])  # truncated
    headline = part.parent.with_name(f"hook_resid_post-L{LAYER}-random-a2") / "headline.json"
    headline.write_text("{")
    capsys.readouterr()
    again = steer_days(model, out, vector=vector)
    err = capsys.readouterr().err
    assert "is damaged" in err and "steer.parquet.damaged" in err
    assert part.with_name("steer.parquet.damaged").is_file()
    pd.testing.assert_frame_equal(again.table, first.table)
    pd.testing.assert_frame_equal(again.summary, first.summary)
    assert json.loads(headline.read_text())["label"] == "gap"
    # a damaged manifest is one line
    (out / "manifest.json").write_text("{")
    with pytest.raises(ProbekitError) as error:
        steer_days(model, out, vector=vector)
    assert "manifest.json is damaged" in one_line(error)
    # deleted, as that line advises, and run with another seed: no part is reused
    (out / "manifest.json").unlink()
    capsys.readouterr()
    other = steer_days(model, out, vector=vector, seed=1)
    assert capsys.readouterr().err.count("steer.parquet.mismatched") == 4
    steered = other.table[other.table["vector"] == "steer"].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        steered, first.table[first.table["vector"] == "steer"].reset_index(drop=True)
    )


def test_the_page_shows_each_alpha_beside_the_control(model, tmp_path, capsys):
    np.save(tmp_path / "v.npy", np.random.default_rng(8).standard_normal(64))
    done = steer_days(model, tmp_path / "steer", vector=str(tmp_path / "v.npy"))
    page = (tmp_path / "steer" / "report.html").read_text()
    assert "random control" in page and 'src="data:image/png;base64,' in page
    for row in done.summary.itertuples():
        assert f"{row.value:+.3f}" in page and f"{row.mean_kl:.4f}" in page
    assert page.count("<tr>") >= 2 + done.summary["alpha"].nunique()
    capsys.readouterr()  # more αs later: only they are scored
    more = steer_days(model, tmp_path / "steer", vector=str(tmp_path / "v.npy"), alphas=[2, -2])
    assert "4 of 6 α runs already done" in capsys.readouterr().err
    assert len(more.summary) == 6 and sorted(set(more.summary["alpha"])) == [-2.0, 0.0, 2.0]


def test_saturating_alphas_and_non_finite_activations_are_one_line(model, vector):
    with pytest.raises(ProbekitError) as error:
        steer(model, PROMPTS[:1], vector, layers=[LAYER], alphas=[1e30], answers="0-10")
    assert "saturates the model" in one_line(error)
    from probekit.mechanism.steering import steered_results

    scorer = model.scorer(ANSWERS, epsilon=0.0)
    encoded = [model.encode(item) for item in as_items(PROMPTS[:1])]
    nan = torch.full((model.hf.config.hidden_size,), float("nan"), dtype=torch.float64)
    with pytest.raises(ProbekitError) as error:
        steered_results(scorer, encoded, ("hook_resid_post", LAYER), nan, "all", "answer")
    assert "are not finite" in one_line(error)


def test_nnsight_with_answer_positions_is_refused_before_any_work(steer_cli, capsys, tmp_path):
    argv = ["intergroup", "--hooks", "nnsight", "--positions", "all", "--out", str(tmp_path)]
    assert steer_cli(None, *argv) == 2
    err = capsys.readouterr().err
    assert "--positions all steers the answer tokens" in err and err.count("\n") == 1


def test_a_vector_file_is_checked_and_known_by_its_content(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.ones(4), "b": torch.ones(4)}, tmp_path / "two.safetensors")
    (tmp_path / "bad.npy").write_bytes(b"not an array")
    for name, message in [("two.safetensors", "holds 2 tensors"), ("bad.npy", "not readable")]:
        with pytest.raises(ProbekitError) as error:
            read_vector_file(tmp_path / name)
        assert message in one_line(error)
    np.save(tmp_path / "a.npy", np.arange(1.0, 5.0))
    torch.save(torch.arange(1.0, 5.0), tmp_path / "a.pt")
    np.save(tmp_path / "b.npy", np.arange(1.0, 5.0))
    a, b, pt = (read_vector_file(tmp_path / n) for n in ("a.npy", "b.npy", "a.pt"))
    assert a.sha256 == b.sha256 != pt.sha256  # the same bytes, another name; other bytes
    assert np.array_equal(a.values, pt.values)


def test_several_random_controls_by_default_pooled_on_the_page(model, tmp_path):
    out = tmp_path / "steer"
    steered = probekit.steer_study(DAYS, model, out=out, layers=[LAYER], alphas=[2], quiet=True)
    summary = steered.summary
    assert set(summary["vector"]) == {"steer", "random", "random2", "random3"}
    norms = summary[summary["alpha"] == 2].set_index("vector")["norm"]
    assert norms.drop("steer").to_numpy() == pytest.approx([norms["steer"]] * 3, rel=1e-9)
    at_two = summary[(summary["alpha"] == 2) & summary["vector"].str.startswith("random")]
    assert at_two["value"].nunique() == 3  # three different directions
    page = (out / "report.html").read_text()
    assert "random controls (mean; range)" in page
    low, high = at_two["value"].min(), at_two["value"].max()
    assert f"[{low:+.3f}, {high:+.3f}]" in page
