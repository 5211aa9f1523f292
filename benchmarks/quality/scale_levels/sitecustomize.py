"""Above 20,000 samples, every row in the cluster k-means gives it: a probe (issues 38, 42).

``train.alignment.input_levels`` finds the input's clusters on 20,000 sampled rows and
gives every other row the cluster of its nearest sampled row of its own batch, in the
uncorrected data's PCA. Where the clusters cut a group in two, that neighbour follows
the noise across the cut: on the 100k scale data it disagreed with the clusters' own
assignment for 10 to 16% of the rows of the two groups cut. With ``LF_FILL=predict`` in
the environment, this hook replaces the fill: the quick correction
(``train.alignment.quick_scores``: the matrix and its PCA) of all rows, k-means fitted
on the same sampled rows and every row given its nearest centre. Put this folder first
on ``PYTHONPATH`` and run the workflow (its rules keep a ``PYTHONPATH`` that is set):

    cd RUN && LF_FILL=predict PYTHONPATH=$REPO/benchmarks/quality/scale_levels:$REPO/src \\
        snakemake --snakefile $REPO/workflow/Snakefile --directory RUN --cores 2 \\
        results/summary.tsv

It holds every row's corrected values in memory (about 3 GB at 100k samples, far more at
1M): a probe for the 100k data, not for the product.

With ``LF_QUICK=harmony`` the quick correction's principal-component scores go through
Harmony (harmonypy, theta 2, one cluster per 30 samples, 8 to 50) before k-means: its
clusters with a diversity penalty take out the batch's residual within each group,
which k-means otherwise cuts along.

With ``LF_LEVEL`` the level term (``model.losses.level_batch_share``, the term the input
clusters feed) takes another form, for the probes of docs/notes/2026-12-06.md:

- ``fade``: its weight as configured until the ramp-up ends, then times ``LF_FADE``
  (0.1);
- ``whiten``: the batch's between-cell scatter within levels in the latent whitened by
  the minibatch's covariance (ridge ``LF_RIDGE``, 0.1, of its mean eigenvalue), over
  the latent's width;
- ``anova``: the between-batch sum of squares within levels less the share within-cell
  noise puts there (``(C_l - 1)`` times the pooled within-cell variance, a one-way
  ANOVA's expectation), over the total sum of squares;
- ``detached``: the term as it ships with its denominator, the total sum of squares,
  held constant in the gradient, so that moving the levels apart does not lower it;
- ``per_axis``: the batch's share of each latent axis's sum of squares, averaged over
  the axes: scale-free per axis, so that spreading the levels along one axis lowers that
  axis's share only and folding the others in gains nothing;
- ``rank_guard``: the term as it ships, times the square of the minibatch latent's
  participation ratio over the highest seen in the process (one training a process):
  the term weakens as the latent folds; with ``LF_RANK_FLOOR`` (a share, 0 off) only
  once the ratio falls below that share of its best;
- ``mincell``: only (level, batch) cells of ``LF_MIN_CELL`` (3) samples or more in the
  minibatch, each level's mean over those cells.
"""

import os

if os.environ.get("LF_FILL") == "predict":
    import numpy as np

    from locusformer.train import alignment, loop

    def _predicted_levels(
        X, codes, n_clusters, seed, *, max_samples=alignment.INPUT_MAX_SAMPLES, **kwargs
    ):
        from sklearn.cluster import KMeans

        codes = np.asarray(codes)
        n = len(codes)
        if n <= max_samples:
            return alignment.input_clusters(X, codes, n_clusters, seed, **kwargs)
        kwargs.pop("softness", None)  # hard levels only
        rows = alignment._input_rows(codes, max_samples, seed)
        quick = alignment.quick_scores(np.asarray(X, dtype=np.float32), codes, seed)
        if quick is None:
            return None
        if kwargs.get("from_structure"):
            n_clusters = alignment.cluster_count(quick.matrix[rows], n_clusters, seed)
        kmeans = KMeans(n_clusters, n_init=10, random_state=seed).fit(quick.scores[rows])
        return alignment.InputClusters(kmeans.predict(quick.scores).astype(np.int64), None)

    loop.input_clusters = _predicted_levels


