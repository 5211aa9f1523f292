"""The genome of a simulation: its loci table, and the segments regional effects act on.

Split from :mod:`locusformer.simulate.datasets`, which draws the expression on it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from locusformer.errors import InputError
from locusformer.simulate.params import RegionKind

SIM_CHROMOSOMES = [f"chr{i}" for i in range(1, 23)] + ["chrX", "chrY"]


def draw_regions(
    chrom: pd.Series | np.ndarray,
    region_size: float,
    kind: RegionKind,
    rng: np.random.Generator,
) -> pd.DataFrame:
    """Cut loci in genomic order into segments of consecutive loci, none across chromosomes.

    Parameters
    ----------
    chrom
        The chromosome of each locus, in genomic order (a chromosome's loci are one run);
        ``""`` or missing marks an unplaced locus, which no segment holds.
    region_size
        Mean segment length in loci for ``kind="segments"``: lengths are
        ``round(gamma(4, region_size / 4))`` (at least 1), so most lie within a factor of
        two of the mean; the last segment of a chromosome is cut at its end.
    kind
        ``"segments"``, or ``"arms"``: two segments per chromosome, split at a point drawn
        uniformly between 30% and 70% of its loci (no centromere positions are used).

    Returns
    -------
    One row per segment, in genomic order: ``region`` (0, 1, ...), ``chrom``,
    ``start_index`` and ``end_index`` (the segment's loci are
    ``start_index <= i < end_index`` in the given order) and ``n_loci``.
    """
    names = pd.Series(chrom).fillna("").astype(str).to_numpy()
    # Runs of one chromosome: a change of name starts a new run.
    starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]])
    ends = np.r_[starts[1:], len(names)]
    rows = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if not names[a]:
            continue
        n = b - a
        if kind == "arms":
            cut = a + min(max(round(rng.uniform(0.3, 0.7) * n), 1), n - 1) if n > 1 else b
            bounds = [(a, cut), (cut, b)] if cut < b else [(a, b)]
        else:
            bounds, s = [], a
            while s < b:
                e = min(b, s + max(1, round(rng.gamma(4.0, region_size / 4.0))))
                bounds.append((s, e))
                s = e
        rows += [(names[a], s, e) for s, e in bounds]
    frame = pd.DataFrame(rows, columns=["chrom", "start_index", "end_index"])
    frame = frame.astype({"start_index": np.int64, "end_index": np.int64})
    frame.insert(0, "region", np.arange(len(frame), dtype=np.int64))
    frame["n_loci"] = frame["end_index"] - frame["start_index"]
    return frame


def regional_batch_effect(
    loci: pd.DataFrame,
    batch_names: list[str],
    shift_sd: float,
    scale_sd: float,
    region_size: float,
    kind: RegionKind,
    rng: np.random.Generator,
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Draw segments (:func:`draw_regions`) and each batch's shift and scale on them.

    Parameters
    ----------
    loci
        In genomic order, with ``gene_id``, ``chrom`` and, if present, ``start``/``end``
        (base pairs; they name the segments' bounds in the table).
    batch_names
        One per batch; they name the table's columns.
    shift_sd, scale_sd
        Standard deviations of a segment's shift and of the log of its scale.

    Returns
    -------
    regions
        :func:`draw_regions`'s table plus ``first_gene``, ``last_gene``, ``start_bp`` and
        ``end_bp`` (when ``loci`` has coordinates), and per batch ``shift_<name>`` and
        ``scale_<name>``: what the batch adds to, and multiplies, on every locus of the
        segment.
    shift, scale
        (B, L) the same values per locus, in the order of ``loci``; 0 and 1 on loci that
        no segment holds (unplaced).
    """
    regions = draw_regions(loci["chrom"], region_size, kind, rng)
    B, L, R = len(batch_names), len(loci), len(regions)
    region_shift = rng.normal(0.0, shift_sd, size=(B, R))
    region_scale = np.exp(rng.normal(0.0, scale_sd, size=(B, R)))
    first, last = regions["start_index"].to_numpy(), regions["end_index"].to_numpy() - 1
    regions["first_gene"] = loci["gene_id"].to_numpy()[first]
    regions["last_gene"] = loci["gene_id"].to_numpy()[last]
    if {"start", "end"} <= set(loci.columns):
        # Only placed loci start or end a segment: no missing coordinate is read.
        regions["start_bp"] = loci["start"].to_numpy()[first].astype(np.int64)
        regions["end_bp"] = loci["end"].to_numpy()[last].astype(np.int64)
    for b, name in enumerate(batch_names):
        regions[f"shift_{name}"] = region_shift[b]
    for b, name in enumerate(batch_names):
        regions[f"scale_{name}"] = region_scale[b]
    of = np.full(L, R)  # segment of each locus; R: none (a zero shift, a unit scale)
    for r, (a, e) in enumerate(zip(first, last + 1, strict=True)):
        of[a:e] = r
    shift = np.c_[region_shift, np.zeros(B)][:, of]
    scale = np.c_[region_scale, np.ones(B)][:, of]
    return regions, shift, scale


def simulate_loci(
    n_loci: int, n_chromosomes: int, unplaced_fraction: float, rng: np.random.Generator
) -> pd.DataFrame:
    """A loci table in genomic order: placed loci by chromosome and start, then unplaced."""
    n_unplaced = round(unplaced_fraction * n_loci)
    n_placed = n_loci - n_unplaced
    chrom_of = np.sort(rng.integers(1, n_chromosomes + 1, size=n_placed))
    starts = np.empty(n_placed, dtype=np.int64)
    for c in np.unique(chrom_of):
        idx = np.flatnonzero(chrom_of == c)
        starts[idx] = np.sort(rng.integers(1, 100_000_000, size=len(idx)))
    chrom = [f"chr{c}" for c in chrom_of] + [""] * n_unplaced
    start = pd.array(list(starts) + [None] * n_unplaced, dtype="Int64")
    return pd.DataFrame(
        {
            "gene_id": [f"g{i:05d}" for i in range(n_loci)],
            "chrom": chrom,
            "start": start,
            "end": start + 1000,
            "position": np.arange(n_loci),
            "placed": [True] * n_placed + [False] * n_unplaced,
        }
    )


def pick_genes(
    annotation: str | os.PathLike, n_genes: int, rng: np.random.Generator
) -> pd.DataFrame:
    """``n_genes`` genes of ``annotation`` on the main chromosomes, drawn with ``rng``."""
    from locusformer.io.genes import CHROM_RANK, normalize_chrom

    path = Path(annotation)
    try:
        table = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise InputError(path, "gene annotation not found") from None
    except (pd.errors.ParserError, UnicodeDecodeError, EOFError, OSError) as err:
        raise InputError(path, f"cannot read the gene annotation ({err})") from None
    missing = {"ensembl_id", "chrom", "start", "end"} - set(table.columns)
    if missing:
        raise InputError(path, f"missing column {sorted(missing)[0]!r}")
    table = table[table["ensembl_id"] != ""].drop_duplicates("ensembl_id")
    table = table.assign(chrom=table["chrom"].map(normalize_chrom))
    table = table[table["chrom"].isin(SIM_CHROMOSOMES)]
    table = table.assign(
        start=pd.to_numeric(table["start"], errors="coerce"),
        end=pd.to_numeric(table["end"], errors="coerce"),
    ).dropna(subset=["start", "end"])
    if n_genes > len(table):
        raise InputError(
            "simulate n_genes", f"{n_genes} requested, {path} places only {len(table)} genes"
        )
    picked = table.iloc[np.sort(rng.choice(len(table), size=n_genes, replace=False))]
    picked = picked.assign(rank=picked["chrom"].map(CHROM_RANK))
    picked = picked.sort_values(["rank", "start", "ensembl_id"]).reset_index(drop=True)
    columns = {"ensembl_id": "gene_id", "symbol": "symbol", "chrom": "chrom"}
    genes = picked[[c for c in columns if c in picked.columns]].rename(columns=columns)
    genes["start"] = picked["start"].astype(np.int64)
    genes["end"] = picked["end"].astype(np.int64)
    return genes  # in genomic order
