"""Nothing silently wrong on the input side: a damaged model cache is re-converted, damaged
weights and data are refused or said, bad values give the same line from the command line and the
API, and weak signals are warned about. Each test fails if its check is taken away."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import reference_data_root

import probekit
from probekit import cli
from probekit.core.errors import ProbekitError
from probekit.core.signal import WEAK_SIGNAL_VALID_MASS, prefill_trap, weak_signal
from probekit.datasets.crowd_envent import CROWD_ENVENT, SAMPLE_ROOT, load_crowd_envent
from probekit.engines.hf import gguf
from probekit.engines.hf.model import load_model

PROMPTS = [
    "On a scale from 0 to 10, how happy is someone who just won a prize? Answer with a number.",
    "On a scale from 0 to 10, how tired is someone after a marathon? Answer with a number.",
]


CHOICE = (
    "Question: What color is the sky on a clear day?\nA) green\nB) blue\nC) red\n"
    "Answer with A, B or C only."
)


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


# ---------------------------------------------------------------------- the model cache


@pytest.fixture
def cache_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the verified default-model cache in a fresh `PROBEKIT_CACHE` (mtimes kept, so
    its stamp still matches); the user's own cache is never touched."""
    source, _ = gguf.ensure_converted(gguf.default_gguf_path())
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path / "cache"))
    copy = gguf.converted_cache_dir(gguf.default_gguf_path())
    shutil.copytree(source, copy)
    assert gguf.verify_cache(copy) is None
    return copy


