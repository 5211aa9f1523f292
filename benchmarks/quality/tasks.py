"""Build the quality-benchmark tasks from the CellBench files in ../shared/data.

Tasks (each a genes x cells count matrix plus a sample sheet with `batch` and `cell_line`):

- ``protocols``: CEL-seq2 + Drop-seq, three cell lines (the demo's task);
- ``cellbench5``: all five sets (two protocols, three CEL-seq2 plates; five cell lines, two
  of them, A549 and H838, only in the plates);
- ``control``: CEL-seq2 cells split at random into two pseudo-batches (no batch effect);
- ``pseudobulk``: sums over random groups of 10 cells of one line within one set, from all
  five sets (a bulk-sized study of tens of samples).

Composition imbalance (issue 18):

- ``cellbench5_inner``: the five sets on the genes that every set measured (inner join)
  instead of their union with the missing genes filled with zeros (11,533 genes, 1,021
  cells before the three-sample gene filter of ``write_task``);
- ``cellbench5_skewed``: the five sets with each line subsampled per set as ``SKEW`` plans
  (four sets lose one line; the others keep uneven fractions);
- ``pseudobulk_confounded``: sums over random groups of ``CONFOUNDED_GROUP`` cells of one
  line within one set, ``CONFOUNDED_SAMPLES`` samples per set of which ``CONFOUNDED_SHARE``
  come from the set's own dominant line (each line dominant in a different set,
  ``CONFOUNDED``): a confounded bulk study of tens of samples.

Continuous biology:

- ``mixture``: CEL-seq2 and Drop-seq, each sample a mixture of the three lines' RNA in one
  of ``MIXTURES``' proportions (the design of CellBench's RNA-mixture experiment, rebuilt
  from single cells): one random cell of each line in the mixture, thinned binomially to
  its proportion of a common depth (the smallest of the cells' library sizes) and summed.
  ``MIXTURE_SAMPLES`` samples per protocol and mixture; the label is the mixture, so
  neighbouring labels are neighbouring biology.
- ``mixture_pooled``: the same design from pools of ``MIXTURE_POOL`` cells per line
  (thinned to one cell's depth): closer to mixing extracted RNA, without the single
  cells' own variation (cell cycle, size) inside a mixture.

CellBench's own mixture experiments (not in ../shared/data: the files
``RNAmix_celseq2``, ``RNAmix_sortseq`` and ``cellmix1`` to ``cellmix4`` of
``data/csv/`` in github.com/LuyiTian/sc_mixology, MIT licence, GEO GSE118767, put
beside the others in ``<shared>/cellbench/``):

- ``rnamix``: RNA extracted from the three lines, mixed in seven proportions and diluted
  to four amounts, sequenced by CEL-seq2 and by SORT-seq (the batches); the label is the
  mixture (``mixture_name``);
- ``cellmix``: wells of nine cells of the three lines in 34 combinations (and three-cell
  wells of one of each), on four CEL-seq2 plates (the batches); the label is the
  combination (``cells_3_3_3``, in ``MIXTURE_LINES`` order); wells the authors flagged
  as poor quality dropped.

Singlets that are not flagged as outliers only; ERCC spike-ins dropped. Every random step
takes ``seed`` (``write_task`` builds with seed 0: the data of a task do not change with the
workflow's seeds).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

SETS = {
    "CEL-seq2": "sc_celseq2",
    "Drop-seq": "sc_dropseq",
    "plate1": "sc_celseq2_5cl_p1",
    "plate2": "sc_celseq2_5cl_p2",
    "plate3": "sc_celseq2_5cl_p3",
}
TASKS = (
    "protocols",
    "cellbench5",
    "control",
    "pseudobulk",
    "cellbench5_inner",
    "cellbench5_skewed",
    "pseudobulk_confounded",
    "mixture",
    "mixture_pooled",
    "rnamix",
    "cellmix",
)
#: Tasks that need CellBench's mixture files (module docstring), which ../shared/data
#: does not hold; the others are built from it.
MIXTURE_TASKS = ("rnamix", "cellmix")
SHARED_TASKS = tuple(t for t in TASKS if t not in MIXTURE_TASKS)
#: Set -> file stem of CellBench's mixture experiments.
MIXTURE_SETS = {
    "CEL-seq2": "RNAmix_celseq2",
    "SORT-seq": "RNAmix_sortseq",
    **{f"cellmix{i}": f"cellmix{i}" for i in range(1, 5)},
}

# cellbench5_skewed: the fraction of each set's cells of a line that is kept (0 drops the
# line from that set; a line not named keeps all its cells). Every line stays in at least
# two sets, so the batches still share biology, but no two sets hold it in the same share.
SKEW: dict[str, dict[str, float]] = {
    "CEL-seq2": {"H1975": 1.0, "H2228": 0.25, "HCC827": 0.0},
    "Drop-seq": {"H1975": 0.25, "H2228": 0.0, "HCC827": 1.0},
    "plate1": {"A549": 1.0, "H838": 0.0, "H1975": 0.5, "H2228": 1.0, "HCC827": 0.3},
    "plate2": {"A549": 0.0, "H838": 1.0, "H1975": 1.0, "H2228": 0.3, "HCC827": 0.5},
    "plate3": {"A549": 0.2, "H838": 0.3, "H1975": 1.0, "H2228": 0.5, "HCC827": 1.0},
}

# pseudobulk_confounded: set -> (its dominant line, the lines of its minority samples).
# Each line is dominant in one set and a minority in two others; 8 of every set's 10
# samples come from its dominant line. Groups of 4 cells, because plate 3 holds only 34
# singlets of H2228 (8 samples x 4 cells = 32).
CONFOUNDED: dict[str, tuple[str, tuple[str, ...]]] = {
    "CEL-seq2": ("H1975", ("H2228", "HCC827")),
    "Drop-seq": ("HCC827", ("H1975", "H2228")),
    "plate1": ("A549", ("H838", "H1975")),
    "plate2": ("H838", ("A549", "HCC827")),
    "plate3": ("H2228", ("A549", "H838")),
}
CONFOUNDED_SAMPLES, CONFOUNDED_SHARE, CONFOUNDED_GROUP = 10, 0.8, 4


#: Proportions of (H1975, H2228, HCC827) in each mixture: the pure lines, the three
#: pairs, the three 68/16/16 mixtures and the equal one.
MIXTURES = (
    (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0),
    (0.5, 0.5, 0.0), (0.5, 0.0, 0.5), (0.0, 0.5, 0.5),
    (0.68, 0.16, 0.16), (0.16, 0.68, 0.16), (0.16, 0.16, 0.68),
    (1 / 3, 1 / 3, 1 / 3),
)  # fmt: skip
MIXTURE_LINES = ("H1975", "H2228", "HCC827")
MIXTURE_SAMPLES = 30
#: Cells of each line summed before thinning, in ``mixture_pooled``.
MIXTURE_POOL = 10


def _read(shared: Path, stem: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Counts (genes x samples) and metadata (samples x fields) of one CellBench file pair."""
    counts = pd.read_csv(shared / "cellbench" / f"{stem}.count.csv.gz", index_col=0)
    meta = pd.read_csv(shared / "cellbench" / f"{stem}.metadata.csv.gz", index_col=0)
    return counts, meta


