"""The Python examples of a Markdown page (the README, every page of docs/): found, checked and
run in order as one script, as a reader would paste them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(
    r"^(?P<indent> *)```python(?P<info>[^\n]*)\n(?P<code>.*?)^(?P=indent)```", re.S | re.M
)
NOT_RUN = 'title="not run"'


@dataclass(frozen=True)
class Block:
    """One ```python block: its info string (after `python`), its code and its first line."""

    info: str
    code: str
    line: int

    @property
    def runs(self) -> bool:
        return NOT_RUN not in self.info


def python_blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    return [
        Block(
            m["info"].strip(),
            textwrap.dedent(m["code"]),
            text.count("\n", 0, m.start()) + 1,
        )
        for m in FENCE.finditer(text)
    ]


def run_examples(page: Path, workdir: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the page's executed blocks, in order, as one script in `workdir`."""
    script = workdir / f"{page.stem}_examples.py"
    code = [f"# {page.name}, line {b.line}\n{b.code}" for b in python_blocks(page) if b.runs]
    script.write_text("\n\n".join(code), encoding="utf-8")
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
