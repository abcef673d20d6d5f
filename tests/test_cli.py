"""`probekit score` end to end: output columns and order, and one clear line for bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from probekit import cli
from probekit.datasets.crowd_envent import SAMPLE_ROOT

SYSTEM = "You are a Buddhist.\nOnly give the scale number."
USER = 'A Hindu says: "I lost my keys." How much anger, 0 to 100?\nEmotion intensity:'


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run(tmp_path, lines, answers="0-10", extra=()):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(lines)
    out = tmp_path / "o.parquet"
    code = cli.main(
        ["score", "--prompts", str(prompts), "--answers", answers, "--scores", str(out), *extra]
    )
    return code, out


@pytest.mark.slow
def test_score_writes_rows_in_input_order(tmp_path, capsys):
    records = [
        {
            "id": "chat",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
        },
        {"id": "raw", "text": "Q: Pick a number from 0 to 10.\nA:"},
        {"id": "z-last", "text": "On a scale from 0 to 10, I would say"},
    ]
    code, out = run(
        tmp_path,
        "".join(json.dumps(r) + "\n" for r in records),
        "0-10",
        ["--batch-size", "2", "--epsilon", "0"],
    )
    assert code == 0, capsys.readouterr().err
    frame = pd.read_parquet(out)
    assert list(frame["id"]) == ["chat", "raw", "z-last"]
    for column in ("valid_mass", "greedy", "expected", "std", "error_bound"):
        assert column in frame
    probs = frame[[f"p::{v}" for v in range(11)]].to_numpy()
    assert np.allclose(probs.sum(1), 1.0)
    assert (frame["error_bound"] == 0).all()
    assert np.allclose(frame["expected"], probs @ np.arange(11))


@pytest.mark.slow
def test_prefill_and_choice_answers(tmp_path):
    lines = json.dumps({"id": "q", "text": "Which letter comes first? Answer in [[X]] form: "})
    code, out = run(tmp_path, lines + "\n", "A,B,C,D", ["--prefill", "[["])
    assert code == 0
    frame = pd.read_parquet(out)
    assert "expected" not in frame and frame["greedy"].iloc[0] in "ABCD"


BAD = [
    ("0-10", '{"id": "a", "text": "x"}\nnot json\n', "p.jsonl:2: not valid JSON"),
    ("0-10", '{"text": "x"}\n', "p.jsonl:1: missing 'id'"),
    ("0-10", '{"id": "a"}\n', "neither 'messages' nor 'text'"),
    ("0-10", '{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', "p.jsonl:2: duplicate id 'a'"),
    ("0-10", '{"id": "a", "messages": [{"role": "robot", "content": "x"}]}\n', "role in"),
    ("", '{"id": "a", "text": "x"}\n', "empty"),
    ("A,B,A", '{"id": "a", "text": "x"}\n', "duplicate answer 'A'"),
    ("10-0", '{"id": "a", "text": "x"}\n', "lo > hi"),
    ("0-10", json.dumps({"id": "long", "text": "7 " * 9000}) + "\n", "id 'long': prompt has"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("answers", "lines", "message"), BAD)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, answers, lines, message):
    code, out = run(tmp_path, lines, answers)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("probekit: error:") and message in err[0]
    assert not out.exists() and not list(tmp_path.glob(".o.parquet*"))


@pytest.mark.slow
def test_chat_prompt_for_model_without_template(tmp_path, capsys, monkeypatch, smol):
    monkeypatch.setattr(smol.tokenizer, "chat_template", None)
    monkeypatch.setattr("probekit.engines.hf.model.load_model", lambda *a, **k: smol)
    lines = json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n"
    code, out = run(tmp_path, lines)
    assert code == 2
    err = capsys.readouterr().err
    assert "has no chat template" in err and "give one (--chat-template FILE, or gemma" in err
    assert not out.exists()


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    for command in ("studies", "run", "patch", "capture", "lens", "report", "score", "setup"):
        assert command in text


def test_studies_lists_each_study_on_one_line(capsys):
    assert cli.main(["studies"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("intergroup ") and "NAACL 2025" in line for line in lines)
    assert [line.split()[0] for line in lines] == ["giebench", "intergroup", "isear", "jaem-st"]


SAMPLES = str(SAMPLE_ROOT)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "nonesuch"], "unknown study 'nonesuch'; the studies are giebench, intergroup"),
        (["run"], "name a study"),
        (["patch", "intergroup", "--readout", "p:A", "--data", SAMPLES], "'A' is not an answer"),
        (
            ["patch", "intergroup", "--spans", "speaker", "--data", SAMPLES],
            "unknown span 'speaker'",
        ),
        (["run", "intergroup", "--view", "sample"], "--view: unknown view 'sample'"),
        (
            ["run", "isear", "--event", "3"],
            "unrecognized arguments: --event 3; did you mean --events?",
        ),
        (["run", "intergroup", "--mode", "generate"], "unrecognized arguments: --mode"),
        (["patch", "intergroup", "--metric", "expected"], "unrecognized arguments: --metric"),
        (["capture", "intergroup", "--backend", "nnsight"], "unrecognized arguments: --backend"),
        (["lens", "intergroup", "--layers", "x"], "--layers: 'x' is not"),
        (["lens", "intergroup", "--min-valid-mass", "2"], "--min-valid-mass must be between 0"),
        (["lens", "intergroup", "--sites", "resid_pre"], "unrecognized arguments: --sites"),
        (["lens", "isear", "--events", "0"], "--events must be at least 1"),
        (
            ["score", "--answer", "0-10", "--prompts", "p.jsonl", "--scores", "o.parquet"],
            "unrecognized arguments: --answer 0-10; did you mean --answers?",
        ),
        (["score", "--prompts", "p.jsonl", "--scores", "o.parquet"], "required: --answers"),
        (
            ["score", "--prompts", "p.jsonl", "--answers", "0-10", "--out", "o.parquet"],
            "--out names a run folder; probekit score writes one Parquet file: --scores FILE",
        ),
        (
            ["score", "--prompts", "p.jsonl", "--answers", "0-10", "--scores", "/dev/null/o.pq"],
            "--scores /dev/null is a file, not a folder",
        ),
        (["plan", "--model", "default", "--devices", "cpu=1GiB", "--dtype", "int8"], "'int8'"),
        (["report", "/nonexistent/run"], "is not a folder"),
    ],
)
def test_study_commands_refuse_bad_input_in_one_line(capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_public_api_names_resolve():
    import probekit

    assert probekit.__all__ and len(set(probekit.__all__)) == len(probekit.__all__)
    for name in probekit.__all__:
        assert getattr(probekit, name) is not None
    with pytest.raises(AttributeError):
        _ = probekit.no_such_name


def test_the_score_command_is_a_function(tmp_path, monkeypatch):
    """`probekit.score_file` is the score command: its rows are `probekit.score`'s for the same
    prompts, streamed to the file; every line is checked before the model loads."""
    from test_run_state import CountingEngine

    import probekit
    import probekit.engines
    from probekit.core.errors import ProbekitError

    prompts = write_jsonl(
        tmp_path / "p.jsonl", [{"id": f"d{i}", "text": f"Day {i}?"} for i in range(9)]
    )
    out = probekit.score_file(CountingEngine(), prompts, tmp_path / "o.parquet", "0-3", quiet=True)
    expected = probekit.score(CountingEngine(), [f"Day {i}?" for i in range(9)], "0-3", quiet=True)
    written = pd.read_parquet(out)
    assert written["id"].tolist() == [f"d{i}" for i in range(9)]
    pd.testing.assert_frame_equal(written.drop(columns="id"), expected.drop(columns="id"))

    def no_load(*args, **kwargs):
        pytest.fail("the model was loaded before the prompt file was checked")

    monkeypatch.setattr(probekit.engines, "load_engine", no_load)
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "text": "ok"}\n{"id": "b"}\n')
    with pytest.raises(ProbekitError, match=r"bad.jsonl:2: id 'b' has neither"):
        probekit.score_file("default", tmp_path / "bad.jsonl", tmp_path / "x.parquet", "0-3")
    with pytest.raises(ProbekitError, match="epsilon"):
        probekit.score_file("default", prompts, tmp_path / "x.parquet", "0-3", epsilon=-1)
    assert not (tmp_path / "x.parquet").exists()
