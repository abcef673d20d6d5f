"""What a paper takes from a run as it comes: each summary table as LaTeX beside its CSV
(`summary.tex`: booktabs, intervals and p-values as a paper prints them), and the methods record
(`methods.md`, `provenance.json`) beside each run's summary and a report's over several runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import metadata

import pandas as pd
import pytest

import probekit
from probekit.reporting.latex import latex_table
from probekit.run import report
from probekit.testing.synthetic import tiny_model


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny):
    """Two finished runs of the minimal study, on two tiny random models."""
    import minimal_study

    root = tmp_path_factory.mktemp("paper")
    for name, model in (("a", tiny), ("b", tiny_model(seed=1))):
        probekit.run_study(minimal_study.STUDY, model, out=root / name, days=2, quiet=True)
    return root


def body_rows(tex: str) -> list[list[str]]:
    """The cells of each row between `\\midrule` and `\\bottomrule`."""
    body = tex.split("\\midrule\n")[1].split("\\bottomrule")[0]
    return [line.removesuffix(" \\\\").split(" & ") for line in body.splitlines()]


def balanced(tex: str) -> bool:
    depth = 0
    for char in re.sub(r"\\[{}]", "", tex):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def test_each_summary_csv_has_a_latex_twin_with_its_rows_and_numbers(runs):
    tex = (runs / "a" / "summary.tex").read_text()
    summary = pd.read_csv(runs / "a" / "summary.csv")
    assert balanced(tex)
    rules = [tex.index(r) for r in ("\\toprule", "\\midrule", "\\bottomrule")]
    assert rules == sorted(rules) and "\\begin{tabular}" in tex and "\\end{table}" in tex
    rows = body_rows(tex)
    assert len(rows) == len(summary)
    for row, (_, expected) in zip(rows, summary.iterrows(), strict=True):
        for column in ("Alice", "Bob", "gap"):
            assert f"{expected[column]:.3f}" in row
    assert "view: exact" in re.search(r"\\caption\{(.*)\}", tex).group(1)


def test_intervals_and_p_values_are_written_as_a_paper_writes_them():
    table = pd.DataFrame(
        {
            "category": ["religion_a", "gender"],
            "delta": [0.12, -0.3],
            "delta_ci_low": [0.05, -0.5],
            "delta_ci_high": [0.19, -0.1],
            "p_value": [0.0002, 0.04567],
            "n_kept": [12, 9],
        }
    )
    tex = latex_table(table, "Δ in z-scores; view: exact")
    assert body_rows(tex) == [
        ["religion\\_a", "0.120 [0.050, 0.190]", "$<$ 0.001", "12"],
        ["gender", "-0.300 [-0.500, -0.100]", "0.046", "9"],
    ]
    assert "category & delta & p\\_value & n\\_kept \\\\" in tex


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no pdflatex here: the table parses")
def test_the_latex_compiles(runs, tmp_path):
    document = (
        "\\documentclass{article}\\usepackage[utf8]{inputenc}\\usepackage{booktabs}"
        f"\\begin{{document}}\\input{{{runs / 'a' / 'summary.tex'}}}\\end{{document}}"
    )
    (tmp_path / "doc.tex").write_text(document)
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:]


def test_methods_name_the_runs_weights_seed_resamples_and_commit(runs):
    manifest = json.loads((runs / "a" / "manifest.json").read_text())
    methods = (runs / "a" / "methods.md").read_text()
    assert manifest["weights"] in methods and manifest["commit"] in methods
    assert f"seed {manifest['seed']}" in methods and "Bootstrap resamples: 1000" in methods
    assert f"ε = {manifest['epsilon']}" in methods and manifest["model"] in methods
    record = json.loads((runs / "a" / "provenance.json").read_text())
    (facts,) = record["runs"].values()
    assert facts["weights"] == manifest["weights"] and facts["seed"] == manifest["seed"]
    assert facts["versions"] == manifest["versions"]
    for name in ("torch", "transformers", "pandas", "numpy"):
        assert record["packages"][name] == metadata.version(name)


def test_a_report_over_two_runs_writes_one_record_for_the_set(runs, minimal):
    report.report([runs / "a", runs / "b"])
    combined = runs / "combined"
    record = json.loads((combined / "provenance.json").read_text())
    assert len(record["runs"]) == 2
    weights = {facts["weights"] for facts in record["runs"].values()}
    assert weights == {"random seed 0", "random seed 1"}
    methods = (combined / "methods.md").read_text()
    assert all(w in methods for w in weights) and methods.count("## ") == 2
    assert len(body_rows((combined / "summary.tex").read_text())) == 2
    written = json.loads((combined / report.RECORD).read_text())["files"]
    assert {"summary.tex", "methods.md", "provenance.json"} <= set(written)
