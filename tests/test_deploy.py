"""The package as a scanpy user installs it, and the workflow as snakedeploy deploys it (#41).

Built here, offline: the sdist, then the wheel from the unpacked sdist (as ``python -m
build`` does, with the project venv's setuptools instead of an isolated build env). The
wheel goes into a new venv that already holds scanpy, torch and snakemake: those of the
project's venv, seen through a site folder of links that leaves out the project's own
(editable) locusformer, so that the wheel is the only locusformer there is. (A venv made
with ``--system-site-packages`` by the project venv's python would see the base Python's
site-packages, not the project venv's.) It is installed by the stage envs' post-deploy
script, as ``snakemake --sdm conda`` would install the released package.

In that venv: the package imports from the wheel, fits the tiny data and maps it; pip,
asked to install the wheel with its dependencies where another torch 2.x is installed,
keeps that torch; and the workflow, copied without src/ beside it and used as a module
from an empty folder the way snakedeploy writes one, runs the tiny data end to end with
every job running the wheel's package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

pytestmark = pytest.mark.slow

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NAME = f"locusformer-{PROJECT['version']}"
TEST_DIR = ROOT / ".test"
GENES = ROOT / "workflow" / "resources" / "hs_gene_coordinates.tsv.gz"
POST_DEPLOY = ROOT / "workflow" / "envs" / "torch.post-deploy.sh"
IMPORT_PROBE = ROOT / "tests" / "import_probe"


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    assert result.returncode == 0, f"{args}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _env(venv: Path, **extra: str) -> dict:
    """A clean environment for the venv: its bin/ first, no PYTHONPATH, no pip config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        OMP_NUM_THREADS="1",
        SLURM_CONF=os.devnull,  # the SLURM plugin's help text asks scontrol (workflow_helpers)
    )
    env.update(extra)
    return env


