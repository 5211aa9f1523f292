"""What the reports show, assembled from the workflow's outputs: one dict per section.

Each section reads its input (stats, loci, history, integration results, metrics,
benchmarks, the design check; the attention's section is
:mod:`locusformer.report.attention`) and returns what its template needs, with
``available`` False when the input was not given; a figure comes drawn by
:mod:`locusformer.report.figures`. A file that cannot be read is an
:class:`~locusformer.errors.InputError` naming it, before any report is written.
:func:`verdict` decides which method a dataset's scores crown, for the dataset report and
the index alike.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from locusformer.errors import InputError, one_line
from locusformer.pp.pca import pca
from locusformer.report.figures import (
    embedding_figure,
    history_figure,
    legend_figure,
    loci_figure,
    runtime_figure,
    scores_figure,
)
from locusformer.train.alignment import NEVER_COMPARED, never_compared

#: What the training section says of a run trained without the adversary whose latent
#: clusters never held two batches: the shared check keeps such a run
#: (``training.shared_check``), or the user asked for no adversary.
KEPT_APART = (
    "the run was trained without the adversary, and no latent cluster held a fair share of "
    "two batches in any epoch: nothing the run found says the batches share biology, so "
    "the differences between them are kept; if they are technical, "
    "training.shared_check: false trains with the adversary"
)
#: embedding plots use UMAP from this many samples on, the first two PCs below it
UMAP_MIN_SAMPLES = 200
#: the embedding plots show at most this many samples, the same for every method (at 1M
#: samples, with a PCA and a UMAP per method of the 50,000 scored, the report took 475 s)
EMBEDDING_MAX_SAMPLES = 10_000

PathLike = str | os.PathLike
Paths = PathLike | Sequence[PathLike]


# --------------------------------------------------------------------------- helpers


def _chrom_key(chrom: str) -> tuple[int, int, str]:
    c = re.sub(r"^chr", "", str(chrom), flags=re.IGNORECASE)
    if c.isdigit():
        return (0, int(c), "")
    order = {"X": 1, "Y": 2, "M": 3, "MT": 3}
    return (1, order.get(c.upper(), 9), c)


def _read_table(path: PathLike, what: str) -> pd.DataFrame:
    try:
        return pd.read_csv(path, sep="\t")
    except Exception as exc:
        raise InputError(path, f"cannot read {what}: {one_line(exc)}") from exc


# --------------------------------------------------------------------------- sections


def summary_section(
    stats_json: PathLike | None, obs: pd.DataFrame | None, batch_key: str, label_key: str | None
) -> dict:
    """Samples, genes, samples per batch and label, and the batch x label table.

    From preprocessing's ``stats.json`` and, where they tell more, the samples' ``obs``.
    """
    section: dict[str, Any] = {
        "available": False,
        "stats": {},
        "per_batch": [],
        "per_label": [],
        "dropped": [],
        "crosstab": None,
    }
    if stats_json is not None:
        try:
            stats = json.loads(Path(stats_json).read_text(encoding="utf-8"))
        except Exception as exc:
            raise InputError(stats_json, f"cannot read dataset stats: {one_line(exc)}") from exc
        if not isinstance(stats, dict):
            raise InputError(stats_json, "dataset stats must be a JSON object")
        section["available"] = True
        section["stats"] = {
            "Samples": stats.get("n_samples"),
            "Genes in the input": stats.get("n_genes_input"),
            "Genes kept": stats.get("n_genes_kept"),
            "Value type": stats.get("value_type"),
        }
        section["per_batch"] = sorted((stats.get("samples_per_batch") or {}).items())
        section["per_label"] = sorted((stats.get("samples_per_label") or {}).items())
        section["dropped"] = list((stats.get("genes_dropped") or {}).items())
    if obs is not None and batch_key in obs.columns:
        section["available"] = True
        if not section["per_batch"]:
            section["per_batch"] = sorted(obs[batch_key].astype(str).value_counts().items())
        if label_key is not None and label_key in obs.columns:
            tab = pd.crosstab(obs[batch_key].astype(str), obs[label_key].astype(str))
            section["crosstab"] = {
                "labels": [str(c) for c in tab.columns],
                "rows": [
                    (str(b), [int(v) for v in row])
                    for b, row in zip(tab.index, tab.to_numpy(), strict=True)
                ],
            }
    return section


def loci_section(loci_parquet: PathLike | None) -> dict:
    """How many loci were placed, and on which chromosomes (from ``loci.parquet``)."""
    section: dict[str, Any] = {"available": False}
    if loci_parquet is None:
        return section
    try:
        loci = pd.read_parquet(loci_parquet)
    except Exception as exc:
        raise InputError(loci_parquet, f"cannot read loci: {one_line(exc)}") from exc
    if "chrom" not in loci.columns:
        raise InputError(loci_parquet, "no 'chrom' column")
    chrom = loci["chrom"].fillna("").astype(str)
    placed = loci["placed"].astype(bool) if "placed" in loci.columns else chrom.ne("")
    counts = chrom[placed].value_counts()
    order = sorted(counts.index, key=_chrom_key)
    counts = counts.reindex(order)
    section.update(
        available=True,
        n_loci=len(loci),
        n_placed=int(placed.sum()),
        share_placed=float(placed.mean()) if len(loci) else float("nan"),
        n_chrom=len(order),
        figure=loci_figure(order, counts),
    )
    return section


def history_section(history_tsv: PathLike | None) -> dict:
    """The training history's columns, grouped into losses, accuracies, rates and timings."""
    section: dict[str, Any] = {"available": False}
    if history_tsv is None:
        return section
    hist = _read_table(history_tsv, "training history")
    numeric = hist.apply(pd.to_numeric, errors="coerce")
    x = numeric["epoch"] if "epoch" in numeric.columns else pd.Series(np.arange(len(hist)))
    cols = [c for c in numeric.columns if c != "epoch" and numeric[c].notna().any()]
    lr = [c for c in cols if c.lower() in ("lr", "learning_rate") or c.lower().startswith("lr_")]
    acc = [c for c in cols if "acc" in c.lower() and c not in lr]
    # Schedules, timings and the clusters compared are not losses: their own panel.
    schedule = [
        c for c in cols if c.lower().endswith("_weight") or c in ("seconds", "clusters_compared")
    ]
    loss = [c for c in cols if c not in lr and c not in acc and c not in schedule]
    panels = [
        (title, c)
        for title, c in (
            ("losses", loss),
            ("accuracy", acc),
            ("learning rate", lr),
            ("schedule and epoch time", schedule),
        )
        if c
    ]
    if not panels or len(hist) == 0:
        section["message"] = "the training history has no numeric columns"
        return section
    # A term that is zero at every epoch (switched off, or never acting) is a flat line on
    # the axis that hides the ones that move: named in the caption, not drawn.
    silent = [c for c in cols if (numeric[c].dropna() == 0).all()]
    drawn = [(title, [c for c in c_ if c not in silent]) for title, c_ in panels]
    drawn = [(title, c_) for title, c_ in drawn if c_]
    if not drawn:
        section["message"] = "every column of the training history is zero throughout"
        return section
    figure = history_figure(x, numeric, drawn)
    section.update(available=True, figure=figure, columns=cols, silent=silent, n_epochs=len(hist))
    if "clusters_compared" in hist.columns and never_compared(numeric):
        section["warning"] = _never_compared_warning(numeric)
    return section


