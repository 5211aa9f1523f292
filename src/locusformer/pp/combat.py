"""ComBat (parametric, empirical Bayes) streamed over blocks of genes.

:func:`scanpy.pp.combat` holds the whole matrix in float64, several times over (the data,
the standardized data, the adjusted data, pandas copies), which at atlas scale (1M samples
x 2,000 loci) is many times 16 GB. Yet ComBat's estimates are per gene: the design
regression, the pooled variance, the standardized batch means and variances, and the
adjustment. Only the empirical-Bayes hyper-priors look across genes, and they are moments
of small per-gene summaries. So the same numbers come out of two passes over column blocks:

1. :func:`gene_summaries`: per gene, the regression on the design (batch indicators, then
   the covariates), the pooled variance and, per batch, the mean and the centred sum of
   squares of the standardized data; also which genes are constant within some batch;
2. :func:`eb_estimates`: the hyper-priors (``gamma_bar``, ``t2``, ``a_prior``,
   ``b_prior``) and scanpy's ``_it_sol`` iteration, both from those summaries alone;
3. :func:`adjust`: the adjusted data, block by block, written into a float32 array.

Extra memory is a few ``n_samples x block_size`` float64 arrays plus ``O(n_samples x
n_terms + n_batches x n_genes)``. The formulas are scanpy's (``_standardize_data``,
``combat``, ``_it_sol``, ``_aprior``, ``_bprior`` in ``scanpy/preprocessing/_combat.py``);
they are rearranged, not changed, and the output equals scanpy's to float32 rounding
(``tests/test_combat_stream.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

#: scanpy's ``_it_sol`` convergence criterion (largest relative change of gamma and delta)
CONV = 1e-4
#: a bound scanpy does not have; its loop would spin forever on a pathological input
MAX_ITER = 100_000


class ColumnBlocks(Protocol):
    """A 2-D matrix that gives ``x[:, a:b]`` as an array: an ndarray, a memmap, an h5py or
    zarr dataset."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray: ...


class NonFiniteError(ValueError):
    """The input matrix holds NaN or infinite values."""


@dataclass
class _Rows:
    """The samples sorted by batch, so that each batch is a contiguous slice of a block."""

    order: np.ndarray  # (n,) original row of each sorted row
    identity: bool  # rows already sorted by batch: read and write without fancy indexing
    starts: np.ndarray  # (k,) first sorted row of each batch
    sizes: np.ndarray  # (k,) samples per batch

    def slices(self) -> list[slice]:
        return [slice(int(s), int(s + m)) for s, m in zip(self.starts, self.sizes, strict=True)]


@dataclass
class GeneSummaries:
    """What pass 1 keeps per gene: small (``n_terms x n_genes`` and ``n_batches x n_genes``)."""

    rows: _Rows
    design: np.ndarray  # (n, p) batch indicators then covariates, rows sorted by batch
    beta: np.ndarray  # (p, G) scanpy's b_hat: regression of each gene on the design
    grand_mean: np.ndarray  # (G,) batch coefficients weighted by batch size
    var_pooled: np.ndarray  # (G,) mean squared residual
    gamma_hat: np.ndarray  # (k, G) per-batch mean of the standardized data
    ss: np.ndarray  # (k, G) per-batch sum of squares of standardized data about gamma_hat
    constant: np.ndarray  # (G,) bool: constant within at least one batch (left unadjusted)

    @property
    def delta_hat(self) -> np.ndarray:
        """(k, G) per-batch variance (ddof=1, as pandas' ``var``) of the standardized data."""
        return self.ss / (self.rows.sizes[:, None] - 1)


def _rows(batches: np.ndarray) -> tuple[_Rows, np.ndarray]:
    """Sort the samples by batch; return the layout and the batch codes 0..k-1 (sorted)."""
    batches = np.asarray(batches)
    if batches.ndim != 1:
        raise ValueError(f"batches must be 1-D, got shape {batches.shape}")
    # observed levels only, in sorted order: scanpy's groupby(observed=True)
    _, codes = np.unique(batches, return_inverse=True)
    order = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes)
    if (sizes < 2).any():
        # delta_hat is a variance with ddof=1: a batch of one sample has none
        raise ValueError("ComBat needs at least 2 samples in every batch")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    identity = bool((order == np.arange(len(order))).all())
    return _Rows(order=order, identity=identity, starts=starts, sizes=sizes), codes[order]


