"""The conda environment and the pip metadata must list the same packages."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# conda-forge names that differ from PyPI's
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_PACKAGES = {"python", "pip"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement.strip(), maxsplit=1)[0].lower()


def _pyproject_packages() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    return {_name(r): r for r in requirements}


def _conda_packages() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge", "bioconda", "nodefaults"]
    packages = {}
    for dep in env["dependencies"]:
        assert isinstance(dep, str), "no pip section: every package comes from conda"
        name = _name(dep)
        if name not in NOT_PACKAGES:
            packages[CONDA_TO_PYPI.get(name, name)] = dep
    return packages


def test_environment_yml_lists_the_pyproject_packages():
    assert sorted(_conda_packages()) == sorted(_pyproject_packages())


def test_torch_is_pinned_to_the_same_release_in_both():
    assert _pyproject_packages()["torch"].replace(" ", "") == "torch==2.13.0"
    assert _conda_packages()["torch"].replace(" ", "") == "pytorch=2.13.0"


def test_lock_pins_every_runtime_dependency():
    lock = {
        _name(line): line.strip()
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for name in _pyproject_packages():
        assert name in lock, f"{name} missing from requirements.lock (run make lock)"
        assert "==" in lock[name]
