"""Place genes on the genome and order them: the token order the attention model sees."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .errors import InputError

UNPLACED_POLICIES = ("append", "drop")
CHROMOSOMES = [f"chr{i}" for i in range(1, 23)] + ["chrX", "chrY", "chrM"]
CHROM_RANK = {name: rank for rank, name in enumerate(CHROMOSOMES)}

_ENSEMBL_VERSION = re.compile(r"^(ENS[A-Z]*[GTP]\d+)\.\d+(_PAR_Y)?$", re.IGNORECASE)
_CHROM_ALIASES = {"m": "M", "mt": "M", "x": "X", "y": "Y", "23": "X", "24": "Y"}
# RefSeq accessions of assembled chromosomes (NCBI annotations name them so):
# human NC_000001..NC_000024 and NC_012920 (mitochondrion), mouse NC_000067..NC_000087
# and NC_005089. Their numbers do not overlap, so one table serves both.
_REFSEQ = re.compile(r"^NC_0*(\d+)(?:\.\d+)?$", re.IGNORECASE)
_REFSEQ_CHROM = {
    **{n: str(n) for n in range(1, 23)},
    23: "X",
    24: "Y",
    12920: "M",
    **{66 + n: str(n) for n in range(1, 20)},
    86: "X",
    87: "Y",
    5089: "M",
}


def normalize_chrom(name: object) -> str | None:
    """Map chromosome names of common conventions to ``chr1``..``chr22``, ``chrX/Y/M``.

    ``1``, ``chr1``, ``Chr1`` -> ``chr1``; ``MT``, ``chrMT``, ``M`` -> ``chrM``; RefSeq
    accessions of human and mouse chromosomes (``NC_000001.11`` -> ``chr1``,
    ``NC_012920.1`` -> ``chrM``). Scaffolds, patches and other contigs (``chrUn_...``,
    ``GL000220.1``, ``NT_187361.1``, ``chr1_KI270706v1_random``) return ``None``: they have
    no place in a genome-wide order.
    """
    text = str(name).strip()
    refseq = _REFSEQ.match(text)
    if refseq:
        core = _REFSEQ_CHROM.get(int(refseq.group(1)))
        return f"chr{core}" if core else None
    core = text[3:] if text.lower().startswith("chr") else text
    core = _CHROM_ALIASES.get(core.lower(), core)
    if core.isdigit():
        core = str(int(core))
    candidate = f"chr{core}"
    return candidate if candidate in CHROM_RANK else None


def normalize_gene_id(gene_id: object, id_type: str) -> str:
    """Key on which matrix ids and annotation ids are matched.

    Ensembl ids lose their version suffix (``ENSG00000141510.17`` -> ``ENSG00000141510``);
    all ids are compared case-insensitively, which is what symbols need.
    """
    text = str(gene_id).strip()
    match = _ENSEMBL_VERSION.match(text)
    if match:
        text = match.group(1)
    if id_type == "entrez_id" and text.endswith(".0") and text[:-2].isdigit():
        text = text[:-2]
    return text.upper()


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
        :func:`locusformer.annotation.read_annotation`).
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
    joined = genes.join(placements[["chrom", "start", "end", "chrom_rank"]], on="key")
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
    shuffled["gene_id"] = loci["gene_id"].to_numpy()[rng.permutation(len(loci))]
    return shuffled