def _never_compared_warning(numeric: pd.DataFrame) -> str:
    """The history's warning where the cluster term never acted: without the adversary
    as well (the shared check's choice, or the user's), the batches were kept apart."""
    adversary = numeric.get("adversary_weight")
    alone = adversary is not None and bool((adversary.dropna() == 0).all())
    return KEPT_APART if alone else NEVER_COMPARED.removeprefix("training: ")


def _embedding_coords(
    result, seed: int, mode: str, stored: np.ndarray | None = None
) -> tuple[np.ndarray, str]:
    """2-D coordinates of ``result``'s scored representation (``stored``, the metrics job's,
    when given; else computed as the metrics job computes it) and their axis name."""
    from locusformer.scoring.metrics import scoring_representation

    rep = scoring_representation(result, seed) if stored is None else stored
    # One memory layout either way (sklearn's PCA returns Fortran order, the file C order):
    # the 2-D PCA and the neighbour search below then give the same plot to the last bit.
    rep = np.ascontiguousarray(rep)
    n = rep.shape[0]
    use_umap = mode == "umap" or (mode == "auto" and n >= UMAP_MIN_SAMPLES)
    if use_umap and n > 3:
        import anndata as ad
        import scanpy as sc

        from locusformer.scoring.neighbors import cache_numba_compilation

        cache_numba_compilation()
        tmp = ad.AnnData(X=np.zeros((n, 1), dtype=np.float32))
        tmp.obsm["X_rep"] = rep
        # Exact kNN, scanpy's own choice below 4,096 samples (the same plots there): above
        # it scanpy's pynndescent path fails with this scipy ('csr_array' has no getnnz).
        k = min(15, n - 1)
        sc.pp.neighbors(tmp, k, use_rep="X_rep", random_state=seed, transformer="sklearn")
        sc.tl.umap(tmp, random_state=seed)
        return np.asarray(tmp.obsm["X_umap"]), "UMAP"
    if rep.shape[1] <= 2:
        coords = rep if rep.shape[1] == 2 else np.column_stack([rep[:, 0], np.zeros(n)])
        return coords, "dim"
    return pca(rep, 2, seed), "PC"