def overwrite(path: Path) -> None:
    """Replace 1 MiB in the middle of `path` by other bytes: the same length, another content."""
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.seek(size // 2)
        old = fh.read(1 << 20)
        fh.seek(size // 2)
        fh.write(bytes((b + 1) % 256 for b in old))
    assert path.stat().st_size == size


def truncate(path: Path) -> None:
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size // 2)


@pytest.mark.slow
@pytest.mark.parametrize("damage", [overwrite, truncate], ids=["overwritten", "truncated"])
def test_a_damaged_model_cache_is_converted_again(smol, cache_copy, capsys, damage):
    before = probekit.score(smol, PROMPTS, "0-10")
    damage(cache_copy / "model.safetensors")
    assert gguf.verify_cache(cache_copy) is not None
    capsys.readouterr()
    model = load_model("default")
    err = capsys.readouterr().err.splitlines()  # the line, and the converter's progress bar
    line = one_line("\n".join(x for x in err if "Converting and de-quantizing" not in x))
    assert "is damaged (model.safetensors" in line and "converting" in line
    after = probekit.score(model, PROMPTS, "0-10")
    assert np.isfinite(after["valid_mass"]).all() and (after["greedy"] != "").all()
    pd.testing.assert_frame_equal(after, before)
    assert gguf.verify_cache(cache_copy) is None


@pytest.mark.slow
def test_what_makes_a_cache_damaged(cache_copy):
    (cache_copy / "tokenizer.json").unlink()
    assert gguf.verify_cache(cache_copy) == "tokenizer.json is missing"
    (cache_copy / gguf.MARKER).write_text("{not json")
    assert gguf.verify_cache(cache_copy) == f"its record {gguf.MARKER} is unreadable"


@pytest.mark.slow
def test_an_untouched_cache_is_not_hashed_again(cache_copy, monkeypatch):
    def no_hashing(path: Path) -> str:
        raise AssertionError(f"{path} hashed although its size and mtime match the stamp")

    monkeypatch.setattr(gguf, "file_sha256", no_hashing)
    assert gguf.verify_cache(cache_copy) is None
    (cache_copy / gguf.STAMP).unlink()  # no stamp: every file is hashed
    with pytest.raises(AssertionError, match="hashed"):
        gguf.verify_cache(cache_copy)


@pytest.mark.slow
def test_a_damaged_cache_whose_gguf_is_gone_is_one_line(cache_copy, tmp_path):
    truncate(cache_copy / "model.safetensors")
    with pytest.raises(ProbekitError, match="is gone, so it cannot be converted again"):
        gguf.ensure_converted(tmp_path / "removed.gguf", cache=cache_copy)


class FakeConversion:
    """`gguf.read_gguf` without transformers: a "model" and a "tokenizer" whose save_pretrained
    writes one small file each, counting the conversions."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, path: Path):
        self.count += 1
        weights = path.read_bytes()  # the converted copy depends on the GGUF's content only

        class Saved:
            def __init__(self, name: str, data: bytes) -> None:
                self.name, self.data = name, data

            def save_pretrained(self, folder: Path) -> None:
                Path(folder).mkdir(parents=True, exist_ok=True)
                (Path(folder) / self.name).write_bytes(self.data)

        return Saved("model.safetensors", weights * 3), Saved("tokenizer.json", b"{}")


@pytest.fixture
def fake_conversion(tmp_path, monkeypatch) -> FakeConversion:
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path / "cache"))
    fake = FakeConversion()
    monkeypatch.setattr(gguf, "read_gguf", fake)
    return fake


def gguf_file(path: Path, content: bytes = b"GGUF one model") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_every_path_of_a_gguf_shares_one_converted_copy(fake_conversion, tmp_path):
    first = gguf_file(tmp_path / "venv-a" / "model.gguf")
    second = gguf_file(tmp_path / "venv-b" / "renamed.gguf")  # the same bytes elsewhere
    cache, record = gguf.ensure_converted(first)
    again, record_again = gguf.ensure_converted(second)
    assert again == cache and fake_conversion.count == 1
    assert record["gguf"] == str(first) and record_again["gguf"] == str(second)
    assert record["gguf_sha256"] == record_again["gguf_sha256"]
    folders = [p for p in (tmp_path / "cache" / "models").iterdir() if p.is_dir()]
    assert folders == [cache]
    other = gguf_file(tmp_path / "venv-c" / "model.gguf", b"GGUF another model")
    assert gguf.ensure_converted(other)[0] != cache and fake_conversion.count == 2


def test_a_gguf_is_hashed_once_until_it_changes(fake_conversion, tmp_path, monkeypatch):
    path = gguf_file(tmp_path / "model.gguf")
    hashed = []
    real = gguf.file_sha256
    monkeypatch.setattr(gguf, "file_sha256", lambda p: hashed.append(p) or real(p))
    first = gguf.converted_cache_dir(path)
    assert gguf.converted_cache_dir(path) == first and hashed == [path]
    gguf_file(path, b"GGUF a changed model")  # another size and mtime: hashed again
    assert gguf.converted_cache_dir(path) != first and hashed == [path, path]
    index = json.loads((tmp_path / "cache" / "models" / gguf.DIGESTS).read_text())
    assert index[str(path.resolve())][2] == real(path)


def test_a_copy_whose_record_names_another_gguf_is_converted_again(
    fake_conversion, tmp_path, capsys
):
    path = gguf_file(tmp_path / "model.gguf")
    cache, _ = gguf.ensure_converted(path)
    record = json.loads((cache / gguf.MARKER).read_text())
    (cache / gguf.MARKER).write_text(json.dumps({**record, "gguf_sha256": "f" * 64}))
    capsys.readouterr()
    gguf.ensure_converted(path)
    assert "its record names another GGUF" in one_line(capsys.readouterr().err)
    assert fake_conversion.count == 2
    assert json.loads((cache / gguf.MARKER).read_text())["gguf_sha256"] == record["gguf_sha256"]


@pytest.fixture
def tiny_folder(tmp_path) -> Path:
    """A two-layer model with the default model's tokenizer, saved as a model folder."""
    from probekit.testing.synthetic import tiny_model

    model = tiny_model(layers=2, width=32, mlp_width=64, head_width=8, context=256)
    folder = tmp_path / "tiny"
    model.hf.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.default_model
def test_folder_weights_with_nan_are_one_line(tiny_folder, capsys):
    assert load_model(str(tiny_folder)).n_layers == 2  # sound weights load
    from safetensors.torch import load_file, save_file

    weights = load_file(tiny_folder / "model.safetensors")
    weights["model.layers.0.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(weights, tiny_folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ProbekitError, match="gives non-finite logits"):
        load_model(str(tiny_folder))
    prompts = tiny_folder.parent / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "Hello"}\n')
    out = tiny_folder.parent / "o.parquet"
    args = ["score", "--model", str(tiny_folder), "--prompts", str(prompts)]
    assert cli.main([*args, "--answers", "0-3", "--scores", str(out)]) == 2
    assert "non-finite logits" in one_line(capsys.readouterr().err) and not out.exists()


@pytest.mark.slow
@pytest.mark.default_model
def test_truncated_folder_weights_are_one_line(tiny_folder):
    truncate(tiny_folder / "model.safetensors")
    with pytest.raises(ProbekitError, match="is not a model folder transformers can read"):
        load_model(str(tiny_folder))


# ---------------------------------------------------------------------- data


@pytest.fixture
def data_copy(tmp_path) -> Path:
    """A copy of the crowd-enVent data root: the real one when present, else probekit's
    sample."""
    root = reference_data_root() or SAMPLE_ROOT
    shutil.copytree(root / "crowd-enVent", tmp_path / "data" / "crowd-enVent")
    return tmp_path / "data"


def cut(path: Path, line: int) -> None:
    """Cut `path` in the middle of its `line`-th line (1-based), as a broken copy would."""
    lines = path.read_text(encoding="utf-8").split("\n")
    path.write_text("\n".join(lines[: line - 1] + [lines[line - 1][:60]]), encoding="utf-8")


def test_a_file_cut_mid_row_is_refused_with_file_and_line(data_copy, tmp_path, capsys):
    joy = data_copy / "crowd-enVent" / "crowd-enVent_joy.tsv"
    cut(joy, 4)
    with pytest.raises(ProbekitError, match=r"crowd-enVent_joy\.tsv:4: the file ends mid-row"):
        load_crowd_envent(data_copy)
    joy.write_text(joy.read_text(encoding="utf-8") + "\n", encoding="utf-8")  # ends in a newline
    with pytest.raises(ProbekitError, match=r"crowd-enVent_joy\.tsv:4: \d tab-separated fields"):
        load_crowd_envent(data_copy)
    # the command line refuses it before any model loads
    argv = ["run", "intergroup", "--data", str(data_copy), "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "crowd-enVent_joy.tsv:4:" in err.strip().splitlines()[-1]
    assert not (tmp_path / "run" / "scores.parquet").exists()


def test_an_empty_text_field_is_refused_with_its_line(data_copy):
    fear = data_copy / "crowd-enVent" / "crowd-enVent_fear.tsv"
    lines = fear.read_text(encoding="utf-8").split("\n")
    fields = lines[2].split("\t")
    fields[3] = ""
    lines[2] = "\t".join(fields)
    fear.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ProbekitError, match=r"fear\.tsv:3: the field first_person_text is empty"):
        load_crowd_envent(data_copy)


def test_local_data_is_checked_against_its_pinned_sums(data_copy, monkeypatch, capsys):
    real = reference_data_root() is not None  # asked before PROBEKIT_DATA names the copy
    monkeypatch.setenv("PROBEKIT_DATA", str(data_copy))
    anger = data_copy / "crowd-enVent" / "crowd-enVent_anger.tsv"
    if real:  # a copy of the real files: verified
        source = CROWD_ENVENT.find(None, print)
        assert "warning" not in capsys.readouterr().err
        assert CROWD_ENVENT.manifest(source)["data_verified"] is True
    anger.write_text(anger.read_text(encoding="utf-8").replace("a", "A", 1), encoding="utf-8")
    source = CROWD_ENVENT.find(None, print)
    assert "is not the pinned crowd-enVent file" in one_line(capsys.readouterr().err)
    fields = CROWD_ENVENT.manifest(source)
    assert fields["data_verified"] is False
    from probekit.core.paths import file_sha256

    assert fields["data_mismatched"]["crowd-enVent/crowd-enVent_anger.tsv"] == file_sha256(anger)
    # probekit's own sample is not pinned: nothing to verify, nothing said
    sample = CROWD_ENVENT.find(SAMPLE_ROOT, print)
    assert capsys.readouterr().err == ""
    assert CROWD_ENVENT.manifest(sample)["data_verified"] is None


# ---------------------------------------------------------------------- one validation


def cli_score(tmp_path: Path, capsys, *options: str) -> tuple[int, str]:
    prompts = tmp_path / "p.jsonl"
    if not prompts.exists():
        prompts.write_text(
            "".join(json.dumps({"id": i, "text": p}) + "\n" for i, p in enumerate(PROMPTS))
        )
    argv = ["score", "--prompts", str(prompts), "--scores", str(tmp_path / "o.parquet"), *options]
    code = cli.main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("keyword", "value", "text"),
    [
        ("epsilon", -1, "-1"),
        ("epsilon", float("nan"), "nan"),
        ("epsilon", "abc", "abc"),
        ("batch_size", 0, "0"),
        ("batch_size", 2.5, "2.5"),
    ],
)
def test_the_api_and_the_command_line_refuse_a_value_in_the_same_words(
    tmp_path, capsys, keyword, value, text
):
    flag = "--" + keyword.replace("_", "-")
    code, err = cli_score(tmp_path, capsys, "--answers", "0-10", f"{flag}={text}")
    assert code == 2
    cli_line = one_line(err).removeprefix("probekit: error: ")
    with pytest.raises(ProbekitError) as refused:  # refused before any model is loaded
        probekit.score("no-such-model-is-loaded", PROMPTS, "0-10", **{keyword: value})
    assert str(refused.value) == cli_line.replace(flag, keyword, 1)


def test_answer_lists_are_the_answer_sets_they_name(tiny):
    words = probekit.score(tiny, PROMPTS, ["yes", "no"])
    pd.testing.assert_frame_equal(words, probekit.score(tiny, PROMPTS, "yes,no"))
    numbers = probekit.score(tiny, PROMPTS, [1, 2, 3])
    pd.testing.assert_frame_equal(numbers, probekit.score(tiny, PROMPTS, "1-3"))
    assert "expected" in numbers.columns


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        (None, r"^score\(\) needs answers"),
        ([1], "has one answer"),
        ([1, None], "answer 1 is None"),
        (["a", "a"], "duplicate answer 'a'"),
        ({"a", "b"}, "got set"),
    ],
)
def test_bad_answer_values_are_one_line(answers, message):
    with pytest.raises(ProbekitError, match=message):
        probekit.score("no-such-model-is-loaded", PROMPTS, answers)


