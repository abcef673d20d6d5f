"""The study contract: a minimal study registers and runs end to end in a few dozen lines; every
option is checked before any work (one line, exit 2, nothing written); the command line lists
and explains the studies without importing a model library."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import minimal_study
import pandas as pd
import pytest
from conftest import DATA_ROOT

import probekit
from probekit import cli
from probekit.core.errors import ProbekitError
from probekit.core.kinds import positive_int
from probekit.core.options import Command, named, option
from probekit.datasets.crowd_envent import SAMPLE_ROOT
from probekit.run import runner
from probekit.run.report import report
from probekit.studies import base, get_study, list_studies
from probekit.studies.base import Context


@pytest.mark.slow
def test_minimal_study_runs_end_to_end(minimal, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "minimal", "--days", "2", "--epsilon", "0", "--out", str(out)]) == 0
    scores = pd.read_parquet(out / "scores.parquet")
    assert len(scores) == 4 and list(scores["name"]) == ["Alice", "Bob", "Alice", "Bob"]
    assert scores["expected"].between(0, 10).all() and (scores["error_bound"] == 0).all()
    summary = pd.read_csv(out / "summary.csv")
    means = scores.groupby("name")["expected"].mean()
    assert summary.loc[0, "view"] == "exact"
    assert summary.loc[0, "gap"] == pytest.approx(means["Alice"] - means["Bob"])
    assert (out / "summary.md").read_text().startswith(f"# {minimal.title}")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["study"] == "minimal" and manifest["dtype"] == "float32"
    assert manifest["probe"]["days"] == list(minimal_study.DAYS[:2])
    assert "A minimal study" in capsys.readouterr().out


def test_options_are_declared_once_for_every_command():
    """intergroup's --events: one declaration, a count or all, one meaning and default on every
    command, read the same from flags and keywords."""
    intergroup, giebench = get_study("intergroup"), get_study("giebench")
    for command in ("run", "patch", "capture", "steer", "lens"):
        options = runner(command)
        assert options.parse(["--data", str(SAMPLE_ROOT)], "p", intergroup).study.events == 2
        assert options.parse(["--events", "all"], "p", intergroup).study.events is None
        assert options.build({"events": "all"}, "f", intergroup).study.events is None
        four = options.parse(["--events", "4"], "p", intergroup)
        assert options.build({"events": 4}, "f", intergroup) == four
    patch = runner("patch").parse([], "p", giebench).study
    assert patch.prompt == ["cot"] and patch.items == "sample"


BAD = [
    (["--epsilon", "-1"], "--epsilon must be at least 0"),
    (["--epsilon", "nan"], "--epsilon must be a finite number"),
    (["--min-valid-mass", "2"], "--min-valid-mass must be between 0 and 1"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--seed", "x"], "--seed: 'x' is not an integer"),
    (["--shard", "3/2"], "need 0 <= i < n"),
    (["--shard", "1"], "must look like i/n"),
    (["--events", "0"], "--events must be at least 1"),
    (["--setting", "P9"], "unknown setting 'P9'"),
    (["--category", "x"], "unknown category 'x'"),
    (["--dtype", "int8"], "'int8' is not a dtype"),
    (["--device", "gpu"], "'gpu' is not a device"),
    (["--view", "sample"], "unknown view 'sample'"),
    (["--limit", "0"], "--limit must be at least 1"),
    (["--numerics", "-1"], "--numerics must be at least 0"),
    (["--nonesuch"], "unrecognized arguments: --nonesuch"),
]


@pytest.mark.parametrize(("extra", "message"), BAD)
def test_bad_options_are_one_line_and_write_nothing(tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert cli.main(["run", "intergroup", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("probekit: error:") and message in err[0], err
    assert not out.exists()


def test_unwritable_out_is_refused_before_the_data_or_the_model(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert cli.main(["run", "intergroup", "--out", str(tmp_path / "file" / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file, not a folder" in err[0]


def test_mechanism_commands_take_the_same_checks(capsys):
    assert cli.main(["patch", "intergroup", "--category", "all", "--events", "0"]) == 2
    assert "--events must be at least 1" in capsys.readouterr().err
    assert cli.main(["capture", "intergroup", "--setting", "all"]) == 2
    assert "not all" in capsys.readouterr().err


@dataclass(frozen=True)
class Counted:
    """Counted."""

    n: int = option(1, help="a count", kind=positive_int)


def test_checks_run_after_every_option_passed_with_each_front_ends_names():
    seen = []

    def check(parsed):
        seen.append(parsed[0].n)
        if parsed[0].n == 3:
            raise ProbekitError(f"{named('n')} must not be 3")

    command = Command("count", (Counted,), checks=(check,))
    assert command.parse(["--n", "4"], "p") == (Counted(n=4),)
    assert command.build({"n": 5}, "f()") == (Counted(n=5),)
    with pytest.raises(ProbekitError, match=r"^--n must not be 3$"):
        command.parse(["--n", "3"], "p")
    with pytest.raises(ProbekitError, match=r"^n must not be 3$"):
        command.build({"n": 3}, "f()")
    assert seen == [4, 5, 3, 3]
    with pytest.raises(ProbekitError, match=r"^--n must be at least 1 \(got 0\)$"):
        command.parse(["--n", "0"], "p")
    with pytest.raises(ProbekitError, match=r"^n must be at least 1 \(got 0\)$"):
        command.build({"n": 0}, "f()")
    assert len(seen) == 4


def test_run_help_lists_the_studies(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: probekit run STUDY") and "unrecognized" not in text
    for name in ("giebench", "intergroup", "isear", "jaem-st"):
        assert f"\n{name} " in text


HEAVY = ("torch", "transformers", "matplotlib", "scipy")
LIGHT_COMMANDS = [
    ["--help"],
    ["run", "--help"],
    ["studies"],
    *(["run", name, "--help"] for name in ("giebench", "intergroup", "isear", "jaem-st")),
]


@pytest.mark.parametrize("argv", LIGHT_COMMANDS, ids=" ".join)
@pytest.mark.slow
def test_listing_and_help_import_no_model_library(argv):
    code = (
        "import sys\nfrom probekit import cli\n"
        f"try:\n    cli.main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
    assert "usage" in done.stdout or "intergroup" in done.stdout


# ------------------------------------------------------------ every command on every study
# Each case: the study (a registered name, or the minimal study as an unregistered object), its
# options for `run` (a balanced smoke run) and for the mechanism commands (one event, item or
# sample; intergroup on its 0-10 scale, the quicker to score).
CASES = {
    "intergroup": ({"limit": 72, "setting": "P0S1T0"}, {"events": 2, "setting": "P0S1T0"}),
    "isear": ({"limit": 6}, {"events": 2}),
    "giebench": ({"items": "sample", "limit": 16}, {}),
    "jaem-st": ({"samples": 4}, {"samples": 2}),
    "minimal": ({"days": 2}, {"days": 2}),
}
STEER = {"jaem-st": {"samples": 54}}
"""What steering needs beyond `CASES`: a unit of every group the headline compares (JaEm-ST's
outliers compare every template x group; fewer is refused before scoring)."""
JAEM = pytest.mark.reference_data("jaem_st/dimensions.json")
"""JaEm-ST's case: its templates are in the reference data only; slow (steering needs its 54
samples)."""
TINY = {"layers": [1], "batch_size": 8}
KINDS = ("steer", "random")


def _study_and_data(name: str) -> tuple[Any, dict[str, Any]]:
    """The study object (the minimal one unregistered) and its data option."""
    if name == "minimal":
        return minimal_study.MinimalStudy(), {}
    if name == "jaem-st":  # its templates are in the reference data only (`JAEM`)
        return get_study(name), {"data": DATA_ROOT}
    return get_study(name), {}


def test_every_registered_study_is_a_contract_case():
    assert {study.name for study in list_studies()} | {"minimal"} == set(CASES)


STUDIES = [pytest.param(n, marks=[pytest.mark.slow, JAEM]) if n in STEER else n for n in CASES]
"""Every contract case, JaEm-ST's slow (`JAEM`); each command is its own test so that the
workers share them."""


def _items_of(study, keywords: dict[str, Any], command: str):
    """The study's probe and mechanism items for `command` with these options."""
    options = runner(command).build(keywords, "f", study).study
    return study.mechanism_items(options, Context(command))