def embedding_subsample(
    integrated: Mapping[str, PathLike],
    batch_key: str,
    label_key: str | None,
    max_samples: int,
    seed: int,
) -> tuple[pd.Index | None, str]:
    """The samples the plots show (``None``: all) and the sentence that says so ("" for all).

    Above ``max_samples``, the stratified subsample the metrics job scores
    (:func:`~locusformer.scoring.subsample.scoring_subsample` of the uncorrected result's sample
    table, else the first method's, with the same seed), so that the plots show samples
    the scores were computed on; of those (or of all samples, below ``max_samples``) at most
    :data:`EMBEDDING_MAX_SAMPLES`, drawn the same way: a UMAP of more shows no more, and
    would not finish on an atlas.
    """
    from locusformer.scoring.result_rows import open_result
    from locusformer.scoring.subsample import scoring_subsample

    first = "uncorrected" if "uncorrected" in integrated else next(iter(integrated))
    obs = open_result(integrated[first]).obs  # the sample table only; matrices stay on disk
    scored = scoring_subsample(obs, batch_key, label_key, max_samples, seed)
    pool = obs if scored is None else obs.loc[scored]
    shown = scoring_subsample(pool, batch_key, label_key, EMBEDDING_MAX_SAMPLES, seed)
    keep = scored if shown is None else shown
    if keep is None:
        return None, ""
    labelled = label_key is not None and label_key in obs and obs[label_key].nunique() > 1
    how = f"by {'batch and label' if labelled else 'batch'}, seed {seed}"
    if scored is None:
        return keep, (
            f"A stratified subsample of {len(keep):,} of the {len(obs):,} samples ({how}), "
            "the same for every method; the scores were computed on all of them."
        )
    if shown is None:
        return keep, (
            f"Drawn from the stratified subsample the scores were computed on: "
            f"{len(keep):,} of {len(obs):,} samples ({how})."
        )
    return keep, (
        f"Drawn from the stratified subsample the scores were computed on: {len(keep):,} "
        f"of its {len(scored):,} samples, of {len(obs):,} in all ({how})."
    )


