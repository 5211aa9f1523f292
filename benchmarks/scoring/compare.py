"""The workflow's metric and the independent scorer on the same outputs, and why they differ.

For each task and seed of ``--outputs`` (made by ``produce.py``), every output is scored
four ways:

* ``W_own``: the workflow's :func:`locusformer.scoring.metrics.score_method` as the
  workflow runs it (the method's own genes: the batch-aware HVGs of normalize; PCA with
  the ``n_pcs`` rule; exact kNN; BRAS; scikit-learn k-means, best of ten starts);
* ``W_one``: the same code on one gene set chosen from the uncorrected data (the
  independent scorer's, intersected with the method's genes; the uncorrected reference of
  PCR comparison cut to the same genes);
* ``I_one``: the independent scorer (``independent.py``) as it is, with one more value,
  ``PCR comparison (genes scored)``: against the uncorrected PCA on the genes ``W_one``
  takes as its reference (the set's genes that the workflow's outputs have), not the whole
  set;
* ``I_own``: the independent scorer on the workflow's genes (the method's own).

``uncorrected_full`` (the log-normalized data themselves, every chosen gene) is scored by
the independent scorer only. No scoring may change an output (checked): scib-metrics'
k-means centres its input in place, and KBET moved by 0.06 when an embedding had been
through it (float32 rounding).

On both workflow scorings it also computes, on the very representation the workflow scores,
scib-metrics' ``silhouette_batch`` and k-means NMI/ARI from one start and from the best of
ten of scib-metrics' own k-means (``extra`` metrics), so that one thing at a time can be
swapped. Writes ``--outputs``/compare.tsv (task, method, seed, scorer, metric, value) and
prints, with ``--table``, the side-by-side table and the step table.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scoring/compare.py --tasks mixture --seeds 0
    .venv/bin/python benchmarks/scoring/compare.py --table --steps-task mixture
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from independent import OUTPUTS, VARIANTS, Scorer, variant_rows

COLUMNS = ["task", "method", "seed", "scorer", "metric", "value"]
METHODS = ("locusformer", "locusformer_latent", "sysvi", "scvi", "combat", "harmony", "uncorrected")
SCORERS = ("W_own", "W_one", "I_one", "I_own")
WORKFLOW_BATCH = ("BRAS", "iLISI", "KBET", "Graph connectivity", "PCR comparison")
WORKFLOW_BIO = ("Isolated labels", "KMeans NMI", "KMeans ARI", "Silhouette label", "cLISI")


def workflow_scores(
    result: ad.AnnData, uncorrected: ad.AnnData, genes: pd.Index | None, seed: int
) -> dict[str, float]:
    """The workflow's metrics of ``result`` (on ``genes`` of it and of ``uncorrected`` when
    given), with the extra scib-metrics values on the same representation."""
    import scib_metrics
    from scib_metrics.utils import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from locusformer.pp.pca import n_pcs
    from locusformer.scoring.metrics import score_method, scoring_representation

    is_uncorrected = result is uncorrected
    if genes is not None:
        uncorrected = uncorrected[:, uncorrected.var_names.isin(genes)].copy()
        if is_uncorrected:
            result = uncorrected
        elif result.uns.get("representation") == "matrix":
            result = result[:, result.var_names.isin(genes)].copy()
    df = score_method(result, uncorrected, "batch", "cell_line", seed=seed)
    v = dict(zip(df["metric"], df["value"].astype(float), strict=True))
    x = scoring_representation(result, seed)
    labels = result.obs["cell_line"].astype(str).to_numpy()
    batches = result.obs["batch"].astype(str).to_numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v["extra Silhouette batch"] = float(scib_metrics.silhouette_batch(x, labels, batches))
        one = scib_metrics.nmi_ari_cluster_labels_kmeans(x.copy(), labels)
        best = KMeans(len(np.unique(labels)), n_init=10, seed=seed).fit(x.copy()).labels_
    v["extra KMeans NMI (1)"], v["extra KMeans ARI (1)"] = one["nmi"], one["ari"]
    v["extra KMeans NMI (10)"] = normalized_mutual_info_score(labels, best)
    v["extra KMeans ARI (10)"] = adjusted_rand_score(labels, best)
    v["n_dims"] = float(x.shape[1])
    if result.uns.get("representation") == "matrix":
        v["n_genes"] = float(result.n_vars)
        v["n_pcs rule"] = float(n_pcs(result.n_obs, result.n_vars))
    return v


def _fingerprint(result: ad.AnnData) -> bytes:
    from locusformer.io.results import EMBEDDING_KEY

    x = result.obsm[EMBEDDING_KEY] if EMBEDDING_KEY in result.obsm else result.X
    return np.ascontiguousarray(x).tobytes()


def score_task(
    outputs: Path, task: str, seed: int, scorers: tuple[str, ...] = SCORERS
) -> pd.DataFrame:
    """Every output of ``task`` and ``seed`` (the :data:`METHODS` ``produce.py`` wrote),
    scored by ``scorers``: the side-by-side table needs ``W_own`` and ``I_one``, the step
    table all four."""
    import scib_metrics

    lognorm = ad.read_h5ad(outputs / task / "lognorm.h5ad")
    where = outputs / task / f"seed{seed}"
    files = {m: where / f"{m}.h5ad" for m in METHODS}
    results = {m: ad.read_h5ad(f) for m, f in files.items() if f.exists()}
    uncorrected = results["uncorrected"]
    one = Scorer(lognorm, "batch", "cell_line", seed=0)
    own = Scorer(lognorm, "batch", "cell_line", genes=uncorrected.var_names, seed=0)
    # W_one's reference genes: the set's genes that the workflow's outputs have
    w_one_genes = one.genes[one.genes.isin(uncorrected.var_names)]
    rows = []

    def add(method: str, scorer: str, values: dict[str, float]) -> None:
        rows.extend((task, method, seed, scorer, k, float(x)) for k, x in values.items())

    for method, result in results.items():
        before = _fingerprint(result)
        if "W_own" in scorers:
            add(method, "W_own", workflow_scores(result, uncorrected, None, seed))
        if "W_one" in scorers:
            add(method, "W_one", workflow_scores(result, uncorrected, one.genes, seed))
        if "I_one" in scorers:
            values, info = one.score(result)
            x, _, _ = one.representation(result)
            values["PCR comparison (genes scored)"] = float(
                scib_metrics.pcr_comparison(
                    one.x_pre(w_one_genes), x, one.batches, categorical=True
                )
            )
            add(method, "I_one", {**values, **info})
        if "I_own" in scorers:
            values, info = own.score(result)
            add(method, "I_own", {**values, **info})
        if _fingerprint(result) != before:
            raise RuntimeError(f"scoring changed the output of {method}")
        print(f"{task}\tseed {seed}\t{method}\tscored", flush=True)
    values, info = one.score(lognorm)
    add("uncorrected_full", "I_one", {**values, **info})
    return pd.DataFrame(rows, columns=COLUMNS)


# --------------------------------------------------------------------------- tables


def _totals_workflow(v: pd.Series, silhouette: str = "BRAS", kmeans: str = "") -> float:
    """The workflow's total from its metrics, with the batch silhouette and the k-means
    NMI/ARI swapped for ``silhouette`` and ``kmeans`` (``""``: the workflow's own; ``"1"``
    or ``"10"``: scib-metrics' k-means with that many starts)."""
    batch = [v["extra Silhouette batch"] if silhouette != "BRAS" else v["BRAS"]]
    batch += [v[m] for m in WORKFLOW_BATCH[1:]]
    bio = [v["Isolated labels"], v["Silhouette label"], v["cLISI"]]
    if kmeans:
        bio += [v[f"extra KMeans NMI ({kmeans})"], v[f"extra KMeans ARI ({kmeans})"]]
    else:
        bio += [v["KMeans NMI"], v["KMeans ARI"]]
    return 0.4 * float(np.nanmean(batch)) + 0.6 * float(np.nanmean(bio))


def _independent_total(v: pd.Series, variant: str, pcr: str = "PCR comparison") -> float:
    """The independent scorer's total of ``variant``, with PCR comparison taken from
    ``pcr`` (``"PCR comparison (genes scored)"``: against W_one's reference)."""
    return variant_rows({**v.to_dict(), "PCR comparison": v[pcr]}, variant)["Total"]


def side_by_side(long: pd.DataFrame) -> pd.DataFrame:
    """task x method: workflow total, independent totals (each variant), mean over seeds."""
    rows = []
    for (task, method, seed), g in long.groupby(["task", "method", "seed"], sort=False):
        by = {s: sub.set_index("metric")["value"] for s, sub in g.groupby("scorer")}
        workflow = by["W_own"]["Total"] if "W_own" in by else np.nan
        row = {"task": task, "method": method, "seed": seed, "workflow": workflow}
        for variant in VARIANTS:
            row[variant] = _independent_total(by["I_one"], variant)
        row["genes scored"] = by["I_one"].get("n_genes_scored", np.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def _mean_sd(values: pd.Series) -> str:
    values = values.dropna()
    if values.empty:
        return "–"
    if len(values) == 1:
        return f"{values.iloc[0]:.3f}"
    return f"{values.mean():.3f} ± {values.std():.3f}"


def markdown_side_by_side(table: pd.DataFrame) -> str:
    """Mean ± sd over the seeds of each (task, method): the workflow's total and the
    independent scorer's variants, with the seeds and the genes the scorer used."""
    rows = []
    for (task, method), g in table.groupby(["task", "method"], sort=False):
        row = {"task": task, "method": method, "seeds": len(g)}
        row["workflow"] = _mean_sd(g["workflow"])
        row.update({v: _mean_sd(g[v]) for v in VARIANTS})
        genes = g["genes scored"].dropna()
        row["genes scored"] = "embedding" if genes.empty else f"{int(genes.iloc[0])}"
        rows.append(row)
    return pd.DataFrame(rows).to_markdown(index=False)


#: The label-free correctors LocusFormer is measured against (issue 38's bar).
BASELINES = ("sysvi", "scvi", "combat", "harmony")


def margins(table: pd.DataFrame, scorers: tuple[str, ...] = ("workflow", "silhouette_k10")) -> str:
    """Per task and scorer: LocusFormer's mean over the seeds, the best label-free
    baseline's, and the margin between them (issue 38's bar is +0.02)."""
    rows = []
    for task, g in table.groupby("task", sort=False):
        means = g.groupby("method")[list(scorers)].mean()
        row = {"task": task, "seeds": int(g["seed"].nunique())}
        for scorer in scorers:
            present = [m for m in BASELINES if m in means.index]
            best = means.loc[present, scorer].idxmax()
            lf = means.loc["locusformer", scorer]
            row[f"{scorer}: LocusFormer"] = f"{lf:.3f}"
            row[f"{scorer}: best baseline"] = f"{best} {means.loc[best, scorer]:.3f}"
            row[f"{scorer}: margin"] = f"{lf - means.loc[best, scorer]:+.3f}"
        rows.append(row)
    return pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True)


STEPS = (
    "workflow as it runs (own genes, n_pcs rule, BRAS, sklearn k-means best of 10)",
    "one gene set from the uncorrected data (its HVGs, not batch-aware, ∩ the method's)",
    "50 PCs instead of the n_pcs rule",
    "batch silhouette instead of BRAS",
    "scib-metrics' own k-means, best of 10, instead of scikit-learn's",
    "scib-metrics' neighbours (pynndescent), scanpy's PCA, kBET as shipped",
    "one PCR reference for every method: the uncorrected PCA on the whole set = independent",
)


def step_table(long: pd.DataFrame, task: str) -> pd.DataFrame:
    """Cumulative totals from the workflow's scoring to the independent scorer, one change
    at a time (mean over the seeds present), with each change alone from the workflow."""
    sub = long[long["task"] == task]
    out: dict[str, list[float]] = {}
    alone: dict[str, list[float]] = {}
    for (method, _seed), g in sub.groupby(["method", "seed"], sort=False):
        by = {s: x.set_index("metric")["value"] for s, x in g.groupby("scorer")}
        if not set(SCORERS) <= set(by):  # scored for the side-by-side table only
            continue
        w_own, w_one, i_one, i_own = by["W_own"], by["W_one"], by["I_one"], by["I_own"]
        # The n_pcs rule gives min(50, n - 1, genes - 1): 50 on these tasks (checked), so
        # scoring 50 PCs instead changes nothing.
        for v in (w_own, w_one):
            if v.get("n_pcs rule", 50) != 50:
                raise ValueError(f"{method}: the n_pcs rule gives {v['n_pcs rule']}, not 50")
        path = [
            w_own["Total"],
            w_one["Total"],
            w_one["Total"],
            _totals_workflow(w_one, "silhouette"),
            _totals_workflow(w_one, "silhouette", "10"),
            _independent_total(i_one, "silhouette_k10", "PCR comparison (genes scored)"),
            _independent_total(i_one, "silhouette_k10"),
        ]
        out.setdefault(method, []).append(path)
        single = [
            w_one["Total"] - w_own["Total"],
            0.0,
            _totals_workflow(w_own, "silhouette") - w_own["Total"],
            _totals_workflow(w_own, "BRAS", "10") - w_own["Total"],
            _independent_total(i_own, "bras_k10") - _totals_workflow(w_own, "BRAS", "10"),
            _independent_total(i_one, "silhouette_k10")
            - _independent_total(i_one, "silhouette_k10", "PCR comparison (genes scored)"),
            _independent_total(i_one, "silhouette_k1")
            - _independent_total(i_one, "silhouette_k10"),
        ]
        alone.setdefault(method, []).append(single)
    rows = []
    for i, step in enumerate(STEPS):
        row = {"step": f"{i}. {step}" if i else step}
        for method, paths in out.items():
            mean = np.mean([p[i] for p in paths])
            delta = np.mean([p[i] - p[i - 1] for p in paths]) if i else np.nan
            row[method] = f"{mean:.3f}" + (f" ({delta:+.3f})" if i else "")
        rows.append(row)
    alone_names = (
        "alone: one gene set",
        "alone: 50 PCs",
        "alone: batch silhouette",
        "alone: scib-metrics' k-means (10)",
        "alone: neighbours/PCA/kBET code",
        "alone: one PCR reference (in the independent scorer)",
        "aside: one k-means start instead of ten (independent)",
    )
    for i, name in enumerate(alone_names):
        row = {"step": name}
        for method, deltas in alone.items():
            row[method] = f"{np.mean([d[i] for d in deltas]):+.3f}"
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=Path, default=OUTPUTS)
    parser.add_argument("--tasks", nargs="+", default=["mixture"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--table", action="store_true", help="print the tables and stop")
    parser.add_argument("--steps-task", nargs="*", default=["mixture"])
    parser.add_argument(
        "--scorers", nargs="+", choices=SCORERS, default=list(SCORERS),
        help="W_own and I_one make the side-by-side table; the step table needs all four",
    )  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    path = args.outputs / "compare.tsv"
    if not args.table:
        for task in args.tasks:
            for seed in args.seeds:
                part = score_task(args.outputs, task, seed, tuple(args.scorers))
                if path.exists():  # one row set per (task, seed): a rerun replaces its own
                    old = pd.read_csv(path, sep="\t")
                    old = old[~((old["task"] == task) & (old["seed"] == seed))]
                    part = pd.concat([old, part], ignore_index=True)
                part.to_csv(path, sep="\t", index=False)
    long = pd.read_csv(path, sep="\t")
    table = side_by_side(long)
    print(markdown_side_by_side(table))
    print("\n#### LocusFormer against the best label-free baseline\n")
    print(margins(table))
    for task in args.steps_task:
        if task in set(long["task"]):
            print(f"\n#### steps on {task}\n")
            print(step_table(long, task).to_markdown(index=False))


if __name__ == "__main__":
    main()