def test_a_model_that_is_not_one_is_one_line():
    with pytest.raises(ProbekitError, match=r"model must be a str, a Path or an Engine \(got 42\)"):
        probekit.score(42, PROMPTS, "0-10")
    with pytest.raises(ProbekitError, match="prefill must be text \\(got 3\\)"):
        probekit.score("no-such-model-is-loaded", PROMPTS, "0-10", prefill=3)


# ---------------------------------------------------------------------- weak signal


@pytest.mark.slow
def test_a_weak_signal_is_said_in_the_api_and_on_the_command_line(smol, tmp_path, capsys):
    question = ["Which letter comes first in the alphabet? Answer with one letter."]
    with pytest.warns(UserWarning, match="weak signal: the mean valid mass is"):
        scores = probekit.score(smol, question, "1-7")  # digits for a letter: 0.02 here
    assert scores["valid_mass"].mean() < WEAK_SIGNAL_VALID_MASS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a question that fits its answers: 0.6 here, no warning
        fits = probekit.score(smol, [CHOICE], "A-C")
    assert fits["valid_mass"].mean() >= WEAK_SIGNAL_VALID_MASS
    prompts = tmp_path / "letters.jsonl"
    prompts.write_text(json.dumps({"id": "q", "text": question[0]}) + "\n")
    argv = ["score", "--prompts", str(prompts), "--answers", "1-7", "--scores", str(tmp_path / "o")]
    capsys.readouterr()
    assert cli.main([*argv, "--quiet"]) == 0  # no progress line: the warning still says itself
    lines = capsys.readouterr().err.splitlines()  # and the tier the rows were scored in
    warned = [line for line in lines if line.startswith("probekit: warning: ")]
    assert len(warned) == 1 and "weak signal" in warned[0]
    assert [line for line in lines if line not in warned][0].startswith("probekit: precision: ")
    assert weak_signal(0.2) is None and WEAK_SIGNAL_VALID_MASS in (0.05,)


