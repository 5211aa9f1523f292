"""Whether a short run's decoder learned the data, and the run's second try (issue 38).

A run sized in epochs gives a study of 40 samples 40 optimizer steps (one minibatch a
pass); its decoder then returns little more than each batch's mean, and the corrected
matrix ``decode(z, reference)`` loses the biology (the simulated suite's ``n-40`` scored
0.376, below the uncorrected data). More steps for every small run lowered CellBench's
pseudo-bulk, whose decoder had learned its cell lines in 80 (docs/notes/2026-12-05.md).
So the floor applies where it is needed: a run of fewer than ``refit_steps`` steps is
trained again with ``min_steps = refit_steps`` when its decoder reconstructs less than
:data:`REFIT_BELOW` of the structure the data hold above noise (:func:`decoder_fit`).

The share is label-free and noise-aware: the reconstruction's gain over each batch's
mean, over the gain of the within-batch data projected on its principal components that
stand above a column-shuffled null (Horn's parallel analysis). Counts' noise lowers both
alike, so a decoder that has learned the biology scores about 1 (CellBench's pseudo-bulk
0.79-0.81; the suite's 600-sample studies 0.64-1.04) and one that has not about 0 or
below (the suite's 40-sample studies: -3.0 to 0.33; docs/notes/2026-12-06.md). The
threshold is low, a fifth, because CellBench's confounded pseudo-bulk reads 0.26-0.35,
its decoder having learned what the cell-line labels reward, and more steps there lower
the protected variant (0.786 to 0.771); at a fifth it keeps those runs and still trains
again the 40-sample studies whose decoders returned their batch means.

A decoder can also read above a fifth and still have lost what the data hold: the
suite's ``n-40`` at seed 2 reads 0.33 and scores 0.356, below the uncorrected data. Its
corrected matrix explains 0.34 of the structure of the input corrected quickly
(:func:`locusformer.train.fold.fold_capture`), where every CellBench run reads 0.72 or
more, so the loop trains a short run again on either reading: this one, below the fold
check's threshold, or the decoder's.

A longer run can stop early too. On shallow counts a 600-cell run's 400 steps can end
before the decoder learned the biology (the suite's shallow ``middle`` at seeds 0 and 2:
bio 0.55 and 0.54, where seed 1 reaches 0.91), and its corrected matrix then explains
less than :data:`~locusformer.train.fold.FOLD_BELOW` of the quick correction's structure
(0.29-0.57). So a run planned at ``refit_steps`` or more is trained again with
``refit_factor`` times its planned steps on that reading, where that stays within
``max_steps`` (the two 3,000-cell runs that read low, near it already, trained three
times as long: -0.011 and +0.035, at three times the time) and where the input clusters
were found: they say the batches share biology, so the quick correction's structure is the
biology; where none is shared the quick correction removes it with the batch (the
suite's ``confounded-total`` reads 0.004, and three times the steps lowers it from 0.679
to 0.427). Every 600-sample deep suite run with the clusters and every CellBench run
that the check reads read 0.62 or more (three seeds each; docs/notes/2026-12-07.md).
"""

from __future__ import annotations

import numpy as np
import torch

from locusformer.model.network import LocusFormer
from locusformer.train.runtime import evaluating_on_cpu, sampled_rows

#: A short run is trained again when its decoder reconstructs less than this share of
#: the structure above noise: a fifth, set between the suite's 40-sample runs that had
#: learned nothing (-3.05 to 0.02) and the least of CellBench's short runs (0.26, the
#: confounded pseudo-bulk, which more steps lower); the 150-sample studies read
#: 0.27-0.55 (three seeds each, docs/notes/2026-12-06.md).
REFIT_BELOW = 0.2
#: Rows the check reads at most (seeded sample): a short run has few.
FIT_MAX_ROWS = 5000
#: Principal components the structure is sought among at most.
FIT_MAX_COMPONENTS = 50


def batch_centred(x: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``x`` with each batch's mean removed (a new array)."""
    out = x.copy()
    for b in np.unique(codes):
        out[codes == b] -= x[codes == b].mean(axis=0)
    return out


def gain(x: np.ndarray, fitted: np.ndarray, codes: np.ndarray) -> float:
    """1 - SSE(``fitted``) / SSE(each batch's mean), over every sample and locus."""
    return _gain(x - fitted, batch_centred(x, codes))


def _gain(residual: np.ndarray, centred: np.ndarray) -> float:
    """1 - SSE(``residual``) / SSE(``centred``): :func:`gain` from its two residuals."""
    return float(1.0 - (residual**2).sum() / max((centred**2).sum(), 1e-12))


def structure(x: np.ndarray, codes: np.ndarray, seed: int) -> np.ndarray | None:
    """The within-batch data (each batch's mean removed) projected on its principal
    components whose variance exceeds the largest of the same data with every locus
    shuffled on its own (Horn's parallel analysis); None when none does."""
    return _above_noise(batch_centred(x, codes), seed)


def _above_noise(centred: np.ndarray, seed: int) -> np.ndarray | None:
    from sklearn.decomposition import PCA

    k = max(1, min(FIT_MAX_COMPONENTS, *centred.shape) - 1)
    fit = PCA(n_components=k, random_state=seed).fit(centred)
    null = np.random.default_rng([seed, 8]).permuted(centred, axis=0)
    top = PCA(n_components=1, random_state=seed).fit(null).explained_variance_[0]
    keep = int((fit.explained_variance_ > top).sum())
    if keep == 0:
        return None
    return fit.transform(centred)[:, :keep] @ fit.components_[:keep] + fit.mean_


def structure_gain(x: np.ndarray, codes: np.ndarray, seed: int) -> float:
    """:func:`gain` of each batch's mean plus :func:`structure`; 0 when there is none."""
    centred = batch_centred(x, codes)
    projected = _above_noise(centred, seed)
    if projected is None:
        return 0.0
    # x - (x - centred + projected) is centred - projected
    return _gain(centred - projected, centred)


def decoder_fit(net: LocusFormer, X: np.ndarray, codes: np.ndarray, seed: int) -> float | None:
    """Share of the structure above noise that ``net``'s reconstruction of ``X`` (samples x
    loci log-expression, each sample decoded with its own batch) recovers: about 1 when
    the decoder learned it, about 0 or below when it returns each batch's mean. None when
    the data hold no structure above noise (nothing to learn).

    Computed on at most :data:`FIT_MAX_ROWS` rows, in standardized loci, fp32 on the CPU.
    """
    rows = sampled_rows(len(X), FIT_MAX_ROWS, [seed, 9])
    codes = np.asarray(codes)[rows]
    with evaluating_on_cpu(net), torch.inference_mode():
        xs = net.standardize(torch.as_tensor(np.asarray(X[rows], dtype=np.float32)))
        z, _ = net.encode(xs)
        own = net.decode(z, net.condition(torch.as_tensor(codes))).float().numpy()
    x = xs.numpy().astype(np.float64)
    possible = structure_gain(x, codes, seed)
    if possible <= 0:
        return None
    return gain(x, own.astype(np.float64), codes) / possible
