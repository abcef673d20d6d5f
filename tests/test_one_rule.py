"""One input, one rule (issue 62): the same input gets the same answer on every path that reads
it (a spec or an `AnswerSet`, a JSONL line or an `Item`, the command line's text or a Python
list), and what a user can get wrong is refused in one line, never a traceback."""

from __future__ import annotations

import argparse

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from probekit.core.answers import AnswerSet, as_answer_set
from probekit.core.errors import ProbekitError
from probekit.core.io import check_writable
from probekit.core.items import PROMPT_ID, Item, fill_template
from probekit.core.kinds import count_or_all, float_list, int_list
from probekit.core.prompts import parse_prompt_line, read_prompts
from probekit.core.rundir import RowKey, RunDir
from probekit.core.store import ARROW_SCHEMA, INDEX, Damaged, read_rows, schema_of, write_rows

USER = {"role": "user", "content": "x"}


@pytest.mark.parametrize(
    "make",
    [
        lambda: AnswerSet(("A",)),
        lambda: AnswerSet.parse("A-A"),
        lambda: AnswerSet.parse("7"),
        lambda: as_answer_set(["A"]),
    ],
)
def test_a_set_of_one_answer_is_refused_however_it_is_given(make):
    with pytest.raises(ProbekitError, match="one answer.*, whose probability is always 1"):
        make()


@pytest.mark.parametrize(
    ("spec", "answers"),
    [
        ("00-09", [f"0{d}" for d in range(10)]),
        ("0-09", [f"0{d}" for d in range(10)]),
        ("-05-05", ["-05", "-04", "-03", "-02", "-01", "00", "01", "02", "03", "04", "05"]),
        ("8-10", ["8", "9", "10"]),
        ("-2-0", ["-2", "-1", "0"]),
    ],
)
def test_an_integer_range_keeps_the_zero_padding_it_is_written_with(spec, answers):
    parsed = AnswerSet.parse(spec)
    assert list(parsed.answers) == answers and parsed.kind.name == "integer"


@pytest.mark.parametrize(
    ("written", "pid"),
    [
        ("1e300", "1" + "0" * 300),
        ("1.0", "1"),
        ("1e0", "1"),
        ("2.50", "2.5"),
        ("1e-7", "0.0000001"),
    ],
)
def test_a_number_id_is_the_exact_value_it_is_written_as(written, pid):
    assert parse_prompt_line(f'{{"id": {written}, "text": "x"}}', "p.jsonl:1").id == pid


def test_text_and_messages_together_are_refused_from_a_file_and_from_an_item():
    with pytest.raises(ProbekitError, match="has both 'messages' and 'text'; give one"):
        parse_prompt_line(
            '{"id": "a", "text": "x", "messages": [{"role": "user", "content": "x"}]}', "w"
        )
    with pytest.raises(ProbekitError, match="one of them"):
        Item("a", text="x", messages=[USER])


@pytest.mark.parametrize("role", ["robot", "User"])
def test_an_unknown_role_is_refused_from_a_file_and_from_an_item(role):
    said = "each message needs a role in"
    with pytest.raises(ProbekitError, match=said):
        Item("a", messages=[{"role": role, "content": "x"}])
    line = f'{{"id": "a", "messages": [{{"role": "{role}", "content": "x"}}]}}'
    with pytest.raises(ProbekitError, match=said):
        parse_prompt_line(line, "w")
    assert Item("a", messages=[USER]).messages == (USER,)  # a list held as a tuple


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_reads_the_same_records(tmp_path, end):
    path = tmp_path / "p.jsonl"
    path.write_bytes(end.join([b'{"id": "a", "text": "x"}', b"", b'{"id": "b", "text": "y"}', b""]))
    assert [item.id for item in read_prompts(path)] == ["a", "b"]
    path.write_bytes(end.join([b'{"id": "a", "text": "x"}', b'{"id": "a", "text": "y"}']))
    with pytest.raises(ProbekitError, match=r"p\.jsonl:2: duplicate id 'a' \(line 1 has it\)"):
        list(read_prompts(path))


def test_a_duplicate_id_is_refused_from_items_as_from_a_file():
    """Two `Item`s with one id would be two rows under one `prompt_id`: refused before any
    model work, as a prompt file's repeated id is (it was kept from Python)."""
    from probekit.engines.score import as_items

    with pytest.raises(ProbekitError, match=r"^prompt 1: duplicate id 'a' \(prompt 0 has it\)$"):
        list(as_items([Item("a", text="x"), Item("a", text="y")]))
    with pytest.raises(ProbekitError, match="prompt 1: duplicate id '0'"):
        list(as_items(["x", Item("0", text="y")]))  # a given id against a position's
    assert [item.id for item in as_items(["x", "y"])] == ["0", "1"]


def test_a_folder_given_as_a_file_is_called_a_folder(tmp_path):
    with pytest.raises(ProbekitError, match="answer file '.*' is a folder, not a file"):
        AnswerSet.parse(f"@{tmp_path}")
    with pytest.raises(ProbekitError, match="prompt file '.*' is a folder$"):
        list(read_prompts(tmp_path))
    with pytest.raises(ProbekitError, match="does not exist"):
        AnswerSet.parse(f"@{tmp_path / 'none'}")