def embedding_section(
    integrated: Mapping[str, PathLike],
    batch_key: str,
    label_key: str | None,
    seed: int,
    mode: str,
    max_samples: int | None = None,
    representations: PathLike | None = None,
) -> tuple[dict, Any]:
    """One embedding plot per method of ``integrated`` (method -> result h5ad), and an obs.

    ``uncorrected`` comes first; a failed method (or one that cannot be plotted) gets its
    error instead of a plot. Also returns the obs of ``uncorrected`` (else of the first
    method), for the summary's batch x label table. Above ``max_samples`` samples
    (default :data:`~locusformer.scoring.subsample.DEFAULT_MAX_SAMPLES`) each plot shows the
    scored subsample, and above :data:`EMBEDDING_MAX_SAMPLES` that many of it or of all
    (:func:`embedding_subsample`); then only those rows are read, and each method's PCA
    and UMAP are of those rows. ``representations`` (the ``metrics`` job's file) gives the
    representation of a method as scored, so that its PCA is not computed again
    (:func:`~locusformer.scoring.representations.stored_representation`). The plots are
    small and carry no legend, for the report to set several per row; the section's
    ``legend`` gives their colours once (:func:`_draw_embeddings`).
    """
    from locusformer.scoring.representations import read_representations, stored_representation
    from locusformer.scoring.result_rows import open_result, read_result, take
    from locusformer.scoring.subsample import DEFAULT_MAX_SAMPLES

    limit = DEFAULT_MAX_SAMPLES if max_samples is None else max_samples
    keep, sentence = embedding_subsample(integrated, batch_key, label_key, limit, seed)
    scored = read_representations(representations)
    plots = []
    names: dict[str, str] = {}
    obs = None
    methods = sorted(integrated, key=lambda m: (m != "uncorrected",))
    for method in methods:
        # up to the limit read whole, as always; above it the matrices stay on disk
        result = (
            read_result(integrated[method]) if keep is None else open_result(integrated[method])
        )
        if result.uns.get("display_name"):  # combat_mod: says which labels it kept
            names[method] = str(result.uns["display_name"])
        if method == "uncorrected" or obs is None:
            obs = result.obs
        status = str(result.uns.get("status", "ok"))
        if status != "ok":
            plots.append(
                {"method": method, "failed": True, "error": str(result.uns.get("error", "failed"))}
            )
            continue
        try:
            shown = result if keep is None else take(result, keep, method)
            stored = stored_representation(scored, method, shown.obs_names)
            coords, axis = _embedding_coords(shown, seed, mode, stored)
        except Exception as exc:
            plots.append(
                {"method": method, "failed": True, "error": f"cannot plot: {one_line(exc)}"}
            )
            continue
        keys = [batch_key] + ([label_key] if label_key and label_key in shown.obs else [])
        plots.append(
            {
                "method": method,
                "failed": False,
                "drawing": (coords, shown.obs[keys].copy(), keys, axis),
                "axis": "UMAP" if axis == "UMAP" else "PCA",
            }
        )
    section = {"available": bool(plots), "plots": plots, "names": names, "subsample": sentence}
    section["legend"] = _draw_embeddings(plots)
    return section, obs


def _draw_embeddings(plots: list[dict]) -> str | None:
    """Draw each plot's figure; return the legend they share (None when none is drawn).

    Every method's batch (and label) column is given the same categories, the union over
    the methods in sorted order, so that a batch has one colour in every panel and one
    legend figure explains them all.
    """
    drawn = [p for p in plots if not p["failed"]]
    if not drawn:
        return None
    categories: dict[str, list[str]] = {}
    for plot in drawn:
        _, obs, keys, _ = plot["drawing"]
        for key in keys:
            seen = categories.setdefault(key, [])
            seen.extend(set(obs[key].astype(str)) - set(seen))
    categories = {key: sorted(values) for key, values in categories.items()}
    for plot in drawn:
        coords, obs, keys, axis = plot.pop("drawing")
        for key in keys:
            obs[key] = pd.Categorical(obs[key].astype(str), categories=categories[key])
        plot["figure"] = embedding_figure(coords, obs, keys, plot["method"], axis)
    return legend_figure(categories)