def _build(build_dir: Path, source: Path, kind: str) -> Path:
    """setuptools' PEP 517 hook ``build_{kind}`` run in ``source``: the file it wrote."""
    hook = f"import sys; from setuptools import build_meta as b; print(b.build_{kind}(sys.argv[1]))"
    result = _run([sys.executable, "-c", hook, str(build_dir)], cwd=source)
    return build_dir / result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("build")
    project = root / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, project / name)
    shutil.copytree(
        ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    out = root / "dist"
    out.mkdir()
    sdist = _build(out, project, "sdist")
    with tarfile.open(sdist) as archive:
        archive.extractall(root / "unpacked", filter="data")
    wheel = _build(out, root / "unpacked" / NAME, "wheel")
    return {"sdist": sdist, "wheel": wheel, "dir": out}


def _base_site(folder: Path) -> Path:
    """Links to every entry of the project venv's site-packages but its own locusformer."""
    folder.mkdir(exist_ok=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "locusformer" not in entry.name.lower():
            (folder / entry.name).symlink_to(entry)
    return folder


def _venv(path: Path, base_site: Path) -> Path:
    """A new venv (no pip of its own) whose python also sees ``base_site``, after its own."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = _run([str(path / "bin" / "python"), "-c", where]).stdout.strip()
    pth = f"import site; site.addsitedir({str(base_site)!r})\n"
    Path(purelib, "_base_site.pth").write_text(pth)
    return Path(purelib)


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("venv")
    base_site = _base_site(root / "base-site")
    path = root / "venv"
    purelib = _venv(path, base_site)
    # Installed as the stage envs' post-deploy script installs the release (pip, no deps),
    # here from the built files instead of the index.
    env = _env(path, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(dist["dir"]))
    env.pop("LOCUSFORMER_SRC", None)
    _run(["sh", str(POST_DEPLOY)], env=env)
    return {"path": path, "python": path / "bin" / "python", "purelib": purelib, "base": base_site}


def test_the_sdist_and_the_wheel_hold_the_package_its_data_and_its_ranges(dist):
    with tarfile.open(dist["sdist"]) as archive:
        sdist = set(archive.getnames())
    for name in ("pyproject.toml", "README.md", "LICENSE", "src/locusformer/__init__.py"):
        assert f"{NAME}/{name}" in sdist, name
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        files = set(wheel.namelist())
        info = f"{NAME}.dist-info"
        metadata = Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    for name in ("__init__.py", "__main__.py", "api.py", "report/templates/report.html"):
        assert f"locusformer/{name}" in files, name
    assert not [f for f in files if f.startswith(("tests/", "workflow/", "resources/"))]
    assert "locusformer = locusformer.cli.main:main" in entry_points
    assert metadata["License-Expression"] == "MIT"
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    core = {r.name: r.specifier for r in requires if r.marker is None}
    assert core["torch"] == SpecifierSet(">=2.3,<3")
    assert not {"snakemake", "scvi-tools", "snakemake-executor-plugin-slurm"} & set(core)
    optional = {(r.name, str(r.marker)) for r in requires if r.marker is not None}
    assert ("snakemake", 'extra == "workflow"') in optional
    assert ("scvi-tools", 'extra == "scvi"') in optional


_FIT = """
import sys
import anndata as ad
import scanpy as sc
import locusformer as lf

adata = ad.read_h5ad(sys.argv[1])  # the tiny data's counts, samples x genes
sc.pp.normalize_total(adata, target_sum=1e4)
sc.pp.log1p(adata)
adata.obsm["X_own"] = adata.X[:, :2].toarray()
small = {"patch_size": 8, "d_model": 32, "n_heads": 2, "n_layers": 1, "latent_dim": 8}
model = lf.fit(
    adata, "protocol", annotation=sys.argv[2], max_epochs=2, batch_size=32, model=small,
    device="cpu", progress=False,
)
out = lf.map(adata, model)
sc.pp.neighbors(out, use_rep="X_locusformer_pca")
print(lf.__file__)
print(len(model.history), out.obsm["X_locusformer_pca"].shape[0], out.obsm["X_locusformer"].shape)
print("X_own" in out.obsm, "corrected" in out.layers)
print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_the_wheel_imports_fits_and_maps_beside_scanpy(venv):
    fitted = _run(
        [str(venv["python"]), "-c", _FIT, str(TEST_DIR / "data" / "tiny.h5ad"), str(GENES)],
        env=_env(venv["path"]),
        cwd=venv["path"],
        timeout=600,
    )
    where, sizes, kept, modules = fitted.stdout.strip().splitlines()[-4:]
    assert Path(where).is_relative_to(venv["purelib"]), where  # the wheel's, not src/
    epochs, samples, latent = sizes.split(" ", 2)
    assert (epochs, samples) == ("2", "113") and latent == "(113, 8)"
    assert kept == "True True"
    assert not {"snakemake", "scvi"} & set(modules.split())
    shown = _run([str(venv["path"] / "bin" / "locusformer"), "--help"], env=_env(venv["path"]))
    assert "usage: locusformer" in shown.stdout


@pytest.mark.parametrize(
    ("installed", "kept"),
    [("2.4.1", True), ("2.13.0", True), ("1.13.1", False)],
    ids=["torch-2.4", "torch-2.13", "torch-1.13"],
)
def test_installing_the_wheel_with_its_dependencies_keeps_an_installed_torch_2(
    dist, venv, tmp_path, installed, kept
):
    # A torch of another release, as pip sees one (its metadata, before the project venv's
    # torch): pip resolves the wheel with every dependency, offline, and says what it would
    # install. A torch 2 stays; torch 1 would have to be replaced (none to be found here).
    purelib = _venv(tmp_path / "venv", venv["base"])
    info = purelib / f"torch-{installed}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {installed}\n")
    (info / "INSTALLER").write_text("pip\n")
    report = tmp_path / "report.json"
    resolved = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "install", "--dry-run",
         "--no-index", "--find-links", str(dist["dir"]), "--report", str(report), "--quiet",
         str(dist["wheel"])],
        capture_output=True,
        text=True,
        env=_env(tmp_path / "venv"),
        check=False,
    )  # fmt: skip
    if kept:
        assert resolved.returncode == 0, resolved.stderr[-3000:]
        install = json.loads(report.read_text())["install"]
        assert [item["metadata"]["name"] for item in install] == ["locusformer"]
    else:
        assert resolved.returncode != 0
        assert "torch<3,>=2.3" in resolved.stderr.replace(" ", ""), resolved.stderr[-3000:]