if os.environ.get("LF_QUICK") == "harmony":
    import logging

    import numpy as np
    import pandas as pd

    from locusformer.train import alignment

    _quick = alignment.quick_scores

    def _harmonized(x, codes, seed):
        import harmonypy

        quick = _quick(x, codes, seed)
        if quick is None:
            return None
        scores = quick.scores
        logging.getLogger("harmonypy").setLevel(logging.WARNING)
        n = len(codes)
        meta = pd.DataFrame({"b": pd.Categorical(np.asarray(codes))})
        ho = harmonypy.run_harmony(
            scores.astype(np.float64),
            meta,
            ["b"],
            theta=2.0,
            nclust=int(min(50, max(8, n // 30), n - 1)),
            random_state=seed,
            verbose=False,
        )
        z = np.asarray(ho.Z_corr)
        return quick._replace(scores=(z.T if z.shape[0] != n else z).astype(np.float32))

    alignment.quick_scores = _harmonized


def _level_fade() -> None:
    from locusformer.train import loop

    shipped = loop.loss_weights
    fade = float(os.environ.get("LF_FADE", "0.1"))

    def faded(tc, ramp):
        weights = shipped(tc, ramp)
        factor = fade if ramp >= 1.0 else 1.0  # LossWeights is a NamedTuple
        return weights._replace(level_mean=weights.level_mean * factor)

    loop.loss_weights = faded


def _cells(z, batch, levels, n_batches):
    """The float latent, its (level, batch) and level means, and (B,) 1.0 for the samples
    of levels two or more batches hold: what every form below starts from."""
    from locusformer.model.losses import level_means

    z = z.float()
    m = level_means(z, batch, levels, n_batches)
    return z, m, (m.batches_held >= 2).float()[levels]


def _level_whiten(z, batch, levels, n_batches):
    import torch

    z, m, kept = _cells(z, batch, levels, n_batches)
    diff = (m.cell - m.level) * kept[:, None]  # (B, Z)
    centred = z - z.mean(dim=0)
    n, width = z.shape
    cov = centred.T @ centred / n
    ridge = float(os.environ.get("LF_RIDGE", "0.1")) * torch.trace(cov).clamp_min(1e-8) / width
    cov = cov + ridge * torch.eye(width, device=z.device)
    return torch.trace(torch.linalg.solve(cov, diff.T @ diff / n)) / width


def _level_anova(z, batch, levels, n_batches):
    z, m, kept = _cells(z, batch, levels, n_batches)
    kept_level = m.batches_held >= 2  # (M,)
    between = (kept * (m.cell - m.level).pow(2).sum(-1)).sum()
    within = (kept * (z - m.cell).pow(2).sum(-1)).sum()
    dof_within = ((m.level_size - m.batches_held) * kept_level).sum()
    dof_between = ((m.batches_held - 1) * kept_level).sum()
    total = (z - z.mean(dim=0)).pow(2).sum()
    if dof_within <= 0:
        return between * 0.0
    excess = (between - dof_between * within / dof_within).clamp_min(0.0)
    return excess / total.clamp_min(1e-8)


def _level_mincell(z, batch, levels, n_batches):
    import torch
    import torch.nn.functional as F

    z, m, _ = _cells(z, batch, levels, n_batches)
    n_levels = int(levels.max()) + 1
    cell = levels * n_batches + batch
    big = torch.bincount(cell, minlength=n_levels * n_batches) >= int(
        os.environ.get("LF_MIN_CELL", "3")
    )
    held = big.reshape(n_levels, n_batches).sum(dim=1)  # (M,)
    kept = (big[cell] & (held[levels] >= 2)).float()[:, None]  # (B, 1)
    onehot = F.one_hot(levels, n_levels).float()  # (B, M)
    level_mean = (onehot.T @ (kept * z)) / (onehot.T @ kept).clamp_min(1.0)  # (M, Z)
    between = (kept[:, 0] * (m.cell - level_mean[levels]).pow(2).sum(-1)).sum()
    return between / (z - z.mean(dim=0)).pow(2).sum().clamp_min(1e-8)


def _level_detached(z, batch, levels, n_batches):
    z, m, kept = _cells(z, batch, levels, n_batches)
    between = (kept * (m.cell - m.level).pow(2).sum(-1)).sum()
    total = (z - z.mean(dim=0)).pow(2).sum().detach()
    return between / total.clamp_min(1e-8)


def _level_per_axis(z, batch, levels, n_batches):
    z, m, kept = _cells(z, batch, levels, n_batches)
    between = (kept[:, None] * (m.cell - m.level).pow(2)).sum(dim=0)  # (Z,)
    total = (z - z.mean(dim=0)).pow(2).sum(dim=0)  # (Z,)
    return (between / total.clamp_min(1e-8)).mean()


_RANK = {"best": 0.0}


def _level_rank_guard(z, batch, levels, n_batches):
    import torch

    from locusformer.model.losses import level_batch_share

    share = level_batch_share(z, batch, levels, n_batches)
    with torch.no_grad():
        centred = z.float() - z.float().mean(dim=0)
        eig = torch.linalg.eigvalsh(centred.T @ centred).clamp_min(0.0)
        rank = float(eig.sum() ** 2 / (eig.pow(2).sum()).clamp_min(1e-12))
    _RANK["best"] = max(_RANK["best"], rank)
    # LF_RANK_FLOOR (0: off): the term is whole while the ratio stays above this share
    # of its best, and falls with the square of the shortfall below it.
    floor = float(os.environ.get("LF_RANK_FLOOR", "0")) * _RANK["best"]
    if floor > 0:
        return share * min(1.0, rank / floor) ** 2
    return share * (rank / _RANK["best"]) ** 2


_FORMS = {
    "rank_guard": _level_rank_guard,
    "per_axis": _level_per_axis,
    "detached": _level_detached,
    "whiten": _level_whiten,
    "anova": _level_anova,
    "mincell": _level_mincell,
}
if os.environ.get("LF_LEVEL") == "fade":
    _level_fade()
elif os.environ.get("LF_LEVEL") in _FORMS:
    from locusformer.model import network

    network.level_batch_share = _FORMS[os.environ["LF_LEVEL"]]