def _kept(meta: pd.DataFrame, flag: str, value: str) -> pd.Series:
    """Whether each sample's ``flag`` reads ``value`` (the files write TRUE, True, YES...)."""
    return meta[flag].astype(str).str.upper() == value


def _as_batch(
    counts: pd.DataFrame, batch: str, samples: pd.Index, labels: list | np.ndarray
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``samples``' counts without ERCC spike-ins and their sheet, prefixed by the batch."""
    counts = counts[samples]
    counts = counts[~counts.index.str.startswith("ERCC-")]
    ids = [f"{batch}_{c}" for c in samples]
    sheet = pd.DataFrame(
        {"batch": batch, "cell_line": labels}, index=pd.Index(ids, name="sample_id")
    )
    counts.columns = ids
    return counts, sheet


def load_set(shared: Path, batch: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Counts (genes x cells) and sheet of one CellBench set, cells prefixed by the batch."""
    counts, meta = _read(shared, SETS[batch])
    keep = (meta["demuxlet_cls"] == "SNG") & _kept(meta, "outliers", "FALSE")
    cells = meta.index[keep].intersection(counts.columns)
    return _as_batch(counts, batch, cells, meta.loc[cells, "cell_line_demuxlet"].to_numpy())


def load_mixture_set(shared: Path, batch: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Counts (genes x samples) and sheet of one of CellBench's mixture plates, samples
    prefixed by the batch, labelled by their mixture (RNA) or combination of cells."""
    counts, meta = _read(shared, MIXTURE_SETS[batch])
    keep = _kept(meta, "outliers", "FALSE")
    if "poor_quality" in meta:
        keep &= _kept(meta, "poor_quality", "NO")
    samples = meta.index[keep].intersection(counts.columns)
    meta = meta.loc[samples]
    if "mix" in meta:  # RNA mixtures: proportions of each line's RNA
        props = meta[[f"{line}_prop" for line in MIXTURE_LINES]].to_numpy()
        labels = [mixture_name(tuple(p)) for p in props]
    else:  # cell mixtures: cells of each line in the well
        cells = meta[list(MIXTURE_LINES)].to_numpy()
        labels = ["cells_" + "_".join(str(int(c)) for c in row) for row in cells]
    return _as_batch(counts, batch, samples, labels)


def combine(
    parts: list[tuple[pd.DataFrame, pd.DataFrame]], join: str = "outer"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Side by side: ``outer`` fills a set's unmeasured genes with 0, ``inner`` keeps the
    genes every set measured."""
    counts = pd.concat([c for c, _ in parts], axis=1, join=join).fillna(0).astype(np.int64)
    counts.index.name = "gene_id"
    return counts, pd.concat([s for _, s in parts])


def pseudobulk(
    counts: pd.DataFrame, sheet: pd.DataFrame, group_size: int, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sum random groups of ``group_size`` cells of one line within one batch."""
    rng = np.random.default_rng(seed)
    columns, rows = {}, []
    for (batch, line), cells in sheet.groupby(["batch", "cell_line"]).groups.items():
        cells = rng.permutation(np.asarray(cells))
        for k in range(len(cells) // group_size):
            name = f"{batch}_{line}_pb{k}"
            columns[name] = counts[cells[k * group_size : (k + 1) * group_size]].sum(axis=1)
            rows.append({"sample_id": name, "batch": batch, "cell_line": line})
    bulk = pd.DataFrame(columns)
    bulk.index.name = "gene_id"
    return bulk, pd.DataFrame(rows).set_index("sample_id")


def _round(x: float) -> int:
    return int(np.floor(x + 0.5))


def skew_plan(sheet: pd.DataFrame, plan: dict[str, dict[str, float]]) -> pd.DataFrame:
    """Cells of each (batch, line) that ``skew`` keeps: the planned fraction of the cells
    there, rounded half up, at least one where the fraction is above 0."""
    have = pd.crosstab(sheet["batch"], sheet["cell_line"])
    keep = have.copy()
    for batch in have.index:
        for line in have.columns:
            fraction = plan.get(batch, {}).get(line, 1.0)
            n = int(have.loc[batch, line])
            keep.loc[batch, line] = 0 if fraction <= 0 or n == 0 else max(1, _round(fraction * n))
    return keep


def skew(
    counts: pd.DataFrame, sheet: pd.DataFrame, plan: dict[str, dict[str, float]], seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Subsample each (batch, line) at random to ``skew_plan``'s count; the cells keep their
    order."""
    rng = np.random.default_rng(seed)
    keep = skew_plan(sheet, plan)
    position = pd.Series(np.arange(len(sheet)), index=sheet.index)
    chosen = []
    for (batch, line), cells in sheet.groupby(["batch", "cell_line"], sort=True).groups.items():
        n = int(keep.loc[batch, line])
        chosen.append(rng.choice(position[cells].to_numpy(), size=n, replace=False))
    rows = np.sort(np.concatenate(chosen))
    sheet = sheet.iloc[rows]
    return counts[sheet.index], sheet


def confounded_pseudobulk(
    counts: pd.DataFrame,
    sheet: pd.DataFrame,
    design: dict[str, tuple[str, tuple[str, ...]]],
    samples_per_batch: int,
    share: float,
    group_size: int,
    seed: int,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pseudo-bulk samples (sums of ``group_size`` random cells of one line within one batch,
    no cell in two samples) with ``share`` of every batch's ``samples_per_batch`` from its
    dominant line and the rest dealt in turn to its minority lines."""
    rng = np.random.default_rng(seed)
    columns, rows = {}, []
    for batch, (dominant, minority) in design.items():
        n_dominant = _round(share * samples_per_batch)
        plan = {dominant: n_dominant}
        for i in range(samples_per_batch - n_dominant):
            line = minority[i % len(minority)]
            plan[line] = plan.get(line, 0) + 1
        for line, n in plan.items():
            cells = sheet.index[(sheet["batch"] == batch) & (sheet["cell_line"] == line)]
            if len(cells) < n * group_size:
                raise ValueError(
                    f"{batch} has {len(cells)} cells of {line}: {n} samples of "
                    f"{group_size} need {n * group_size}"
                )
            cells = rng.permutation(np.asarray(cells))
            for k in range(n):
                name = f"{batch}_{line}_pb{k}"
                columns[name] = counts[cells[k * group_size : (k + 1) * group_size]].sum(axis=1)
                rows.append({"sample_id": name, "batch": batch, "cell_line": line})
    bulk = pd.DataFrame(columns)
    bulk.index.name = "gene_id"
    return bulk, pd.DataFrame(rows).set_index("sample_id")


def mixture_name(proportions: tuple[float, ...]) -> str:
    """A mixture's label, its percentages in ``MIXTURE_LINES`` order: ``mix_68_16_16``."""
    return "mix_" + "_".join(str(_round(100 * p)) for p in proportions)


def mixtures(
    counts: pd.DataFrame,
    sheet: pd.DataFrame,
    design: tuple[tuple[float, ...], ...],
    samples: int,
    seed: int,
    pool: int = 1,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``samples`` mixtures of each proportion in ``design`` within each batch.

    Each line present gives the sum of ``pool`` random cells of its own (with ``pool`` 1,
    no cell twice within one batch and mixture), thinned binomially to its share of a
    common depth: the smallest of the lines' mean library sizes per cell. So every
    mixture has one cell's depth, and ``pool`` > 1 takes the cell-to-cell variation of
    the lines out, as mixing extracted RNA does."""
    rng = np.random.default_rng(seed)
    values = counts.to_numpy()
    column = pd.Series(np.arange(counts.shape[1]), index=counts.columns)
    columns, rows = {}, []
    for batch in sorted(sheet["batch"].unique()):
        lines = {
            line: column[sheet.index[(sheet["batch"] == batch) & (sheet["cell_line"] == line)]]
            for line in MIXTURE_LINES
        }
        for proportions in design:
            shares = zip(MIXTURE_LINES, proportions, strict=True)
            present = [(line, p) for line, p in shares if p > 0]
            if pool == 1:
                picks = {
                    line: rng.choice(lines[line].to_numpy(), size=(samples, 1), replace=False)
                    for line, _ in present
                }
            else:
                picks = {
                    line: np.stack(
                        [
                            rng.choice(lines[line].to_numpy(), pool, replace=False)
                            for _ in range(samples)
                        ]
                    )
                    for line, _ in present
                }
            label = mixture_name(proportions)
            for k in range(samples):
                cells = [values[:, picks[line][k]].sum(axis=1) for line, _ in present]
                depth = min(int(c.sum()) // pool for c in cells)
                mixed = sum(
                    rng.binomial(c, min(1.0, p * depth / max(int(c.sum()), 1)))
                    for c, (_, p) in zip(cells, present, strict=True)
                )
                name = f"{batch}_{label}_{k}"
                columns[name] = mixed
                rows.append({"sample_id": name, "batch": batch, "cell_line": label})
    out = pd.DataFrame(columns, index=counts.index)
    out.index.name = "gene_id"
    return out, pd.DataFrame(rows).set_index("sample_id")


def composition(sheet: pd.DataFrame) -> pd.DataFrame:
    """Samples per batch (rows) and cell line (columns), with totals."""
    return pd.crosstab(sheet["batch"], sheet["cell_line"], margins=True, margins_name="total")


def build(task: str, shared: Path, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    if task == "protocols":
        return combine([load_set(shared, b) for b in ("CEL-seq2", "Drop-seq")])
    if task == "cellbench5":
        return combine([load_set(shared, b) for b in SETS])
    if task == "control":
        counts, sheet = load_set(shared, "CEL-seq2")
        rng = np.random.default_rng(seed)
        sheet["batch"] = np.where(rng.random(len(sheet)) < 0.5, "pseudoA", "pseudoB")
        return counts, sheet
    if task == "pseudobulk":
        counts, sheet = combine([load_set(shared, b) for b in SETS])
        return pseudobulk(counts, sheet, group_size=10, seed=seed)
    if task == "cellbench5_inner":
        return combine([load_set(shared, b) for b in SETS], join="inner")
    if task == "cellbench5_skewed":
        counts, sheet = combine([load_set(shared, b) for b in SETS])
        return skew(counts, sheet, SKEW, seed=seed)
    if task == "pseudobulk_confounded":
        counts, sheet = combine([load_set(shared, b) for b in CONFOUNDED])
        return confounded_pseudobulk(
            counts, sheet, CONFOUNDED, CONFOUNDED_SAMPLES, CONFOUNDED_SHARE, CONFOUNDED_GROUP,
            seed=seed,
        )  # fmt: skip
    if task == "mixture":
        counts, sheet = combine([load_set(shared, b) for b in ("CEL-seq2", "Drop-seq")])
        return mixtures(counts, sheet, MIXTURES, MIXTURE_SAMPLES, seed=seed)
    if task == "mixture_pooled":
        counts, sheet = combine([load_set(shared, b) for b in ("CEL-seq2", "Drop-seq")])
        return mixtures(counts, sheet, MIXTURES, MIXTURE_SAMPLES, seed=seed, pool=MIXTURE_POOL)
    if task == "rnamix":
        return combine([load_mixture_set(shared, b) for b in ("CEL-seq2", "SORT-seq")])
    if task == "cellmix":
        return combine([load_mixture_set(shared, f"cellmix{i}") for i in range(1, 5)])
    raise ValueError(f"unknown task {task!r}; choose from {TASKS}")


def write_task(task: str, shared: Path, out_dir: Path) -> dict:
    """Write ``{task}_counts.tsv.gz``, ``{task}_samples.tsv`` and ``{task}_composition.tsv``
    (samples per batch and line); return a datasets-sheet row."""
    out_dir.mkdir(parents=True, exist_ok=True)
    matrix = out_dir / f"{task}_counts.tsv.gz"
    samples = out_dir / f"{task}_samples.tsv"
    if not (matrix.exists() and samples.exists()):
        counts, sheet = build(task, shared)
        counts = counts[(counts > 0).sum(axis=1) >= 3]
        counts.to_csv(matrix, sep="\t", compression={"method": "gzip", "mtime": 0})
        sheet.to_csv(samples, sep="\t")
    sheet = pd.read_csv(samples, sep="\t", index_col=0, dtype=str)
    composition(sheet).to_csv(out_dir / f"{task}_composition.tsv", sep="\t")
    return {
        "name": task,
        "expression": str(matrix.resolve()),
        "samples": str(samples.resolve()),
        "batch_key": "batch",
        "label_key": "cell_line",
        "genes": str(
            Path(__file__).resolve().parents[2] / "resources" / "hs_gene_coordinates.tsv.gz"
        ),
        "gene_id": "ensembl_id",
        "value_type": "counts",
    }