_DEPLOYED = """\
configfile: "config/config.yaml"


# As snakedeploy writes it, with the release's path for github("...", path=..., tag=...).
module locusformer:
    snakefile:
        "{snakefile}"
    config:
        config


use rule * from locusformer
"""


def test_the_workflow_deploys_as_snakedeploy_does_and_runs_the_tiny_data(venv, tmp_path):
    # The release's workflow/ alone: no src/ beside it, so the rules run the installed wheel.
    release = tmp_path / "release"
    shutil.copytree(ROOT / "workflow", release / "workflow", ignore=shutil.ignore_patterns(".*"))
    # The deployment: an empty folder, a Snakefile using the workflow as a module, and the
    # config/ that snakedeploy copies, here the tiny test config and its data. The sheet
    # names the gene coordinates as a deployment does, resources/…, which the working
    # directory lacks: the workflow reads its own copy.
    deployed = tmp_path / "deployed"
    (deployed / "workflow").mkdir(parents=True)
    (deployed / "workflow" / "Snakefile").write_text(
        _DEPLOYED.format(snakefile=release / "workflow" / "Snakefile")
    )
    shutil.copytree(TEST_DIR / "config", deployed / "config")
    shutil.copytree(TEST_DIR / "data", deployed / "data")
    sheet = pd.read_csv(deployed / "config" / "datasets.tsv", sep="\t")
    sheet["genes"] = "resources/hs_gene_coordinates.tsv.gz"
    sheet.to_csv(deployed / "config" / "datasets.tsv", sep="\t", index=False)
    assert not (deployed / "resources").exists()
    imports = tmp_path / "imports"
    imports.mkdir()
    env = _env(venv["path"], PYTHONPATH=str(IMPORT_PROBE), LOCUSFORMER_IMPORTS=str(imports))
    started = time.monotonic()
    result = subprocess.run(
        [str(venv["python"]), "-m", "snakemake", "--cores", "2"],
        cwd=deployed,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"deployed run: {time.monotonic() - started:.0f} s")
    results = deployed / "results"
    summary = pd.read_csv(results / "summary.tsv", sep="\t")
    assert {"uncorrected", "locusformer", "locusformer_latent"} <= set(summary["method"])
    assert (summary["status"] == "ok").all(), summary
    assert (results / "tiny" / "report.html").exists()
    assert 'href="tiny/report.html"' in (results / "index.html").read_text()
    # Every job ran the wheel's package: `python -m locusformer` runs its __main__.py.
    main = venv["purelib"] / "locusformer" / "__main__.py"
    commands = {}
    for record in imports.glob("*.json"):
        argv = json.loads(record.read_text())["argv"]
        if argv and argv[0].endswith(os.path.join("locusformer", "__main__.py")):
            assert Path(argv[0]).resolve() == main.resolve(), argv[0]
            commands[argv[1]] = commands.get(argv[1], 0) + 1
    every = {"normalize", "order-loci", "train", "correct", "baseline", "metrics", "report"}
    assert every | {"confounding", "attention", "inspect", "summarize", "index"} <= set(commands)
    # The shipped gene coordinates keep their path from run to run: nothing to do again.
    again = _run(
        [str(venv["python"]), "-m", "snakemake", "-n", "--cores", "2"], cwd=deployed, env=env
    )
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]