@pytest.mark.parametrize(("kind", "what"), [(int_list, "integers"), (float_list, "numbers")])
def test_a_list_option_is_refused_empty_or_with_a_repeat_from_text_and_from_python(kind, what):
    """`--layers ''` and `layers=[]` are one input: both refused, as are `3,3` and `[3, 3]`."""
    for given in (lambda: kind(""), lambda: kind(" , "), lambda: kind.check([])):
        with pytest.raises(argparse.ArgumentTypeError, match=f"must name one or more {what}"):
            given()
    for given in (lambda: kind("1,3,3"), lambda: kind.check([1, 3, 3])):
        with pytest.raises(argparse.ArgumentTypeError, match="must name each once .* 3.* twice"):
            given()
    assert kind("0,2") == kind.check(range(0, 4, 2)) == [0, 2]


def test_a_count_is_a_whole_number_from_python_as_on_the_command_line():
    with pytest.raises(argparse.ArgumentTypeError, match=r"'2\.0' is not an integer"):
        count_or_all.check(2.0)
    with pytest.raises(argparse.ArgumentTypeError, match="must be at least 1"):
        count_or_all.check(0)
    assert count_or_all("all") is None and count_or_all("3") == count_or_all.check(3) == 3


@pytest.mark.parametrize("template", ["a {", "a } b", "{x"])
def test_a_template_with_a_lone_brace_is_one_line(template):
    with pytest.raises(ProbekitError, match="is not a str.format template"):
        fill_template(template, x="1")


def test_discovering_runs_in_no_folder_is_one_line():
    with pytest.raises(
        ProbekitError, match=r"RunDir\.discover\(\): folder must be a str or a Path"
    ):
        RunDir.discover(None)  # type: ignore[arg-type]


def test_a_file_where_a_folder_must_be_is_named_not_blamed_on_the_disk(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ProbekitError, match=r"^out .*file is a file, not a folder$"):
        check_writable(tmp_path / "file")
    with pytest.raises(ProbekitError, match=r"^scores .*file/sub: .*file is a file, not a folder"):
        check_writable(tmp_path / "file" / "sub", "scores")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "parts").write_text("x")
    with pytest.raises(ProbekitError, match="a file stands where a folder must be"):
        RunDir(tmp_path / "run").make()


def test_a_schema_other_than_the_one_written_is_damaged(tmp_path):
    """The page checksums do not cover the schema: a column's name, its type or the file's
    records changed since it was written (same-length bytes of the footer) make the file
    damaged, never rows read under other words."""
    records = {b"probekit.settings": b'{"dtype": "\\"float32\\""}'}
    words = pa.table({"prompt_id": ["a", "b"]}).replace_schema_metadata(records)
    pq.write_table(words, tmp_path / "words.parquet")
    pq.write_table(words.cast(pa.schema([("prompt_id", pa.binary())], records)), tmp_path / "b")
    whole = (tmp_path / "words.parquet").read_bytes()
    assert schema_of(tmp_path / "words.parquet").equals(words.schema)
    assert read_rows(tmp_path / "words.parquet", None).ids == ["a", "b"]
    stored = [pq.read_metadata(tmp_path / n).metadata[ARROW_SCHEMA] for n in ("words.parquet", "b")]
    cases = {
        "renamed": (whole.replace(b"prompt_id", b"prompt_ie"), "schema is not the one written"),
        "recorded": (whole.replace(b"float32", b"float33"), "schema is not the one written"),
        "retyped": ((tmp_path / "b").read_bytes().replace(stored[1], stored[0]), "types are not"),
    }
    for name, (data, said) in cases.items():
        path = tmp_path / f"{name}.parquet"
        path.write_bytes(data)
        with pytest.raises(Damaged, match=said):
            read_rows(path, None)


def test_a_manifest_edited_beside_its_scores_says_what_to_do_that_works(tmp_path):
    """A manifest with a key its rows do not record is not answered "run the same command
    again" (which the resume would refuse): the line names the key and the way out."""
    manifest = {"model": "m", "dtype": "float32"}
    run = RunDir(tmp_path)
    run.write_manifest(manifest)
    frame = pd.DataFrame({INDEX: [0, 1], PROMPT_ID: ["a", "b"]})
    write_rows(run.scores_path, frame, RowKey.of(manifest, ["a", "b"]))
    assert run.scores()[PROMPT_ID].tolist() == ["a", "b"]
    run.write_manifest({**manifest, "a_new_key": 1})
    with pytest.raises(ProbekitError) as refused:
        run.scores()
    said = str(refused.value)
    assert "holds rows that record no a_new_key, but manifest.json says 1" in said
    assert "delete manifest.json and run the same command again" in said
    run.write_manifest({**manifest, "dtype": "bfloat16"})
    with pytest.raises(
        ProbekitError, match="scored under dtype 'float32', but manifest.json says 'bfloat16'"
    ):
        run.scores()
