"""The per-stage conda envs of workflow/envs/ (used with `snakemake --sdm conda`).

Conda channels cannot be reached from the machines that run the tests, so the envs are
never built here: these tests read them. Every rule names one, every package is pinned to
requirements.lock's version, a rule's command finds the workflow's own package where
Snakemake clears PYTHONPATH, and each env's post-deploy script installs this release of the
package for a deployment (tests/test_deploy.py runs one against the built wheel). That each
job's imports are in its env is checked on the tiny run's jobs (tests/test_workflow.py,
test_every_job_imports_only_what_its_rules_conda_env_lists).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest
import yaml
from conda_envs import ENVS, env_files, env_packages, load_env, lock_versions, rules
from conftest import ROOT

# What each baseline of the schema needs from the baselines env.
BASELINE_PACKAGES = {
    "combat": {"scanpy"},
    "combat_mod": {"scanpy"},
    "harmony": {"harmonypy"},
    "scvi": {"scvi-tools", "torch"},
    "sysvi": {"scvi-tools", "torch"},
}
PREFIX = "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}}"


def test_every_rule_names_an_env_of_workflow_envs_and_every_env_is_used():
    found = rules()
    assert len(found) >= 13
    for name, rule in found.items():
        assert rule["env"] is not None, f"rule {name} has no conda env"
        assert rule["env"].parent == ENVS and rule["env"].is_file(), (name, rule["env"])
        assert rule["command"], f"rule {name} runs no locusformer command"
    assert {rule["env"] for rule in found.values()} == set(env_files())


@pytest.mark.parametrize("path", env_files(), ids=lambda p: p.name)
def test_env_file_parses_with_the_channels_and_python_of_the_project(path):
    env = load_env(path)
    assert env["channels"] == ["conda-forge", "bioconda", "nodefaults"]
    assert all(isinstance(dep, str) for dep in env["dependencies"]), "no pip section"
    assert "python =3.11" in env["dependencies"]  # requirements.lock's Python
    assert "pip" in env["dependencies"]  # for its post-deploy script
    assert path.read_text().startswith("# Conda env of "), "says which rules use it"


@pytest.mark.parametrize("path", env_files(), ids=lambda p: p.name)
def test_every_package_is_pinned_to_the_version_of_requirements_lock(path):
    lock = lock_versions()
    packages = env_packages(path)
    assert packages
    for name, requirement in packages.items():
        pin = re.fullmatch(r"\S+ ==(\S+)", requirement)
        assert pin, f"{path.name}: {requirement!r} is not pinned as 'name ==version'"
        assert name in lock, f"{path.name}: {name} is not in requirements.lock"
        assert pin.group(1) == lock[name], f"{path.name}: {requirement} but the lock has {name}"


def test_the_baselines_env_has_every_baseline_the_schema_allows():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    allowed = schema["properties"]["baselines"]["items"]["enum"]
    assert set(allowed) == set(BASELINE_PACKAGES), "a new baseline: say what it needs here"
    env = {rule["env"] for rule in rules().values() if rule["command"] == "baseline"}
    assert len(env) == 1
    listed = set(env_packages(env.pop()))
    for method in allowed:
        assert BASELINE_PACKAGES[method] <= listed, method


def test_torch_is_only_in_the_envs_of_the_rules_that_run_a_torch_model():
    # ours, or scvi-tools' (whose env asks torch for a GPU): the rest stay light
    for name, rule in rules().items():
        packages = env_packages(rule["env"])
        model_commands = {"train", "correct", "attention", "inspect", "map"}
        runs_a_model = rule["command"] in model_commands or "scvi-tools" in packages
        assert ("torch" in packages) == runs_a_model, name


def test_every_command_finds_the_workflows_package_without_an_inherited_pythonpath():
    for name, rule in rules().items():
        shell = rule["file"].read_text().split(f"rule {name}:", 1)[1].split("shell:", 1)[1]
        assert shell.lstrip().startswith(f'"{PREFIX}'), f"rule {name}: {shell[:80]!r}"
    # What a job in a conda env gets: no PYTHONPATH, LOCUSFORMER_SRC from common.smk. -S
    # keeps site-packages (and an installed locusformer) out, so src/ must be what imports.
    line = PREFIX.replace("{{", "{").replace("}}", "}")
    script = f'{line} "{sys.executable}" -S -c "import locusformer; print(locusformer.__file__)"'
    env = {"PATH": "/usr/bin:/bin", "LOCUSFORMER_SRC": str(ROOT / "src")}
    found = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; {script}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == str(ROOT / "src" / "locusformer" / "__init__.py")


def test_min_version_is_the_lowest_snakemake_pyproject_allows():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lowest = next(
        re.fullmatch(r"snakemake\s*>=\s*(\S+)", d).group(1)
        for d in project["optional-dependencies"]["workflow"]
        if re.match(r"snakemake\s*>=", d)
    )
    snakefile = (ROOT / "workflow" / "Snakefile").read_text()
    assert f'min_version("{lowest}")' in snakefile


def _post_deploy(path):
    return path.with_name(f"{path.stem}.post-deploy.sh")


@pytest.mark.parametrize("path", env_files(), ids=lambda p: p.name)
def test_every_env_installs_this_release_of_the_package_without_its_dependencies(path):
    # Snakemake runs <env>.post-deploy.sh in the env it has just built (--sdm conda). A pip
    # section would resolve the package's whole dependency list into every stage's env
    # (torch into metrics and report); --no-deps keeps each env to what it lists.
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    script = _post_deploy(path).read_text()
    command = " ".join(line for line in script.splitlines() if not line.startswith("#"))
    assert "python -m pip install --no-deps" in command
    assert f'"locusformer=={version}"' in command, f"{path.name}: not this release"
    subprocess.run(["sh", "-n", str(_post_deploy(path))], check=True)


@pytest.mark.parametrize(
    ("pip_works", "src", "succeeds"),
    [(True, "", True), (False, "/clone/src", True), (False, "", False)],
    ids=["installed", "clone-without-index", "deployment-without-index"],
)
def test_post_deploy_tolerates_a_failed_install_only_where_src_runs(
    tmp_path, pip_works, src, succeeds
):
    # A `python` that records its arguments and exits as pip would: from a clone the rules
    # run src/ (LOCUSFORMER_SRC), so an unreleased version is no error there.
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\nexit {0 if pip_works else 1}\n')
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "LOCUSFORMER_SRC": src}
    script = _post_deploy(ENVS / "torch.yaml")
    ran = subprocess.run(["sh", str(script)], env=env, capture_output=True, check=False)
    assert (ran.returncode == 0) == succeeds
    assert (tmp_path / "args").read_text().split()[:4] == ["-m", "pip", "install", "--no-deps"]


def test_every_post_deploy_script_is_the_same():
    scripts = {_post_deploy(path).read_text() for path in env_files()}
    assert len(scripts) == 1
    assert sorted(ENVS.glob("*.post-deploy.sh")) == [_post_deploy(p) for p in env_files()]
