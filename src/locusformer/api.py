"""AnnData in and out: the Python face of the functions the workflow's rules call.

    import locusformer as lf

    model = lf.fit(adata, batch_key="batch", annotation=genes)   # adata.X: log-expression
    model.get_latent_representation()            # (n, Z): the training AnnData's latent
    model.get_normalized_expression(new, transform_batch="plate1")  # decoded as plate1
    corrected = lf.map(adata, model)      # layers["corrected"], obsm["X_locusformer"]
    mapped = lf.map(new_adata, model, adapt_epochs=50)             # new batches too
    model.save("ref/")  and  Model.load("ref/")  (or lf.save(model, "ref/"), lf.load("ref/"))

(``locusformer.api.correct`` is ``map`` under its other name; the package's own
``locusformer.infer.correct`` is the module of the correction step.)

The shape follows scvi-tools' models (a trained object with save and load, its latent
and its decoded expression; the corrected values under a named layer, the latent in
``obsm``), kept thin: each call is the library function the rule calls, on the matrix in
memory. Genes are ordered along the genome from ``annotation`` (as the ``order-loci``
step does), or from ``chrom`` and ``start`` columns that ``adata.var`` already holds.
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


class Model(TrainedModel):
    """A trained corrector with scvi-tools' methods; every library function takes it.

    ``adata``, ``batch_key`` and ``layer`` are what :func:`fit` was given (None after
    :meth:`load` unless passed there): the methods' defaults, as scvi-tools' models keep
    the AnnData they were set up with. They are not saved with the model.
    """

    adata: ad.AnnData | None = None
    batch_key: str | None = None
    layer: str | None = None

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
        batch_key: str | None = None,
        layer: str | None = None,
    ) -> np.ndarray:
        """The batch-free latent (n, Z) float32 of ``adata``'s samples (default: the
        AnnData :func:`fit` was given), as :func:`correct` writes it to ``obsm``.

        The encoder never sees the batch, so samples of batches the model was not trained
        on get their latent the same way (zero-shot).
        """
        adata, layer = self._data(adata, layer)
        return correct(adata, self, batch_key, layer=layer).obsm[LATENT_KEY]

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

    def save(self, directory: str | Path) -> None:
        """Write ``model.pt`` and ``model.json`` into ``directory`` (see :func:`save`)."""
        save(self, directory)

    @classmethod
    def load(cls, directory: str | Path, adata: ad.AnnData | None = None) -> Model:
        """The model :meth:`save` (or the workflow's train rule) wrote to ``directory``;
        ``adata`` becomes the methods' default data."""
        from locusformer.model.files import load_model

        directory = Path(directory)
        return cls.of(load_model(directory / "model.pt", directory / "model.json"), adata)


def _matrix(adata: ad.AnnData, layer: str | None) -> np.ndarray:
    from scipy import sparse

    values = adata.X if layer is None else adata.layers[layer]
    values = values.toarray() if sparse.issparse(values) else np.asarray(values)
    return np.ascontiguousarray(values, dtype=np.float32)


def _loci(adata: ad.AnnData, annotation: pd.DataFrame | None, id_type: str) -> pd.DataFrame:
    from locusformer.pp.loci import order_loci

    if annotation is None:
        if not {"chrom", "start"} <= set(adata.var.columns):
            raise InputError(
                "adata.var",
                "needs chrom and start columns, or pass annotation= (gene_id, chrom, start, end)",
            )
        annotation = adata.var[["chrom", "start"]].assign(
            gene_id=adata.var_names.astype(str), end=adata.var["start"]
        )
        id_type = "gene_id"
    loci, _ = order_loci(adata.var_names.astype(str), annotation, id_type)
    return loci


def fit(
    adata: ad.AnnData,
    batch_key: str,
    *,
    annotation: pd.DataFrame | None = None,
    id_type: str = "ensembl_id",
    layer: str | None = None,
    protect: Sequence[str] = (),
    model: Mapping[str, Any] | None = None,
    training: Mapping[str, Any] | None = None,
    seed: int = 0,
    device: str = "auto",
) -> Model:
    """Train a corrector on ``adata`` (samples x genes log-expression in ``X`` or ``layer``).

    ``protect`` names ``obs`` columns of biology to keep; ``model`` and ``training`` are
    the config's overrides. Returns the trained :class:`Model` (its loci in genomic
    order), which keeps ``adata`` as its methods' default data.
    """
    from locusformer.pp.batches import refuse_protected_batch
    from locusformer.train.alignment import covariate_levels
    from locusformer.train.loop import train_corrector

    batches = _batch_values(adata, batch_key)
    refuse_protected_batch(protect, batch_key)
    loci = _loci(adata, annotation, id_type)
    X = _matrix(adata, layer)[:, adata.var_names.get_indexer(loci["gene_id"])]
    obs = adata.obs.astype(str)
    levels = covariate_levels(obs, list(protect), "adata.obs") if protect else None
    trained, _ = train_corrector(
        X,
        batches,
        loci,
        model,
        training,
        seed=seed,
        device=device,
        progress=False,
        covariates=levels,
    )
    trained.record.protect = list(protect)
    return Model.of(trained, adata, batch_key, layer)


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
    """A copy of ``adata`` over the model's loci with ``layers["corrected"]`` and
    ``obsm["X_locusformer"]``; batches the model never saw are mapped (see :func:`map`).

    ``batch_key`` defaults to the one :func:`fit` was given, when ``adata.obs`` has it,
    else to the ``obs`` column holding the model's batch names.
    """
    from locusformer.infer.mapping import align_genes, map_query
    from locusformer.steps.outputs import model_uns

    batch_key = batch_key or _batch_column(adata, model)
    frame = pd.DataFrame(_matrix(adata, layer), index=adata.obs_names, columns=adata.var_names)
    X, match = align_genes(frame, model, "adata")
    result = map_query(
        model,
        X,
        _batch_values(adata, batch_key),
        reference=reference,
        adapt_epochs=adapt_epochs,
        seed=seed,
        device=device,
    )
    import anndata as ad

    var = model.loci.set_index("gene_id") if model.loci is not None else None
    out = ad.AnnData(X=X, obs=adata.obs.copy(), var=var)
    out.layers[LAYER] = result.corrected
    out.obsm[LATENT_KEY] = result.latent
    out.uns["locusformer"] = {
        **model_uns(model),
        "mapping": {"new_batches": result.new_batches, "adapted": result.adapted},
        "genes": match.to_dict(),
    }
    return out


#: A query onto a trained model is the same call: known batches corrected, new ones mapped.
map = correct


def _batch_values(adata: ad.AnnData, batch_key: str) -> list[str]:
    """Each sample's batch: the ``obs`` column ``batch_key``, or the combination of the
    ``+``-joined columns it names (as the workflow's sample sheets allow)."""
    from locusformer.pp.batches import combine_batch_columns

    obs = combine_batch_columns(adata.obs, batch_key, "adata.obs")
    if batch_key not in obs.columns:
        raise InputError("adata.obs", f"no batch column {batch_key!r}")
    return obs[batch_key].astype(str).tolist()


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


def save(model: TrainedModel, directory: str | Path) -> None:
    """Write ``model.pt`` and ``model.json`` into ``directory``, as the train rule does."""
    from locusformer.model.files import save_model

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_model(model, directory / "model.pt", directory / "model.json")
