"""Memory that pyarrow takes for a parquet footer, per column chunk, writing and reading.

Writes ``--groups`` row groups of a samples x 2000 float32 matrix (index ``sample_id``, like
the workflow's intermediates) with each writer option, and reports: the footer's size on
disk (``metadata.serialized_size``), the RSS the open writer gained, and the RSS that
opening the file took. Each option runs in a fresh subprocess. Rows per group do not
matter to the footer (64 are written to keep it quick).

Usage: ``python benchmarks/parquet_footer.py [--groups 150]``
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path

OPTIONS = ("default", "no-statistics", "non-nullable", "no-statistics+non-nullable")


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


def measure(option: str, groups: int, directory: Path, genes: int = 2000, rows: int = 64) -> dict:
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = pd.DataFrame(
        np.random.default_rng(0).normal(size=(rows, genes)).astype(np.float32),
        columns=[f"ENSG{i:011d}" for i in range(genes)],
        index=pd.Index([f"s{i}" for i in range(rows)], name="sample_id"),
    )
    table = pa.Table.from_pandas(frame, preserve_index=True)
    kwargs = {"compression": "zstd"}
    if "no-statistics" in option:
        kwargs["write_statistics"] = False
    if "non-nullable" in option:
        schema = pa.schema([f.with_nullable(False) for f in table.schema])
        table = table.cast(schema.with_metadata(table.schema.metadata))
    path = directory / f"{option}.parquet"
    gc.collect()
    before = rss_mb()
    writer = pq.ParquetWriter(path, table.schema, **kwargs)
    for _ in range(groups):
        writer.write_table(table)
    written = rss_mb() - before
    writer.close()
    del writer
    gc.collect()
    before = rss_mb()
    meta = pq.ParquetFile(path).metadata
    opened = rss_mb() - before
    chunks = groups * (genes + 1)
    return {
        "option": option,
        "row_groups": groups,
        "footer_mb": round(meta.serialized_size / 2**20, 2),
        "writer_mb": round(written, 1),
        "open_mb": round(opened, 1),
        "writer_bytes_per_chunk": round(written * 2**20 / chunks),
        "open_bytes_per_chunk": round(opened * 2**20 / chunks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=150)
    parser.add_argument("--option", choices=OPTIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.option:
        with tempfile.TemporaryDirectory() as directory:
            print(json.dumps(measure(args.option, args.groups, Path(directory))))
        return
    for option in OPTIONS:
        argv = [sys.executable, __file__, "--groups", str(args.groups), "--option", option]
        print(subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
