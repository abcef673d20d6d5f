"""Users' text files and strings: a UTF-8 byte-order mark at a file's start is dropped, bytes that
are not UTF-8 and lone surrogates (a JSON `"\\ud800"` escape) are refused in one line naming the
file, line and column or the prompt's id, in every reader: prompt files, answer files, items,
and the data files of the studies (crowd-enVent, ISEAR, GIEBench records, JaEm-ST's JSON)."""

from __future__ import annotations

import json
import shutil

import pytest

import probekit
from probekit import cli
from probekit.core.answers import AnswerSet, as_answer_set
from probekit.core.errors import ProbekitError
from probekit.core.items import Item
from probekit.core.prompts import read_prompts
from probekit.core.text import read_json, read_text
from probekit.datasets.crowd_envent import SAMPLE_ROOT, load_crowd_envent

BOM = b"\xef\xbb\xbf"
LONE = "holds a lone surrogate"


def test_a_bom_is_dropped_and_undecodable_bytes_are_named_by_line_and_column(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(BOM + b"first\nsecond")
    assert read_text(path) == "first\nsecond"
    path.write_bytes(b"first\nse\xffcond\n")
    with pytest.raises(ProbekitError, match=r"t.txt:2: not UTF-8 \(byte 0xff at column 3\)"):
        read_text(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": "x\\ud800y"}', r"t.json:1: the escape \\ud800 at column 9 is a lone surrogate"),
        ('[1,\n "\\uDC00"]', r"t.json:2: the escape \\udc00 at column 3 is a lone surrogate"),
        ('{"a": "\\ud800\\ud800\\udc00"}', r"t.json:1: the escape \\ud800 at column 8"),
        ('{"a": 1,}', r"t.json:1: not valid JSON \(Expecting property name"),
    ],
)
def test_json_files_name_the_line_of_a_lone_surrogate(tmp_path, text, message):
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(ProbekitError, match=message):
        read_json(path)


def test_json_files_read_pairs_escaped_backslashes_and_a_bom(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(BOM + b'{"pair": "\\ud83d\\ude00", "escaped": "\\\\ud800"}')
    assert read_json(path) == {"pair": "\U0001f600", "escaped": "\\ud800"}


def test_a_prompt_file_with_a_bom_reads_and_a_lone_surrogate_names_file_line_and_id(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(BOM + b'{"id": "a", "text": "hi"}\n{"id": "b", "text": "x\\ud800"}\n')
    with pytest.raises(ProbekitError, match=rf"p.jsonl:2: id 'b': 'text' {LONE} \\ud800"):
        list(read_prompts(path))
    path.write_bytes(BOM + b'{"id": "a", "text": "hi"}\n')
    assert [item.id for item in read_prompts(path)] == ["a"]
    chat = b'{"id": "c", "messages": [{"role": "user", "content": "\\udfff"}]}\n'
    path.write_bytes(chat)
    with pytest.raises(ProbekitError, match=rf"p.jsonl:1: id 'c': message 0 {LONE}"):
        list(read_prompts(path))
    path.write_bytes(b'{"id": "\\ud800", "text": "hi"}\n')
    with pytest.raises(ProbekitError, match=rf"p.jsonl:1: 'id' {LONE}"):
        list(read_prompts(path))


def test_the_score_command_refuses_a_lone_surrogate_before_loading(tmp_path, monkeypatch, capsys):
    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("probekit.engines.load_engine", loaded)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "q1", "text": "How sad?\\ud83d"}\n')
    argv = ["score", "--prompts", str(prompts), "--answers", "0-10"]
    assert cli.main([*argv, "--scores", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err
    assert f"p.jsonl:1: id 'q1': 'text' {LONE} \\ud83d at character 9" in err
    assert err.count("\n") == 1


def test_items_answers_and_python_prompts_refuse_lone_surrogates(tmp_path):
    with pytest.raises(ProbekitError, match=rf"item 'x': its text {LONE}"):
        Item("x", text="a\udc00")
    with pytest.raises(ProbekitError, match=rf"item 'y': its prefill {LONE}"):
        Item("y", text="a", prefill="\ud800")
    with pytest.raises(ProbekitError, match=rf"answer 1 \('b\\ud800'\) {LONE}"):
        AnswerSet(("a", "b\ud800"))
    with pytest.raises(ProbekitError, match=rf"item '0': its message 0 {LONE}"):
        probekit.score("default", ["caf\ud800"], "A,B")  # refused before the model loads
    answers = tmp_path / "answers.txt"
    answers.write_bytes(BOM + b"yes\nno\n")
    assert as_answer_set(f"@{answers}").answers == ("yes", "no")


def test_a_crowd_envent_file_with_a_bom_reads_as_without(tmp_path):
    shutil.copytree(SAMPLE_ROOT, tmp_path / "data")
    first = sorted((tmp_path / "data" / "crowd-enVent").glob("*.tsv"))[0]
    first.write_bytes(BOM + first.read_bytes())
    assert load_crowd_envent(tmp_path / "data").equals(load_crowd_envent(SAMPLE_ROOT))
    first.write_bytes(first.read_bytes().replace(b"\n", b"\n\xc3(", 2))
    with pytest.raises(ProbekitError, match=r"crowd-enVent_anger.tsv:2: not UTF-8"):
        load_crowd_envent(tmp_path / "data")


def test_isear_events_and_giebench_records_read_text_the_same_way(tmp_path):
    from probekit.studies.giebench.sources import SAMPLE_FILE, read_records
    from probekit.studies.isear.events import FILE, SAMPLE_ROOT, load_events

    shutil.copytree(SAMPLE_ROOT, tmp_path / "isear")
    events = tmp_path / "isear" / FILE
    events.write_bytes(BOM + events.read_bytes())
    assert load_events(tmp_path / "isear") == load_events(SAMPLE_ROOT)  # the BOM is no event's
    records = json.loads(SAMPLE_FILE.read_text(encoding="utf-8"))
    text = json.dumps(records, indent=1).replace('"question": "', '"question": "\\udead ', 1)
    broken = tmp_path / "records.json"
    broken.write_text(text)
    line = text[: text.index("\\udead")].count("\n") + 1
    with pytest.raises(ProbekitError, match=rf"records.json:{line}: the escape \\udead"):
        read_records(broken)


def test_prompt_files_joined_with_their_marks_read_every_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(BOM + b'{"id": "a", "text": "hi"}\n' + BOM + b'{"id": "b", "text": "ho"}\n')
    assert [item.id for item in read_prompts(path)] == ["a", "b"]
