"""When has the decoder not learned the data? A label-free check, and the quick correction
as what a corrector could return instead (issue 38): a probe.

On the suite's small studies (``n-40``, ``bulk-6-batches``, ``bulk-confounded``) the
corrected matrix ``decode(z, reference)`` scores below ComBat and often below the
uncorrected data: 40 optimizer steps leave the decoder short of the biology, and every
way of giving it more steps so far lowered CellBench's pseudo-bulk (notes of
2026-12-05). The quick correction that training already computes for its input clusters
(ComBat, each batch then re-centred on its mutual nearest neighbours:
:func:`locusformer.train.alignment.mnn_recentred`) needs no training. This probe trains
once at the defaults and prints, per data set, label-free diagnostics that could tell the
two cases apart, and scores both matrices:

- ``gain``: the reconstruction ``decode(z, own batch)``'s share of the variance that each
  batch's own mean leaves (standardized loci, every sample): near 0 where the decoder
  returns little more than the batch's mean;
- ``relative``: ``gain`` over the same share for the within-batch-centred data projected
  on its principal components above noise: what
  :func:`locusformer.train.refit.decoder_fit` returns, which ``training.refit_steps``
  acts on (its numbers in the notes of 2026-12-06 are from this probe's first version,
  at ``f45e959``, in float32 and with another shuffle);
- ``kept``: the mean share of each sample's 15 nearest neighbours in the quickly
  corrected input that are among its 15 nearest in the corrected matrix (50 PCs);
- ``ratio``: :func:`~locusformer.train.alignment.structure_ratio` of the quick correction;
- ``aligned``: the squared cosine between the within-batch reconstruction and the
  structure above noise, blind to scale: a decoder that returns the structure shrunk
  (smoother than the data) scores as one that returns it whole.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/small_fallback.py --out OUT.tsv \\
        --scenarios n-40 n-150 bulk-6-batches bulk-confounded --tasks pseudobulk

One row per (data set, seed) appended to ``--out``: data set, seed, samples, gain,
relative, kept, ratio, aligned, then batch, bio and total of the default matrix and of
the quick correction.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probes import append_row, each_dataset, probe_parser, score_matrix

NEIGHBOURS = 15


def neighbours_kept(a: np.ndarray, b: np.ndarray, seed: int) -> float:
    """Mean share of each row's nearest neighbours in ``a`` that are also nearest in ``b``."""
    from sklearn.neighbors import NearestNeighbors

    from locusformer.pp.pca import pca

    k = min(NEIGHBOURS, len(a) - 1)
    found = []
    for m in (a, b):
        scores = pca(np.asarray(m, dtype=np.float32), min(50, *m.shape) - 1, seed)
        found.append(NearestNeighbors(n_neighbors=k + 1).fit(scores).kneighbors(scores)[1][:, 1:])
    return float(np.mean([len(set(p) & set(q)) / k for p, q in zip(*found, strict=True)]))


def cosine_squared(a: np.ndarray, b: np.ndarray) -> float:
    """Squared cosine of the angle between two matrices read as vectors: 1 when one is
    the other scaled, whatever the scale."""
    return float((a * b).sum() ** 2 / max((a * a).sum() * (b * b).sum(), 1e-24))


def matrices(model, X, codes: np.ndarray, seed: int) -> tuple[dict[str, np.ndarray], list]:
    """The default corrected matrix and the quick correction (log-expression), and the
    diagnostics [gain, relative, kept, ratio, aligned]."""
    import torch

    from locusformer.infer.correct import reference_code
    from locusformer.pp.combat import combat
    from locusformer.train.alignment import mnn_recentred, structure_ratio
    from locusformer.train.refit import batch_centred, gain, structure, structure_gain

    net = model.module.eval()
    x = np.asarray(X.toarray() if hasattr(X, "toarray") else X, dtype=np.float32)
    with torch.inference_mode():
        xs = net.standardize(torch.as_tensor(x))
        z, _ = net.encode(xs)
        ref = net.reference_condition(reference_code(model, "mean"), len(xs), xs.device)
        default = net.unstandardize(net.decode(z, ref).float()).numpy()
        own = net.decode(z, net.condition(torch.as_tensor(codes))).float().numpy()
    quick = combat(x, codes)
    ratio = structure_ratio(quick, seed)
    quick = mnn_recentred(quick, codes, seed)
    x64 = xs.numpy().astype(np.float64)
    share = gain(x64, own.astype(np.float64), codes)
    relative = share / max(structure_gain(x64, codes, seed), 1e-12)
    kept = neighbours_kept(quick, default, seed)
    projected, learned = structure(x64, codes, seed), batch_centred(own.astype(np.float64), codes)
    aligned = 0.0 if projected is None else cosine_squared(learned, projected)
    diagnostics = [round(v, 4) for v in (share, relative, kept, ratio, aligned)]
    return {"default": default, "quick": quick}, diagnostics


def run(name, adata, loci, keys, seed, out: Path) -> None:
    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import batch_codes
    from locusformer.train.loop import train_corrector

    uncorrected = run_method("uncorrected", adata.copy(), keys[0], 0)
    batches = adata.obs[keys[0]].astype(str).tolist()
    trained, _ = train_corrector(adata.X, batches, loci, None, None, seed=seed, progress=False)
    found, diagnostics = matrices(trained, adata.X, batch_codes(trained, batches), seed)
    scores = [s for m in found.values() for s in score_matrix(m, adata, uncorrected, keys, seed)]
    append_row(out, [name, seed, adata.n_obs, *diagnostics, *(round(s, 4) for s in scores)])


def main() -> None:
    args = probe_parser(__doc__).parse_args()
    for name, adata, loci, keys, seed in each_dataset(args):
        run(name, adata, loci, keys, seed, args.out)


if __name__ == "__main__":
    main()
