"""An independent scorer: every method's output on ONE gene set chosen from the uncorrected data.

It shares no code with ``locusformer.scoring`` (only scanpy and scib-metrics' functions as
they ship), so that it can check the workflow's own metric:

* **one gene set**: ``sc.pp.highly_variable_genes(n_top_genes=2000, flavor="seurat")`` on the
  uncorrected log-normalized data, without a batch key (:func:`choose_genes`). Every
  corrected matrix is scored on those genes; a method that lacks some is scored on the
  intersection, and the rows say how many it lacked (``n_genes_missing``). Genes a method has
  beyond the set are ignored;
* **what is scored**: the PCA (50 components, scanpy's ARPACK PCA, centred, not scaled) of a
  matrix's genes in the set; an embedding as it is (:meth:`Scorer.representation`). The
  pre-integration reference of PCR comparison is one for every method, as the Benchmarker's
  ``X_pre``: the PCA (50) of the uncorrected data on the whole gene set;
* **metrics**: scib-metrics' Benchmarker set, called as the Benchmarker calls them
  (pynndescent neighbours, ``random_state=0``, 90 with the 15 and 50 subsets): Isolated
  labels, KMeans NMI/ARI, Silhouette label, cLISI; iLISI, KBET, Graph connectivity, PCR
  comparison, and both batch silhouettes: ``silhouette_batch`` (scIB's, Euclidean, nearest
  other batch) and ``bras`` (cosine, mean over other batches). KMeans NMI/ARI from one start
  (``scib_metrics.nmi_ari_cluster_labels_kmeans`` itself) and from the lowest inertia of ten
  (``scib_metrics.utils.KMeans(n_init=10)``, seed 0). scib-metrics' k-means centres its
  input in place and adds the mean back, which moves an embedding by float32 rounding; kBET
  per label's diffusion map is sensitive enough for that to move KBET by 0.06 (Harmony on
  ``protocols``), so every metric here gets its own copy and the output is never changed;
* **totals** for each of four scorer variants (:data:`VARIANTS`: batch silhouette or BRAS x
  one or ten k-means starts): batch = mean of the five batch metrics, bio = mean of the five
  bio metrics (NaN left out), total = 0.4 batch + 0.6 bio, absolute values, no min-max
  scaling. ``silhouette_k10`` is the harness of issue 38.

Outputs are AnnData integration results (``uns["representation"]`` "matrix" with the
corrected matrix in ``.X``, or "embedding" with ``.obsm["X_emb"]``), a DataFrame (samples x
genes: a matrix) or an ndarray (samples x dims, rows in the uncorrected data's order: an
embedding).

    .venv/bin/python benchmarks/scoring/independent.py --outputs benchmarks/out/indep \\
        --tasks mixture mixture_pooled --seeds 0 --tsv benchmarks/out/indep/independent.tsv
"""

from __future__ import annotations

import argparse
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

#: Where ``produce.py`` writes its outputs and ``compare.py`` reads them.
OUTPUTS = Path(__file__).resolve().parents[2] / "benchmarks" / "out" / "indep"

log = logging.getLogger("independent")

EMBEDDING_KEY = "X_emb"
N_TOP_GENES = 2000
N_COMPS = 50
BATCH_WEIGHT, BIO_WEIGHT = 0.4, 0.6
#: variant -> (batch silhouette metric, k-means starts)
VARIANTS: dict[str, tuple[str, int]] = {
    "silhouette_k10": ("Silhouette batch", 10),
    "silhouette_k1": ("Silhouette batch", 1),
    "bras_k10": ("BRAS", 10),
    "bras_k1": ("BRAS", 1),
}
BATCH_METRICS = ("iLISI", "KBET", "Graph connectivity", "PCR comparison")
BIO_METRICS = ("Isolated labels", "Silhouette label", "cLISI")
LONG_COLUMNS = ["task", "method", "seed", "variant", "metric", "value"]


