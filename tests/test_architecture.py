"""The package's shape: one job per module, imports in one direction, a torch-only core."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "locusformer"

#: Each module's layer. A module imports only modules of lower layers, so there is no
#: circle, and the flow is errors -> io/data -> model -> train/correct -> cli. A new
#: module must be placed here (the test says so).
LAYERS = {
    "__init__": 11,  # imports the API lazily, when first used
    "errors": 0,
    "batches": 1,
    "atomic": 0,
    "memory": 0,
    "vi_device": 1,
    "pca": 0,
    "combat": 0,
    "report_figures": 0,
    "config": 1,
    "loci": 1,
    "runtime": 1,
    "checks": 1,
    "results": 1,
    "subsample": 1,
    "neighbors": 1,
    "tables": 1,
    "parquet": 2,
    "diagram": 2,
    "annotation": 2,
    "io": 3,
    "data": 3,
    "simulate_genome": 2,
    "result_rows": 2,
    "simulate": 3,
    "baselines": 3,
    "preprocess": 4,
    "alignment": 3,
    "attention": 4,
    "losses": 4,
    "confounding": 4,
    "metrics": 4,
    "model": 5,
    "report_sections": 5,
    "report_attention": 5,
    "report_trace": 5,
    "report": 6,
    "layout": 6,
    "schedule": 6,
    "distributed": 2,
    "checkpoint": 6,
    "epoch_checks": 6,
    "train": 7,
    "correct": 7,
    "trace": 7,
    "mapping": 8,
    "steps": 8,
    "api": 9,
    "cli_parser": 8,
    "cli": 9,
    "__main__": 10,
}

MAX_LINES = 600


def modules() -> list[Path]:
    return sorted(PACKAGE.glob("*.py"))


def imported(path: Path) -> set[str]:
    """The package's modules that ``path`` imports anywhere (functions included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x / from .x import y
                base = f"locusformer.{base}" if base else "locusformer"
            if base == "locusformer":
                names |= {f"locusformer.{alias.name}" for alias in node.names}
            elif base.startswith("locusformer."):
                names.add(base)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("locusformer.")}
    return {name.split(".")[1] for name in names} - {"__version__"}


def runtime_imports(path: Path) -> set[str]:
    """Top-level names imported by ``path`` at run time (``TYPE_CHECKING`` blocks aside)."""
    roots: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            roots |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module)
    return roots


def test_every_module_has_a_layer() -> None:
    missing = sorted({p.stem for p in modules()} - set(LAYERS))
    assert not missing, f"place these modules in LAYERS: {missing}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.stem)
def test_imports_flow_one_way(path: Path) -> None:
    mine = LAYERS[path.stem]
    against = {name for name in imported(path) if LAYERS.get(name, 99) >= mine}
    assert not against, f"{path.stem} (layer {mine}) imports {sorted(against)}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.stem)
def test_no_module_is_above_the_size_limit(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines: split it by job"


@pytest.mark.parametrize("core", ["attention", "losses", "model"])
def test_the_core_imports_torch_and_the_standard_library_only(core: str) -> None:
    allowed = {"locusformer.attention", "locusformer.losses"} if core == "model" else set()
    for name in runtime_imports(PACKAGE / f"{core}.py"):
        root = name.split(".")[0]
        assert root == "torch" or root in sys.stdlib_module_names or name in allowed, (
            f"{core}.py imports {name}"
        )


def test_the_direction_check_catches_a_circle(tmp_path: Path) -> None:
    # The checker itself: an import of a higher layer is found, also inside a function.
    fake = tmp_path / "model.py"
    fake.write_text("def f():\n    from locusformer.train import run_train\n")
    assert imported(fake) == {"train"}
    fake.write_text("from . import correct\nfrom .errors import InputError\n")
    assert imported(fake) == {"correct", "errors"}
