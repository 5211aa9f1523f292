"""benchmarks/quality/tasks.py's composition-imbalance tasks, on a tiny fake of the CellBench
files (same names, layout and columns as ../shared/data/cellbench; never reads ../shared)."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

QUALITY = ROOT / "benchmarks" / "quality"
sys.path.insert(0, str(QUALITY))
import tasks  # noqa: E402

THREE = ("H1975", "H2228", "HCC827")
FIVE = ("A549", "H1975", "H2228", "H838", "HCC827")
DOMINANT = {"CEL-seq2": "H1975", "Drop-seq": "HCC827", "plate1": "A549", "plate2": "H838"}
DOMINANT["plate3"] = "H2228"
COMMON = [f"ENSG{i:011d}" for i in range(20)]
MARKER = {line: f"ENSG9{i:010d}" for i, line in enumerate(FIVE)}  # 1 in each cell of line


def _write_csv_r(frame: pd.DataFrame, path: Path) -> None:
    """As R's write.csv wrote the CellBench files: quoted header without the index's field."""
    lines = [",".join(f'"{c}"' for c in frame.columns)]
    for name, row in frame.iterrows():
        values = [f'"{v}"' if isinstance(v, str) else str(v) for v in row.tolist()]
        lines.append(",".join([f'"{name}"', *values]))
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(lines) + "\n")


def _fake_set(rng, batch: str, stem: str, out: Path) -> None:
    lines = THREE if batch in ("CEL-seq2", "Drop-seq") else FIVE
    labels = [line for line in lines for _ in range(33 if line == DOMINANT[batch] else 6)]
    labels += [lines[0], lines[1], lines[2]]  # two doublets and an outlier, all dropped
    cells = [f"{stem}_c{i:03d}" for i in range(len(labels))]
    kind = ["SNG"] * (len(labels) - 3) + ["DBL", "DBL", "SNG"]
    outlier = ["FALSE"] * (len(labels) - 1) + ["TRUE"]
    meta = pd.DataFrame(
        {"outliers": outlier, "cell_line_demuxlet": labels, "demuxlet_cls": kind}, index=cells
    )
    if len(lines) == 3:
        meta.insert(1, "cell_line", labels)
    genes = COMMON + [f"ENSG8{stem[-4:]}{i}" for i in range(2)]  # two of this set's own
    values = rng.poisson(2.0, size=(len(genes), len(cells)))
    markers = [[int(label == line) for label in labels] for line in FIVE]
    ercc = ["ERCC-00002", "ERCC-00003"] if batch != "Drop-seq" else []
    counts = pd.DataFrame(
        np.vstack([values, np.asarray(markers), np.full((len(ercc), len(cells)), 7)]),
        index=genes + list(MARKER.values()) + ercc,
        columns=cells,
    )
    _write_csv_r(counts, out / f"{stem}.count.csv.gz")
    _write_csv_r(meta, out / f"{stem}.metadata.csv.gz")


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shared")
    (root / "cellbench").mkdir()
    rng = np.random.default_rng(0)
    for batch, stem in tasks.SETS.items():
        _fake_set(rng, batch, stem, root / "cellbench")
    return root


def test_the_fake_reads_as_the_real_files_do(shared):
    counts, sheet = tasks.load_set(shared, "CEL-seq2")
    assert counts.shape == (len(COMMON) + 2 + len(FIVE), 45)  # ERCC, doublets, outlier gone
    assert sheet["cell_line"].value_counts().to_dict() == {"H1975": 33, "H2228": 6, "HCC827": 6}


def test_inner_join_keeps_only_the_genes_every_set_measured(shared):
    counts, sheet = tasks.build("cellbench5_inner", shared)
    assert set(counts.index) == set(COMMON) | set(MARKER.values())
    assert len(sheet) == counts.shape[1] == 2 * 45 + 3 * 57
    union, _ = tasks.build("cellbench5", shared)
    assert len(union) == len(counts) + 5 * 2  # the union adds each set's own two genes
    assert (union.loc[counts.index, counts.columns] == counts).all().all()


def test_skewed_has_the_planned_composition(shared):
    counts, sheet = tasks.build("cellbench5_skewed", shared, seed=0)
    expected = pd.DataFrame(
        {  # SKEW on the fake's 33 / 6 cells a line: fractions rounded half up, 0 drops
            "A549": [0, 0, 33, 0, 1],
            "H1975": [33, 2, 3, 6, 6],
            "H2228": [2, 0, 6, 2, 17],
            "H838": [0, 0, 0, 33, 2],
            "HCC827": [0, 33, 2, 3, 6],
        },
        index=["CEL-seq2", "Drop-seq", "plate1", "plate2", "plate3"],
    )
    table = pd.crosstab(sheet["batch"], sheet["cell_line"])
    pd.testing.assert_frame_equal(table, expected, check_names=False)
    assert list(counts.columns) == list(sheet.index)
    # Every kept cell is one of its line's: its marker gene is 1.
    markers = counts.loc[[MARKER[line] for line in sheet["cell_line"]]].to_numpy()
    assert (np.diag(markers) == 1).all()
    again = tasks.build("cellbench5_skewed", shared, seed=0)
    assert again[1].equals(sheet) and again[0].equals(counts)
    other = tasks.build("cellbench5_skewed", shared, seed=1)[1]
    assert not other.index.equals(sheet.index)
    pd.testing.assert_frame_equal(
        pd.crosstab(other["batch"], other["cell_line"]), table, check_names=False
    )


def test_confounded_pseudobulk_has_each_batch_dominated_by_one_line(shared):
    counts, sheet = tasks.build("pseudobulk_confounded", shared, seed=0)
    n = tasks.CONFOUNDED_SAMPLES
    assert len(sheet) == n * len(tasks.CONFOUNDED) == counts.shape[1]
    assert list(counts.columns) == list(sheet.index)
    lines = set()
    for batch, rows in sheet.groupby("batch"):
        top = rows["cell_line"].value_counts()
        assert top.index[0] == DOMINANT[batch] == tasks.CONFOUNDED[batch][0]
        assert top.iloc[0] / len(rows) == pytest.approx(tasks.CONFOUNDED_SHARE)
        assert len(rows) == n
        lines.add(top.index[0])
    assert lines == set(FIVE)  # each line dominant in a different batch
    # The label is the line summed: its marker counts the cells, the others are 0.
    for sample, line in sheet["cell_line"].items():
        got = {other: counts.loc[MARKER[other], sample] for other in FIVE}
        assert got == {other: tasks.CONFOUNDED_GROUP * (other == line) for other in FIVE}
    again = tasks.build("pseudobulk_confounded", shared, seed=0)
    assert again[0].equals(counts) and again[1].equals(sheet)
    assert not tasks.build("pseudobulk_confounded", shared, seed=1)[0].equals(counts)


def test_confounded_pseudobulk_says_which_line_is_short_of_cells(shared):
    counts, sheet = tasks.combine([tasks.load_set(shared, "CEL-seq2")])
    design = {"CEL-seq2": ("H2228", ("H1975",))}  # 8 samples of 4 need 32 of H2228's 6
    with pytest.raises(ValueError, match="CEL-seq2 has 6 cells of H2228"):
        tasks.confounded_pseudobulk(counts, sheet, design, 10, 0.8, 4, seed=0)


@pytest.mark.parametrize("task", ["cellbench5_inner", "cellbench5_skewed", "pseudobulk_confounded"])
def test_write_task_writes_what_the_other_tasks_write(shared, tmp_path, task):
    row = tasks.write_task(task, shared, tmp_path)
    assert row["name"] == task and row["label_key"] == "cell_line"
    assert row["batch_key"] == "batch" and row["value_type"] == "counts"
    matrix = pd.read_csv(row["expression"], sep="\t", index_col=0)
    samples = pd.read_csv(row["samples"], sep="\t", index_col=0)
    assert matrix.index.name == "gene_id" and samples.index.name == "sample_id"
    assert list(matrix.columns) == list(samples.index)
    assert list(samples.columns) == ["batch", "cell_line"]
    assert ((matrix > 0).sum(axis=1) >= 3).all()
    composition = pd.read_csv(tmp_path / f"{task}_composition.tsv", sep="\t", index_col=0)
    assert composition.loc["total", "total"] == len(samples)
    assert (composition.drop(index="total", columns="total").sum().sum()) == len(samples)


def _run_module():
    spec = importlib.util.spec_from_file_location("quality_run", QUALITY / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_offers_the_tasks_and_tables_each_one():
    run = _run_module()
    assert {"cellbench5_inner", "cellbench5_skewed", "pseudobulk_confounded"} <= set(run.TASKS)
    rows = [
        {"dataset": task, "method": method, "variant": "default", "seed": seed,
         "batch": 0.5 + 0.01 * seed, "bio": 0.8, "total": 0.68 + 0.004 * seed,
         "wall_s": 1.0, "max_rss_mb": float("nan")}
        for task in ("cellbench5_inner", "pseudobulk_confounded")
        for method in ("uncorrected", "locusformer")
        for seed in (0, 1, 2)
    ]  # fmt: skip
    report = run.tables(pd.DataFrame(rows))
    for task in ("cellbench5_inner", "pseudobulk_confounded"):
        assert f"### {task} (3 seeds; mean ± sd)" in report
    assert "| locusformer | 0.510 ± 0.010 | 0.800 ± 0.000 | 0.684 ± 0.004 |" in report


def test_run_protects_the_label_only_where_the_schema_has_the_key(monkeypatch):
    run = _run_module()
    monkeypatch.setattr(run, "_schema", lambda: {"baselines": {"items": {"enum": ["combat"]}}})
    assert run.protect_config() is None and run.label_baselines() == []
    schema = {"protect": {"type": "string"}, "baselines": {"items": {"enum": ["combat_mod"]}}}
    monkeypatch.setattr(run, "_schema", lambda: schema)
    assert run.protect_config() == {"protect": "cell_line"}
    assert run.label_baselines() == ["combat_mod"]
    monkeypatch.setattr(run, "_schema", lambda: {"protect": {"type": "array"}})
    assert run.protect_config() == {"protect": ["cell_line"]}


def test_label_using_rows_are_tabled_apart():
    run = _run_module()
    run.VARIANTS["protected_cell_line"] = {"protect": ["cell_line"]}
    run.VARIANT_BASELINES["protected_cell_line"] = ["combat_mod"]
    assert run.protected_columns("protected_cell_line") == ["cell_line"]
    assert run.protected_columns("default") == []
    methods = {
        "default": ("uncorrected", "combat", "locusformer"),
        "protected_cell_line": ("uncorrected", "combat_mod (mod: cell_line)", "locusformer"),
    }
    rows = [
        {"dataset": "pseudobulk_confounded", "method": method, "variant": variant, "seed": 0,
         "batch": 0.5, "bio": 0.9 if "mod" in method else 0.7, "total": 0.7, "wall_s": 1.0,
         "max_rss_mb": float("nan")}
        for variant, names in methods.items()
        for method in names
    ]  # fmt: skip
    report = run.tables(pd.DataFrame(rows))
    default, protected = report.split("### pseudobulk_confounded, protected_cell_line (1 seed")
    assert "### pseudobulk_confounded (1 seed; mean ± sd)" in default
    assert "combat_mod" not in default and "| combat |" in default
    assert "| combat_mod (mod: cell_line) | 0.500 | 0.900 |" in protected
    assert "locusformer" not in protected and "| uncorrected |" in protected
    assert "Ablations" not in report  # the protected run's LocusFormer is no ablation


@pytest.mark.parametrize("pool", [1, 3])
def test_mixtures_follow_the_design_at_one_cells_depth(shared, pool):
    counts, sheet = tasks.combine([tasks.load_set(shared, b) for b in ("CEL-seq2", "Drop-seq")])
    design = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.0), (0.68, 0.16, 0.16))
    mixed, labels = tasks.mixtures(counts, sheet, design, samples=4, seed=0, pool=pool)
    assert list(mixed.columns) == list(labels.index) and mixed.index.equals(counts.index)
    table = pd.crosstab(labels["batch"], labels["cell_line"])
    assert sorted(table.columns) == ["mix_100_0_0", "mix_50_50_0", "mix_68_16_16"]
    assert (table == 4).all().all()
    # Each line's marker gene counts its cells: a mixture holds only the lines it names,
    # and a pure sample with no pooling is one real cell of its line, untouched.
    markers = mixed.loc[[MARKER[line] for line in THREE]].T
    pure = labels["cell_line"] == "mix_100_0_0"
    assert (markers.loc[pure, MARKER["H2228"]] == 0).all()
    assert (markers.loc[pure, MARKER["HCC827"]] == 0).all()
    halves = labels["cell_line"] == "mix_50_50_0"
    assert (markers.loc[halves, MARKER["HCC827"]] == 0).all()
    depth = counts.sum()
    if pool == 1:
        for sample in labels.index[pure]:
            assert (counts == mixed[[sample]].to_numpy()).all().any()
    # No mixture is deeper than the deepest cell of its batch (thinned to one cell's depth).
    for batch, names in labels.groupby("batch").groups.items():
        deepest = depth[sheet.index[sheet["batch"] == batch]].max()
        assert (mixed[names].sum() <= deepest).all()
    again, _ = tasks.mixtures(counts, sheet, design, samples=4, seed=0, pool=pool)
    pd.testing.assert_frame_equal(mixed, again)


def _fake_mixture_plate(rng, stem: str, meta: pd.DataFrame, out: Path) -> None:
    genes = [*COMMON, "ERCC-00002"]
    counts = pd.DataFrame(
        rng.poisson(3.0, size=(len(genes), len(meta))), index=genes, columns=meta.index
    )
    _write_csv_r(counts, out / f"{stem}.count.csv.gz")
    _write_csv_r(meta, out / f"{stem}.metadata.csv.gz")


@pytest.fixture(scope="module")
def mixture_shared(tmp_path_factory) -> Path:
    """CellBench's mixture experiments as their files hold them: the RNA mixtures' sheet
    gives each line's proportion (columns in another order than ``MIXTURE_LINES``), the
    cell mixtures' the cells of each line and the authors' quality flag."""
    root = tmp_path_factory.mktemp("mixture_shared")
    (root / "cellbench").mkdir()
    rng = np.random.default_rng(1)
    for stem in ("RNAmix_celseq2", "RNAmix_sortseq"):
        wells = [f"A{i}" for i in range(4)]
        meta = pd.DataFrame(
            {"outliers": ["FALSE", "FALSE", "FALSE", "TRUE"], "mix": [1, 2, 3, 3],
             "H2228_prop": [0.68, 0.0, 0.16, 0.16], "H1975_prop": [0.16, 1.0, 0.16, 0.16],
             "HCC827_prop": [0.16, 0.0, 0.68, 0.68]},
            index=wells,
        )  # fmt: skip
        _fake_mixture_plate(rng, stem, meta, root / "cellbench")
    for i in range(1, 5):
        meta = pd.DataFrame(
            {"outliers": ["FALSE"] * 3, "H1975": [9, 3, 0], "H2228": [0, 3, 1],
             "HCC827": [0, 3, 8], "poor_quality": ["NO", "NO", "YES"]},
            index=[f"B{j}" for j in range(3)],
        )  # fmt: skip
        _fake_mixture_plate(rng, f"cellmix{i}", meta, root / "cellbench")
    return root


def test_rna_mixtures_are_labelled_by_their_proportions_in_the_lines_order(mixture_shared):
    counts, sheet = tasks.build("rnamix", mixture_shared)
    assert sheet["batch"].value_counts().to_dict() == {"CEL-seq2": 3, "SORT-seq": 3}
    first = sheet[sheet["batch"] == "CEL-seq2"]["cell_line"].tolist()
    assert first == ["mix_16_68_16", "mix_100_0_0", "mix_16_16_68"]  # the outlier dropped
    assert list(counts.columns) == list(sheet.index)
    assert not counts.index.str.startswith("ERCC-").any()


def test_cell_mixtures_are_labelled_by_their_cells_and_poor_wells_dropped(mixture_shared):
    counts, sheet = tasks.build("cellmix", mixture_shared)
    assert sorted(sheet["batch"].unique()) == [f"cellmix{i}" for i in range(1, 5)]
    assert set(sheet["cell_line"]) == {"cells_9_0_0", "cells_3_3_3"}
    assert len(sheet) == 8 and counts.shape[1] == 8