def verdict(scores: pd.DataFrame) -> dict | None:
    """Which method a dataset's scores crown, the sentence that says so, and its margin.

    ``scores`` has one row per method with ``method``, ``total`` and ``status``. A
    correction is crowned only when its total is above that of ``uncorrected``: a method
    that scores below leaving the data as they are is never called the best, and when no
    correction beats the uncorrected data the verdict says that leaving them uncorrected
    scored best (a tie goes to the uncorrected data too: correcting gained nothing). This
    matters most in a confounded design, where a correction can remove biology. None
    when no method has a total.

    ``runner_up`` is the method with the next total after the crowned one (the best
    correction when the uncorrected data are crowned), ``margin`` the crowned total minus
    its total, and ``margin_sentence`` says so ("" when no other method has a total).
    """
    ok = scores[(scores["status"] == "ok") & np.isfinite(scores["total"].astype(float))]
    if ok.empty:
        return None
    totals = ok.set_index(ok["method"].astype(str))["total"].astype(float)
    totals = totals[~totals.index.duplicated()]
    uncorrected = totals.get("uncorrected")
    corrections = totals.drop("uncorrected", errors="ignore")
    best = str(corrections.idxmax()) if len(corrections) else None
    best_total = float(corrections.max()) if len(corrections) else None
    out = {
        "uncorrected_total": None if uncorrected is None else float(uncorrected),
        "best_correction": best,
        "best_correction_total": best_total,
    }
    if uncorrected is None:
        sentence = (
            f"{best} scored best (total {best_total:.3f}); the uncorrected data have no total."
        )
        out.update(crowned=best, uncorrected_best=False, sentence=sentence)
    elif best is None or best_total <= uncorrected + 1e-12:
        sentence = f"Leaving the data uncorrected scored best (total {uncorrected:.3f})"
        sentence += (
            f"; the best correction, {best}, scored {best_total:.3f}."
            if best is not None
            else ": no correction has a score."
        )
        out.update(crowned="uncorrected", uncorrected_best=True, sentence=sentence)
    else:
        sentence = f"{best} scored best (total {best_total:.3f}; uncorrected {uncorrected:.3f})."
        out.update(crowned=best, uncorrected_best=False, sentence=sentence)
    return {**out, **_margin(totals, out["crowned"], best)}


def _margin(totals: pd.Series, crowned: str, best: str | None) -> dict:
    """The crowned method's lead over the runner-up, in Total, and the sentence saying it."""
    others = totals.drop(crowned)
    if crowned == "uncorrected":
        others = others.drop([m for m in others.index if m != best])
    if others.empty:
        return {"runner_up": None, "runner_up_total": None, "margin": None, "margin_sentence": ""}
    runner_up = str(others.idxmax())
    margin = float(totals[crowned] - others.max())
    whom = "the best correction" if crowned == "uncorrected" else "the runner-up"
    lead = "the uncorrected data lead" if crowned == "uncorrected" else f"{crowned} leads"
    sentence = (
        f"Margin: {lead} {whom}, {runner_up} (total {float(others.max()):.3f}), "
        f"by {margin:.3f} in Total."
    )
    return {
        "runner_up": runner_up,
        "runner_up_total": float(others.max()),
        "margin": margin,
        "margin_sentence": sentence,
    }


def seeds_sentence(seed: int | None, spread: Mapping[str, Sequence[float]] | None = None) -> str:
    """How many seeds the scores rest on, and how far the totals moved between them.

    A report is one run: without ``spread`` it says so ("one seed"), since a margin is only
    a difference once it exceeds what another seed would move. ``spread`` maps a method to
    its totals over several seeds' runs (:func:`seed_spread`); the sentence then gives each
    method's range.
    """
    which = f" (seed {seed})" if seed is not None else ""
    if not spread:
        return (
            f"These scores come from one seed{which}: how far another seed would move them "
            "is not known from this run, so read a small margin as no difference until "
            "other seeds confirm it."
        )
    n = max(len(v) for v in spread.values())
    ranges = "; ".join(
        f"{method} {min(values):.3f} to {max(values):.3f}"
        for method, values in spread.items()
        if len(values)
    )
    this = f"; this report shows seed {seed}" if seed is not None else ""
    return f"Over {n} seeds{this}, Total ranged: {ranges}."


def seed_spread(metrics_tsvs: Sequence[PathLike], methods: Sequence[str]) -> dict[str, list[float]]:
    """Each of ``methods``' Totals over several runs' metrics tables (one per seed).

    A method failed or missing in a run has no Total from it; the tables are read as the
    report reads its own (:func:`~locusformer.scoring.tables.read_metrics`).
    """
    from locusformer.scoring.tables import method_scores, read_metrics

    spread: dict[str, list[float]] = {str(m): [] for m in methods}
    for path in metrics_tsvs:
        long = read_metrics(path)
        scores = method_scores(long[long["type"] != "subsample"]).set_index("method")
        for method in spread:
            if method in scores.index and scores.loc[method, "status"] == "ok":
                total = float(scores.loc[method, "total"])
                if np.isfinite(total):
                    spread[method].append(total)
    return spread