def _case(name: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The study, its data option and its mechanism options."""
    study, data = _study_and_data(name)
    return study, data, CASES[name][1]


@pytest.mark.parametrize("name", STUDIES)
def test_run_and_report_on_every_study(name, tiny, tmp_path):
    """`run` writes the study's scores and headline; `report` reads the run folder back."""
    study, data = _study_and_data(name)
    options = {**data, **CASES[name][0]}
    run = probekit.run_study(study, tiny, out=tmp_path / "run", numerics=0, **options)
    assert len(run.scores) and run.headline is not None and run.headline.primary
    table = report(run.path, tmp_path / "report", studies=[study])
    summary = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert len(table) and len(summary) == len(run.summary)


@pytest.mark.parametrize("name", STUDIES)
def test_patch_on_every_study(name, tiny, tmp_path):
    """`patch` writes its table (one set of pairs per unit, the quicker); the pairs put the first
    side of the study's declared contrast against the other within a unit."""
    study, data, mechanism = _case(name)
    patched = probekit.patch_study(
        study,
        tiny,
        out=tmp_path / "patch",
        sites=["resid_pre"],
        bootstrap=20,
        sets_per_unit=1,
        **TINY,
        **data,
        **mechanism,
    )
    assert len(patched.table) and set(patched.table["layer"]) == {1}
    probe, items = _items_of(study, {**data, **mechanism}, "patch")
    encoded = [tiny.encode(item) for item in items]
    sides = {study.mechanism_defaults().contrast.side(probe)(prompt) for prompt in encoded}
    pairs = study.pairs(probe, encoded)
    assert sides == {True, False} and pairs
    assert all(clean.item.unit == corrupt.item.unit != "" for clean, corrupt in pairs)


@pytest.mark.parametrize("name", STUDIES)
def test_capture_on_every_study(name, tiny, tmp_path):
    """`capture` keeps one row per mechanism item."""
    study, data, mechanism = _case(name)
    captured = probekit.capture_study(
        study, tiny, out=tmp_path / "capture", sites=["resid_post"], **TINY, **data, **mechanism
    )
    _, items = _items_of(study, {**data, **mechanism}, "capture")
    assert set(captured.index["prompt_id"]) == {item.id for item in items}


@pytest.mark.parametrize("name", STUDIES)
def test_steer_on_every_study(name, tiny, tmp_path):
    """`mean_diff` steers along the study's contrast, and each α's headline is the study's own
    headline of that α's rows; the unsteered rows are reported once."""
    study, data, mechanism = _case(name)
    more = STEER.get(name, {})
    steered = probekit.steer_study(
        study,
        tiny,
        out=tmp_path / "steer",
        alphas=[0, 4],
        vector="mean_diff",
        **TINY,
        **data,
        **{**mechanism, **more},
    )
    probe, items = _items_of(study, {**data, **mechanism, **more}, "steer")
    assert len(steered.table) == 2 * 4 * len(items)  # the vector and 3 controls, at α 0 and 4
    manifest = {**probe.manifest(), "model": tiny.name, "seed": 0, "view": "exact"}
    row = steered.summary.set_index(["vector", "alpha"]).loc[("steer", 4.0)]
    rows = steered.table[(steered.table["vector"] == "steer") & (steered.table["alpha"] == 4)]
    own = study.headline(rows.reset_index(drop=True), tmp_path / "own", manifest)
    assert (row["label"], row["value"]) == (own.label, pytest.approx(own.value, nan_ok=True))
    # the control's α = 0 holds the same files as the vector's
    steer0, random0 = (next((tmp_path / "steer" / "alphas").glob(f"*-{k}-a0")) for k in KINDS)
    assert {p.name for p in random0.iterdir()} == {p.name for p in steer0.iterdir()}


@pytest.mark.parametrize("name", STUDIES)
def test_lens_on_every_study(name, tiny, tmp_path):
    """`lens` reads each item at each layer; each layer's headline is the study's own of that
    layer's rows."""
    study, data, mechanism = _case(name)
    lens = probekit.lens_study(study, tiny, out=tmp_path / "lens", **TINY, **data, **mechanism)
    probe, items = _items_of(study, {**data, **mechanism}, "lens")
    assert len(lens.table) == len(items) and set(lens.table["layer"]) == {1}
    manifest = {**probe.manifest(), "model": tiny.name, "seed": 0, "view": "exact"}
    first = lens.summary[lens.summary["primary"]].iloc[0]
    own = study.headline(lens.table, tmp_path / "own-lens", {**manifest, "min_valid_mass": 0.0})
    assert (first["label"], first["value"]) == (own.label, pytest.approx(own.value, nan_ok=True))


def test_a_study_must_declare_its_contrast():
    class Partial(base.Study):
        name = "partial"

        def probes(self, options, context):
            return []

    with pytest.raises(ProbekitError, match="mechanism_defaults"):
        Partial()


def test_default_pairs_put_the_contrasts_first_side_against_the_other_in_each_unit(tiny):
    study = minimal_study.MinimalStudy()
    options = minimal_study.MinimalOptions(days=3)
    probe, items = study.mechanism_items(options, Context("patch", limit=6))  # every day
    encoded = [tiny.encode(item) for item in items]
    pairs = [(clean.item.id, corrupt.item.id) for clean, corrupt in study.pairs(probe, encoded)]
    assert pairs == [(f"{day}|Alice", f"{day}|Bob") for day in range(3)]


def test_steer_isear_with_a_vector_file_reports_every_alpha(tiny, tmp_path):
    """The issue's `probekit steer isear --vector v.npy`: every α gets ISEAR's own headline
    (max_diff), not a traceback after the first."""
    import numpy as np

    vector = tmp_path / "v.npy"
    np.save(vector, np.random.default_rng(0).standard_normal(tiny.hf.config.hidden_size))
    steered = probekit.steer_study(
        "isear", tiny, out=tmp_path / "steer", vector=str(vector), alphas=[-4, 4], events=2, **TINY
    )
    assert sorted(steered.summary["alpha"]) == [-4] * 4 + [0] * 4 + [4] * 4  # and 3 controls
    assert steered.summary["label"].str.startswith("max_diff").all()
    assert steered.summary["value"].between(0, 1).all()
