"""A first try on a handful of prompts computes: a run (and `steer`, `lens`) too small for the
interval of its study's headline scores and reports what it can, its headline marked "no
interval: N < M" in the summary table, `summary.md`, the page and the returned object; only a
slice that holds no whole unit is refused (issue 60)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from conftest import DATA_ROOT

import probekit
from probekit import cli
from probekit.core.errors import ProbekitError
from probekit.studies import get_study

JAEM = pytest.mark.reference_data("jaem_st/dimensions.json")


def sample(name: str) -> dict[str, str]:
    """The study's data option: probekit's sample, or the reference data (JaEm-ST)."""
    if name == "jaem-st":
        return {"data": str(DATA_ROOT)}
    dataset = get_study(name).dataset
    return {} if name == "giebench" else {"data": str(dataset.sample)}


def assert_marked(note: str, given: int, needed: int, unit: str) -> None:
    assert note.startswith(f"no interval: {given} < {needed} {unit}s"), note


RUNS = [  # (study, options, units given, units needed, unit)
    ("isear", {"events": 1}, 1, 2, "event"),
    ("intergroup", {"limit": 36, "min_valid_mass": 0.0}, 1, 2, "event"),
    ("giebench", {"limit": 5}, 1, 2, "item"),
    pytest.param("jaem-st", {"limit": 4}, 4, 54, "sample", marks=JAEM),
]


@pytest.mark.parametrize(("name", "options", "given", "needed", "unit"), RUNS)
def test_a_run_too_small_for_an_interval_reports_without_one(
    tiny, tmp_path, name, options, given, needed, unit
):
    out = tmp_path / name
    run = probekit.run_study(name, tiny, out=out, numerics=0, **sample(name), **options)
    headline = run.headline  # the returned object
    assert_marked(headline.note, given, needed, unit)
    assert math.isnan(headline.low) and math.isnan(headline.high)
    assert headline.interval_text == "—"
    summary = pd.read_csv(out / "summary.csv")
    for note in (summary["interval_note"], run.summary["interval_note"]):
        assert note.map(lambda n, g=given: n.startswith(f"no interval: {g} < ")).all()
    markdown = (out / "summary.md").read_text()
    assert f"## No interval\n\n- run: no interval: {given} < {needed} {unit}s: too few" in markdown
    assert f"no interval: {given} &lt; {needed} {unit}s" in (out / "report.html").read_text()
    assert run.manifest["interval_note"] == f"no interval: {given} < {needed} {unit}s"


def test_a_run_with_enough_units_has_its_interval_and_no_note(tiny, tmp_path):
    run = probekit.run_study(
        "isear", tiny, out=tmp_path / "r", numerics=0, events=2, **sample("isear")
    )
    assert run.headline.low < run.headline.high and "no interval" not in run.headline.note
    assert "interval_note" not in run.summary and "interval_note" not in run.manifest
    assert "## No interval" not in (tmp_path / "r" / "summary.md").read_text()


def test_limit_keeps_one_unit_and_refuses_only_less(tiny, tmp_path, capsys):
    """`--limit N` below a unit is refused with the smallest N; one unit's prompts run."""
    common = ["--events", "3", "--data", str(get_study("isear").dataset.sample), "--numerics", "0"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("probekit.engines.load_engine", lambda *a, **k: tiny)
        out = tmp_path / "two"
        assert cli.main(["run", "isear", *common, "--limit", "2", "--out", str(out)]) == 2
        error = capsys.readouterr().err
        assert "--limit 2 is too small for isear: the smallest balanced run is 3 prompts" in error
        assert not out.exists()
        out = tmp_path / "three"
        assert cli.main(["run", "isear", *common, "--limit", "3", "--out", str(out)]) == 0
    assert "no interval: 1 < 2 events" in (out / "summary.md").read_text()


STEERED = [  # (study, options, units given, units needed, unit)
    ("isear", {"events": 1}, 1, 2, "event"),
    ("intergroup", {"limit": 36, "setting": "P0S1T0"}, 1, 2, "event"),  # 0-10: quick to score
    # slow as the contract's JaEm-ST steer: its long prompts (9 s of the unit loop's 2 minutes)
    pytest.param("jaem-st", {"samples": 4}, 4, 54, "sample", marks=[JAEM, pytest.mark.slow]),
]


@pytest.mark.parametrize(("name", "options", "given", "needed", "unit"), STEERED)
def test_steer_on_too_few_units_steers_and_marks_each_alpha(
    tiny_bridged, tmp_path, capsys, name, options, given, needed, unit
):
    out = tmp_path / name
    steered = probekit.steer_study(
        name,
        tiny_bridged,
        out=out,
        layers=[1],
        alphas=[1],
        controls=1,
        quiet=True,
        **sample(name),
        **options,
    )
    for table in (steered.summary, pd.read_csv(out / "summary.csv")):
        assert len(table) == 4  # the vector and one control, at α 0 and 1
        for note in table["note"]:
            assert_marked(note, given, needed, unit)
        assert table["low"].isna().all() and table["high"].isna().all()
    if given == 1:  # one unit: no other to cross-fit the vector on
        assert "warning: one unit: the vector is fitted on the prompts it steers" in (
            capsys.readouterr().err
        )


def test_lens_on_one_event_marks_every_layer(tiny_bridged, tmp_path):
    lens = probekit.lens_study(
        "isear", tiny_bridged, out=tmp_path / "lens", quiet=True, events=1, **sample("isear")
    )
    notes = lens.summary["note"]  # after a weak layer's flag
    assert len(notes) and notes.str.contains("no interval: 1 < 2 events").all()


def test_a_mechanism_limit_below_one_unit_is_refused():
    with pytest.raises(ProbekitError, match="smallest balanced run is 36 prompts"):
        probekit.steer_study("intergroup", limit=35)
