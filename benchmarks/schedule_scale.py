"""LocusFormer alone, at the defaults, on a ``workflow_scale.py`` size: the training schedule's
effect on quality at scale, one code tree against another on the same prepared data.

It trains and corrects on the run's ``ordered.parquet`` with the package of ``TREE/src``
(so an older checkout can be measured on the same data), and scores the corrected matrix
and the latent as the workflow's metrics rule does: against that run's uncorrected result,
on the same stratified subsample (``metrics.max_samples``, seed 0). One JSON line per run
is appended to ``OUT``:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/schedule_scale.py TREE \\
        benchmarks/out/workflow_scale/n10000 SEED benchmarks/out/schedule_scale.jsonl
"""

import json
import sys
import time
from pathlib import Path

tree, work, seed, out = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
sys.path.insert(0, str(Path(tree) / "src"))

import anndata as ad  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from locusformer.infer.correct import correct  # noqa: E402
from locusformer.io.parquet import read_matrix_parquet  # noqa: E402
from locusformer.io.results import make_result  # noqa: E402
from locusformer.scoring import subsample  # noqa: E402
from locusformer.scoring.metrics import score_method  # noqa: E402
from locusformer.train.loop import train_corrector  # noqa: E402

BATCH, LABEL = "batch", "group"
results = work / "results" / "sim"
X = read_matrix_parquet(results / "ordered.parquet", "ordered matrix")
loci = pd.read_parquet(results / "loci.parquet")
samples = pd.read_csv(results / "samples.tsv", sep="\t", index_col=0, dtype=str).loc[X.index]
batches = samples[BATCH].tolist()
values = X.to_numpy(np.float32)
start = time.perf_counter()
model, history = train_corrector(values, batches, loci, seed=seed, progress=False)
train_s = time.perf_counter() - start
corrected, latent = correct(model, values, batches)

obs = samples.astype("category")
uncorrected = ad.read_h5ad(results / "integrated" / "uncorrected.h5ad")
keep = subsample.scoring_subsample(uncorrected.obs, BATCH, LABEL, subsample.DEFAULT_MAX_SAMPLES, 0)
row = {"tree": tree, "size": len(X), "seed": seed, "epochs": len(history), "train_s": train_s}
for method, result in (
    ("locusformer", make_result(
        corrected, method="locusformer", representation="matrix", obs=obs,
        var_names=X.columns, batch_key=BATCH, label_key=LABEL,
    )),
    ("locusformer_latent", make_result(
        None, method="locusformer_latent", representation="embedding", obs=obs,
        embedding=latent, batch_key=BATCH, label_key=LABEL,
    )),
):  # fmt: skip
    value = score_method(result, uncorrected, BATCH, LABEL, seed=0, samples=keep)
    value = value.set_index("metric")["value"]
    row[method] = {k: float(value[k]) for k in ("Batch correction", "Bio conservation", "Total")}
print(json.dumps(row), flush=True)
with open(out, "a") as f:
    f.write(json.dumps(row) + "\n")
