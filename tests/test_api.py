"""The script API: `probekit.score` against `probekit score`, the prompt forms it accepts, and a
public surface whose every name is what its docstring says."""

from __future__ import annotations

import importlib
import json
import pkgutil

import numpy as np
import pandas as pd
import pytest

import probekit
from probekit import cli
from probekit.core.errors import ProbekitError
from probekit.core.items import Item

pytestmark = pytest.mark.slow

SYSTEM = "You are a Buddhist.\nOnly give the scale number."
USER = 'A Hindu says: "I lost my keys." How much anger, 0 to 10?\nEmotion intensity:'


def test_score_equals_the_command(smol, tmp_path):
    records = [
        {
            "id": "chat",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
        },
        {"id": "raw", "text": "Q: Pick a number from 0 to 10.\nA:"},
    ]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "o.parquet"
    assert (
        cli.main(["score", "--prompts", str(prompts), "--answers", "0-10", "--scores", str(out)])
        == 0
    )
    command = pd.read_parquet(out)
    script = probekit.score(smol, prompts, "0-10")
    assert list(script.columns) == list(command.columns)
    assert list(script["id"]) == ["chat", "raw"]
    numbers = [c for c in command.columns if c not in ("id", "greedy", "most_probable")]
    assert np.allclose(script[numbers], command[numbers], atol=1e-6, rtol=0)
    assert list(script["greedy"]) == list(command["greedy"])


def test_every_prompt_form_gives_the_same_row(smol):
    messages = [{"role": "user", "content": USER}]
    forms = [
        USER,
        [USER],
        [messages],
        [Item(messages=tuple(messages))],
    ]
    frames = [probekit.score(smol, form, "0-10", epsilon=0) for form in forms]
    for frame in frames:
        assert list(frame["id"]) == ["0"]
        assert frame["error_bound"].iloc[0] == 0
        assert np.allclose(frame.filter(like="p::"), frames[0].filter(like="p::"), atol=1e-12)


def test_letter_range_and_prefill(smol):
    frame = probekit.score(
        smol, ["Which letter comes first? Answer as [[X]]."], "A-E", prefill="[["
    )
    assert [c for c in frame if c.startswith("p::")] == [f"p::{x}" for x in "ABCDE"]
    assert np.isclose(frame.filter(like="p::").to_numpy().sum(), 1.0)
    assert "expected" not in frame and frame["greedy"].iloc[0] in "ABCDE"


@pytest.mark.parametrize(
    "prompts, answers, message",
    [
        ([3], "0-10", r"prompts must be .* \(got \[3\]\)"),
        ({"role": "user", "content": "x"}, "0-10", "prompts must be"),
        ([[{"role": "robot", "content": "x"}]], "0-10", "role"),
        (["x"], "A", "one answer"),
        ([], "0-10", "no prompts"),
    ],
)
def test_bad_input_is_one_line(smol, prompts, answers, message):
    with pytest.raises(ProbekitError, match=message) as caught:
        probekit.score(smol, prompts, answers)
    assert "\n" not in str(caught.value)


def test_public_names_are_what_they_say_on_every_access():
    before = {name: getattr(probekit, name) for name in probekit.__all__}
    for info in pkgutil.walk_packages(probekit.__path__, "probekit."):
        if not info.name.startswith(("probekit.studies.", "probekit.engines.vllm")):
            importlib.import_module(info.name)
    for name in probekit.__all__:
        value = getattr(probekit, name)
        assert value is before[name], name
        if name != "__version__":
            assert not isinstance(value, type(probekit)), f"probekit.{name} is a module"
            assert (value.__doc__ or "").strip(), f"probekit.{name} has no docstring"


def test_the_scorer_refuses_text_where_token_ids_go(smol):
    scorer = smol.scorer(probekit.AnswerSet.parse("0-10"))
    for bad in (["text"], [[]], [["a", "b"]]):
        with pytest.raises(ProbekitError, match="token-id lists"):
            list(scorer.score(bad))
