"""Where issue 14's per-set misses come from: the reference, or the mapping?

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/mapping_diagnosis.py \\
        benchmarks/out/kbet --heldout CEL-seq2 Drop-seq plate1 plate2 plate3 --seeds 0 1 2

WORK holds ``cellbench5_inner`` prepared by ``variants.py`` or ``mapping.py``. For each
held-out set and seed, as ``mapping.py`` does: LocusFormer (default config) is trained on
the other four sets and the fifth is mapped zero-shot; and LocusFormer is trained on all
five (de novo). The outputs are kept in WORK/mapping_diagnosis, so a rerun only scores;
``--training '{"alignment": "shared"}'`` trains every reference with those settings over the
defaults (kept in WORK/mapping_diagnosis/alignment=shared).
Printed per run:

- ``ref_self``: kNN label transfer inside the reference, each reference cell classified
  by its 15 nearest other reference cells in the latent (``mapping.K``), with the errors
  by true -> predicted line; ``query``: the benchmark's label transfer (accuracy, its
  errors, and ``query_f1``, :func:`mapping.knn_transfer`'s macro-F1). When the query's
  errors repeat the reference's own, the reference's latent already joins those lines and
  no mapping of the query can separate them.
- ``total``: the scIB total of the combined reference + query with KMeans NMI and ARI
  from scib-metrics' single k-means start (``metrics.kmeans_starts: 1``, the workflow's
  earlier scoring), and ``total_km10`` from the best of ten starts (the
  workflow's default since): how much of a gap is the clustering metric's start. With ``--surgery``
  (``mapping.py``'s ``--work``), the scVI surgery latents it kept are scored both ways too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mapping import Bench, K, confusions, knn_transfer, vote, zero_shot


def _totals(bench: Bench, result, seed: int) -> tuple[float, float]:

    from locusformer.scoring.metrics import score_method

    totals = []
    for starts in (1, 10):
        v = score_method(
            result, bench.uncorrected, "batch", "cell_line", seed=seed, kmeans_starts=starts
        )
        totals.append(float(v.set_index("metric").loc["Total", "value"]))
    return totals[0], totals[1]


def _run(
    bench: Bench, heldout: str | None, seed: int, cache: Path, training: dict | None
) -> dict[str, np.ndarray]:
    """Reference + query (or de novo, ``heldout`` None) outputs, trained once and kept."""
    path = cache / f"{heldout or 'denovo'}_{seed}.npz"
    if path.exists():
        return dict(np.load(path))
    corrected, latent = zero_shot(bench, heldout, seed, training)
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, corrected=corrected, latent=latent)
    return {"corrected": corrected, "latent": latent}


def main() -> None:
    import torch
    from sklearn.neighbors import NearestNeighbors

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--heldout", nargs="+", default=["CEL-seq2", "plate2", "plate3"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--surgery", type=Path,
        help="mapping.py's --work: also score its scVI surgery latents (reps/) both ways",
    )  # fmt: skip
    parser.add_argument(
        "--training", type=json.loads, default=None,
        help='training settings over the defaults, as JSON, e.g. \'{"alignment": "shared"}\'',
    )  # fmt: skip
    parser.add_argument("--no-denovo", action="store_true", help="the held-out sets only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bench = Bench("cellbench5_inner", args.work)
    cache = args.work / "mapping_diagnosis"
    if args.training:  # each setting its own outputs: name=value pairs, sorted
        cache = cache / "_".join(f"{k}={v}" for k, v in sorted(args.training.items()))
    rows = []
    for heldout in [*([] if args.no_denovo else [None]), *args.heldout]:
        for seed in args.seeds:
            out = _run(bench, heldout, seed, cache, args.training)
            result = bench.result("locusformer", out["corrected"], None)
            row = {"heldout": heldout or "de novo", "seed": seed}
            row["total"], row["total_km10"] = _totals(bench, result, seed)
            found = [row]
            if heldout is not None:
                query = bench.batches == heldout
                z, labels = out["latent"], bench.labels
                zr, lr = z[~query], labels[~query]
                nn = NearestNeighbors(n_neighbors=K + 1).fit(zr)
                own = vote(lr[nn.kneighbors(zr)[1][:, 1:]])  # itself left out
                mapped = vote(lr[nn.kneighbors(z[query], K)[1]])
                row |= {
                    "ref_self": float((own == lr).mean()),
                    "ref_errors": confusions(lr, own),
                    "query": float((mapped == labels[query]).mean()),
                    "query_errors": confusions(labels[query], mapped),
                    "query_f1": knn_transfer(z, labels, query)["macro_f1"],
                }
                surgery = (
                    args.surgery and args.surgery / "reps" / f"{heldout}_scvi_surgery_{seed}.npy"
                )
                if surgery and surgery.exists():
                    result = bench.result("scvi", None, np.load(surgery))
                    found.append({"heldout": f"{heldout} scVI surgery", "seed": seed})
                    found[-1]["total"], found[-1]["total_km10"] = _totals(bench, result, seed)
            for row in found:
                rows.append(row)
                print("\t".join(str(round(v, 4) if isinstance(v, float) else v)
                                for v in row.values()), flush=True)  # fmt: skip
    table = pd.DataFrame(rows)
    print(table.groupby("heldout", sort=False)[["total", "total_km10"]].agg(["mean", "std"])
          .round(3).to_string())  # fmt: skip


if __name__ == "__main__":
    main()
