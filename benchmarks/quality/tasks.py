"""Build the quality-benchmark tasks from the CellBench files in ../shared/data.

Tasks (each a genes x cells count matrix plus a sample sheet with `batch` and `cell_line`):

- ``protocols``: CEL-seq2 + Drop-seq, three cell lines (the demo's task);
- ``cellbench5``: all five sets (two protocols, three CEL-seq2 plates; five cell lines, two
  of them, A549 and H838, only in the plates);
- ``control``: CEL-seq2 cells split at random into two pseudo-batches (no batch effect);
- ``pseudobulk``: sums over random groups of 10 cells of one line within one set, from all
  five sets (a bulk-sized study of tens of samples).

Singlets that are not flagged as outliers only; ERCC spike-ins dropped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

SETS = {
    "CEL-seq2": "sc_celseq2",
    "Drop-seq": "sc_dropseq",
    "plate1": "sc_celseq2_5cl_p1",
    "plate2": "sc_celseq2_5cl_p2",
    "plate3": "sc_celseq2_5cl_p3",
}
TASKS = ("protocols", "cellbench5", "control", "pseudobulk")


def load_set(shared: Path, batch: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Counts (genes x cells) and sheet of one CellBench set, cells prefixed by the batch."""
    stem = SETS[batch]
    counts = pd.read_csv(shared / "cellbench" / f"{stem}.count.csv.gz", index_col=0)
    meta = pd.read_csv(shared / "cellbench" / f"{stem}.metadata.csv.gz", index_col=0)
    keep = (meta["demuxlet_cls"] == "SNG") & (meta["outliers"].astype(str).str.upper() == "FALSE")
    cells = meta.index[keep].intersection(counts.columns)
    counts = counts[cells]
    counts = counts[~counts.index.str.startswith("ERCC-")]
    ids = [f"{batch}_{c}" for c in cells]
    sheet = pd.DataFrame(
        {"batch": batch, "cell_line": meta.loc[cells, "cell_line_demuxlet"].to_numpy()},
        index=pd.Index(ids, name="sample_id"),
    )
    counts.columns = ids
    return counts, sheet


def combine(parts: list[tuple[pd.DataFrame, pd.DataFrame]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    counts = pd.concat([c for c, _ in parts], axis=1, join="outer").fillna(0).astype(np.int64)
    counts.index.name = "gene_id"
    return counts, pd.concat([s for _, s in parts])


def pseudobulk(
    counts: pd.DataFrame, sheet: pd.DataFrame, group_size: int, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sum random groups of ``group_size`` cells of one line within one batch."""
    rng = np.random.default_rng(seed)
    columns, rows = {}, []
    for (batch, line), cells in sheet.groupby(["batch", "cell_line"]).groups.items():
        cells = rng.permutation(np.asarray(cells))
        for k in range(len(cells) // group_size):
            name = f"{batch}_{line}_pb{k}"
            columns[name] = counts[cells[k * group_size : (k + 1) * group_size]].sum(axis=1)
            rows.append({"sample_id": name, "batch": batch, "cell_line": line})
    bulk = pd.DataFrame(columns)
    bulk.index.name = "gene_id"
    return bulk, pd.DataFrame(rows).set_index("sample_id")


def build(task: str, shared: Path, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    if task == "protocols":
        return combine([load_set(shared, b) for b in ("CEL-seq2", "Drop-seq")])
    if task == "cellbench5":
        return combine([load_set(shared, b) for b in SETS])
    if task == "control":
        counts, sheet = load_set(shared, "CEL-seq2")
        rng = np.random.default_rng(seed)
        sheet["batch"] = np.where(rng.random(len(sheet)) < 0.5, "pseudoA", "pseudoB")
        return counts, sheet
    if task == "pseudobulk":
        counts, sheet = combine([load_set(shared, b) for b in SETS])
        return pseudobulk(counts, sheet, group_size=10, seed=seed)
    raise ValueError(f"unknown task {task!r}; choose from {TASKS}")


def write_task(task: str, shared: Path, out_dir: Path) -> dict:
    """Write ``{task}_counts.tsv.gz`` and ``{task}_samples.tsv``; return a datasets-sheet row."""
    out_dir.mkdir(parents=True, exist_ok=True)
    matrix = out_dir / f"{task}_counts.tsv.gz"
    samples = out_dir / f"{task}_samples.tsv"
    if not (matrix.exists() and samples.exists()):
        counts, sheet = build(task, shared)
        counts = counts[(counts > 0).sum(axis=1) >= 3]
        counts.to_csv(matrix, sep="\t", compression={"method": "gzip", "mtime": 0})
        sheet.to_csv(samples, sep="\t")
    return {
        "name": task,
        "expression": str(matrix.resolve()),
        "samples": str(samples.resolve()),
        "batch_key": "batch",
        "label_key": "cell_line",
        "genes": str(
            Path(__file__).resolve().parents[2] / "resources" / "hs_gene_coordinates.tsv.gz"
        ),
        "gene_id": "ensembl_id",
        "value_type": "counts",
    }