@pytest.mark.slow
def test_a_prefill_ending_in_whitespace_is_warned_about(smol, tmp_path, capsys):
    with pytest.warns(UserWarning, match="ends in whitespace"):
        spaced = probekit.score(smol, [CHOICE], "A-C", prefill="Answer: ")
    unspaced = probekit.score(smol, [CHOICE], "A-C", prefill="Answer:")
    assert spaced["valid_mass"][0] < unspaced["valid_mass"][0] / 4  # the trap it warns of
    assert prefill_trap("Answer:") is None and prefill_trap("[[") is None
    code, err = cli_score(tmp_path, capsys, "--answers", "0-10", "--prefill", "Answer: ")
    assert code == 0 and "ends in whitespace" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["run", "intergroup", "--event", "2"],
            "unrecognized arguments: --event 2; did you mean --events?",
        ),
        (
            ["score", "--epsilonn", "1"],
            "unrecognized arguments: --epsilonn 1; did you mean --epsilon?",
        ),
        (["score", "--zzz"], "unrecognized arguments: --zzz"),
    ],
)
def test_options_are_matched_exactly_with_a_did_you_mean(tmp_path, capsys, argv, message):
    if argv[0] == "score":
        prompts = tmp_path / "p.jsonl"
        prompts.write_text('{"id": "a", "text": "Hi"}\n')
        files = ["--prompts", str(prompts), "--answers", "0-3", "--scores", str(tmp_path / "o")]
        argv = [*argv, *files]
    assert cli.main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"probekit: error: {message}")
    assert "did you mean" in line or "--zzz" in argv


