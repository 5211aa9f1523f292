"""Do two versions of the code train and correct to bitwise the same outputs?

Runs the CLI's ``train`` and ``correct`` at seed 0 on each prepared dataset folder (the
workflow's ``ordered.parquet``, ``loci.parquet`` and ``samples.tsv``), with whatever code
``PYTHONPATH`` puts first, and then compares two such runs: every weight of the state dict,
every value of the corrected matrix and of the latent.

    # a checkout of the earlier commit in a git worktree, then the same command under each
    PYTHONPATH=$OLD/src python benchmarks/bitwise.py run --out $W/old --data DIR ...
    PYTHONPATH=src      python benchmarks/bitwise.py run --out $W/new --data DIR ...
    python benchmarks/bitwise.py compare $W/old $W/new

A dataset folder's batch column is ``--batch-key`` (default ``batch``; the demo's is
``protocol``: give ``DIR:protocol``). One thread per process (``OMP_NUM_THREADS=1``), so
the comparison does not depend on the machine's load. Exit status 1 when anything differs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path


def run(data: list[str], out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for spec in data:
        folder, _, batch_key = spec.partition(":")
        d, o = Path(folder), out / Path(folder).name
        o.mkdir(parents=True, exist_ok=True)
        cli = [sys.executable, "-m", "locusformer"]
        common = ["--matrix", str(d / "ordered.parquet"), "--samples", str(d / "samples.tsv")]
        common += ["--batch-key", batch_key or "batch"]
        subprocess.run(
            [*cli, "train", *common, "--loci", str(d / "loci.parquet"), "--seed", "0",
             "--device", "cpu", "--out-weights", str(o / "model.pt"),
             "--out-config", str(o / "model.json"), "--out-history", str(o / "history.tsv")],
            check=True, env=env,
        )  # fmt: skip
        subprocess.run(
            [*cli, "correct", *common, "--weights", str(o / "model.pt"),
             "--config", str(o / "model.json"), "--device", "cpu",
             "--out-corrected", str(o / "corrected.parquet"),
             "--out-latent", str(o / "latent.parquet"), "--out-h5ad", str(o / "out.h5ad")],
            check=True, env=env,
        )  # fmt: skip
        print(f"{d.name}: done", flush=True)


def compare(a: Path, b: Path) -> bool:
    import pandas as pd
    import torch

    same = True
    for first in sorted(p for p in a.iterdir() if p.is_dir()):
        second = b / first.name
        wa = torch.load(first / "model.pt", map_location="cpu", weights_only=False)
        wb = torch.load(second / "model.pt", map_location="cpu", weights_only=False)
        sa, sb = (w.get("state_dict", w) for w in (wa, wb))
        weights = sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
        frames = [
            pd.read_parquet(first / f).equals(pd.read_parquet(second / f))
            for f in ("corrected.parquet", "latent.parquet")
        ]
        ok = weights and all(frames)
        same &= ok
        print(f"{first.name}: weights {weights}, corrected {frames[0]}, latent {frames[1]}")
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("run")
    p.add_argument("--data", nargs="+", required=True, help="DIR or DIR:BATCH_KEY")
    p.add_argument("--out", type=Path, required=True)
    p = commands.add_parser("compare")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.data, args.out)
    else:
        sys.exit(0 if compare(args.a, args.b) else 1)


if __name__ == "__main__":
    main()
