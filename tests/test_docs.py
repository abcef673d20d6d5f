"""The documentation site: it builds with `mkdocs build --strict`, every public name has an API
reference entry, the performance page is what its generator makes from the committed results,
and every Python example of every page runs, in order, on the default model."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import DATA_ROOT, REAL_CROWD_ENVENT, REPO
from examples import python_blocks, run_examples

import probekit

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
EXECUTED = [p for p in PAGES if any(b.runs for b in python_blocks(p))]


def reference_entries() -> list[str]:
    text = (DOCS / "reference.md").read_text(encoding="utf-8")
    return re.findall(r"^::: ([\w.]+)\s*$", text, flags=re.M)


def test_every_public_name_has_a_reference_entry_at_its_real_module():
    entries = set(reference_entries())
    missing = [
        name
        for name in probekit.__all__
        if name != "__version__" and f"{probekit._API[name]}.{name}" not in entries
    ]
    assert not missing, f"docs/reference.md lacks ::: entries for {missing}"
    for entry in entries:
        module, name = entry.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), name), entry


def test_examples_that_do_not_run_say_why():
    for page in [REPO / "README.md", *PAGES]:
        for block in python_blocks(page):
            if not block.runs:
                first = block.code.splitlines()[0] if block.code.strip() else ""
                assert re.match(r"# not run: \S", first), f"{page.name}:{block.line}: {first!r}"


def test_the_performance_page_is_generated_from_the_committed_results():
    spec = importlib.util.spec_from_file_location("benchmark_report", REPO / "benchmarks/report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    results = report.load_results()
    assert results, "benchmarks/results/ holds no results"
    page = (DOCS / "performance.md").read_text(encoding="utf-8")
    stale = "docs/performance.md is stale: run python benchmarks/report.py"
    assert page == report.render(results), stale


@pytest.mark.reference_data(REAL_CROWD_ENVENT)
def test_the_full_study_counts_the_grid_probekit_run_would_score(monkeypatch):
    """The performance page's "The full study": its prompts per model are what probekit's own
    intergroup probes hold for `--category all --setting all --events all` on the real
    crowd-enVent (checked where that data is here), the spec's (19² + 22² + 6²) pairs x 6,050
    events x 7 settings."""
    root = DATA_ROOT
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    full_study = importlib.import_module("full_study")
    probes, data = full_study.grid_probes(str(root))
    results = json.loads((REPO / "benchmarks/results/full_study.json").read_text("utf-8"))
    grid = next(f for f in results["figures"] if f["series"] == "the full grid")
    assert grid["value"] == sum(len(p) for p in probes) == (19**2 + 22**2 + 6**2) * 6050 * 7
    assert grid["data_sha256"] == data["data_sha256"] and grid["data_verified"]
    per_probe = {(f["category"], f["setting"]): f["value"] for f in results["figures"][:-1]}
    assert per_probe == {(p.category.name, p.setting.name): len(p) for p in probes}


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip('mkdocs is not installed (pip install -e ".[docs]", or ./setup.sh --dev)')
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    reference = (tmp_path / "reference" / "index.html").read_text(encoding="utf-8")
    for entry in reference_entries():
        assert f'id="{entry}"' in reference, entry


@pytest.mark.slow
@pytest.mark.default_model
@pytest.mark.parametrize("page", EXECUTED, ids=[str(p.relative_to(DOCS)) for p in EXECUTED])
def test_the_python_examples_of_a_page_run(page, tmp_path):
    done = run_examples(page, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
