"""Write and read time and size of one matrix row group under parquet encoding options.

The workflow's matrices are float32 samples x genes tables written row group by row group
(``locusformer.io.parquet.matrix_parquet_writer``). This times one row group of the size it writes
(``parquet.ROW_GROUP_BYTES``: 16,777 rows of 2000 genes) for three kinds of simulated values:
dense (model outputs such as the corrected matrix) and log-normalized counts at about 70%
and 96% zeros (the normalized and ordered matrices), then the first row group of each
``--matrix`` file (the workflow's own matrices of real data), with arrow's default
dictionary settings, without dictionaries, with a small dictionary page limit, with
BYTE_STREAM_SPLIT, the two per-gene choices (dictionary or not where sparse), and with what
the workflow chooses gene by gene (choice made before the timer):

    .venv/bin/python benchmarks/parquet_encoding.py [--repeats 3] [--out DIR] \\
        [--matrix results/DATASET/ordered.parquet ...]

Medians over the repeats, options interleaved so that a noisy machine hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from locusformer.io.parquet import ROW_GROUP_BYTES, _column_encoding

#: The dictionary page limit the workflow used before it dropped dictionaries.
DICTIONARY_PAGE_BYTES = 1 << 13

N_GENES = 2000
#: Writer options for each encoding, from the values (rows x genes) and their gene columns.
OPTIONS = {
    "arrow default (dictionary up to 1 MiB)": lambda values, genes: {},
    "no dictionary": lambda values, genes: {"use_dictionary": False},
    f"dictionary up to {DICTIONARY_PAGE_BYTES // 1024} KiB": lambda values, genes: {
        "dictionary_pagesize_limit": DICTIONARY_PAGE_BYTES
    },
    "byte stream split": lambda values, genes: {
        "use_dictionary": False,
        "column_encoding": dict.fromkeys(genes, "BYTE_STREAM_SPLIT"),
    },
    "no dictionary; byte stream split where dense": lambda values, genes: {
        "use_dictionary": False,
        "column_encoding": dict.fromkeys(genes[~_sparse(values)], "BYTE_STREAM_SPLIT"),
    },
    "dictionary up to 8 KiB where sparse; byte stream split where dense": (
        lambda values, genes: {
            "use_dictionary": genes[_sparse(values)].tolist(),
            "dictionary_pagesize_limit": DICTIONARY_PAGE_BYTES,
            "column_encoding": dict.fromkeys(genes[~_sparse(values)], "BYTE_STREAM_SPLIT"),
        }
    ),
    # What matrix_parquet_writer chooses, gene by gene, from the first row group.
    "workflow (per gene)": lambda values, genes: _column_encoding(values.T, genes),
}


def _sparse(values: np.ndarray) -> np.ndarray:
    """(genes,) whether each column (of rows x genes) is at least half zeros."""
    return (values == 0).mean(axis=0) >= 0.5


def _log_counts(rng: np.random.Generator, shape: tuple[int, int], size: float, p: float):
    counts = rng.negative_binomial(size, p, size=shape).astype(np.float32)
    library = counts.sum(axis=1, keepdims=True) + 1
    return np.log1p(counts / library * 1e4).astype(np.float32)


def matrices(n_rows: int, seed: int = 0, files: list[Path] = ()) -> dict[str, np.ndarray]:
    """Simulated row groups, then the first row group of each matrix file (a workflow
    matrix: normalized, ordered, counts or corrected)."""
    rng = np.random.default_rng(seed)
    shape = (n_rows, N_GENES)
    out = {
        "dense": rng.normal(size=shape).astype(np.float32),
        "log counts, 70% zeros": _log_counts(rng, shape, 1.0, 0.7),
        "log counts, 96% zeros": _log_counts(rng, shape, 0.2, 0.8),
    }
    for path in files:
        group = pq.ParquetFile(path).read_row_group(0)
        genes = [c for c in group.column_names if c != "sample_id"]
        values = np.stack([group.column(g).to_numpy() for g in genes], axis=1)
        zeros = (values == 0).mean()
        out[f"{path.parent.name}/{path.name} ({len(values)} rows, {zeros:.0%} zeros)"] = values
    return out


def as_table(values: np.ndarray) -> pa.Table:
    frame = pd.DataFrame(values, columns=[f"g{i}" for i in range(values.shape[1])], copy=False)
    frame.index = pd.Index([f"s{i}" for i in range(len(frame))], name="sample_id")
    return pa.Table.from_pandas(frame, preserve_index=True)


def time_once(table: pa.Table, path: Path, options: dict) -> tuple[float, float, float]:
    start = time.perf_counter()
    with pq.ParquetWriter(path, table.schema, compression="zstd", **options) as writer:
        writer.write_table(table, row_group_size=table.num_rows)
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    pq.ParquetFile(path).read_row_group(0)
    read_s = time.perf_counter() - start
    return write_s, read_s, path.stat().st_size / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument(
        "--matrix", type=Path, nargs="*", default=[], help="also the first row group of these"
    )
    args = parser.parse_args()
    n_rows = ROW_GROUP_BYTES // (4 * N_GENES)
    print(f"one row group: {n_rows} rows x {N_GENES} genes, float32, zstd\n")
    print("| values | encoding | write s | read s | MiB |")
    print("| --- | --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(dir=args.out) as scratch:
        path = Path(scratch) / "group.parquet"
        for kind, values in matrices(n_rows, files=args.matrix).items():
            table = as_table(values)
            times = {name: [] for name in OPTIONS}
            genes = pd.Index(table.column_names[:-1])  # the index column comes last
            chosen = {name: options(values, genes) for name, options in OPTIONS.items()}
            for _ in range(args.repeats):
                for name, options in chosen.items():
                    times[name].append(time_once(table, path, options))
            for name, runs in times.items():
                write_s, read_s, size = (statistics.median(r[i] for r in runs) for i in range(3))
                print(f"| {kind} | {name} | {write_s:.2f} | {read_s:.2f} | {size:.1f} |")


if __name__ == "__main__":
    main()
