"""AnnData in and out: the Python face of the functions the workflow's rules call.

    import locusformer as lf

    model = lf.fit(adata, batch_key="batch", max_epochs=40)   # adata.X: log-expression
    out = lf.map(adata, model)            # the query's own AnnData, with LocusFormer's keys
    sc.pp.neighbors(out, use_rep="X_locusformer_pca")        # what the report scores
    model.history                         # one row per epoch
    model.get_latent_representation()     # (n, Z): the latent alone, encoder only
    model.get_normalized_expression(new, transform_batch="plate1")  # decoded as plate1
    mapped = lf.map(new_adata, model, adapt_epochs=50)             # new batches too
    model.save("ref/")  and  lf.load("ref/")

What :func:`map` adds to a copy of the query (over the model's loci):

- ``layers["corrected"]``: the batch-corrected log-expression;
- ``obsm["X_locusformer_pca"]``: the PCA of the corrected matrix, computed as the
  workflow's scoring does: the representation the report ranks as "LocusFormer", and
  the one to hand to ``sc.pp.neighbors``;
- ``obsm["X_locusformer"]``: the model's latent (scored as "LocusFormer (latent)");
- ``uns["locusformer"]``: the model, the mapping and the genes matched.

Every entry checks its input as the workflow's steps do (:mod:`locusformer.pp.validate`):
non-finite values, counts where log-expression belongs, repeated ids, missing batches
are one :class:`~locusformer.errors.InputError`, never a NaN result.

The shape follows scvi-tools' models (a trained object with save and load, its latent
and its decoded expression; the corrected values under a named layer, the latent in
``obsm``), kept thin: each call is the library function the rule calls, on the matrix in
memory. Genes are ordered along the genome from ``annotation`` (a path or a table, as
the ``order-loci`` step reads), from ``chrom`` and ``start`` columns that ``adata.var``
already holds, or from the bundled human table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from locusformer.errors import InputError
from locusformer.model.files import TrainedModel

if TYPE_CHECKING:
    import anndata as ad

LAYER = "corrected"
LATENT_KEY = "X_locusformer"
#: The PCA of the corrected matrix, as the workflow's scoring computes it.
PCA_KEY = "X_locusformer_pca"


class Model(TrainedModel):
    """A trained corrector with scvi-tools' methods; every library function takes it.

    ``adata``, ``batch_key`` and ``layer`` are what :func:`fit` was given (None after
    :meth:`load` unless passed there): the methods' defaults, as scvi-tools' models keep
    the AnnData they were set up with. They are not saved with the model.
    """

    adata: ad.AnnData | None = None
    batch_key: str | None = None
    layer: str | None = None
    #: One row per training epoch (losses, learning rate, time), as the workflow's
    #: ``history.tsv``; None for a loaded model.
    history: pd.DataFrame | None = None

    def __repr__(self) -> str:
        return super().__repr__().replace("TrainedModel(", "Model(", 1)

    @classmethod
    def of(
        cls,
        trained: TrainedModel,
        adata: ad.AnnData | None = None,
        batch_key: str | None = None,
        layer: str | None = None,
    ) -> Model:
        """``trained``'s network and record (shared, not copied) as a :class:`Model`."""
        model = cls(trained.module, trained.record)
        model.adata, model.batch_key, model.layer = adata, batch_key, layer
        return model

    def _data(self, adata: ad.AnnData | None, layer: str | None) -> tuple[ad.AnnData, str | None]:
        if adata is not None:
            return adata, layer
        if self.adata is None:
            raise InputError("adata", "none given, and the model keeps none (it was loaded)")
        return self.adata, layer if layer is not None else self.layer

    def get_latent_representation(
        self,
        adata: ad.AnnData | None = None,
        *,
        indices: Sequence[int] | np.ndarray | None = None,
        batch_size: int | None = None,
        layer: str | None = None,
        device: str = "auto",
    ) -> np.ndarray:
        """The batch-free latent (n, Z) float32 of ``adata``'s samples (default: the
        AnnData :func:`fit` was given), or of its rows ``indices``.

        Only the encoder runs, ``batch_size`` samples at a time: it never sees the batch,
        so samples of batches the model was not trained on get their latent the same way.
        """
        from locusformer.infer.correct import CHUNK_SIZE, encode

        adata, layer = self._data(adata, layer)
        if indices is not None:
            adata = adata[np.asarray(indices)]
        X, _ = _aligned(adata, layer, self)
        return encode(self, X, chunk_size=batch_size or CHUNK_SIZE, device=device)

    def get_normalized_expression(
        self,
        adata: ad.AnnData | None = None,
        transform_batch: str | None = None,
        *,
        batch_key: str | None = None,
        layer: str | None = None,
        return_numpy: bool = False,
    ) -> pd.DataFrame | np.ndarray:
        """Every sample decoded as if it came from training batch ``transform_batch``.

        Parameters
        ----------
        adata
            Samples x genes log-expression (default: the AnnData :func:`fit` was given);
            aligned to the model's loci as :func:`correct` does.
        transform_batch
            A batch the model was trained on, or None (or "mean") for the model's
            reference, the average of all batch conditionings: then the values are
            :func:`correct`'s ``layers["corrected"]``. Unlike scvi-tools, None does not mean
            each sample's own batch, and a list of batches is not taken.
        return_numpy
            An (n, L) float32 array instead of a DataFrame (samples x the model's genes).

        Returns
        -------
        Log-expression on the model's loci (LocusFormer decodes log-expression, not
        scVI's per-gene frequencies).
        """
        from locusformer.infer.correct import reference_code

        reference = "mean" if transform_batch is None else str(transform_batch)
        try:
            reference_code(self, reference)
        except InputError as err:
            raise InputError("transform_batch", err.problem) from None
        adata, layer = self._data(adata, layer)
        out = correct(adata, self, batch_key, layer=layer, reference=reference)
        values = out.layers[LAYER]
        if return_numpy:
            return values
        return pd.DataFrame(values, index=out.obs_names, columns=out.var_names)

    def save(self, directory: str | Path, overwrite: bool = False) -> None:
        """Write ``model.pt`` and ``model.json`` into ``directory`` (see :func:`save`)."""
        save(self, directory, overwrite=overwrite)

    @classmethod
    def load(cls, directory: str | Path, adata: ad.AnnData | None = None) -> Model:
        """The model :meth:`save` (or the workflow's train rule) wrote to ``directory``;
        ``adata`` becomes the methods' default data."""
        from locusformer.model.files import load_model

        directory = Path(directory)
        return cls.of(load_model(directory / "model.pt", directory / "model.json"), adata)