# ---------------------------------------------------------------------- smaller ones


@pytest.mark.parametrize("device", ["cuda", "cuda:7", "mps"])
def test_a_device_this_torch_lacks_is_one_line(tmp_path, capsys, device):
    available = {
        "cuda": torch.cuda.is_available(),
        "cuda:7": torch.cuda.device_count() > 7,
        "mps": torch.backends.mps.is_available(),
    }
    if available[device]:
        pytest.skip(f"{device} is available here")
    with pytest.raises(ProbekitError, match=f"^device='{device}': "):  # the caller's words
        load_model("default", device=device)
    code, err = cli_score(tmp_path, capsys, "--answers", "0-3", "--device", device)
    assert code == 2 and f"--device {device}: " in one_line(err)


def test_an_empty_prompt_is_one_line_naming_it(tmp_path, capsys):
    with pytest.raises(ProbekitError, match=r"item '1': the prompt is empty"):
        probekit.score("no-such-model-is-loaded", ["Hello", "  "], "0-3")
    with pytest.raises(ProbekitError, match=r"prompt 0: the prompt is empty"):
        probekit.score("no-such-model-is-loaded", [[{"role": "user", "content": ""}]], "0-3")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "text": "Hi"}\n{"id": "b", "text": ""}\n')
    code, err = cli_score(tmp_path, capsys, "--answers", "0-3")
    assert code == 2 and f"{prompts}:2: id 'b': the prompt is empty" in one_line(err)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ('{"id": null, "text": "Hi"}', "'id' is null; give a string or a number"),
        ('{"id": true, "text": "Hi"}', "'id' is true"),
        ('{"id": [1], "text": "Hi"}', "'id' is a list"),
        ('{"id": " ", "text": "Hi"}', "'id' is empty"),
    ],
)
def test_an_id_that_is_not_one_is_refused_with_its_line(tmp_path, capsys, record, message):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 7, "text": "Hi"}\n' + record + "\n")
    code, err = cli_score(tmp_path, capsys, "--answers", "0-3")
    assert code == 2 and f"{prompts}:2: {message}" in one_line(err)


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        ("1", "1.0", "duplicate id '1' (line 1 has it)"),
        ("100", "1e2", "duplicate id '100' (line 1 has it)"),
        ('"2.5"', "2.5", "duplicate id '2.5' (line 1 has it)"),  # the same text: one row
    ],
)
def test_ids_are_compared_as_the_json_values_they_are(tmp_path, first, second, message):
    """`1` and `1.0` are one JSON number: one id, and the second line is a duplicate (they
    were two rows, "1" and "1.0")."""
    from probekit.core.prompts import read_prompts

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(f'{{"id": {first}, "text": "Hi"}}\n{{"id": {second}, "text": "Ho"}}\n')
    with pytest.raises(ProbekitError) as error:
        list(read_prompts(prompts))
    assert str(error.value) == f"{prompts}:2: {message}"
    prompts.write_text('{"id": 3.0, "text": "Hi"}\n{"id": 3.5, "text": "Ho"}\n')
    assert [item.id for item in read_prompts(prompts)] == ["3", "3.5"]
    prompts.write_text('{"id": NaN, "text": "Hi"}\n')
    with pytest.raises(ProbekitError, match="'id' is nan; give a string or a finite number"):
        list(read_prompts(prompts))