def bio_losses(scores: pd.DataFrame, names: Mapping[str, str] | None = None) -> list[dict]:
    """The methods whose bio conservation falls below the uncorrected data's, with a sentence.

    ``scores`` is :func:`~locusformer.scoring.tables.method_scores` indexed by method.
    A correction that keeps less of the biology than no correction at all has removed
    biology along with the batch, whatever its batch score (and Total) says.
    """
    names = dict(names or {})
    ok = scores[scores["status"] == "ok"]
    if "uncorrected" not in ok.index or not np.isfinite(ok.loc["uncorrected", "bio"]):
        return []
    floor = float(ok.loc["uncorrected", "bio"])
    out = []
    for method, bio in ok["bio"].drop("uncorrected").items():
        if np.isfinite(bio) and bio < floor - 1e-12:
            name = names.get(method, method)
            out.append(
                {
                    "method": str(method),
                    "bio": float(bio),
                    "uncorrected_bio": floor,
                    "sentence": (
                        f"{name} kept less biology than no correction: bio conservation "
                        f"{bio:.3f}, below the uncorrected data's {floor:.3f}. It removed "
                        "biological signal along with the batch effect."
                    ),
                }
            )
    return out


def confounding_section(confounding_json: PathLike | None) -> dict:
    """The design check of :mod:`locusformer.scoring.confounding`, with its top PCs tabled."""
    from locusformer.scoring.confounding import read_confounding

    if confounding_json is None:
        return {"available": False}
    check = read_confounding(confounding_json)
    pcs = check.get("pca") or {}
    per = pcs.get("r2_per_pc") or []
    var = pcs.get("variance_per_pc") or []
    total_var = sum(v for v in var if v is not None)
    pc_rows = [
        {
            "pc": i + 1,
            "r2": r2,
            "share": (v / total_var) if v is not None and total_var > 0 else None,
        }
        for i, (r2, v) in enumerate(zip(per, var, strict=False))
    ][:10]
    return {
        "available": True,
        "level": check["level"],
        "reasons": [str(r) for r in check.get("reasons", [])],
        "sentences": [str(r) for r in check.get("sentences", [])],
        "labels": check.get("labels"),
        "pca": pcs,
        "pc_rows": pc_rows,
        "batch_dominated": bool(check.get("batch_dominated")),
        "thresholds": check.get("thresholds") or {},
    }


def mapping_section(mapping_json: PathLike | None) -> dict:
    """Which trained model a mapped dataset went onto and which of its batches were new
    (the ``mapping.json`` of ``locusformer map``); not available for a trained dataset."""
    if mapping_json is None:
        return {"available": False}
    try:
        with open(mapping_json, encoding="utf-8") as handle:
            record = json.load(handle)
        model, genes = record["model"], record["genes"]
        return {
            "available": True,
            "model": str(model.get("name") or Path(model["weights"]).parent),
            "trained_batches": [str(b) for b in record["trained_batches"]],
            "new_batches": [str(b) for b in record["new_batches"]],
            "adapted": bool(record["adapted"]),
            "adapt_epochs": int(record.get("adapt_epochs", 0)),
            "n_model_loci": int(genes["n_model_loci"]),
            "n_present": int(genes["n_present"]),
            "n_missing": int(genes["n_missing"]),
        }
    except (OSError, ValueError) as exc:
        raise InputError(mapping_json, f"cannot read the mapping report: {one_line(exc)}") from None
    except (KeyError, TypeError) as exc:
        raise InputError(mapping_json, f"not a mapping report (no {one_line(exc)})") from None


def subsample_sentence(long: pd.DataFrame) -> str:
    """What the ``subsample`` rows of a metrics table say, in one sentence ("" without them).

    The strata are (batch, label) exactly when the methods were scored with labels (a
    label column of two values or more; one value stratifies as the batch alone), which
    the bio metrics' names tell.
    """
    from locusformer.scoring.subsample import SUBSAMPLE_METRICS
    from locusformer.scoring.tables import BIO_METRICS

    rows = long[long["type"] == "subsample"]
    if rows.empty:
        return ""
    by_method = rows.pivot_table(index="method", columns="metric", values="value", sort=False)
    by_method = by_method.reindex(columns=list(SUBSAMPLE_METRICS))
    strata = "batch and label" if long["metric"].isin(BIO_METRICS).any() else "batch"
    # One job scores every method on one subsample; tables joined from several runs could
    # differ, and then each subsample is named with its methods.
    groups = by_method.groupby(list(SUBSAMPLE_METRICS), sort=False, dropna=False)
    parts = []
    for (n, total, seed), sub in groups:
        what = f"{_count(n)} of {_count(total)} samples (by {strata}, seed {_count(seed)})"
        parts.append(what if groups.ngroups == 1 else f"{what} for {', '.join(sub.index)}")
    article = "a stratified subsample" if len(parts) == 1 else "stratified subsamples"
    return f"Scored on {article} of {'; '.join(parts)}."


