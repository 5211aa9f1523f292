from __future__ import annotations

import pandas as pd
import pytest

from locusformer.errors import InputError
from locusformer.pp.loci import normalize_chrom, normalize_gene_id, order_loci, shuffle_loci


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("1", "chr1"),
        ("chr1", "chr1"),
        ("Chr01", "chr1"),
        ("X", "chrX"),
        ("chrx", "chrX"),
        ("MT", "chrM"),
        ("chrMT", "chrM"),
        ("M", "chrM"),
        ("22", "chr22"),
        ("chrUn_KI270302v1", None),
        ("chr1_KI270706v1_random", None),
        ("GL000220.1", None),
        ("NC_000001.11", "chr1"),  # RefSeq accession of chromosome 1
        ("23", "chrX"),
    ],
)
def test_chromosome_names_of_common_conventions(name, expected):
    assert normalize_chrom(name) == expected


def test_gene_id_keys():
    assert normalize_gene_id("ENSG00000141510.17", "ensembl_id") == "ENSG00000141510"
    assert normalize_gene_id("ENSG00000002586.20_PAR_Y", "ensembl_id") == "ENSG00000002586"
    assert normalize_gene_id("tp53", "symbol") == normalize_gene_id("TP53", "symbol")
    assert normalize_gene_id("7157.0", "entrez_id") == "7157"


ANNOTATION = pd.DataFrame(
    {
        "gene_id": ["G10", "GX", "G2b", "G2a", "GM", "G1", "GPAR", "GPAR", "GSCAF"],
        "chrom": ["10", "chrX", "chr2", "2", "MT", "chr1", "chrY", "chrX", "chrUn_x"],
        "start": [5, 1, 300, 100, 1, 999, 10, 10, 1],
        "end": [9, 2, 400, 200, 2, 1999, 20, 20, 2],
    }
)


def test_natural_chromosome_order_then_start():
    genes = ["GM", "G10", "GX", "G2b", "G1", "G2a"]
    loci, stats = order_loci(genes, ANNOTATION, "gene_id")
    assert loci["gene_id"].tolist() == ["G1", "G2a", "G2b", "G10", "GX", "GM"]
    assert loci["chrom"].tolist() == ["chr1", "chr2", "chr2", "chr10", "chrX", "chrM"]
    assert loci["position"].tolist() == list(range(6))
    assert loci["placed"].all() and stats["share_placed"] == 1.0
    assert stats["loci_per_chromosome"] == {"chr1": 1, "chr2": 2, "chr10": 1, "chrX": 1, "chrM": 1}


def test_gene_on_two_chromosomes_takes_the_first_in_natural_order():
    loci, _ = order_loci(["GPAR"], ANNOTATION, "gene_id")
    assert loci["chrom"].tolist() == ["chrX"]


def test_unplaced_policy_append_and_drop():
    genes = ["zeta", "G2a", "GSCAF", "alpha", "G1"]
    loci, stats = order_loci(genes, ANNOTATION, "gene_id", "append")
    assert loci["gene_id"].tolist() == ["G1", "G2a", "GSCAF", "alpha", "zeta"]
    assert loci["placed"].tolist() == [True, True, False, False, False]
    assert loci["chrom"].tolist()[2:] == ["", "", ""]
    assert loci["start"].isna().tolist() == [False, False, True, True, True]
    assert stats["n_unplaced"] == 3 and stats["share_placed"] == 0.4
    dropped, stats = order_loci(genes, ANNOTATION, "gene_id", "drop")
    assert dropped["gene_id"].tolist() == ["G1", "G2a"]
    assert stats["n_loci"] == 2


def test_ensembl_versions_and_symbol_case_match():
    annotation = pd.DataFrame(
        {"gene_id": ["ENSG1", "TP53"], "chrom": ["1", "17"], "start": [1, 5], "end": [2, 6]}
    )
    loci, _ = order_loci(["ENSG1.4"], annotation, "ensembl_id")
    assert loci["placed"].tolist() == [True] and loci["gene_id"].tolist() == ["ENSG1.4"]
    loci, _ = order_loci(["Tp53"], annotation, "symbol")
    assert loci["chrom"].tolist() == ["chr17"]


def test_no_gene_placed_is_refused():
    with pytest.raises(InputError, match=r"no gene of the matrix .* matched by .symbol."):
        order_loci(["A", "B"], ANNOTATION, "symbol", source="genes.tsv")


def test_shuffled_order_keeps_the_slots_and_moves_only_the_genes():
    genes = ["GM", "G10", "GX", "G2b", "G1", "G2a"]
    loci, _ = order_loci(genes, ANNOTATION, "gene_id")
    shuffled = shuffle_loci(loci, seed=3)
    assert sorted(shuffled["gene_id"]) == sorted(loci["gene_id"])
    assert shuffled["gene_id"].tolist() != loci["gene_id"].tolist()
    slots = ["chrom", "start", "end", "position", "placed"]
    pd.testing.assert_frame_equal(shuffled[slots], loci[slots])
    assert shuffle_loci(loci, seed=3)["gene_id"].tolist() == shuffled["gene_id"].tolist()