def choose_genes(uncorrected: ad.AnnData, n_top_genes: int = N_TOP_GENES) -> pd.Index:
    """The ``n_top_genes`` highly variable genes of the uncorrected log-normalized data
    (scanpy's ``seurat`` flavour, no batch key), in the data's gene order."""
    import scanpy as sc

    table = sc.pp.highly_variable_genes(
        uncorrected, n_top_genes=n_top_genes, flavor="seurat", inplace=False
    )
    return uncorrected.var_names[np.asarray(table["highly_variable"], dtype=bool)]


def _dense(x: Any) -> np.ndarray:
    return np.asarray(x.toarray() if hasattr(x, "toarray") else x, dtype=np.float32)


def _as_output(output: Any, obs_names: pd.Index) -> tuple[str, pd.DataFrame | np.ndarray]:
    """("matrix", samples x genes DataFrame in ``obs_names``' order) or ("embedding", array)."""
    if isinstance(output, ad.AnnData):
        if set(output.obs_names) != set(obs_names) or output.n_obs != len(obs_names):
            raise ValueError("an output's samples differ from the uncorrected data's")
        order = output.obs_names.get_indexer(obs_names)
        if output.uns.get("representation", "matrix") == "embedding":
            return "embedding", _dense(output.obsm[EMBEDDING_KEY])[order]
        x = pd.DataFrame(_dense(output.X), index=output.obs_names, columns=output.var_names)
        return "matrix", x.iloc[order]
    if isinstance(output, pd.DataFrame):
        return "matrix", output.loc[obs_names]
    x = np.asarray(output, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] != len(obs_names):
        raise ValueError(f"an embedding must be samples x dims, got shape {x.shape}")
    return "embedding", x


def pca(x: np.ndarray, n_comps: int = N_COMPS, seed: int = 0) -> np.ndarray:
    """scanpy's PCA (ARPACK, centred, not scaled) with ``n_comps`` components (fewer only
    when the matrix has too few rows or columns)."""
    import scanpy as sc

    n = min(n_comps, x.shape[0] - 1, x.shape[1] - 1)
    return np.asarray(
        sc.pp.pca(np.asarray(x, dtype=np.float32), n_comps=n, svd_solver="arpack",
                  random_state=seed),
        dtype=np.float32,
    )  # fmt: skip


@dataclass
class Scorer:
    """Scores outputs against one uncorrected log-normalized AnnData on one gene set.

    ``genes``: the gene set (None: :func:`choose_genes` of ``uncorrected``). ``seed`` seeds
    the ten-start k-means and the PCA; the neighbours use ``random_state=0`` as the
    Benchmarker does, and the one-start k-means is scib-metrics' own (seed 0).
    """

    uncorrected: ad.AnnData
    batch_key: str = "batch"
    label_key: str = "cell_line"
    genes: pd.Index | None = None
    n_top_genes: int = N_TOP_GENES
    n_comps: int = N_COMPS
    seed: int = 0
    _pre: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.genes is None:
            self.genes = choose_genes(self.uncorrected, self.n_top_genes)
        self.genes = pd.Index(self.genes).astype(str)
        missing = self.genes.difference(self.uncorrected.var_names)
        if len(missing):
            raise ValueError(f"{len(missing)} chosen genes are not in the uncorrected data")
        self.batches = self.uncorrected.obs[self.batch_key].astype(str).to_numpy()
        self.labels = self.uncorrected.obs[self.label_key].astype(str).to_numpy()

    def x_pre(self, genes: pd.Index | None = None) -> np.ndarray:
        """PCA of the uncorrected data on ``genes`` (default: the whole gene set, the
        reference of every method; cached per gene set)."""
        genes = self.genes if genes is None else genes
        key = tuple(genes)
        if key not in self._pre:
            self._pre[key] = pca(_dense(self.uncorrected[:, genes].X), self.n_comps, self.seed)
        return self._pre[key]

    def representation(self, output: Any) -> tuple[np.ndarray, pd.Index, dict[str, float]]:
        """(what is scored, the genes it was scored on, counts): the PCA of a matrix's
        genes in the set, an embedding as it is (the whole set as its genes)."""
        kind, data = _as_output(output, self.uncorrected.obs_names)
        if kind == "embedding":
            info = {"n_genes_scored": np.nan, "n_genes_missing": np.nan}
            return np.asarray(data, dtype=np.float32), self.genes, info
        present = self.genes[self.genes.isin(data.columns.astype(str))]
        missing = len(self.genes) - len(present)
        if missing:
            log.warning(
                "the output lacks %d of the %d chosen genes: scored on the %d it has",
                missing, len(self.genes), len(present),
            )  # fmt: skip
        x = data.set_axis(data.columns.astype(str), axis=1)[present].to_numpy(np.float32)
        if not np.isfinite(x).all():
            raise ValueError("the corrected matrix has non-finite values")
        info = {"n_genes_scored": float(len(present)), "n_genes_missing": float(missing)}
        return pca(x, self.n_comps, self.seed), present, info

    def metrics(self, x: np.ndarray, x_pre: np.ndarray) -> dict[str, float]:
        """Every metric of :data:`VARIANTS` on the representation ``x``."""
        return metric_values(x, x_pre, self.batches, self.labels, self.seed)

    def score(self, output: Any) -> tuple[dict[str, float], dict[str, float]]:
        """(metric values, gene counts) of one output."""
        x, _, info = self.representation(output)
        info["n_dims"] = float(x.shape[1])
        return self.metrics(x, self.x_pre()), info