def _read(x: ColumnBlocks, rows: _Rows, a: int, b: int) -> np.ndarray:
    """Columns ``a:b`` as a fresh float64 array, rows sorted by batch: (n, b - a)."""
    block = x[:, a:b]
    if rows.identity:
        # np.array copies, so the in-place arithmetic below never touches the input
        return np.array(block, dtype=np.float64)
    # the fancy index copies already (in the input's dtype); asarray then only casts
    return np.asarray(np.asarray(block)[rows.order], dtype=np.float64)


def _check_block_size(block_size: int) -> int:
    if int(block_size) < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    return int(block_size)


def _design(rows: _Rows, codes: np.ndarray, covariates: np.ndarray | None) -> np.ndarray:
    """(n, p) design in ``rows``' order: the batch indicators, then the covariates."""
    n = len(codes)
    onehot = np.eye(len(rows.sizes))[codes]  # (n, k)
    covariates = np.empty((n, 0)) if covariates is None else np.asarray(covariates, np.float64)
    if covariates.ndim == 1:
        covariates = covariates[:, None]
    if covariates.shape[0] != n:
        raise ValueError(f"covariates have {covariates.shape[0]} rows for {n} samples")
    if not rows.identity:
        covariates = covariates[rows.order]
    return np.column_stack([onehot, covariates])


def gene_summaries(
    x: ColumnBlocks,
    batches: np.ndarray,
    covariates: np.ndarray | None = None,
    *,
    block_size: int = 256,
) -> GeneSummaries:
    """Pass 1: per-gene regression and standardized batch moments, block by block.

    Parameters
    ----------
    x
        (n_samples, n_genes) matrix, any float dtype and memory order; read ``block_size``
        columns at a time.
    batches
        (n_samples,) batch labels (any sortable values; observed levels, sorted, as scanpy).
    covariates
        (n_samples, q) numeric design columns added after the batch indicators, as scanpy
        adds numerical covariates (``None`` or ``q = 0``: batch only). They must not be
        collinear with the batch indicators (the caller checks; scanpy inverts anyway).
    block_size
        Genes per block; extra memory is a few ``n_samples x block_size`` float64 arrays.

    Returns
    -------
    GeneSummaries
        Everything the later steps need; no ``n_samples x n_genes`` array.

    Raises
    ------
    NonFiniteError
        When ``x`` holds NaN or infinite values.
    """
    block_size = _check_block_size(block_size)
    n, n_genes = int(x.shape[0]), int(x.shape[1])
    rows, codes = _rows(batches)
    if len(codes) != n:
        raise ValueError(f"{len(codes)} batch labels for {n} samples")
    k = len(rows.sizes)
    design = _design(rows, codes, covariates)  # (n, p)
    # scanpy: b_hat = inv(D'D) D' data'; the (p, n) projector is formed once, not per block
    proj = np.linalg.inv(design.T @ design) @ design.T  # (p, n)
    weights = rows.sizes / n  # (k,) scanpy's n_batches / n_array

    p = design.shape[1]
    beta = np.empty((p, n_genes))
    var_pooled = np.empty(n_genes)
    gamma_hat = np.empty((k, n_genes))
    ss = np.empty((k, n_genes))
    constant = np.empty(n_genes, dtype=bool)
    slices = rows.slices()
    for a in range(0, n_genes, block_size):
        b = min(a + block_size, n_genes)
        xb = _read(x, rows, a, b)  # (n, w)
        if not np.isfinite(xb).all():
            raise NonFiniteError("the matrix contains non-finite values")
        # constant within a batch: max == min there (exact, unlike a variance of 0)
        top = np.maximum.reduceat(xb, rows.starts, axis=0)  # (k, w)
        bottom = np.minimum.reduceat(xb, rows.starts, axis=0)
        constant[a:b] = (top == bottom).any(axis=0)

        coef = proj @ xb  # (p, w)
        beta[:, a:b] = coef
        resid = xb
        resid -= design @ coef  # (n, w) in place: xb is a private copy
        var_pooled[a:b] = np.einsum("ij,ij->j", resid, resid) / n
        # per-batch mean of the residuals (0 up to rounding: batch indicators are in the
        # design), kept so that gamma_hat is the exact batch mean scanpy takes
        rmean = np.add.reduceat(resid, rows.starts, axis=0) / rows.sizes[:, None]  # (k, w)
        for j, sl in enumerate(slices):
            resid[sl] -= rmean[j]
        np.square(resid, out=resid)
        rss = np.add.reduceat(resid, rows.starts, axis=0)  # (k, w) centred sums of squares

        # scanpy's s_data = (data - stand_mean) / sd, stand_mean = grand mean + covariate
        # part; within batch j that is (resid + beta_j - grand_mean) / sd, so its batch mean
        # and centred sum of squares follow from the residuals' without an (n, w) s_data
        vp = var_pooled[a:b]
        grand = weights @ coef[:k]  # (w,)
        zero = vp == 0  # scanpy sets s_data to 0 there
        with np.errstate(divide="ignore", invalid="ignore"):
            sd = np.sqrt(vp)
            gamma_hat[:, a:b] = np.where(zero, 0.0, (rmean + coef[:k] - grand) / sd)
            ss[:, a:b] = np.where(zero, 0.0, rss / vp)
    grand_mean = weights @ beta[:k]
    return GeneSummaries(
        rows=rows,
        design=design,
        beta=beta,
        grand_mean=grand_mean,
        var_pooled=var_pooled,
        gamma_hat=gamma_hat,
        ss=ss,
        constant=constant,
    )


