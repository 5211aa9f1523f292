"""From scanpy to LocusFormer and back: the bundled demo as an AnnData, step by step.

    .venv/bin/python docs/tutorial.py                       # the demo (about a minute)
    .venv/bin/python docs/tutorial.py --counts .test/data/tiny_counts.csv.gz \\
        --samples .test/data/tiny_samples.csv --max-epochs 3  # the tests' tiny data

Reads raw counts (genes x cells) and a sample sheet, prepares them the scanpy way, trains
a corrector with :func:`locusformer.fit`, hands the representation the report ranks to
``sc.pp.neighbors`` and ``sc.tl.umap``, and maps a run the model never saw with
:func:`locusformer.map`, whose result keeps the query's own layers and embeddings.
``tests/test_tutorial.py`` runs it on the tiny data.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scanpy as sc

import locusformer as lf

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "resources" / "demo"


def read_demo(counts: Path, samples: Path) -> ad.AnnData:
    """Raw counts as cells x genes, the sample sheet as ``obs``, counts kept in a layer."""
    sep = "\t" if ".tsv" in counts.name else ","
    matrix = pd.read_csv(counts, sep=sep, index_col=0).T  # the file is genes x cells
    sheet = pd.read_csv(samples, sep="\t" if ".tsv" in samples.name else ",", index_col=0)
    adata = ad.AnnData(X=matrix.to_numpy(np.float32), obs=sheet.loc[matrix.index])
    adata.var_names = matrix.columns.astype(str)
    adata.layers["counts"] = adata.X.copy()
    return adata


def prepare(adata: ad.AnnData, n_top_genes: int = 2000) -> ad.AnnData:
    """Log-expression of the most variable genes: what LocusFormer takes in ``X``."""
    sc.pp.filter_genes(adata, min_cells=3)
    sc.pp.normalize_total(adata, target_sum=1e4)
    sc.pp.log1p(adata)
    n_top = min(n_top_genes, adata.n_vars)
    sc.pp.highly_variable_genes(adata, n_top_genes=n_top, batch_key="protocol", subset=True)
    return adata


def hold_out_a_run(adata: ad.AnnData, seed: int = 0) -> tuple[ad.AnnData, ad.AnnData]:
    """Half of the Drop-seq cells become a run the model never sees, as a lab's next one."""
    rng = np.random.default_rng(seed)
    dropseq = np.flatnonzero(adata.obs["protocol"].to_numpy() == "Drop-seq")
    held = np.zeros(adata.n_obs, dtype=bool)
    held[rng.choice(dropseq, size=len(dropseq) // 2, replace=False)] = True
    query = adata[held].copy()
    query.obs["protocol"] = "Drop-seq, next run"
    return adata[~held].copy(), query


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=Path, default=DEMO / "cellbench_counts.tsv.gz")
    parser.add_argument("--samples", type=Path, default=DEMO / "cellbench_samples.tsv")
    parser.add_argument("--max-epochs", type=int, default=None, help="default: the model's")
    parser.add_argument("--umap", type=Path, default=None, help="save the UMAP here (PNG)")
    args = parser.parse_args()

    adata = prepare(read_demo(args.counts, args.samples))
    reference, query = hold_out_a_run(adata)
    query.obsm["X_pca_own"] = sc.pp.pca(query.X, n_comps=5)  # the query's own embedding

    # Genes are placed on the genome from the bundled human table (their ids are Ensembl's).
    model = lf.fit(reference, batch_key="protocol", max_epochs=args.max_epochs, seed=0)
    print(f"trained {len(model.history)} epochs on {reference.n_obs} cells, {model.n_loci} loci")

    out = lf.map(reference, model)
    sc.pp.neighbors(out, use_rep="X_locusformer_pca")  # what the report ranks
    sc.tl.umap(out, random_state=0)
    print(f"UMAP of the corrected data: {out.obsm['X_umap'].shape}")
    if args.umap is not None:
        sc.pl.umap(out, color=["protocol", "cell_line"], show=False, save=None)
        import matplotlib.pyplot as plt

        plt.savefig(args.umap, dpi=80, bbox_inches="tight")

    mapped = lf.map(query, model)
    new = mapped.uns["locusformer"]["mapping"]["new_batches"]
    kept = sorted(set(query.obsm) & set(mapped.obsm)) + sorted(
        set(query.layers) & set(mapped.layers)
    )
    print(f"mapped {mapped.n_obs} cells of the new run {new}; the query's own {kept} kept")


if __name__ == "__main__":
    main()