def metric_values(
    x: np.ndarray, x_pre: np.ndarray, batches: np.ndarray, labels: np.ndarray, seed: int = 0
) -> dict[str, float]:
    """scib-metrics' metrics of ``x``, called as its Benchmarker calls them; KMeans NMI/ARI
    under ``KMeans NMI (1)`` / ``(10)`` (starts)."""
    import scib_metrics
    from scib_metrics.nearest_neighbors import pynndescent
    from scib_metrics.utils import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    scib_metrics.settings.verbosity = logging.WARNING
    # A copy, and a copy for each k-means (which centres its input in place): no metric
    # sees another's rounding, and the caller's array is never changed.
    x = np.array(x, dtype=np.float32, order="C", copy=True)
    nn = pynndescent(x, n_neighbors=min(90, x.shape[0] - 1), random_state=0, n_jobs=1)
    nn15, nn50 = (
        nn.subset_neighbors(min(15, nn.indices.shape[1])),
        nn.subset_neighbors(min(50, nn.indices.shape[1])),
    )
    k = len(np.unique(labels))
    v: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v["Isolated labels"] = scib_metrics.isolated_labels(x, labels, batches)
        one = scib_metrics.nmi_ari_cluster_labels_kmeans(x.copy(), labels)
        v["KMeans NMI (1)"], v["KMeans ARI (1)"] = one["nmi"], one["ari"]
        best = KMeans(k, n_init=10, seed=seed).fit(x.copy()).labels_
        v["KMeans NMI (10)"] = normalized_mutual_info_score(
            labels, best, average_method="arithmetic"
        )
        v["KMeans ARI (10)"] = adjusted_rand_score(labels, best)
        v["Silhouette label"] = scib_metrics.silhouette_label(x, labels)
        v["cLISI"] = scib_metrics.clisi_knn(nn, labels)
        v["Silhouette batch"] = scib_metrics.silhouette_batch(x, labels, batches)
        v["BRAS"] = scib_metrics.bras(x, labels, batches)
        v["iLISI"] = scib_metrics.ilisi_knn(nn, batches)
        v["KBET"] = scib_metrics.kbet_per_label(nn50, batches, labels)
        v["Graph connectivity"] = scib_metrics.graph_connectivity(nn15, labels)
        v["PCR comparison"] = scib_metrics.pcr_comparison(x_pre, x, batches, categorical=True)
    return {name: float(value) for name, value in v.items()}