def _count(value: float) -> str:
    return str(int(value)) if np.isfinite(value) else "?"


def metrics_section(
    metrics_tsv: PathLike | None,
    names: Mapping[str, str] | None = None,
    *,
    seed: int | None = None,
    seed_metrics: Sequence[PathLike] | None = None,
) -> dict:
    """The metrics table ranked by total score, the best of each metric, and the verdict.

    ``names`` maps a method to the name the table shows (see :func:`embedding_section`).
    The ``subsample`` rows of methods scored on a subsample are no column of the table but
    the section's ``subsample`` sentence (:func:`subsample_sentence`). The deciding
    columns (:data:`~locusformer.scoring.tables.AGGREGATES`) are shown first, the metrics
    they average after them: ``order`` lists the indices of ``columns`` (and of each row's
    cells, both in the metrics table's order) as the table shows them. ``bio_losses`` are
    the methods that kept less biology than the uncorrected data (:func:`bio_losses`);
    ``seeds`` says how many seeds the scores rest on: this run's ``seed`` alone, or with
    ``seed_metrics``, other seeds' metrics tables of the same dataset, the spread of the
    leading methods' Totals (:func:`seeds_sentence`).
    """
    from locusformer.scoring.tables import AGGREGATES, method_scores, read_metrics, wide_metrics

    # method -> how the table shows it, so that a method that used labels says so
    names = dict(names or {})

    section: dict[str, Any] = {"available": False}
    if metrics_tsv is None:
        return section
    long = read_metrics(metrics_tsv)
    section["subsample"] = subsample_sentence(long)
    long = long[long["type"] != "subsample"]
    if long.empty:
        section["message"] = "the metrics table is empty"
        return section
    wide = wide_metrics(long)
    deciding = [m for m in AGGREGATES if m in wide.columns]
    # the table shows the deciding columns first; ``columns`` and the cells keep the
    # metrics table's order, ``order`` is the order shown (indices into both)
    order = [list(wide.columns).index(m) for m in deciding]
    order += [i for i in range(len(wide.columns)) if i not in order]
    types = dict(zip(long["metric"], long["type"], strict=False))
    scores = method_scores(long).set_index("method")
    ok = scores.index[scores["status"] == "ok"]
    ranked = list(scores.loc[ok].sort_values("total", ascending=False, na_position="last").index)
    losses = bio_losses(scores, names)
    crowned = verdict(scores.reset_index())
    spread = None
    if seed_metrics and crowned is not None:
        leaders = [m for m in (crowned["crowned"], crowned["runner_up"]) if m is not None]
        spread = seed_spread([metrics_tsv, *seed_metrics], leaders)
    section.update(
        available=True,
        columns=[
            {"name": m, "type": types.get(m, ""), "deciding": m in deciding} for m in wide.columns
        ],
        order=order,
        n_deciding=len(deciding),
        rows=_metric_rows(wide, scores, ranked, names, {b["method"] for b in losses}),
        verdict=crowned,
        seeds=seeds_sentence(seed, spread),
        bio_losses=losses,
        # batch vs bio scatter, in the table's order
        scatter=scores_figure(scores.loc[ranked, ["batch", "bio"]].dropna(), names),
        metric_errors=[
            (r.method, r.metric, r.error)
            for r in long.itertuples()
            if r.status == "ok" and isinstance(r.error, str) and r.error
        ],
        n_failed=int((scores["status"] != "ok").sum()),
    )
    return section


