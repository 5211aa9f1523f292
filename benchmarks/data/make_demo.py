"""Build the bundled demo (resources/demo/) from the CellBench files in ../shared/data.

Keeps singlet, non-outlier cells of the CEL-seq2 and Drop-seq 3-cell-line sets, and the
genes detected in at least 3 of those cells (ERCC spike-ins removed). Writes a compact
genes x cells TSV.gz of raw UMI counts (gzip text beats a sparse h5ad here: half the
entries are non-zero) and a sample sheet.

    .venv/bin/python benchmarks/data/make_demo.py [--shared ../shared/data]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

MIN_CELLS = 10  # rarer genes cannot rank among the 2000 most variable
SETS = {"CEL-seq2": "sc_celseq2", "Drop-seq": "sc_dropseq"}


def load(shared: Path, stem: str, protocol: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    counts = pd.read_csv(shared / "cellbench" / f"{stem}.count.csv.gz", index_col=0)
    meta = pd.read_csv(shared / "cellbench" / f"{stem}.metadata.csv.gz", index_col=0)
    keep = (meta["demuxlet_cls"] == "SNG") & (meta["outliers"].astype(str).str.upper() == "FALSE")
    meta = meta[keep]
    prefix = "celseq2_" if protocol == "CEL-seq2" else "dropseq_"
    cells = meta.index.intersection(counts.columns)
    counts = counts[cells]
    sheet = pd.DataFrame(
        {"protocol": protocol, "cell_line": meta.loc[cells, "cell_line_demuxlet"].to_numpy()},
        index=prefix + cells.astype(str),
    )
    counts.columns = sheet.index
    return counts, sheet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shared", default="../shared/data", type=Path)
    parser.add_argument("--out", default="resources/demo", type=Path)
    args = parser.parse_args()
    parts = [load(args.shared, stem, protocol) for protocol, stem in SETS.items()]
    counts = pd.concat([c for c, _ in parts], axis=1, join="outer").fillna(0)
    counts = counts[~counts.index.str.startswith("ERCC-")]
    sheet = pd.concat([s for _, s in parts])
    detected = (counts > 0).sum(axis=1) >= MIN_CELLS
    counts = counts[detected]
    counts = counts.astype(np.int32)
    counts.index.name = "gene_id"
    args.out.mkdir(parents=True, exist_ok=True)
    counts.to_csv(
        args.out / "cellbench_counts.tsv.gz",
        sep="\t",
        compression={"method": "gzip", "compresslevel": 9, "mtime": 0},
    )
    sheet.index.name = "sample_id"
    sheet.to_csv(args.out / "cellbench_samples.tsv", sep="\t")
    print(
        f"{counts.shape[1]} cells x {counts.shape[0]} genes, {(counts > 0).sum().sum()} non-zeros"
    )
    print(sheet.groupby(["protocol", "cell_line"]).size().to_string())


if __name__ == "__main__":
    main()
