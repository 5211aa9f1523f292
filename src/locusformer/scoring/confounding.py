"""How strongly the batch predicts the biology, measured before anything is corrected.

Batch correction removes what the batch explains. When the batch also explains the biology
(every cell type sequenced in its own batch, cases in one batch and controls in another),
the two cannot be told apart and a correction removes biology with the batch effect. This
module measures that on the normalized matrix and the sample sheet:

With a label column (``label_key``, scoring only):

* **Cramér's V** between batch and label, bias-corrected (Bergsma 2013, *J. Korean Stat.
  Soc.* 42: 323-328): 0 when every batch holds the same label mixture, 1 when the label
  decides the batch (each label in one batch only). The uncorrected V is biased upwards in
  small or sparse tables; the correction makes a balanced design read close to 0.
* the **share of labels found in one batch only**, and the share of samples that carry
  such a label.

Without labels (and beside them):

* the **R² of each top principal component on batch** (one-way ANOVA: between-batch sum of
  squares over the total), for the ``n_pcs`` components the metrics use
  (:func:`locusformer.pp.pca.n_pcs`, :func:`locusformer.pp.pca.pca`), summarised as
  the variance-weighted R² over those components: the share of the variance of the main
  axes that batch membership explains. Chance level (no batch effect) is about
  ``(n_batches - 1) / (n_samples - 1)``. This measures how strong the batch effect is; it
  cannot tell a technical effect from biology that differs between batches.

Levels (:func:`design_level`), decided from the labels when there are any:

* ``confounded``: V >= :data:`CONFOUNDED_V` (0.5), or more than half of the labels
  (:data:`CONFOUNDED_SHARE`), or of the samples, are in one batch only. V = 0.5 is a large
  association by Cohen's conventions even for a 2 x 2 table (and larger than "large" for
  bigger tables), and when most labels never meet another batch, no method can learn from
  the data which of their differences are technical: a correction that aligns the batches
  aligns those labels too, and a score that rewards mixed batches rewards removing them.
* ``imbalanced``: V >= :data:`IMBALANCED_V` (0.2), or at least one label in one batch only.
  The batches hold different mixtures: methods that pull every batch onto the same
  distribution (batch means, adversaries) can move a label toward others, and a label seen
  in one batch only is corrected with nothing to compare it with.
* ``balanced``: neither.
* ``unknown``: no usable label (none named, or one value only): confounding cannot be
  measured. When batch explains at least :data:`BATCH_DOMINATED_R2` (half) of the variance
  of the main axes, the design is flagged ``batch_dominated``: if those batches differ in
  biology, correcting will remove it.

These thresholds are conventions chosen to flag designs for a reader, not tests: the
numbers themselves are in the JSON and in the report.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from locusformer.errors import InputError

log = logging.getLogger(__name__)

#: Cramér's V (bias-corrected) from which a design is called confounded
CONFOUNDED_V = 0.5
#: Cramér's V from which a design is called imbalanced
IMBALANCED_V = 0.2
#: share of labels (or of samples) in one batch only above which a design is confounded
CONFOUNDED_SHARE = 0.5
#: variance-weighted R² of the top PCs on batch from which a label-free design is flagged
BATCH_DOMINATED_R2 = 0.5
#: principal components are computed on a seeded subsample of at most this many samples
MAX_PCA_SAMPLES = 20_000
#: labels listed by name in the verdict's sentences
MAX_NAMED = 12

LEVELS: tuple[str, ...] = ("confounded", "imbalanced", "balanced", "unknown")

PathLike = str | os.PathLike


# --------------------------------------------------------------------------- statistics


def contingency(batches: Sequence[object], labels: Sequence[object]) -> pd.DataFrame:
    """Batch x label table of sample counts (labels and batches compared as strings)."""
    b = pd.Series(np.asarray(batches, dtype=object)).astype(str)
    lab = pd.Series(np.asarray(labels, dtype=object)).astype(str)
    if len(b) != len(lab):
        raise ValueError(f"{len(b)} batches but {len(lab)} labels")
    return pd.crosstab(b.rename("batch"), lab.rename("label"))


def cramers_v(table: pd.DataFrame | np.ndarray, bias_corrected: bool = True) -> float:
    """Cramér's V of a contingency table, bias-corrected after Bergsma (2013) by default.

    Parameters
    ----------
    table
        Counts, rows x columns (batches x labels); empty rows and columns are ignored.
    bias_corrected
        Bergsma's correction: ``phi² - (r-1)(c-1)/(n-1)`` (floored at 0) over
        ``min(r~, c~) - 1`` with ``r~ = r - (r-1)²/(n-1)``; else the classic
        ``sqrt(chi² / (n (min(r, c) - 1)))``.

    Returns
    -------
    float
        In [0, 1]; NaN when the table has fewer than two non-empty rows or columns, or too
        few samples for the correction.
    """
    counts = np.asarray(table, dtype=np.float64)
    if counts.ndim != 2:
        raise ValueError(f"a contingency table is 2-dimensional, not {counts.ndim}")
    if (counts < 0).any() or not np.isfinite(counts).all():
        raise ValueError("contingency counts must be finite and non-negative")
    counts = counts[counts.sum(axis=1) > 0][:, counts.sum(axis=0) > 0]
    r, c = counts.shape
    n = counts.sum()
    if r < 2 or c < 2:
        return float("nan")
    expected = np.outer(counts.sum(axis=1), counts.sum(axis=0)) / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    phi2 = chi2 / n
    if not bias_corrected:
        return float(math.sqrt(min(1.0, phi2 / (min(r, c) - 1))))
    if n < 2:
        return float("nan")
    phi2 = max(0.0, phi2 - (r - 1) * (c - 1) / (n - 1))
    r_tilde = r - (r - 1) ** 2 / (n - 1)
    c_tilde = c - (c - 1) ** 2 / (n - 1)
    denominator = min(r_tilde, c_tilde) - 1
    if denominator <= 0:
        return float("nan")
    return float(math.sqrt(min(1.0, phi2 / denominator)))


def single_batch_labels(table: pd.DataFrame) -> dict[str, str]:
    """Labels found in one batch only, each with that batch (table: batches x labels)."""
    present = table > 0
    only = present.sum(axis=0) == 1
    return {str(label): str(present.index[present[label]][0]) for label in table.columns[only]}


def label_statistics(batches: Sequence[object], labels: Sequence[object]) -> dict[str, Any]:
    """Cramér's V and the labels (and samples) found in one batch only.

    Parameters
    ----------
    batches, labels
        One value per sample.

    Returns
    -------
    dict
        ``cramers_v`` (bias-corrected), ``cramers_v_classic``, ``n_labels``,
        ``share_labels_one_batch``, ``share_samples_one_batch``, ``one_batch_labels``
        (label -> its batch) and ``batches_of_label`` (label -> the batches holding it).
    """
    table = contingency(batches, labels)
    only = single_batch_labels(table)
    n = int(table.to_numpy().sum())
    per_label = table.sum(axis=0)
    return {
        "n_labels": int(table.shape[1]),
        "cramers_v": cramers_v(table),
        "cramers_v_classic": cramers_v(table, bias_corrected=False),
        "share_labels_one_batch": len(only) / table.shape[1] if table.shape[1] else float("nan"),
        "share_samples_one_batch": float(per_label[list(only)].sum() / n) if n else float("nan"),
        "one_batch_labels": only,
        "batches_of_label": {
            str(label): [str(b) for b in table.index[table[label] > 0]] for label in table.columns
        },
    }


def batch_r2(scores: np.ndarray, batches: Sequence[object]) -> tuple[np.ndarray, float]:
    """R² of each column of ``scores`` on batch (one-way ANOVA) and their weighted mean.

    Parameters
    ----------
    scores
        Samples x components (principal component scores, or any axes).
    batches
        One batch per sample.

    Returns
    -------
    per_component, weighted
        ``per_component[j]`` = between-batch sum of squares of column ``j`` over its total
        sum of squares (NaN for a constant column); ``weighted`` = the sum of the
        between-batch sums of squares over the sum of the totals, i.e. the mean of the
        per-component R² weighted by each component's variance: the share of the variance
        in those components that batch membership explains.
    """
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    codes, _ = pd.factorize(pd.Series(np.asarray(batches, dtype=object)).astype(str))
    if len(codes) != x.shape[0]:
        raise ValueError(f"{x.shape[0]} rows of scores but {len(codes)} batches")
    centred = x - x.mean(axis=0)
    total = (centred**2).sum(axis=0)
    sizes = np.bincount(codes).astype(np.float64)
    sums = np.zeros((sizes.size, x.shape[1]))
    np.add.at(sums, codes, centred)
    between = (sums**2 / sizes[:, None]).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        per = np.clip(np.where(total > 0, between / total, np.nan), 0.0, 1.0)
    if total.sum() <= 0:
        return per, float("nan")
    return per, float(np.clip(between.sum() / total.sum(), 0.0, 1.0))


def pca_statistics(
    x: np.ndarray, batches: Sequence[object], seed: int = 0, n_comps: int | None = None
) -> dict[str, Any]:
    """Batch R² of the top principal components of ``x`` (samples x genes).

    ``n_comps`` defaults to the metrics' rule, :func:`locusformer.pp.pca.n_pcs`; the
    components are those of :func:`locusformer.pp.pca.pca` (centred, not scaled).
    """
    from locusformer.pp.pca import n_pcs, pca

    x = np.asarray(x, dtype=np.float64)
    k = n_pcs(x.shape[0], x.shape[1]) if n_comps is None else n_comps
    scores = pca(x, k, seed)
    per, weighted = batch_r2(scores, batches)
    n_batches = len(pd.unique(pd.Series(np.asarray(batches, dtype=object)).astype(str)))
    n = x.shape[0]
    return {
        "n_pcs": int(scores.shape[1]),
        "n_samples_used": int(n),
        "weighted_r2": weighted,
        "chance_r2": (n_batches - 1) / (n - 1) if n > 1 else float("nan"),
        "r2_per_pc": [float(v) for v in per],
        "variance_per_pc": [float(v) for v in scores.var(axis=0)],
    }


# --------------------------------------------------------------------------- verdict


def design_level(labels: dict[str, Any] | None) -> tuple[str, list[str]]:
    """The design's level (one of :data:`LEVELS`) and the reasons, from label statistics.

    See the module docstring for the thresholds and why they were chosen.
    """
    if not labels:
        return "unknown", ["no label column: confounding with biology cannot be measured"]
    v = labels["cramers_v"]
    share_labels = labels["share_labels_one_batch"]
    share_samples = labels["share_samples_one_batch"]
    reasons = []
    if np.isfinite(v) and v >= CONFOUNDED_V:
        reasons.append(f"Cramér's V between batch and label is {v:.2f} (>= {CONFOUNDED_V})")
    if share_labels > CONFOUNDED_SHARE:
        reasons.append(f"{share_labels:.0%} of the labels are found in one batch only")
    if share_samples > CONFOUNDED_SHARE:
        reasons.append(f"{share_samples:.0%} of the samples carry a label found in one batch only")
    if reasons:
        return "confounded", reasons
    if np.isfinite(v) and v >= IMBALANCED_V:
        reasons.append(f"Cramér's V between batch and label is {v:.2f} (>= {IMBALANCED_V})")
    if labels["one_batch_labels"]:
        n = len(labels["one_batch_labels"])
        reasons.append(f"{n} label{'s' if n > 1 else ''} found in one batch only")
    if reasons:
        return "imbalanced", reasons
    return "balanced", [f"Cramér's V between batch and label is {v:.2f}"]


def _names(values: Sequence[str]) -> str:
    shown = [str(v) for v in values[:MAX_NAMED]]
    more = len(values) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def describe(check: dict[str, Any]) -> list[str]:
    """The check in sentences: which batches hold which labels, and what it means."""
    level = check["level"]
    labels = check.get("labels")
    pcs = check.get("pca")
    out: list[str] = []
    if labels:
        by_batch: dict[str, list[str]] = {}
        for label, batch in labels["one_batch_labels"].items():
            by_batch.setdefault(batch, []).append(label)
        for batch in sorted(by_batch):
            out.append(f"Only batch {batch} holds label(s) {_names(sorted(by_batch[batch]))}.")
        shared = sorted(k for k, v in labels["batches_of_label"].items() if len(v) > 1)
        if shared:
            out.append(f"Label(s) found in more than one batch: {_names(shared)}.")
    if level == "confounded":
        out.append(
            "Batch and biology are confounded: a correction cannot tell the batch effect from"
            " the differences between these labels, so correcting may remove biology, and"
            " batch-mixing scores reward removing it. Consider protecting the label as a"
            " covariate (ComBat's mod), or treat the scores as a comparison on a design that"
            " cannot separate the two."
        )
    elif level == "imbalanced":
        out.append(
            "The batches hold different label mixtures: methods that make every batch look"
            " alike can move labels toward each other; read the bio-conservation scores"
            " beside the batch scores."
        )
    elif level == "unknown" and check.get("batch_dominated"):
        out.append(
            f"Without labels confounding cannot be measured; batch explains"
            f" {pcs['weighted_r2']:.0%} of the variance of the top {pcs['n_pcs']} principal"
            " components. If the batches differ in biology, correcting will remove it."
        )
    return out


def assess(
    batches: Sequence[object],
    labels: Sequence[object] | None = None,
    x: np.ndarray | None = None,
    x_batches: Sequence[object] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The whole check as a JSON-ready dict.

    Parameters
    ----------
    batches
        One batch per sample (all samples).
    labels
        One label per sample, or None; a label with one value only counts as none.
    x
        Normalized matrix (samples x genes), of the same samples or of a subsample of them;
        None skips the label-free part.
    x_batches
        The batch of each row of ``x`` (default: ``batches``).
    seed
        Seed of the PCA.

    Returns
    -------
    dict
        ``level``, ``reasons``, ``sentences``, ``labels`` (or None), ``pca`` (or None),
        ``batch_dominated``, ``n_samples``, ``n_batches``, ``samples_per_batch`` and the
        ``thresholds`` used.
    """
    b = pd.Series(np.asarray(batches, dtype=object)).astype(str)
    label_stats = None
    if labels is not None:
        lab = pd.Series(np.asarray(labels, dtype=object)).astype(str)
        if lab.nunique() >= 2:
            label_stats = label_statistics(b, lab)
    pcs = None
    if x is not None:
        pcs = pca_statistics(x, b if x_batches is None else x_batches, seed)
    level, reasons = design_level(label_stats)
    dominated = bool(pcs is not None and pcs["weighted_r2"] >= BATCH_DOMINATED_R2)
    check: dict[str, Any] = {
        "level": level,
        "reasons": reasons,
        "n_samples": len(b),
        "n_batches": int(b.nunique()),
        "samples_per_batch": {str(k): int(v) for k, v in b.value_counts().sort_index().items()},
        "labels": label_stats,
        "pca": pcs,
        "batch_dominated": dominated,
        "thresholds": {
            "confounded_v": CONFOUNDED_V,
            "imbalanced_v": IMBALANCED_V,
            "confounded_share": CONFOUNDED_SHARE,
            "batch_dominated_r2": BATCH_DOMINATED_R2,
        },
    }
    check["sentences"] = describe(check)
    return check


# --------------------------------------------------------------------------- files


def _finite(value: Any) -> Any:
    """JSON has no NaN: non-finite floats become null, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def read_confounding(path: PathLike) -> dict[str, Any]:
    """Read a ``confounding.json`` written by :func:`run_confounding`."""
    try:
        with open(path, encoding="utf-8") as handle:
            check = json.load(handle)
    except (OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        raise InputError(path, f"cannot read the confounding check: {reason}") from None
    if not isinstance(check, dict) or check.get("level") not in LEVELS:
        raise InputError(path, "not a confounding check (no valid 'level')")
    for key in ("sentences", "reasons"):
        if not isinstance(check.get(key, []), list):
            raise InputError(path, f"'{key}' must be a list")
    return check