def _it_sol(
    ss: np.ndarray,
    g_hat: np.ndarray,
    d_hat: np.ndarray,
    n: int,
    *,
    g_bar: float,
    t2: float,
    a: float,
    b: float,
) -> tuple[np.ndarray, np.ndarray]:
    """scanpy's ``_it_sol`` for one batch and all genes at once, from summaries.

    scanpy sums ``(s - g_new)**2`` over the batch's samples each iteration; that equals
    ``ss + n * (g_hat - g_new)**2`` (``ss`` centred on the batch mean ``g_hat``), with no
    cancellation. The loop must run over all genes together: scanpy stops when the
    *largest* change over genes is below ``CONV``, so iterating blocks separately would
    stop them at other counts and give other numbers. All arrays (G,).
    """
    g_old, d_old = g_hat.copy(), d_hat.copy()
    g_new, d_new = g_old, d_old
    change, count = 1.0, 0
    # scanpy divides by g_old, which may be 0, and lets NaN end the loop: kept as it is
    with np.errstate(divide="ignore", invalid="ignore"):
        while change > CONV:
            g_new = (t2 * n * g_hat + d_old * g_bar) / (t2 * n + d_old)
            sum2 = ss + n * (g_hat - g_new) ** 2
            d_new = (0.5 * sum2 + b) / (n / 2.0 + a - 1.0)
            # builtin max of two numpy maxima, as scanpy (NaN first wins, NaN second loses)
            change = max((abs(g_new - g_old) / g_old).max(), (abs(d_new - d_old) / d_old).max())
            g_old, d_old = g_new, d_new
            count += 1
            if count >= MAX_ITER:
                raise RuntimeError(f"ComBat: no convergence in {MAX_ITER} iterations")
    return g_new, d_new


def eb_estimates(summ: GeneSummaries) -> tuple[np.ndarray, np.ndarray]:
    """Hyper-priors across the adjusted genes, then the EB estimates per batch and gene.

    Genes constant within some batch take no part (the caller leaves them unadjusted, as
    it gave scanpy only the others); their entries are ``gamma_star = 0, delta_star = 1``.

    Returns
    -------
    gamma_star, delta_star
        (n_batches, n_genes) additive and multiplicative batch effects.

    Raises
    ------
    ValueError
        When every gene is constant within some batch (nothing to estimate from).
    """
    adj = ~summ.constant
    if not adj.any():
        raise ValueError("every gene is constant within at least one batch")
    gh = summ.gamma_hat[:, adj]  # (k, Ga)
    dh = summ.delta_hat[:, adj]
    ss = summ.ss[:, adj]
    # across genes: numpy's var (ddof=0) for t2; pandas' Series.var (ddof=1) in the priors
    gamma_bar = gh.mean(axis=1)  # (k,)
    t2 = gh.var(axis=1)
    m = dh.mean(axis=1)
    s2 = dh.var(axis=1, ddof=1)
    a_prior = (2 * s2 + m**2) / s2
    b_prior = (m * s2 + m**3) / s2

    k, n_genes = summ.gamma_hat.shape
    gamma_star = np.zeros((k, n_genes))
    delta_star = np.ones((k, n_genes))
    for i in range(k):
        gamma_star[i, adj], delta_star[i, adj] = _it_sol(
            ss[i],
            gh[i],
            dh[i],
            int(summ.rows.sizes[i]),
            g_bar=gamma_bar[i],
            t2=t2[i],
            a=a_prior[i],
            b=b_prior[i],
        )
    return gamma_star, delta_star


