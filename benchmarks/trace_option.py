"""How far one option travels: `--layers` of `probekit lens`, followed from the command line to
the engine (issue 58's target: at most 8 modules, never back up a layer).

Runs `probekit lens STUDY --layers L --limit N` in this process under `sys.setprofile` and notes
every call of a probekit function that holds the option: a local named `layers` that is set, an
object whose `layers` attribute is set (the command's options), or the command line itself (a
list of strings with `--layers`). The modules are listed in the order first reached; a climb is
such a call made from a module into a module of a higher layer (`tests/test_layout.py`'s order,
lowest first: core and datasets, stats, engines, reporting, mechanism, studies, run, cli).

    python benchmarks/trace_option.py --json benchmarks/results/trace.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from common import load_line, write_results

from probekit.cli.main import main as probekit_main

RANK = {"core": 0, "datasets": 0, "stats": 1, "engines": 2, "reporting": 3, "mechanism": 4}
RANK |= {"studies": 5, "run": 6, "cli": 7}


def module_of(frame: FrameType | None) -> str | None:
    """The probekit module whose source `frame` runs, if any (not code generated at run time,
    such as a dataclass's `__init__`)."""
    if frame is None or not frame.f_code.co_filename.endswith(".py"):
        return None
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("probekit.") else None


def layer_of(module: str) -> int:
    return RANK.get(module.split(".")[1], -1)


def holds_option(frame: FrameType) -> bool:
    """Whether `frame`'s locals carry `--layers`: by name, in an options object, or as argv."""
    for name, value in frame.f_locals.items():
        if name == "layers" and value is not None:
            return True
        fields = getattr(type(value), "__dataclass_fields__", {})
        if "layers" in fields and not isinstance(value, type) and value.layers is not None:
            return True
        if isinstance(value, list) and "--layers" in value:
            return True
    return False


def trace(argv: list[str]) -> dict[str, Any]:
    """Run probekit with `argv` and follow the option: the modules in order and the climbs."""
    modules: list[str] = []
    climbs: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or (module := module_of(frame)) is None or not holds_option(frame):
            return
        if module not in modules:
            modules.append(module)
        caller = frame.f_back
        while caller is not None and module_of(caller) is None:
            caller = caller.f_back
        came_from = module_of(caller)
        if came_from and layer_of(module) > layer_of(came_from):
            climbs.append(f"{came_from} -> {module} ({frame.f_code.co_name})")

    sys.setprofile(profile)
    try:
        code = probekit_main(argv)
    finally:
        sys.setprofile(None)
    return {"exit": code, "modules": modules, "climbs": sorted(set(climbs))}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="intergroup")
    parser.add_argument("--model", default="default")
    parser.add_argument("--layers", default="3,7")
    parser.add_argument("--limit", type=int, default=36)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    start = load_line("at start")
    with tempfile.TemporaryDirectory() as tmp:
        command = ["lens", args.study, "--model", args.model, "--layers", args.layers]
        command += ["--limit", str(args.limit), "--out", str(Path(tmp) / "lens"), "--quiet"]
        found = trace(command)
    print(f"probekit {' '.join(command[:-3])} ...: exit {found['exit']}")
    for number, module in enumerate(found["modules"], 1):
        print(f"  {number}. {module}")
    print(f"{len(found['modules'])} modules, {len(found['climbs'])} climbs back up a layer")
    for climb in found["climbs"]:
        print(f"  climb: {climb}")
    if args.json:
        figures = [
            {"figure": "modules --layers passes through", "value": len(found["modules"])},
            {"figure": "climbs back up a layer", "value": len(found["climbs"])},
        ]
        for figure in figures:
            figure |= {"unit": "count", "modules": found["modules"], "climbs": found["climbs"]}
        on = {
            "device": "cpu",
            "threads": None,
            "load_start": start,
            "load_end": load_line("at end"),
        }
        write_results("trace_option", figures, path=args.json, **on)
    return found["exit"]


if __name__ == "__main__":
    sys.exit(main())
