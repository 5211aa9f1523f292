"""Whether the input clusters folded the latent, and the run's second try without them
(issue 38).

The level term removes the batch within the input's clusters
(:func:`locusformer.train.alignment.input_levels`) as a share of the latent's total
spread. On shallow counts, where the reconstruction barely resists, the encoder can lower
that share by spreading a few clusters along one or two axes and folding the rest onto
them: the corrected matrix then keeps fewer axes than the biology has, and groups merge
(the suite's ``n-3000`` on a shallow library: 0.662 against 0.829 without the clusters,
seed 0; docs/notes/2026-12-06.md). The latent's own rank does not tell a fold from
learning: a healthy trajectory's corrected matrix is as flat as a folded one.

What a fold cannot hide is the input's structure. The input corrected quickly and without
labels (ComBat, each batch re-centred on its mutual nearest neighbours: the correction the
clusters were found on) holds the biology on its principal axes that stand above a
column-shuffled null (Horn's parallel analysis). A corrected matrix that kept the biology
explains most of those axes' variance with as many of its own; one that folded loses the
later axes (:func:`fold_capture`).
"""

from __future__ import annotations

import numpy as np
import torch

from locusformer.model.network import LocusFormer
from locusformer.pp.combat import combat
from locusformer.train.alignment import mnn_recentred, structured_axes
from locusformer.train.runtime import evaluating_on_cpu, sampled_rows

#: A run whose corrected matrix explains less than this share of the quick correction's
#: structure is trained again without the input clusters. Set between the runs that
#: folded (0.38-0.48: the shallow ``n-3000`` at seeds 0 and 2, a 10,000-sample draw of
#: the scale generator) and those that did not (0.68-0.88: eight deep suite scenarios,
#: the shallow ``n-3000`` at seed 1), seed 0 (docs/notes/2026-12-06.md).
FOLD_BELOW = 0.6
#: Rows the check reads at most (seeded sample).
FOLD_MAX_ROWS = 5000


def _scores(x: np.ndarray, k: int) -> np.ndarray:
    """(n, k) scores of ``x``'s first ``k`` principal axes (centred, as given)."""
    from sklearn.utils.extmath import randomized_svd

    centred = x - x.mean(axis=0)
    u, s, _ = randomized_svd(centred, k, random_state=0)
    return u * s


def capture(corrected: np.ndarray, quick: np.ndarray, seed: int) -> float | None:
    """Share of ``quick``'s structured variance (the scores of its first m principal axes,
    m its :func:`structured_axes`) that ``corrected``'s first m principal axes explain,
    least squares, both samples x loci of the same samples. None when ``quick`` holds no
    structure."""
    m = structured_axes(quick, seed)
    if m == 0:
        return None
    q = _scores(quick, m)
    c = _scores(corrected, min(m, min(corrected.shape) - 1))
    basis = c / np.maximum(np.linalg.norm(c, axis=0), 1e-12)
    residual = q - basis @ (basis.T @ q)
    return float(1.0 - (residual**2).sum() / max((q**2).sum(), 1e-12))


def fold_capture(net: LocusFormer, X: np.ndarray, codes: np.ndarray, seed: int) -> float | None:
    """:func:`capture` of ``net``'s corrected matrix (every sample decoded with all batches
    alike, as ``locusformer correct`` does by default) against the quick correction of
    ``X`` (samples x loci log-expression): about 0.7 or more where the biology's axes were
    kept, below :data:`FOLD_BELOW` where the latent folded. None when the quick correction
    cannot be made (a batch of one sample) or holds no structure.

    Computed on at most :data:`FOLD_MAX_ROWS` rows, fp32 on the CPU.
    """

    rows = sampled_rows(len(X), FOLD_MAX_ROWS, [seed, 10])
    codes = np.asarray(codes)[rows]
    counts = np.bincount(codes)
    if counts[counts > 0].min() < 2:
        return None
    x = np.asarray(X[rows], dtype=np.float32)
    with evaluating_on_cpu(net), torch.inference_mode():
        z, _ = net.encode(net.standardize(torch.from_numpy(x)))
        mean = net.reference_condition(None, len(x), torch.device("cpu"))
        corrected = net.unstandardize(net.decode(z, mean).float()).numpy()
    return capture(corrected, quick_correction(x, codes, seed), seed)


def quick_correction(x: np.ndarray, codes: np.ndarray, seed: int) -> np.ndarray:
    """``x`` (samples x loci) corrected quickly and without labels, as the input clusters'
    search corrects it (:func:`locusformer.train.alignment.quick_matrix`, without its floor):
    ComBat, then each batch re-centred on its mutual nearest neighbours."""
    return mnn_recentred(combat(x, codes), codes, seed)
