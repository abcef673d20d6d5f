"""The README: a short front door whose Python examples run, in order, on the default model."""

from __future__ import annotations

import re

import pytest
from conftest import REPO
from examples import python_blocks, run_examples

README = REPO / "README.md"


def test_the_readme_is_short_and_its_examples_are_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300
    blocks = python_blocks(README)
    assert len(blocks) >= 3
    for block in blocks:
        assert len(block.code.strip().splitlines()) <= 15, block.code


def test_the_readme_quickstart_is_the_two_commands():
    text = README.read_text(encoding="utf-8")
    quickstart = text.split("## Quickstart", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert quickstart.splitlines() == [
        "./setup.sh && python experiments/intergroup_gap.py",
        "./setup.sh --dev --ray --vllm && python -m pytest",
    ]


def test_the_readme_cites_no_commit_and_links_only_to_files_that_exist():
    text = README.read_text(encoding="utf-8")
    assert not re.search(r"\bat (commit )?[0-9a-f]{7}\b", text)
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (REPO / target).exists(), target


@pytest.mark.slow
@pytest.mark.default_model
def test_the_readme_python_examples_run(tmp_path):
    done = run_examples(README, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