def _metric_rows(
    wide: pd.DataFrame,
    scores: pd.DataFrame,
    ranked: Sequence[str],
    names: Mapping[str, str],
    bio_lost: set[str],
) -> list[dict]:
    """The metrics table's rows: the ranked methods with their cells, then the failed ones."""
    ok = list(ranked)
    best = {
        m: (wide.loc[ok, m].max() if ok and wide.loc[ok, m].notna().any() else None)
        for m in wide.columns
    }
    rows = []
    for rank, method in enumerate(ranked, start=1):
        cells = []
        for m in wide.columns:
            v = wide.loc[method, m]
            is_best = best[m] is not None and np.isfinite(v) and v >= best[m] - 1e-12
            cells.append({"value": v, "best": bool(is_best)})
        rows.append(
            {
                "rank": rank,
                "method": names.get(method, method),
                "cells": cells,
                "failed": False,
                "bio_loss": method in bio_lost,
                "error": "",
            }
        )
    for method in scores.index[scores["status"] != "ok"]:
        rows.append(
            {
                "rank": None,
                "method": names.get(method, method),
                "cells": [],
                "failed": True,
                "bio_loss": False,
                "error": scores.loc[method, "error"],
            }
        )
    return rows


def runtime_section(benchmark_files: Mapping[str, Paths] | None) -> dict:
    """Wall time and peak memory of each rule, from its Snakemake benchmark file(s)."""
    from locusformer.scoring.tables import read_benchmark

    section: dict[str, Any] = {"available": False, "rows": []}
    if not benchmark_files:
        return section
    rows = []
    for rule, paths in benchmark_files.items():
        usage = read_benchmark(paths)
        rows.append({"rule": str(rule), **usage})
    section.update(available=True, rows=rows, figure=runtime_figure(rows))
    return section


# --------------------------------------------------------------------------- index


def index_groups(
    summary_tsv: PathLike,
    report_links: Mapping[str, PathLike],
    confounding: Mapping[str, PathLike] | None = None,
) -> list[dict]:
    """One group per dataset for the index: its report's link, rows, verdict and design.

    Per dataset, the method :func:`verdict` crowns is marked (never a correction scoring
    below the uncorrected data); ``confounding`` maps dataset -> its design check
    (:mod:`locusformer.scoring.confounding`). A link that is not a relative path is a ValueError.
    """
    from locusformer.scoring.confounding import read_confounding

    designs = {str(k): read_confounding(v) for k, v in (confounding or {}).items()}
    summary = _read_table(summary_tsv, "summary")
    needed = ["dataset", "method", "batch", "bio", "total", "status"]
    missing = [c for c in needed if c not in summary.columns]
    if missing:
        raise InputError(summary_tsv, f"not a summary table: missing {', '.join(missing)}")
    summary["dataset"] = summary["dataset"].astype(str)
    summary["method"] = summary["method"].astype(str)
    summary["error"] = summary["error"].fillna("").astype(str) if "error" in summary else ""
    for col in ("wall_s", "max_rss_mb"):
        if col not in summary.columns:
            summary[col] = np.nan
    links = {str(k): _href(v) for k, v in report_links.items()}
    datasets = list(dict.fromkeys([*links, *summary["dataset"]]))
    groups = []
    for ds in datasets:
        sub = summary[summary["dataset"] == ds]
        crowned = verdict(sub)
        rows = [
            {
                **rec,
                "best": crowned is not None
                and rec["status"] == "ok"
                and rec["method"] == crowned["crowned"],
            }
            for rec in sub.to_dict("records")
        ]
        design = designs.get(ds)
        groups.append(
            {
                "dataset": ds,
                "href": links.get(ds),
                "rows": rows,
                "verdict": crowned,
                "design": None if design is None else _design_summary(design),
            }
        )
    return groups


def _design_summary(check: Mapping[str, Any]) -> dict:
    labels = check.get("labels") or {}
    pcs = check.get("pca") or {}
    return {
        "level": check["level"],
        "cramers_v": labels.get("cramers_v"),
        "share_labels_one_batch": labels.get("share_labels_one_batch"),
        "weighted_r2": pcs.get("weighted_r2"),
        "n_pcs": pcs.get("n_pcs"),
        "batch_dominated": bool(check.get("batch_dominated")),
        "reasons": [str(r) for r in check.get("reasons", [])],
    }


def _href(path: PathLike) -> str:
    href = str(path).replace(os.sep, "/")
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", href) or href.startswith("//"):
        raise ValueError(f"report links must be relative paths, got {href!r}")
    return urllib.parse.quote(href, safe="/")