def _source(layer: str | None) -> str:
    return "adata.X" if layer is None else f"adata.layers[{layer!r}]"


def _values(adata: ad.AnnData, layer: str | None, columns: np.ndarray) -> np.ndarray:
    """The ``columns`` of ``X`` (or ``layer``) as a dense float32 array, checked.

    Columns are taken before anything is made dense: an AnnData of 30,000 genes, sparse,
    costs the model's genes in memory, not all of them.
    """
    from scipy import sparse

    from locusformer.pp.validate import check_log_expression

    if layer is not None and layer not in adata.layers:
        raise InputError("layer", f"adata has no layer {layer!r} (layers: {list(adata.layers)})")
    values = adata.X if layer is None else adata.layers[layer]
    if values is None:
        raise InputError("adata.X", "is empty; pass layer= the layer that holds log-expression")
    values = values[:, columns]
    values = values.toarray() if sparse.issparse(values) else np.asarray(values)
    values = np.ascontiguousarray(values, dtype=np.float32)
    check_log_expression(values, _source(layer))
    return values


def _check_ids(adata: ad.AnnData) -> None:
    from locusformer.pp.validate import check_ids

    check_ids(pd.Index(adata.var_names.astype(str)), "adata", ("gene", "var_names"))
    check_ids(pd.Index(adata.obs_names.astype(str)), "adata", ("sample", "obs_names"))


