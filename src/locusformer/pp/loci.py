"""Place genes on the genome and order them: the token order the attention model sees."""

from __future__ import annotations

import numpy as np
import pandas as pd

from locusformer.errors import InputError
from locusformer.io.genes import CHROM_RANK, CHROMOSOMES, normalize_chrom, normalize_gene_id

UNPLACED_POLICIES = ("append", "drop")


def prepare_annotation(annotation: pd.DataFrame, id_type: str) -> pd.DataFrame:
    """One placement per id key: canonical chromosomes only, the first in genomic order.

    A gene annotated twice (pseudo-autosomal genes on X and Y, or one symbol on two
    chromosomes) keeps its first placement in natural order so that the result does not
    depend on the row order of the file.
    """
    frame = annotation.copy()
    frame["chrom"] = frame["chrom"].map(normalize_chrom)
    frame = frame.dropna(subset=["chrom"])
    frame["key"] = frame["gene_id"].map(lambda v: normalize_gene_id(v, id_type))
    frame["chrom_rank"] = frame["chrom"].map(CHROM_RANK)
    frame = frame.sort_values(["chrom_rank", "start", "end", "key"], kind="mergesort")
    return frame.drop_duplicates("key", keep="first").set_index("key")


def order_loci(
    gene_ids: pd.Index | list[str],
    annotation: pd.DataFrame,
    id_type: str,
    unplaced: str = "append",
    *,
    source: str = "annotation",
) -> tuple[pd.DataFrame, dict]:
    """Order genes by genomic coordinate.

    Parameters
    ----------
    gene_ids
        The matrix's gene ids.
    annotation
        Frame with gene_id, chrom, start, end (see
        :func:`locusformer.io.annotation.read_annotation`).
    id_type
        Which kind of id the matrix uses (``ensembl_id``, ``symbol``, ``entrez_id``, ...).
    unplaced
        ``"append"`` keeps genes without coordinates after the placed ones, sorted by id;
        ``"drop"`` removes them.

    Returns
    -------
    The loci table (gene_id, chrom, start, end, position, placed) in genomic order, and
    placement statistics.
    """
    if unplaced not in UNPLACED_POLICIES:
        raise InputError("config", f"loci.unplaced must be one of {UNPLACED_POLICIES}")
    placements = prepare_annotation(annotation, id_type)
    genes = pd.DataFrame({"gene_id": pd.Index(gene_ids).astype(str)})
    genes["key"] = genes["gene_id"].map(lambda v: normalize_gene_id(v, id_type))
    # Symbols travel with the loci when the annotation has them: the report names genes
    # by them where the matrix uses Ensembl or Entrez ids.
    extra = ["symbol"] if "symbol" in placements.columns and id_type != "symbol" else []
    joined = genes.join(placements[["chrom", "start", "end", "chrom_rank", *extra]], on="key")
    joined["placed"] = joined["chrom"].notna()
    n_placed = int(joined["placed"].sum())
    if n_placed == 0:
        example = ", ".join(genes["gene_id"].head(3))
        raise InputError(
            source,
            f"no gene of the matrix (e.g. {example}) has coordinates here when matched "
            f"by {id_type!r}; check the dataset's gene_id column",
        )
    placed = joined[joined["placed"]].sort_values(
        ["chrom_rank", "start", "end", "gene_id"], kind="mergesort"
    )
    rest = joined[~joined["placed"]].sort_values("gene_id", kind="mergesort")
    ordered = placed if unplaced == "drop" else pd.concat([placed, rest])
    loci = pd.DataFrame(
        {
            "gene_id": ordered["gene_id"].to_numpy(),
            "chrom": ordered["chrom"].fillna("").to_numpy(dtype=object),
            "start": pd.array(ordered["start"], dtype="Int64"),
            "end": pd.array(ordered["end"], dtype="Int64"),
            "position": np.arange(len(ordered), dtype=np.int64),
            "placed": ordered["placed"].to_numpy(dtype=bool),
        }
    )
    if extra:
        loci["symbol"] = ordered["symbol"].fillna("").astype(str).to_numpy(dtype=object)
    per_chrom = loci.loc[loci["placed"], "chrom"].value_counts()
    stats = {
        "n_genes": len(genes),
        "n_placed": n_placed,
        "n_unplaced": int(len(genes) - n_placed),
        "share_placed": round(n_placed / len(genes), 6),
        "unplaced_policy": unplaced,
        "n_loci": len(loci),
        "loci_per_chromosome": {c: int(per_chrom[c]) for c in CHROMOSOMES if c in per_chrom},
    }
    return loci, stats


def shuffle_loci(loci: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The ablation of genomic order: the same loci dealt at random to the same slots.

    Every slot keeps its chromosome, coordinates and position, so the model sees the same
    token layout (patches, chromosome boundaries, positional encoding); only which gene
    sits in which slot is random. Comparing against this isolates what genomic order adds.
    """
    rng = np.random.default_rng(seed)
    shuffled = loci.copy()
    order = rng.permutation(len(loci))
    shuffled["gene_id"] = loci["gene_id"].to_numpy()[order]
    if "symbol" in loci.columns:  # a gene's symbol goes where the gene goes
        shuffled["symbol"] = loci["symbol"].to_numpy()[order]
    return shuffled
