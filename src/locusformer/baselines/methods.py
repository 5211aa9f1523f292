"""Established batch-correction baselines, run on a dataset's normalized files.

Every method works on the same normalized matrix (log-expression, samples x loci in
genomic order) and returns an *integration result* (:mod:`locusformer.io.results`): the
corrected matrix, or an embedding, with the sample table.

Methods: ``uncorrected`` (the input as it is), ``combat`` (:func:`scanpy.pp.combat`'s
computation, streamed over gene blocks by :mod:`locusformer.pp.combat`),
``combat_mod`` (ComBat that keeps the effects of given sample-sheet columns, like
``sva::ComBat(mod=)``: it uses labels, so it is no unsupervised peer of the others),
``harmony`` (harmonypy on a PCA of the scaled matrix), ``scvi`` (scvi-tools on raw
counts) and ``sysvi`` (scvi-tools' SysVI on the log-normalized matrix); the last two need
the optional ``scvi`` extra.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Mapping, Sequence
from typing import Literal

import anndata as ad
import numpy as np
import pandas as pd

from locusformer.baselines.vi_device import vi_accelerator
from locusformer.errors import InputError
from locusformer.io.results import dense, make_result
from locusformer.pp.pca import NonFiniteError, n_pcs, pca, pca_scaled_blocks

log = logging.getLogger(__name__)

Method = Literal["uncorrected", "combat", "combat_mod", "harmony", "scvi", "sysvi"]
METHODS: tuple[str, ...] = typing.get_args(Method)
#: methods whose result is an embedding (scored as it is), not a corrected matrix
EMBEDDING_METHODS: frozenset[str] = frozenset({"harmony", "scvi", "sysvi"})
#: scVI training epochs; None = scvi-tools' default (depends on the number of samples)
SCVI_MAX_EPOCHS: int | None = None
#: SysVI training epochs: the 200 of scvi-tools' SysVI tutorial
SYSVI_MAX_EPOCHS: int = 200
#: SysVI's loss weights, as in its tutorial (the cycle weight is its one integration knob)
SYSVI_PLAN_KWARGS: Mapping[str, float] = {"kl_weight": 1.0, "z_distance_cycle_weight": 5.0}
#: genes per block of the streamed ComBat (working memory: a few n_samples x this float64)
COMBAT_BLOCK: int = 256
#: Matrices of at most this many values (n_obs * n_vars; 50,000 samples x 2,000 loci)
#: take the in-memory paths, whose results stay bitwise what they were: ComBat in blocks
#: of COMBAT_BLOCK genes, Harmony on sklearn's ARPACK PCA of a float64 scaled copy. Above
#: it (atlas scale, issue 15) ComBat's blocks hold about COMBAT_BLOCK_VALUES values and
#: Harmony's PCA is streamed (pca.pca_scaled_blocks: ARPACK's numbers to ~1e-12 relative).
STREAM_VALUES: int = 100_000_000
#: above STREAM_VALUES, values per ComBat gene block (float64: 256 MB per block array)
COMBAT_BLOCK_VALUES: int = 2**25


# --------------------------------------------------------------------------- results


def failed_result(
    method: str,
    obs: pd.DataFrame,
    var_names: Sequence[str],
    error: object,
    *,
    batch_key: str | None = None,
    label_key: str | None = None,
) -> ad.AnnData:
    """An integration result that records that ``method`` failed (no matrix, no embedding)."""
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return make_result(
        None,
        method=method,
        representation="embedding" if method in EMBEDDING_METHODS else "matrix",
        obs=obs,
        var_names=var_names,
        batch_key=batch_key,
        label_key=label_key,
        status="failed",
        error=str(error),
    )


# --------------------------------------------------------------------------- methods


def _batches(adata: ad.AnnData, batch_key: str) -> pd.Series:
    if batch_key not in adata.obs.columns:
        raise InputError("samples", f"no batch column {batch_key!r}")
    batches = adata.obs[batch_key]
    if batches.isna().any():
        raise InputError("samples", f"batch column {batch_key!r} has missing values")
    return batches.astype(str)


def _need_batches(method: str, batches: pd.Series, min_per_batch: int = 1) -> None:
    counts = batches.value_counts()
    if len(counts) < 2:
        raise RuntimeError(f"{method} needs at least 2 batches, found {len(counts)}")
    small = counts[counts < min_per_batch]
    if len(small):
        names = ", ".join(repr(b) for b in small.index[:5])
        raise RuntimeError(
            f"{method} needs at least {min_per_batch} samples per batch; "
            f"too few in batch {names} ({int(small.iloc[0])} sample(s))"
        )


def _check_finite(method: str, x: np.ndarray, block_size: int = 256) -> None:
    # by column blocks: a whole-matrix boolean mask is 2 GB at 1M samples x 2,000 loci
    values = columns = 0
    for a in range(0, x.shape[1], block_size):
        bad = ~np.isfinite(x[:, a : a + block_size])
        values += int(bad.sum())
        columns += int(bad.any(axis=0).sum())
    if values:
        raise RuntimeError(
            f"{method} produced {values} non-finite values (in {columns} of {x.shape[1]} columns)"
        )


def _uncorrected(adata: ad.AnnData, batch_key: str, seed: int, counts) -> ad.AnnData:
    x = np.asarray(dense(adata.X), dtype=np.float32)  # no copy of a float32 ndarray
    return make_result(
        x,
        method="uncorrected",
        representation="matrix",
        obs=adata.obs,
        var_names=adata.var_names,
        batch_key=batch_key,
    )


def display_name(method: str, covariates: Sequence[str] = ()) -> str | None:
    """How reports show a method that used sample labels (``None``: its plain name).

    ``combat_mod`` keeps the effects of labels that the scores also judge it by, so its
    row must say which ones; ``"combat_mod (mod: cell_line)"``.
    """
    if method == "combat_mod" and covariates:
        return f"combat_mod (mod: {', '.join(covariates)})"
    if covariates:  # LocusFormer trained with protected columns
        return f"{method} (protected: {', '.join(covariates)})"
    return None


def check_covariates(
    covariates: Sequence[str], obs: pd.DataFrame, batch_key: str, source: object
) -> None:
    """:class:`InputError` (naming ``source``) unless every covariate is a usable column."""
    from locusformer.pp.batches import refuse_protected_batch

    if len(set(covariates)) != len(covariates):
        raise InputError("protect", f"columns listed twice: {', '.join(covariates)}")
    refuse_protected_batch(covariates, batch_key)
    for name in covariates:
        if name not in obs.columns:
            raise InputError(source, f"no column {name!r} (named in protect)")
        if obs[name].isna().any():
            raise InputError(source, f"column {name!r} (named in protect) has missing values")


def _covariate_columns(obs: pd.DataFrame, covariates: Sequence[str]) -> pd.DataFrame:
    """Indicator columns of the (categorical) covariates, each without its first level.

    scanpy's ComBat puts one indicator per batch in the design, and those sum to an
    intercept; all levels of a categorical covariate would add a second one. scanpy
    inverts that singular design without complaint and returns nonsense (a group
    difference of 2 came back as 8), so the covariates go in treatment-coded, as numbers,
    which scanpy adds to the design as they are (the model of ``sva::ComBat(mod=)``).
    """
    columns: dict[str, np.ndarray] = {}
    for i, name in enumerate(covariates):
        values = obs[name].astype(str)
        for j, level in enumerate(sorted(values.unique())[1:], start=1):
            columns[f"__protect{i}_{j}"] = (values == level).to_numpy(dtype=np.float64)
    return pd.DataFrame(columns, index=obs.index)


def combat_block(n_obs: int, n_vars: int) -> int:
    """Genes per ComBat block: :data:`COMBAT_BLOCK` up to :data:`STREAM_VALUES` values,
    above it about :data:`COMBAT_BLOCK_VALUES` values per block (at least 1 gene)."""
    if n_obs * n_vars <= STREAM_VALUES:
        return COMBAT_BLOCK
    return max(1, min(COMBAT_BLOCK, COMBAT_BLOCK_VALUES // max(1, n_obs)))


def _writable_float32(x: object) -> bool:
    return type(x) is np.ndarray and x.dtype == np.float32 and x.flags.writeable


def _combat(
    adata: ad.AnnData,
    batch_key: str,
    seed: int,
    counts,
    covariates: Sequence[str] = (),
    overwrite: bool = False,
) -> ad.AnnData:
    from locusformer.pp import combat

    method = "combat_mod" if covariates else "combat"
    batches = _batches(adata, batch_key)
    _need_batches("ComBat", batches, min_per_batch=2)
    check_covariates(covariates, adata.obs, batch_key, "samples")
    # no float64 copy of the whole matrix: locusformer.pp.combat reads blocks of genes
    x = dense(adata.X)
    codes = pd.Categorical(batches).codes

    protect = _covariate_columns(adata.obs, covariates)
    if covariates and protect.shape[1] == 0:
        log.warning("combat_mod: %s has one value only; nothing to protect", covariates)
    if covariates:
        # A covariate that follows the batches leaves no batch effect to estimate apart
        # from it (sva::ComBat refuses it too); the fit needs residual degrees of freedom.
        design = np.column_stack([np.eye(codes.max() + 1)[codes], protect.to_numpy()])
        rank = int(np.linalg.matrix_rank(design))
        if rank < design.shape[1]:
            raise RuntimeError(
                f"ComBat: the protected column(s) {', '.join(covariates)} are confounded "
                f"with batch {batch_key!r} (design of rank {rank} with {design.shape[1]} columns)"
            )
        if design.shape[0] <= design.shape[1]:
            raise RuntimeError(
                f"ComBat: {design.shape[0]} samples cannot fit {design.shape[1]} batch and "
                "covariate terms"
            )
    # scanpy.pp.combat's computation in two passes over gene blocks (its numbers to float32
    # rounding). Like sva::ComBat, genes constant within some batch are left unadjusted:
    # their within-batch variance is 0, so the empirical-Bayes scale factor would divide by 0.
    block = combat_block(*x.shape)
    try:
        summ = combat.gene_summaries(x, codes, protect.to_numpy(), block_size=block)
    except combat.NonFiniteError:
        raise InputError("normalized matrix", "contains non-finite values") from None
    if summ.constant.all():
        raise RuntimeError("ComBat: every gene is constant within at least one batch")
    gamma_star, delta_star = combat.eb_estimates(summ)
    # in place (each block is read into float64 before it is written back: the same
    # float32 numbers) only when the caller gave the matrix away, and it is float32
    into = x if overwrite and not adata.is_view and _writable_float32(adata.X) else None
    out = combat.adjust(x, summ, gamma_star, delta_star, block_size=block, out=into)
    _check_finite("ComBat", out)
    uns: dict[str, object] = {"n_genes_unadjusted": int(summ.constant.sum())}
    if covariates:
        uns.update(covariates=list(covariates), display_name=display_name(method, covariates))
    return make_result(
        out,
        method=method,
        representation="matrix",
        obs=adata.obs,
        var_names=adata.var_names,
        batch_key=batch_key,
        uns=uns,
    )


def _harmony(adata: ad.AnnData, batch_key: str, seed: int, counts) -> ad.AnnData:
    import harmonypy

    batches = _batches(adata, batch_key)
    _need_batches("Harmony", batches, min_per_batch=1)
    x = dense(adata.X)
    n = x.shape[0]
    n_comps = n_pcs(n, x.shape[1])
    # scale each gene to zero mean and unit variance (constant genes stay 0), clip at 10 SD
    # as scanpy.pp.scale(max_value=10) does, then the (centred) PCA of that
    if x.size <= STREAM_VALUES:
        x64 = x.astype(np.float64)
        if not np.isfinite(x64).all():
            raise InputError("normalized matrix", "contains non-finite values")
        sd = x64.std(axis=0, ddof=1)
        sd[sd == 0] = 1.0
        scaled = np.clip((x64 - x64.mean(axis=0)) / sd, -10, 10)
        del x64
        pcs = pca(scaled, n_comps, seed)
        del scaled
    else:
        try:  # no float64 copy: moments, Gram matrix and scores over row blocks
            pcs = pca_scaled_blocks(x, n_comps, max_value=10)
        except NonFiniteError:
            raise InputError("normalized matrix", "contains non-finite values") from None

    # harmonypy's default is round(N / 30) clusters, which is 0 or 1 for small bulk studies
    nclust = int(min(max(2, round(n / 30)), 100, n - 1))
    meta = pd.DataFrame({batch_key: batches.values})
    ho = harmonypy.run_harmony(
        pcs, meta, batch_key, nclust=nclust, random_state=seed, verbose=False
    )
    z = np.asarray(ho.Z_corr)
    if z.shape[0] != n and z.shape[1] == n:  # harmonypy < 0.1 returns PCs x cells
        z = z.T
    _check_finite("Harmony", z)
    return make_result(
        np.asarray(x, dtype=np.float32),  # no copy of a float32 ndarray
        method="harmony",
        representation="embedding",
        obs=adata.obs,
        var_names=adata.var_names,
        embedding=z,
        batch_key=batch_key,
        uns={"n_pcs": int(pcs.shape[1]), "nclust": nclust},
    )


def scvi_available() -> bool:
    """Whether scvi-tools can be imported."""
    try:
        import scvi  # noqa: F401
    except Exception:
        return False
    return True


def _scvi(adata: ad.AnnData, batch_key: str, seed: int, counts) -> ad.AnnData:
    if counts is None:
        raise InputError("scvi", "needs raw counts (counts.parquet); this dataset has no counts")
    try:
        import scvi
    except Exception as exc:
        raise RuntimeError(
            "scVI needs the optional scvi-tools package (pip install 'locusformer[scvi]'): "
            f"{type(exc).__name__}: {exc}"
        ) from exc

    batches = _batches(adata, batch_key)
    _need_batches("scVI", batches, min_per_batch=1)
    if isinstance(counts, pd.DataFrame):
        counts_df = counts
    elif isinstance(counts, ad.AnnData):
        counts_df = pd.DataFrame(dense(counts.X), index=counts.obs_names, columns=counts.var_names)
    else:
        raise TypeError("counts must be a DataFrame or an AnnData")
    counts_df.index = counts_df.index.astype(str)
    missing = adata.obs_names.difference(counts_df.index)
    if len(missing):
        raise InputError("counts", f"no counts for {len(missing)} samples, e.g. {missing[0]!r}")
    genes = [g for g in adata.var_names if g in counts_df.columns]
    if not genes:
        raise InputError("counts", "shares no gene ids with the normalized matrix")
    accelerator = vi_accelerator("scVI", adata.n_obs, len(genes))
    c = counts_df.loc[adata.obs_names, genes].to_numpy(dtype=np.float32)
    if not np.isfinite(c).all() or (c < 0).any():
        raise InputError("counts", "must be finite and not negative")

    scvi.settings.seed = seed
    work = ad.AnnData(X=c, obs=pd.DataFrame({batch_key: batches.values}, index=adata.obs_names))
    work.var_names = genes
    scvi.model.SCVI.setup_anndata(work, batch_key=batch_key)
    n_latent = max(2, min(10, work.n_obs - 1))
    model = scvi.model.SCVI(work, n_latent=n_latent)
    model.train(max_epochs=SCVI_MAX_EPOCHS, accelerator=accelerator, enable_progress_bar=False)
    z = np.asarray(model.get_latent_representation())
    _check_finite("scVI", z)
    return make_result(
        dense(adata.X).astype(np.float32),
        method="scvi",
        representation="embedding",
        obs=adata.obs,
        var_names=adata.var_names,
        embedding=z,
        batch_key=batch_key,
        uns={"n_latent": n_latent, "n_genes_counts": len(genes)},
    )


def _sysvi(adata: ad.AnnData, batch_key: str, seed: int, counts) -> ad.AnnData:
    # SysVI models log-normalized expression (a Gaussian decoder), not counts: it gets
    # the same normalized matrix as ComBat and Harmony.
    batches = _batches(adata, batch_key)
    _need_batches("SysVI", batches, min_per_batch=1)
    accelerator = vi_accelerator("SysVI", adata.n_obs, adata.n_vars)
    x = dense(adata.X).astype(np.float32)
    if not np.isfinite(x).all():
        raise InputError("normalized matrix", "contains non-finite values")
    try:
        import scvi
        from scvi.external import SysVI
    except Exception as exc:
        raise RuntimeError(
            "SysVI needs the optional scvi-tools package (pip install 'locusformer[scvi]'): "
            f"{type(exc).__name__}: {exc}"
        ) from exc

    # seeds Python, NumPy (SysVI draws its VampPrior pseudo-inputs there) and torch
    scvi.settings.seed = seed
    work = ad.AnnData(X=x, obs=pd.DataFrame({batch_key: batches.values}, index=adata.obs_names))
    work.var_names = [str(v) for v in adata.var_names]
    SysVI.setup_anndata(work, batch_key=batch_key)
    model = SysVI(work)  # the tutorial's model: VampPrior, 15 latent dimensions
    model.train(
        max_epochs=SYSVI_MAX_EPOCHS,
        accelerator=accelerator,
        enable_progress_bar=False,
        plan_kwargs=dict(SYSVI_PLAN_KWARGS),
    )
    z = np.asarray(model.get_latent_representation(work))
    _check_finite("SysVI", z)
    return make_result(
        dense(adata.X).astype(np.float32),
        method="sysvi",
        representation="embedding",
        obs=adata.obs,
        var_names=adata.var_names,
        embedding=z,
        batch_key=batch_key,
        uns={"n_latent": int(z.shape[1]), "max_epochs": int(SYSVI_MAX_EPOCHS)},
    )


_RUNNERS = {
    "uncorrected": _uncorrected,
    "combat": _combat,
    "combat_mod": _combat,
    "harmony": _harmony,
    "scvi": _scvi,
    "sysvi": _sysvi,
}


def _check_method(method: str, covariates: Sequence[str]) -> None:
    if method not in _RUNNERS:
        raise InputError("method", f"unknown baseline {method!r}; choose from {', '.join(METHODS)}")
    if method == "combat_mod" and not covariates:
        raise InputError(
            "protect",
            "combat_mod needs at least one sample-sheet column to protect "
            "(config key 'protect', or --protect COLUMN)",
        )
    if covariates and method != "combat_mod":
        raise InputError("protect", f"only combat_mod protects columns, not {method}")


def run_method(
    method: str,
    adata: ad.AnnData,
    batch_key: str,
    seed: int,
    counts: ad.AnnData | pd.DataFrame | None = None,
    covariates: Sequence[str] = (),
    *,
    overwrite: bool = False,
) -> ad.AnnData:
    """Run one baseline on a normalized AnnData (samples x loci, log-expression).

    Parameters
    ----------
    method
        One of :data:`METHODS`.
    adata
        The normalized matrix; ``obs`` holds the batch column (and the covariates).
    batch_key
        The batch column of ``adata.obs``.
    seed
        Seed of the method's random steps.
    counts
        Raw counts of the same samples (``scvi`` only).
    covariates
        ``combat_mod`` only, and required there: categorical ``obs`` columns whose effects
        ComBat keeps (its design matrix, ``mod`` in ``sva::ComBat``).
    overwrite
        ``combat``/``combat_mod`` only: write the corrected matrix into ``adata.X`` (when
        it is a writable float32 ndarray) instead of a new array, saving a copy of the
        matrix at atlas scale; ``adata.X`` then holds the result's values. Off by default,
        so a caller's AnnData is never changed; :func:`run_baseline` turns it on for the
        matrix it loaded itself. Other methods never write into ``adata.X``, but the
        result's ``X`` of ``uncorrected`` and ``harmony`` is ``adata.X`` itself (no copy)
        when that is a float32 ndarray.

    Returns
    -------
    anndata.AnnData
        The integration result.

    Raises
    ------
    InputError
        An unknown method, covariates where they do not belong or missing, missing inputs.
    RuntimeError
        A design the method cannot handle; :func:`run_baseline` records such failures.
    """
    covariates = list(covariates)
    _check_method(method, covariates)
    if adata.n_obs < 2 or adata.n_vars < 1:
        raise InputError("normalized matrix", f"too small ({adata.n_obs} x {adata.n_vars})")
    if method in ("combat", "combat_mod"):
        result = _combat(adata, batch_key, seed, counts, covariates=covariates, overwrite=overwrite)
    else:
        result = _RUNNERS[method](adata, batch_key, seed, counts)
    result.uns["seed"] = int(seed)
    return result


# --------------------------------------------------------------------------- files
