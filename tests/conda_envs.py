"""The workflow's conda envs as data: which env each rule names, what each env lists, and
what a job's own code imported, for tests/test_envs.py and the tiny run's import check in
tests/test_workflow.py. Conda channels cannot be reached from where the tests run, so the
envs are checked by reading them, never by creating them."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import yaml
from conftest import ROOT

ENVS = ROOT / "workflow" / "envs"
RULES = ROOT / "workflow" / "rules"
SRC = ROOT / "src" / "locusformer"
# conda-forge names that differ from PyPI's
CONDA_TO_PYPI = {"pytorch": "torch", "matplotlib-base": "matplotlib"}
NOT_PINNED = {"python", "pip"}

_RULE = re.compile(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", re.S | re.M)
_CONDA = re.compile(r'^\s+conda:\n\s+"([^"]+)"', re.M)
# The locusformer command a rule runs: `python -m locusformer CMD` or `{params.launcher} CMD`
_COMMAND = re.compile(r"(?:-m locusformer|\{params\.launcher\}) ([a-z][\w-]*)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def package_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement.strip(), maxsplit=1)[0]


def rules() -> dict[str, dict]:
    """Every rule with a shell command: its file, env file (or None) and locusformer command."""
    found = {}
    for path in sorted(RULES.glob("*.smk")):
        for name, body in _RULE.findall(path.read_text()):
            if "shell:" not in body:
                continue
            conda = _CONDA.search(body)
            command = _COMMAND.search(body)
            found[name] = {
                "file": path,
                "env": (path.parent / conda.group(1)).resolve() if conda else None,
                "command": command.group(1) if command else None,
            }
    return found


def env_files() -> list[Path]:
    return sorted(ENVS.glob("*.yaml"))


def load_env(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def env_packages(path: Path) -> dict[str, str]:
    """PyPI name (canonical) -> the env's requirement, for every conda package but python."""
    packages = {}
    for dep in load_env(path)["dependencies"]:
        if not isinstance(dep, str):
            continue
        name = canonical(package_name(dep))
        if name not in NOT_PINNED:
            packages[canonical(CONDA_TO_PYPI.get(name, name))] = dep
    return packages


def lock_versions() -> dict[str, str]:
    lock = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            lock[canonical(name)] = version
    return lock


def _third_party_imports(path: Path) -> set[str]:
    """Top-level names of the absolute, non-stdlib imports anywhere in a source file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "locusformer"}


def _source(module: str) -> Path | None:
    parts = module.split(".")[1:]
    for path in (SRC.joinpath(*parts).with_suffix(".py"), SRC.joinpath(*parts, "__init__.py")):
        if parts and path.is_file():
            return path
    return SRC / "__init__.py" if not parts else None


def own_imports(modules: list[str]) -> set[str]:
    """Distributions (canonical names) that a job's own code imported: the third-party
    modules that a locusformer module it loaded imports (anywhere, lazily included) and
    that were loaded, so that an import the job never reached does not count."""
    loaded = {m.split(".")[0] for m in modules}
    wanted = set()
    for module in modules:
        if module == "locusformer" or module.startswith("locusformer."):
            source = _source(module)
            if source is not None:
                wanted |= _third_party_imports(source) & loaded
    by_module = importlib.metadata.packages_distributions()
    return {canonical(dist) for name in wanted for dist in by_module.get(name, [name])}
