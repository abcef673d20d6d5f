"""A wheel of the checkout carries every module and the package data, and once installed in a
fresh environment it imports every module and runs `probekit studies` from outside the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO

from probekit.datasets.crowd_envent import FILES as SAMPLE_FILES

pytestmark = pytest.mark.slow

PACKAGE = REPO / "probekit"
# The files a build needs: the package itself and what pyproject.toml names.
BUILD_INPUTS = ("pyproject.toml", "README.md", "probekit")
REQUIRED_DATA = (
    "probekit/studies/intergroup/study.json",
    "probekit/datasets/SHA256SUMS",
    "probekit/datasets/samples/README.md",
    *(f"probekit/datasets/samples/{rel}" for rel in SAMPLE_FILES),
)

# Run by the installed interpreter: import every module, report where things were found.
PROBE = """
import importlib, json, pkgutil, probekit
from probekit.core.paths import package_path

def fail(name):
    raise  # walk_packages calls this inside its `except`; it would otherwise skip the package

modules = []
for info in pkgutil.walk_packages(probekit.__path__, "probekit.", onerror=fail):
    if not info.name.endswith(".__main__"):
        importlib.import_module(info.name)
        modules.append(info.name)
study = package_path("probekit.studies.intergroup", "study.json")
print(json.dumps({"file": probekit.__file__, "modules": modules, "study": str(study)}))
"""


@dataclass(frozen=True)
class Installed:
    """A built wheel and a virtual environment that has it installed."""

    wheel: Path
    venv: Path
    outside: Path  # a working directory outside the checkout
    env: dict[str, str]

    def run(self, *cmd: str | Path) -> str:
        """Run `cmd` from `outside`; its stdout, after asserting that it succeeded."""
        done = subprocess.run(
            [str(c) for c in cmd],
            cwd=self.outside,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            pytest.fail(f"{Path(cmd[0]).name} {cmd[1]} exited {done.returncode}:\n{done.stderr}")
        return done.stdout


def _clean_env() -> dict[str, str]:
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def venv_site(venv: Path) -> Path:
    """The site-packages folder of a venv made by this interpreter."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


def _module_name(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build one wheel (with build isolation) and install it into one fresh venv."""
    env = _clean_env()
    # Build from a copy: pip builds in the source tree, and setuptools would both write build/
    # into the shared checkout and put modules left in an old build/lib/ into the wheel.
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / name, src / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "-q", "-w", dist, src], env=env, check=True)
    (wheel,) = dist.glob("probekit-*.whl")

    # torch and the other dependencies come from the environment running this test: a .pth
    # file puts its site-packages after the venv's own. (`--system-site-packages` would give the
    # base interpreter's instead, which lack them when this runs inside a venv.) The .pth files
    # of those folders are not processed, so the editable install of the checkout stays
    # invisible and the installed copy is what imports (checked below). No pip inside the venv
    # (saves ~10 s): this pip installs into it (pip >= 22.3).
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    outer = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    (venv_site(venv) / "outer-environment.pth").write_text("".join(f"{p}\n" for p in outer))
    python = venv / "bin" / "python"
    subprocess.run(
        [*pip, "--python", python, "install", "--no-deps", "-q", wheel], env=env, check=True
    )
    outside = tmp_path_factory.mktemp("outside")
    assert not outside.is_relative_to(REPO)
    return Installed(wheel=wheel, venv=venv, outside=outside, env=env)


def test_wheel_holds_every_module_and_the_package_data(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert len(SAMPLE_FILES) == 12
    missing = [rel for rel in REQUIRED_DATA if rel not in names]
    assert not missing, f"package data missing from the wheel: {missing}"
    checkout = [
        p.relative_to(REPO).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and not p.name.startswith(".")
        and p.suffix != ".pyc"
    ]
    missing = [rel for rel in checkout if rel not in names]  # modules, data, study cards
    assert not missing, f"files of the checkout's package missing from the wheel: {missing}"


def test_wheel_install_imports_every_module_outside_the_checkout(installed: Installed) -> None:
    found = json.loads(installed.run(installed.venv / "bin" / "python", "-c", PROBE))
    site = installed.venv / "lib"
    assert Path(found["file"]).is_relative_to(site), found["file"]
    assert Path(found["study"]).is_relative_to(site), found["study"]
    in_wheel = {
        _module_name(n)
        for n in zipfile.ZipFile(installed.wheel).namelist()
        if n.endswith(".py") and not n.endswith("__main__.py")
    }
    assert in_wheel == {"probekit", *found["modules"]}


def test_probekit_studies_runs_from_the_wheel(installed: Installed) -> None:
    out = installed.run(installed.venv / "bin" / "probekit", "studies")
    assert any("intergroup" in line for line in out.splitlines()), out
