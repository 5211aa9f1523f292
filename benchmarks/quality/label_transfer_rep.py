"""Label transfer after zero-shot mapping, read from the latent or from a PCA of the
corrected matrix (issue 14): is the per-set gap to scVI's surgery a matter of
which representation the kNN reads?

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/label_transfer_rep.py \\
        benchmarks/out/kbet plate2 0,1,2

WORK holds ``cellbench5_inner`` prepared by ``variants.py`` or ``mapping.py``. Trains the
reference on the other four sets at each seed, maps the held-out set zero-shot and prints
:func:`mapping.knn_transfer`'s accuracy and macro-F1 on both representations (50 PCs fitted
on the reference's corrected rows).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.decomposition import PCA

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mapping import Bench, knn_transfer, zero_shot


def main() -> None:
    work, heldout = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    bench = Bench("cellbench5_inner", work)
    q = bench.batches == heldout
    r = ~q
    for seed in [int(s) for s in sys.argv[3].split(",")]:
        corrected, latent = zero_shot(bench, heldout, seed)
        pcs = PCA(50, random_state=0).fit(corrected[r]).transform(corrected).astype(np.float32)
        on_latent = knn_transfer(latent, bench.labels, q)
        on_pcs = knn_transfer(pcs, bench.labels, q)
        print(
            heldout, seed,
            "latent", round(on_latent["accuracy"], 4), round(on_latent["macro_f1"], 4),
            "corrected_pca", round(on_pcs["accuracy"], 4), round(on_pcs["macro_f1"], 4),
            flush=True,
        )  # fmt: skip


if __name__ == "__main__":
    main()
