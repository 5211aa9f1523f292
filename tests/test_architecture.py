"""The package's shape: subpackages in layers, imports in one direction, a torch-only core,
and functions small enough to read whole.

The rules, and why:

- **Layers.** Each subpackage (and each top-level module) has a layer; a module imports
  only from lower layers or from its own subpackage, so the tree reads bottom-up:
  ``errors -> io -> pp -> model -> train -> infer / baselines / simulate -> scoring ->
  report -> steps -> cli / api``. Within a subpackage, the module graph has no circle.
- **A torch-only core.** The network (``model/attention.py``, ``model/losses.py``,
  ``model/network.py`` and the ``model/config.py`` it is built from) imports torch and the
  standard library only, so it can be read, tested and reused without the rest.
- **Size where it matters.** No function over 100 lines and no call passing more than six
  positional arguments (more inputs travel as a dataclass or by keyword), and no
  ``fmt: skip`` in the package. A cap on the lines of a *file* is not a rule here: it used
  to force splits by length instead of by job.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "locusformer"

#: The layer of each subpackage and top-level module. A new subpackage must be placed here.
LAYERS = {
    "errors": 0,
    "io": 1,
    "pp": 2,
    "model": 3,
    "train": 4,
    "infer": 5,
    "baselines": 5,
    "simulate": 5,
    "scoring": 6,
    "report": 7,
    "steps": 8,
    "cli": 9,
    "api": 9,
    "__init__": 10,
    "__main__": 10,
}
CORE = ("attention", "losses", "network", "config")
MAX_FUNCTION_LINES = 100
MAX_POSITIONAL = 6


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def dotted(path: Path) -> str:
    """``.../locusformer/train/loop.py`` -> ``train.loop``; a package's init -> its name."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if len(parts) > 1 and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def unit(name: str) -> str:
    """The layered unit of a module: its subpackage, or the top-level module itself."""
    return name.split(".")[0]


def imported(path: Path, name: str | None = None) -> set[str]:
    """The package's modules that ``path`` (the module ``name``) imports anywhere, functions
    included, dotted."""
    name = name or dotted(path)
    here = name.split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(["locusformer", *package[: len(package) - node.level + 1]])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if base == "locusformer" or (
                base.startswith("locusformer.") and _is_package(base.removeprefix("locusformer."))
            ):
                prefix = base.removeprefix("locusformer").lstrip(".")
                for alias in node.names:
                    full = f"{prefix}.{alias.name}" if prefix else alias.name
                    names.add(full if _exists(full) else prefix)
            elif base.startswith("locusformer."):
                names.add(base.removeprefix("locusformer."))
        elif isinstance(node, ast.Import):
            names |= {
                a.name.removeprefix("locusformer.")
                for a in node.names
                if a.name.startswith("locusformer.")
            }
    return {n for n in names if n and n != "__version__"} - {name}


def _is_package(name: str) -> bool:
    return (PACKAGE / name.replace(".", "/") / "__init__.py").exists()


def _exists(name: str) -> bool:
    base = PACKAGE / name.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


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


def test_every_subpackage_and_module_has_a_layer() -> None:
    missing = sorted({unit(dotted(p)) for p in modules()} - set(LAYERS))
    assert not missing, f"place these in LAYERS: {missing}"


def test_there_are_about_a_dozen_layered_units() -> None:
    assert 10 <= len(LAYERS) <= 16


@pytest.mark.parametrize("path", modules(), ids=dotted)
def test_imports_flow_one_way(path: Path) -> None:
    mine = unit(dotted(path))
    against = {
        name for name in imported(path) if unit(name) != mine and LAYERS[unit(name)] >= LAYERS[mine]
    }
    assert not against, f"{dotted(path)} (layer {LAYERS[mine]}) imports {sorted(against)}"


def test_no_import_circle_inside_a_subpackage() -> None:
    graph = {dotted(p): imported(p) for p in modules()}
    inside = {m: {n for n in ns if unit(n) == unit(m) and n in graph} for m, ns in graph.items()}
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"import circle: {' -> '.join((*path, node))}"
        if node in done:
            return
        for nxt in inside[node]:
            visit(nxt, (*path, node))
        done.add(node)

    for node in inside:
        visit(node, ())


@pytest.mark.parametrize("core", CORE)
def test_the_core_imports_torch_and_the_standard_library_only(core: str) -> None:
    allowed = {f"locusformer.model.{c}" for c in CORE} | {"locusformer.errors"}
    for name in runtime_imports(PACKAGE / "model" / f"{core}.py"):
        root = name.split(".")[0]
        assert root == "torch" or root in sys.stdlib_module_names or name in allowed, (
            f"model/{core}.py imports {name}"
        )


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


@pytest.mark.parametrize("path", modules(), ids=dotted)
def test_functions_are_short_enough_to_read_whole(path: Path) -> None:
    long = [
        f"{f.name} ({f.end_lineno - f.lineno + 1} lines)"
        for f in _functions(path)
        if f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{dotted(path)}: {long}: split by job"


@pytest.mark.parametrize("path", modules(), ids=dotted)
def test_calls_pass_few_positional_arguments(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    many = [
        f"line {n.lineno}: {ast.unparse(n.func)} ({len(n.args)})"
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and len(n.args) > MAX_POSITIONAL
    ]
    assert not many, f"{dotted(path)}: {many}: pass by keyword or as a dataclass"


def test_no_formatting_is_switched_off() -> None:
    marked = [
        f"{dotted(p)}:{i}"
        for p in modules()
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "fmt: skip" in line or "fmt: off" in line
    ]
    assert not marked, f"formatted by hand: {marked}"


def test_the_checkers_catch_what_they_check(tmp_path: Path) -> None:
    # The import reader: a higher layer is found, also inside a function, and a relative
    # import resolves against the module's own subpackage.
    fake = tmp_path / "probe.py"
    fake.write_text("def f():\n    from locusformer.train.loop import run\n")
    assert imported(fake, "model.probe") == {"train.loop"}
    fake.write_text("from . import network\nfrom ..errors import InputError\n")
    assert imported(fake, "model.probe") == {"model.network", "errors"}
    fake.write_text("from locusformer.io import atomic\n")
    assert imported(fake, "model.probe") == {"io.atomic"}
    long = tmp_path / "long.py"
    long.write_text("def f(a):\n" + "    a += 1\n" * MAX_FUNCTION_LINES)
    assert [f.name for f in _functions(long)] == ["f"]
    assert max(f.end_lineno - f.lineno + 1 for f in _functions(long)) > MAX_FUNCTION_LINES
