"""The workflow's scores under two scib-metrics versions, metric by metric (issue 15).

scib-metrics 0.6 needs Python >= 3.12; the project runs on 3.11 with 0.5.10. This scores
one finished dataset of a workflow run with ``locusformer metrics`` (the metrics rule's
own command, from this checkout's ``src/``) under each of two interpreters, each with its
scib-metrics installed, and prints every (method, metric) whose value differs, the largest
absolute difference, and each run's wall time.

    # /tmp/sm06: Python 3.12 with scib-metrics 0.6.1 and requirements.lock's pins of the
    # rest the metrics job imports (the install command: docs/notes/2026-12-02.md)
    .venv/bin/python benchmarks/scib_versions.py results/cellbench_demo \
        --batch-key protocol --label-key cell_line --other /tmp/sm06/bin/python

The dataset folder is a workflow output (``results/<dataset>``) with ``integrated/*.h5ad``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def score(python: str, results: Path, batch_key: str, label_key: str, out: Path) -> float:
    """Run the metrics rule's command with ``python``; wall seconds."""
    integrated = sorted((results / "integrated").glob("*.h5ad"))
    args = [python, "-m", "locusformer", "metrics"]
    args += ["--uncorrected", str(results / "integrated" / "uncorrected.h5ad")]
    for h5ad in integrated:
        args += ["--result", f"{h5ad.stem}={h5ad}", "--out", f"{h5ad.stem}={out / h5ad.stem}.tsv"]
    args += ["--batch-key", batch_key, "--label-key", label_key, "--seed", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    subprocess.run(args, check=True, env=env, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def version(python: str) -> str:
    code = "import scib_metrics, sys; print(scib_metrics.__version__, sys.version.split()[0])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a workflow dataset folder, results/<name>")
    parser.add_argument("--batch-key", required=True)
    parser.add_argument("--label-key", required=True)
    parser.add_argument("--other", required=True, help="the second interpreter")
    args = parser.parse_args()
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, python in (("this", sys.executable), ("other", args.other)):
            out = Path(tmp) / name
            out.mkdir()
            wall = score(python, args.results, args.batch_key, args.label_key, out)
            print(f"{name}: scib-metrics {version(python)}: {wall:.1f} s")
            tables[name] = pd.concat(pd.read_csv(t, sep="\t") for t in sorted(out.glob("*.tsv")))
    both = tables["this"].merge(tables["other"], on=["method", "metric"], suffixes=("", "_other"))
    if len(both) != len(tables["this"]) or len(both) != len(tables["other"]):
        sys.exit("the two runs scored different (method, metric) pairs")
    both["diff"] = (both["value"] - both["value_other"]).abs()
    changed = both[(both["diff"] > 0) | (both["status"] != both["status_other"])]
    if len(changed):
        print(changed[["method", "metric", "value", "value_other", "diff"]].to_string(index=False))
    print(f"{len(both)} values compared; largest absolute difference {both['diff'].max():.3g}")


if __name__ == "__main__":
    main()