def _aligned(adata: ad.AnnData, layer: str | None, model: TrainedModel):
    """``adata``'s values over the model's loci (a missing locus takes the model's training
    mean, as :func:`~locusformer.infer.mapping.align_genes` does) and how the genes met."""
    from locusformer.infer.mapping import fill_missing, match_genes

    _check_ids(adata)
    where, match = match_genes(adata.var_names, model, "adata")
    return fill_missing(model, _values(adata, layer, where[where >= 0]), where), match


def annotation_table(
    annotation: str | Path | pd.DataFrame | None, id_type: str
) -> pd.DataFrame | None:
    """Gene coordinates (``gene_id``, ``chrom``, ``start``, ``end``) from what a user
    passes as ``annotation=``: a path (table, GTF or BED, as ``order-loci`` reads), a
    DataFrame holding an id column (``gene_id`` or ``id_type``) and ``chrom``, ``start``,
    ``end``, or None (then None)."""
    from locusformer.io.annotation import ANNOTATION_COLUMNS, numeric_spans, read_annotation

    if annotation is None:
        return None
    if isinstance(annotation, str | Path):
        return read_annotation(annotation, id_type)
    if not isinstance(annotation, pd.DataFrame):
        raise InputError("annotation", f"expected a path or a DataFrame, not {type(annotation)}")
    frame = annotation
    if "gene_id" not in frame.columns and id_type in frame.columns:
        frame = frame.rename(columns={id_type: "gene_id"})
    missing = [c for c in ANNOTATION_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(
            "annotation",
            f"lacks column(s) {', '.join(missing)} (needs {id_type!r} or 'gene_id', chrom, "
            f"start, end; it has {', '.join(str(c) for c in frame.columns[:8])})",
        )
    symbols = ["symbol"] if "symbol" in frame.columns and id_type != "symbol" else []
    frame = frame[ANNOTATION_COLUMNS + symbols].copy()
    frame = frame[frame["gene_id"].notna() & (frame["gene_id"].astype(str).str.strip() != "")]
    return numeric_spans(frame, "annotation").reset_index(drop=True)


def _loci(adata: ad.AnnData, annotation: pd.DataFrame | None, id_type: str) -> pd.DataFrame:
    from locusformer.io.annotation import bundled_annotation, read_annotation
    from locusformer.pp.loci import order_loci

    if annotation is None and {"chrom", "start"} <= set(adata.var.columns):
        annotation = adata.var[["chrom", "start"]].assign(
            gene_id=adata.var_names.astype(str), end=adata.var["start"]
        )
        id_type = "gene_id"
    elif annotation is None:
        bundled = bundled_annotation()
        if bundled is None:
            raise InputError(
                "adata.var",
                "needs chrom and start columns, or pass annotation= (a path, or a table "
                "with gene_id, chrom, start, end)",
            )
        annotation = read_annotation(bundled, id_type)
    loci, _ = order_loci(adata.var_names.astype(str), annotation, id_type)
    return loci


def fit(
    adata: ad.AnnData,
    batch_key: str,
    *,
    annotation: str | Path | pd.DataFrame | None = None,
    id_type: str = "ensembl_id",
    layer: str | None = None,
    protect: Sequence[str] = (),
    max_epochs: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    device: str = "auto",
    progress: bool = True,
    model: Mapping[str, Any] | None = None,
    training: Mapping[str, Any] | None = None,
) -> Model:
    """Train a corrector on ``adata`` (samples x genes log-expression in ``X`` or ``layer``).

    Parameters
    ----------
    batch_key
        The ``obs`` column of batches (or several joined with ``+``).
    annotation
        Where the genes lie: a path (table, GTF or BED), a DataFrame with an id column
        (``gene_id`` or ``id_type``) and ``chrom``, ``start``, ``end``, or None: the
        ``chrom`` and ``start`` columns of ``adata.var``, else the bundled human table.
    id_type
        Which ids ``var_names`` are (``ensembl_id``, ``symbol``, ``entrez_id``).
    protect
        ``obs`` columns of biology to keep: the batch is removed within their levels.
    max_epochs, batch_size
        Training's most common settings; ``training`` takes any other (see
        ``config/README.md``), ``model`` the architecture.
    progress
        A progress bar on stderr (tqdm), one step per epoch.

    Returns
    -------
    The trained :class:`Model` (its loci in genomic order, its ``history`` one row per
    epoch), which keeps ``adata`` as its methods' default data.
    """
    from locusformer.pp.batches import refuse_protected_batch
    from locusformer.pp.validate import batch_labels
    from locusformer.train.alignment import covariate_levels
    from locusformer.train.loop import train_corrector

    _check_ids(adata)
    batches = _batch_values(adata, batch_key, min_batches=2)
    refuse_protected_batch(protect, batch_key)
    loci = _loci(adata, annotation_table(annotation, id_type), id_type)
    X = _values(adata, layer, adata.var_names.get_indexer(loci["gene_id"]))
    levels = None
    if protect:
        obs = adata.obs[list(protect)].copy()
        for column in protect:  # the same checks as a batch column, one level allowed
            obs[column] = batch_labels(obs[column], "adata.obs", min_batches=1)
        levels = covariate_levels(obs, list(protect), "adata.obs")
    settings = dict(training or {})
    settings.update(
        {k: v for k, v in (("max_epochs", max_epochs), ("batch_size", batch_size)) if v is not None}
    )
    trained, history = train_corrector(
        X,
        batches,
        loci,
        model,
        settings,
        seed=seed,
        device=device,
        progress=progress,
        covariates=levels,
    )
    trained.record.protect = list(protect)
    fitted = Model.of(trained, adata, batch_key, layer)
    fitted.history = pd.DataFrame(history)
    return fitted


def correct(
    adata: ad.AnnData,
    model: TrainedModel,
    batch_key: str | None = None,
    *,
    layer: str | None = None,
    reference: str = "mean",
    adapt_epochs: int = 0,
    seed: int = 0,
    device: str = "auto",
) -> ad.AnnData:
    """A copy of ``adata`` over the model's loci, its own ``obs``, ``var``, ``layers``,
    ``obsm`` and ``uns`` kept, with ``layers["corrected"]``, ``obsm["X_locusformer_pca"]``
    (the representation to hand to ``sc.pp.neighbors``), ``obsm["X_locusformer"]`` (the
    latent) and ``uns["locusformer"]``; batches the model never saw are mapped.

    ``batch_key`` defaults to the one :func:`fit` was given, when ``adata.obs`` has it,
    else to the ``obs`` column holding the model's batch names. Where the query lacks some
    of the model's loci, those columns of ``X`` hold the model's training mean and the
    query's own ``layers`` are not carried (a warning says so).
    """
    from locusformer.infer.mapping import map_query
    from locusformer.steps.outputs import model_uns

    batch_key = batch_key or _batch_column(adata, model)
    batches = _batch_values(adata, batch_key, min_batches=1)
    X, match = _aligned(adata, layer, model)
    result = map_query(
        model,
        X,
        batches,
        reference=reference,
        adapt_epochs=adapt_epochs,
        seed=seed,
        device=device,
    )
    out = _query_copy(adata, model, X, complete=not match.missing)
    out.layers[LAYER] = result.corrected
    out.obsm[LATENT_KEY] = result.latent
    out.obsm[PCA_KEY] = _scored_pca(result.corrected, seed)
    out.uns["locusformer"] = {
        **model_uns(model),
        "mapping": {"new_batches": result.new_batches, "adapted": result.adapted},
        "genes": match.to_dict(),
    }
    return out


#: A query onto a trained model is the same call: known batches corrected, new ones mapped.
map = correct


def _query_copy(adata: ad.AnnData, model: TrainedModel, X: np.ndarray, complete: bool):
    """The query over the model's loci: with every locus present, its own AnnData cut to
    them (obs, var, layers, obsm, uns kept); else the model's loci, the query's obs,
    obsm and uns, and its var columns where it has the gene."""
    import warnings

    import anndata as ad

    if complete:
        out = adata[:, model.gene_ids].copy()
        out.X = X
        return out
    var = model.loci.set_index("gene_id") if model.loci is not None else None
    if var is not None:
        extra = adata.var.drop(columns=[c for c in adata.var.columns if c in var.columns])
        var = var.join(extra.set_axis(adata.var_names.astype(str)), how="left")
    if adata.layers:
        warnings.warn(
            f"the query lacks some of the model's loci: its layers ({', '.join(adata.layers)}) "
            "are not carried over",
            stacklevel=3,
        )
    return ad.AnnData(
        X=X, obs=adata.obs.copy(), var=var, obsm=dict(adata.obsm), uns=dict(adata.uns)
    )


def _scored_pca(corrected: np.ndarray, seed: int) -> np.ndarray:
    """The PCA of the corrected matrix, as the workflow's scoring computes it."""
    from locusformer.pp.pca import n_pcs, pca

    return pca(corrected, n_pcs(*corrected.shape), seed).astype(np.float32)


def _batch_values(adata: ad.AnnData, batch_key: str, *, min_batches: int) -> list[str]:
    """Each sample's batch: the ``obs`` column ``batch_key``, or the combination of the
    ``+``-joined columns it names (as the workflow's sample sheets allow), checked as a
    sample sheet's batch column is (:func:`~locusformer.pp.validate.batch_labels`)."""
    from locusformer.pp.batches import batch_columns, combine_batch_columns
    from locusformer.pp.validate import batch_labels

    columns = [batch_key] if batch_key in adata.obs else batch_columns(batch_key)
    obs = adata.obs[[c for c in columns if c in adata.obs.columns]].copy()
    for column in obs.columns:  # each part checked before the parts are joined
        obs[column] = batch_labels(obs[column], "adata.obs", min_batches=1)
    obs = combine_batch_columns(obs, batch_key, "adata.obs")
    if batch_key not in obs.columns:
        raise InputError("adata.obs", f"no batch column {batch_key!r}")
    return batch_labels(obs[batch_key], "adata.obs", min_batches=min_batches)


def _batch_column(adata: ad.AnnData, model: TrainedModel) -> str:
    from locusformer.pp.batches import batch_columns

    known = getattr(model, "batch_key", None)
    if known is not None and set(batch_columns(known)) <= set(adata.obs.columns):
        return known
    for column in adata.obs.columns:
        if set(adata.obs[column].astype(str)) & set(model.batch_names):
            return str(column)
    raise InputError("adata.obs", "no column holds the model's batch names; pass batch_key=")


def load(directory: str | Path) -> Model:
    """A model that :func:`save` (or the workflow's train rule) wrote to ``directory``."""
    return Model.load(directory)


def save(model: TrainedModel, directory: str | Path, *, overwrite: bool = False) -> None:
    """Write ``model.pt`` and ``model.json`` into ``directory``, as the train rule does;
    a model already there is replaced only with ``overwrite=True``."""
    from locusformer.model.files import save_model

    directory = Path(directory)
    there = [name for name in ("model.pt", "model.json") if (directory / name).exists()]
    if there and not overwrite:
        raise InputError(directory, f"holds a model ({', '.join(there)}); pass overwrite=True")
    directory.mkdir(parents=True, exist_ok=True)
    save_model(model, directory / "model.pt", directory / "model.json")
