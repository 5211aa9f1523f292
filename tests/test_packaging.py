"""The package's metadata: ranges that install beside scanpy, the workflow engine in an
extra, environment.yml in step with pyproject.toml, and an import that stays light.

Building the wheel and the sdist, installing the wheel into an environment that already
holds scanpy and torch, and deploying the workflow from it are tests/test_deploy.py's.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# conda-forge names that differ from PyPI's
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_PACKAGES = {"python", "pip"}
# What the workflow needs and the library does not: `pip install locusformer` leaves them out.
WORKFLOW_ONLY = {"snakemake", "snakemake-executor-plugin-slurm"}
# Imported by no entry point of the library: the engine, and the optional scVI baselines.
HEAVY_OPTIONAL = ("snakemake", "scvi")


def _requirements(extra: str | None = None) -> list[Requirement]:
    """The core dependencies, or an extra's, with an extra naming another one expanded."""
    listed = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    found = []
    for text in listed:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == PROJECT["name"]:
            for other in sorted(requirement.extras):
                found += _requirements(other)
        else:
            found.append(requirement)
    return found


def _pyproject_packages() -> dict[str, SpecifierSet]:
    packages = {}
    for extra in [None, *PROJECT["optional-dependencies"]]:
        for requirement in _requirements(extra):
            packages[canonicalize_name(requirement.name)] = requirement.specifier
    return packages


def _conda_packages() -> dict[str, SpecifierSet]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge", "bioconda", "nodefaults"]
    packages = {}
    for dep in env["dependencies"]:
        assert isinstance(dep, str), "no pip section: every package comes from conda"
        name, _, spec = dep.strip().partition(" ")
        if name not in NOT_PACKAGES:
            assert re.fullmatch(r"[<>=!][^ ]*", spec), f"{dep!r}: 'name >=x' or 'name >=x,<y'"
            packages[canonicalize_name(CONDA_TO_PYPI.get(name, name))] = SpecifierSet(spec)
    return packages


def _lock() -> dict[str, str]:
    lock = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            lock[canonicalize_name(name)] = version
    return lock


def test_environment_yml_lists_the_pyproject_packages_with_the_same_ranges():
    assert _conda_packages() == _pyproject_packages()


def test_dependencies_are_ranges_that_admit_other_releases():
    for requirement in _requirements():
        operators = {spec.operator for spec in requirement.specifier}
        assert operators, f"{requirement}: no lower bound"
        assert operators <= {">=", "<"}, f"{requirement}: a range (>=, <), not a pin"
    torch = next(r for r in _requirements() if r.name == "torch")
    # Any torch 2 from 2.3 on: the one a scanpy or scvi-tools environment already has.
    assert torch.specifier == SpecifierSet(">=2.3,<3")
    for version in ("2.3.0", "2.4.1", "2.6.0", "2.13.0", "2.99"):
        assert version in torch.specifier
    assert "3.0" not in torch.specifier
    assert "2.2.2" not in torch.specifier


def test_the_workflow_engine_is_an_extra_not_a_dependency():
    core = {canonicalize_name(r.name) for r in _requirements()}
    assert not core & (WORKFLOW_ONLY | {"scvi-tools"})
    assert {canonicalize_name(r.name) for r in _requirements("workflow")} == WORKFLOW_ONLY
    assert {canonicalize_name(r.name) for r in _requirements("scvi")} == {"scvi-tools"}
    # The tests run the workflow: `make`'s install (dev) has it, and the old slurm extra
    # still means the workflow with its SLURM executor.
    assert WORKFLOW_ONLY <= {canonicalize_name(r.name) for r in _requirements("dev")}
    assert {canonicalize_name(r.name) for r in _requirements("slurm")} == WORKFLOW_ONLY


def test_makefile_installs_every_extra_the_tests_need():
    makefile = (ROOT / "Makefile").read_text()
    extras = re.search(r'pip install .*-c requirements\.lock -e "\.\[([\w,]+)\]"', makefile)
    assert extras, "the Makefile's install line"
    assert {"dev", "scvi", "workflow"} <= set(extras.group(1).split(","))


def test_lock_pins_a_version_in_range_of_every_dependency():
    lock = _lock()
    for name, specifier in _pyproject_packages().items():
        assert name in lock, f"{name} missing from requirements.lock (run make lock)"
        assert lock[name] in specifier, f"requirements.lock has {name}=={lock[name]}"


def test_version_is_the_packages_own():
    import locusformer

    assert locusformer.__version__ == PROJECT["version"]


def test_build_system_builds_without_the_wheel_package():
    # setuptools builds wheels itself from 70.1 on, and reads the SPDX license from 77.
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    assert build == {"requires": ["setuptools>=77"], "build-backend": "setuptools.build_meta"}


_IMPORTED = """
import sys
sys.argv = ["locusformer", *sys.argv[1:]]
{statement}
print(" ".join(sorted({{name.split(".")[0] for name in sys.modules}})))
"""


@pytest.mark.parametrize(
    ("statement", "args"),
    [
        ("import locusformer", []),
        ("import locusformer.api", []),
        ("import locusformer as lf; lf.fit, lf.map, lf.load, lf.save", []),
        ("from locusformer.cli.main import main\ntry: main()\nexcept SystemExit: pass", ["--help"]),
        ("import runpy; runpy.run_module('locusformer', run_name='__main__')", ["--version"]),
    ],
    ids=["import", "api", "api-names", "cli-help", "python-m-version"],
)
def test_the_library_and_its_cli_import_neither_snakemake_nor_scvi(statement, args):
    code = _IMPORTED.format(statement=statement)
    if "runpy" in statement:  # --version exits
        code = code.replace(statement, f"try:\n    {statement}\nexcept SystemExit: pass")
    found = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    modules = set(found.stdout.split("\n")[-2].split())
    assert "locusformer" in modules
    assert not modules & set(HEAVY_OPTIONAL), modules & set(HEAVY_OPTIONAL)


@pytest.mark.parametrize(
    ("statement", "absent"),
    [
        (
            "from locusformer.cli.parser import build_parser\nbuild_parser()",
            {"numpy", "pandas", "scipy", "torch", "anndata"},
        ),
        (
            "import locusformer.steps.aggregate, locusformer.steps.summarize",
            {"scipy", "torch", "anndata", "sklearn", "scib_metrics"},
        ),
    ],
    ids=["parser", "table-steps"],
)
def test_light_steps_import_no_heavy_library(statement, absent):
    # Every workflow job builds the whole parser (one flag per simulation setting among
    # them) before it runs, and the steps that only read and write tables (aggregate,
    # summarize) sit on the demo's critical path: a heavy import there is paid by each.
    found = subprocess.run(
        [sys.executable, "-c", _IMPORTED.format(statement=statement)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    modules = set(found.stdout.split("\n")[-2].split())
    assert "locusformer" in modules
    assert not modules & absent, modules & absent