def adjust(
    x: ColumnBlocks,
    summ: GeneSummaries,
    gamma_star: np.ndarray,
    delta_star: np.ndarray,
    *,
    block_size: int = 256,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Pass 2: the adjusted matrix, block by block; constant genes copied as they are.

    ``out`` (n_samples, n_genes), float32 unless given otherwise, may be ``x`` itself (a
    float32 ndarray): each block is read into float64 before it is written back.
    """
    block_size = _check_block_size(block_size)
    n, n_genes = int(x.shape[0]), int(x.shape[1])
    if out is None:
        out = np.empty((n, n_genes), dtype=np.float32)
    if out.shape != (n, n_genes):
        raise ValueError(f"out has shape {out.shape}, not {(n, n_genes)}")
    rows = summ.rows
    k = len(rows.sizes)
    slices = rows.slices()
    for a in range(0, n_genes, block_size):
        b = min(a + block_size, n_genes)
        xb = _read(x, rows, a, b)  # (n, w)
        coef = summ.beta[:, a:b]  # (p, w)
        resid = summ.design @ coef  # (n, w) the fit, turned into the residual in place
        np.subtract(xb, resid, out=resid)
        vp = summ.var_pooled[a:b]
        sd = np.sqrt(vp)
        shift = coef[:k] - summ.grand_mean[a:b]  # (k, w) batch coefficient - grand mean
        with np.errstate(divide="ignore", invalid="ignore"):
            inv_sd_star = 1.0 / np.sqrt(delta_star[:, a:b])  # (k, w)
        # scanpy: ((s - gamma*) / sqrt(delta*)) * sd + stand_mean, with s * sd = resid +
        # shift and stand_mean = x - resid - shift. Rearranged per batch and gene:
        #   x + (resid + shift) * (scale - 1) - gamma* * sd / sqrt(delta*),
        # scale = 1 / sqrt(delta*), or 0 where the pooled variance is 0 (scanpy's s = 0)
        scale = np.where(vp == 0, 0.0, inv_sd_star)
        offset = gamma_star[:, a:b] * sd * inv_sd_star  # (k, w)
        for j, sl in enumerate(slices):
            r = resid[sl]
            r += shift[j]
            r *= scale[j] - 1.0
            r += xb[sl]
            r -= offset[j]
        keep = summ.constant[a:b]
        if keep.any():
            resid[:, keep] = xb[:, keep]
        if rows.identity:
            out[:, a:b] = resid
        else:
            out[rows.order, a:b] = resid
    return out


def combat(
    x: ColumnBlocks,
    batches: np.ndarray,
    covariates: np.ndarray | None = None,
    *,
    block_size: int = 256,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """ComBat of ``x`` (samples x genes) in two passes over ``block_size`` genes at a time.

    The numbers of ``scanpy.pp.combat(adata, key, covariates=...)`` on the genes that are
    not constant within any batch (those are copied unadjusted, as ``sva::ComBat`` does),
    with a float32 result and ``O(n_samples x block_size)`` float64 working memory.

    Parameters
    ----------
    x
        (n_samples, n_genes) float32 or float64 matrix, C or F order (or anything giving
        ``x[:, a:b]``, see :class:`ColumnBlocks`).
    batches
        (n_samples,) batch labels; at least 2 samples per batch.
    covariates
        (n_samples, q) numeric columns whose effects are kept (``mod`` of
        ``sva::ComBat``); treatment-coded, not collinear with the batches.
    block_size
        Genes read and computed at a time.
    out
        Where to write (default: a new float32 array); may be ``x`` itself.

    Returns
    -------
    np.ndarray
        (n_samples, n_genes) corrected matrix (``out``).
    """
    summ = gene_summaries(x, batches, covariates, block_size=block_size)
    gamma_star, delta_star = eb_estimates(summ)
    return adjust(x, summ, gamma_star, delta_star, block_size=block_size, out=out)