def variant_rows(values: Mapping[str, float], variant: str) -> dict[str, float]:
    """The metrics of one variant under their plain names, with the three aggregates."""
    silhouette, starts = VARIANTS[variant]
    batch = {silhouette: values[silhouette], **{m: values[m] for m in BATCH_METRICS}}
    bio = {
        "Isolated labels": values["Isolated labels"],
        "KMeans NMI": values[f"KMeans NMI ({starts})"],
        "KMeans ARI": values[f"KMeans ARI ({starts})"],
        **{m: values[m] for m in BIO_METRICS if m != "Isolated labels"},
    }
    batch_score = float(np.nanmean(list(batch.values())))
    bio_score = float(np.nanmean(list(bio.values())))
    return {
        **bio,
        **batch,
        "Batch correction": batch_score,
        "Bio conservation": bio_score,
        "Total": BATCH_WEIGHT * batch_score + BIO_WEIGHT * bio_score,
    }


def score_outputs(
    uncorrected: ad.AnnData,
    outputs: Mapping[str, Any],
    batch_key: str = "batch",
    label_key: str = "cell_line",
    *,
    task: str = "",
    run_seed: int = 0,
    scorer: Scorer | None = None,
    **settings: Any,
) -> pd.DataFrame:
    """Score each output (name -> output) on one gene set; long format :data:`LONG_COLUMNS`.

    Each method has the rows of every variant of :data:`VARIANTS` and ``variant="info"``
    rows: ``n_genes_chosen``, ``n_genes_scored`` and ``n_genes_missing`` (NaN for an
    embedding) and ``n_dims``. ``run_seed`` is the seed the outputs were made with (a
    column, not a setting); ``settings`` go to :class:`Scorer`.
    """
    scorer = scorer or Scorer(uncorrected, batch_key, label_key, **settings)
    rows = []
    for method, output in outputs.items():
        values, info = scorer.score(output)
        info = {"n_genes_chosen": float(len(scorer.genes)), **info}
        rows += [(task, method, run_seed, "info", k, x) for k, x in info.items()]
        for variant in VARIANTS:
            rows += [
                (task, method, run_seed, variant, k, x)
                for k, x in variant_rows(values, variant).items()
            ]
    return pd.DataFrame(rows, columns=LONG_COLUMNS)


def totals(long: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, method, seed, variant): batch, bio, total."""
    agg = long[long["metric"].isin(["Batch correction", "Bio conservation", "Total"])]
    wide = agg.pivot_table(
        index=["task", "method", "seed", "variant"], columns="metric", values="value", sort=False
    )
    wide = wide.rename(
        columns={"Batch correction": "batch", "Bio conservation": "bio", "Total": "total"}
    )
    return wide[["batch", "bio", "total"]].reset_index()


def score_directory(outputs: Path, task: str, seed: int) -> pd.DataFrame:
    """Score ``outputs``/<task>/seed<seed>/*.h5ad against ``outputs``/<task>/lognorm.h5ad."""
    uncorrected = ad.read_h5ad(outputs / task / "lognorm.h5ad")
    results = {
        p.stem: ad.read_h5ad(p) for p in sorted((outputs / task / f"seed{seed}").glob("*.h5ad"))
    }
    return score_outputs(uncorrected, results, task=task, run_seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=Path, default=OUTPUTS)
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--tsv", type=Path, required=True, help="long TSV to write")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parts = []
    for task in args.tasks:
        for seed in args.seeds:
            parts.append(score_directory(args.outputs, task, seed))
            print(totals(parts[-1]).round(3).to_string(index=False), flush=True)
    long = pd.concat(parts, ignore_index=True)
    long.to_csv(args.tsv, sep="\t", index=False)
    totals(long).to_csv(args.tsv.with_suffix(".totals.tsv"), sep="\t", index=False)


if __name__ == "__main__":
    main()
