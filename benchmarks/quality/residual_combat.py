"""The decoder's residual added back with the batch taken out of it (issue 38): a probe.

LocusFormer's corrected matrix is ``decode(z, reference)``: what the decoder has not
learned of a sample is lost. On small studies that is most of the biology (the suite's
``n-40`` gets 40 optimizer steps and scores below the uncorrected data). Adding back the
residual ``x - decode(z, own batch)`` keeps it, but also whatever of the batch effect the
decoder did not capture, which lowered the batch score where the decoder had learned
(``n-150``, ``bulk-6-batches``; notes of 2026-12-05). Here the residual is added back after
removing each batch's per-locus location (``residual_mean``) or location and scale
(``residual_combat``, ComBat without covariates) from it. The residual is what the model's
own biology does not explain, so a batch's mean residual is its effect not captured, not
its composition: ComBat with the model's reconstruction as its design.

Each model is trained once at the defaults and corrected four ways; rows scored as the
suite scores them.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/residual_combat.py --out OUT.tsv \\
        --scenarios n-40 n-150 bulk-6-batches bulk-confounded
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/residual_combat.py --out OUT.tsv \\
        --tasks-work benchmarks/out/variants --tasks pseudobulk protocols

One row per (data set, variant, seed) appended to ``--out``: data set, variant, seed,
batch, bio, total, seconds (training).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probes import append_row, each_dataset, probe_parser, score_matrix

VARIANTS = ("default", "residual", "residual_mean", "residual_combat", "residual_structured")


def structured(r: np.ndarray, seed: int, max_components: int = 50) -> tuple[np.ndarray, int]:
    """``r`` projected on its principal components that stand above noise (parallel
    analysis: each one's variance above the largest of ``r`` with every column shuffled
    on its own, which keeps each locus's variance and breaks what loci share), and
    their number."""
    from sklearn.decomposition import PCA

    k = max(1, min(max_components, r.shape[0] - 1, r.shape[1]))
    pca = PCA(n_components=k, svd_solver="full" if max(r.shape) <= 2000 else "randomized",
              random_state=seed).fit(r)  # fmt: skip
    null = np.random.default_rng(seed).permuted(r, axis=0)
    top = PCA(n_components=1, random_state=seed).fit(null).explained_variance_[0]
    keep = int((pca.explained_variance_ > top).sum())
    if keep == 0:
        return np.zeros_like(r), 0
    scores = pca.transform(r)[:, :keep]
    return scores @ pca.components_[:keep] + pca.mean_, keep


def outputs(model, X, codes: np.ndarray) -> dict[str, np.ndarray]:
    """Each variant's corrected matrix (samples x loci, log-expression)."""
    import torch

    from locusformer.infer.correct import reference_code
    from locusformer.pp.combat import combat

    net = model.module.eval()
    X = X.toarray() if hasattr(X, "toarray") else X
    with torch.inference_mode():
        xs = net.standardize(torch.as_tensor(np.asarray(X, dtype=np.float32)))
        z, _ = net.encode(xs)
        ref = net.reference_condition(reference_code(model, "mean"), len(xs), xs.device)
        base = net.decode(z, ref).float()
        residual = (xs - net.decode(z, net.condition(torch.as_tensor(codes))).float()).numpy()
    centred = residual.copy()
    for b in np.unique(codes):
        centred[codes == b] -= residual[codes == b].mean(axis=0)
    kept, n_kept = structured(centred, 0)
    print("structured residual components:", n_kept, flush=True)
    shifted = {
        "default": 0.0,
        "residual": residual,
        "residual_mean": centred,
        "residual_combat": combat(residual, codes),  # into a new array
        "residual_structured": kept,
    }
    return {
        name: net.unstandardize(base + torch.as_tensor(np.asarray(r, dtype=np.float32))).numpy()
        for name, r in shifted.items()
    }


def run(name, adata, loci, keys, seed, out: Path) -> None:
    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import batch_codes
    from locusformer.train.loop import train_corrector

    uncorrected = run_method("uncorrected", adata.copy(), keys[0], 0)
    batches = adata.obs[keys[0]].astype(str).tolist()
    start = time.perf_counter()
    trained, _ = train_corrector(adata.X, batches, loci, None, None, seed=seed, progress=False)
    seconds = round(time.perf_counter() - start, 1)
    for variant, corrected in outputs(trained, adata.X, batch_codes(trained, batches)).items():
        scores = score_matrix(corrected, adata, uncorrected, keys, seed)
        append_row(out, [name, variant, seed, *scores, seconds])


def main() -> None:
    parser = probe_parser(__doc__)
    args = parser.parse_args()
    for name, adata, loci, keys, seed in each_dataset(args):
        run(name, adata, loci, keys, seed, args.out)


if __name__ == "__main__":
    main()
