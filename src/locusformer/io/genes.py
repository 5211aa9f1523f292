"""Names on the genome: chromosome names of every common convention, and gene-id keys.

Readers of matrices and annotations match ids with these; :mod:`locusformer.pp.loci`
orders the loci by :data:`CHROM_RANK`.
"""

from __future__ import annotations

import re

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
