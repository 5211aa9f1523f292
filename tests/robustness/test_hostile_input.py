"""Inputs the way real users get them wrong: each is handled correctly or refused with one
line naming the file and the problem, and a refused step writes nothing."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from robustness_cli import (
    BATCHES,
    GENES,
    SAMPLES,
    assert_refused,
    counts_frame,
    normalize,
    order_loci,
    run_cli,
    sheet_frame,
)

from locusformer.io.annotation import read_annotation
from locusformer.io.expression import read_expression, read_sample_sheet
from locusformer.pp.loci import order_loci as order_loci_frame

# -- written in other ways, read the same ----------------------------------------------------


def _reference(tmp_path):
    """The clean matrix and sheet, normalized: what every variant below must give."""
    (tmp_path / "ref").mkdir()
    matrix, sheet = tmp_path / "ref" / "m.csv", tmp_path / "ref" / "s.csv"
    counts_frame().to_csv(matrix)
    sheet_frame().to_csv(sheet, index=False)
    code, lines = normalize(matrix, sheet, tmp_path / "ref" / "out")
    assert code == 0, lines
    return pd.read_parquet(tmp_path / "ref" / "out" / "normalized.parquet")


def _crlf_and_bom(text: str) -> str:
    return "\ufeff" + text.replace("\n", "\r\n")


def _trailing_separator(text: str) -> str:
    return text.replace("\n", ",\n")


VARIANTS = {
    "windows line endings and a byte-order mark": (
        lambda m: _crlf_and_bom(m.to_csv()),
        lambda s: _crlf_and_bom(s.to_csv(index=False)),
    ),
    "quoted headers and ids": (
        lambda m: m.to_csv(quoting=1),
        lambda s: s.to_csv(index=False, quoting=1),
    ),
    "a trailing empty column": (
        lambda m: _trailing_separator(m.to_csv()),
        lambda s: _trailing_separator(s.to_csv(index=False)),
    ),
    "integer counts stored as floats": (
        lambda m: m.astype(float).to_csv(float_format="%.1f"),
        lambda s: s.to_csv(index=False),
    ),
    "R's header without a name for the gene column": (
        lambda m: ",".join(m.columns) + "\n" + m.to_csv(header=False),
        lambda s: s.to_csv(index=False),
    ),
    "blank lines at the end": (
        lambda m: m.to_csv() + "\n\n",
        lambda s: s.to_csv(index=False) + "\n",
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variants_of_a_csv_give_the_same_result(tmp_path, variant):
    reference = _reference(tmp_path)
    write_matrix, write_sheet = VARIANTS[variant]
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    matrix.write_bytes(write_matrix(counts_frame()).encode("utf-8"))
    sheet.write_bytes(write_sheet(sheet_frame()).encode("utf-8"))
    code, lines = normalize(matrix, sheet, tmp_path / "out")
    assert code == 0, lines
    out = tmp_path / "out"
    pd.testing.assert_frame_equal(pd.read_parquet(out / "normalized.parquet"), reference)
    samples = pd.read_csv(out / "samples.tsv", sep="\t", dtype=str)
    assert samples.columns.tolist() == ["sample_id", "batch"], "no empty or unnamed column"
    if variant == "integer counts stored as floats":
        assert json.loads((out / "stats.json").read_text())["integer_counts"] is True


def test_tsv_and_gzip_with_windows_line_endings(tmp_path):
    path = tmp_path / "m.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8", newline="") as handle:
        handle.write(_crlf_and_bom(counts_frame().to_csv(sep="\t")))
    adata = read_expression(path)
    assert adata.obs_names.tolist() == SAMPLES and adata.var_names.tolist() == GENES
    np.testing.assert_array_equal(adata.X, counts_frame().T.to_numpy(dtype=np.float32))


# -- numbers that are not what they claim ------------------------------------------------------


def test_log_data_declared_as_counts_is_refused(tmp_path):
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    np.log1p(counts_frame()).to_csv(matrix)
    sheet_frame().to_csv(sheet, index=False)
    assert_refused(
        normalize(matrix, sheet, tmp_path / "out"),
        tmp_path / "out",
        "m.csv",
        "look like log-expression",
        "set value_type: log_expression",
    )
    # Declared as what it is, the same file is fine.
    code, lines = normalize(matrix, sheet, tmp_path / "out", value_type="log_expression")
    assert code == 0, lines


def test_counts_declared_as_log_expression_are_refused(tmp_path):
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    (counts_frame() * 50).to_csv(matrix)
    sheet_frame().to_csv(sheet, index=False)
    assert_refused(
        normalize(matrix, sheet, tmp_path / "out", value_type="log_expression"),
        tmp_path / "out",
        "m.csv",
        "set value_type: counts",
    )


def test_estimated_counts_with_fractions_are_taken_as_counts(tmp_path, caplog):
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    (counts_frame() * 10 + 0.25).to_csv(matrix)  # salmon / RSEM: fractional, far above logs
    sheet_frame().to_csv(sheet, index=False)
    code, lines = normalize(matrix, sheet, tmp_path / "out")
    assert code == 0, lines
    assert "estimated counts" in caplog.text
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["integer_counts"] is False


# -- the wrong way round ------------------------------------------------------------------------


def test_transposed_text_matrix_is_refused_with_a_hint(tmp_path):
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    counts_frame().T.rename_axis("sample").to_csv(matrix)
    sheet_frame().to_csv(sheet, index=False)
    line = assert_refused(
        normalize(matrix, sheet, tmp_path / "out"),
        tmp_path / "out",
        "m.csv",
        "looks transposed",
        "genes x samples",
        "transpose it",
    )
    assert "'s0'" in line


def test_transposed_h5ad_is_refused_with_a_hint(tmp_path):
    matrix, sheet = tmp_path / "m.h5ad", tmp_path / "s.csv"
    frame = counts_frame().astype(np.float32)  # genes as obs: the wrong way for h5ad
    ad.AnnData(
        X=frame.to_numpy(), obs=pd.DataFrame(index=GENES), var=pd.DataFrame(index=SAMPLES)
    ).write_h5ad(matrix)
    sheet_frame().to_csv(sheet, index=False)
    assert_refused(
        normalize(matrix, sheet, tmp_path / "out"),
        tmp_path / "out",
        "looks transposed",
        "samples x genes",
    )


# -- gene ids ---------------------------------------------------------------------------------


def _annotation(tmp_path, rows):
    path = tmp_path / "genes.tsv"
    pd.DataFrame(rows, columns=["ensembl_id", "chrom", "start", "end"]).to_csv(
        path, sep="\t", index=False
    )
    return path


def test_versions_and_case_of_gene_ids_still_match_the_annotation(tmp_path):
    frame = counts_frame()
    written = [f"{g}.{i + 3}" if i % 2 else g.lower() for i, g in enumerate(GENES)]
    frame.index = pd.Index(written, name="gene_id")
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    frame.to_csv(matrix)
    sheet_frame().to_csv(sheet, index=False)
    assert normalize(matrix, sheet, tmp_path / "out")[0] == 0
    genes = _annotation(
        tmp_path, [(g, "chr1", 1000 * (9 - i), 1000 * (9 - i) + 10) for i, g in enumerate(GENES)]
    )
    code, lines = order_loci(
        tmp_path / "out" / "normalized.parquet", genes, tmp_path / "loci", "ensembl_id"
    )
    assert code == 0, lines
    loci = pd.read_parquet(tmp_path / "loci" / "loci.parquet")
    assert loci["placed"].all()
    assert loci["gene_id"].tolist() == written[::-1], "ids kept as written, in genomic order"


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        (
            {0: "ENSG00000000002.1", 1: "ENSG00000000002.7"},
            "'ENSG00000000002.1' and 'ENSG00000000002.7'",
        ),
        (
            {0: "ENSG00000000002", 1: "ENSG00000000002.5"},
            "'ENSG00000000002' and 'ENSG00000000002.5'",
        ),
        ({0: "Tp53", 1: "TP53"}, "'Tp53' and 'TP53'"),
    ],
)
def test_ids_that_collide_once_versions_and_case_are_ignored_are_refused(tmp_path, ids, named):
    frame = counts_frame()
    frame.index = pd.Index([ids.get(i, g) for i, g in enumerate(GENES)], name="gene_id")
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    frame.to_csv(matrix)
    sheet_frame().to_csv(sheet, index=False)
    assert_refused(
        normalize(matrix, sheet, tmp_path / "out"),
        tmp_path / "out",
        "m.csv",
        "same gene once Ensembl versions and case are ignored",
        named,
    )


def test_chromosome_conventions_scaffolds_and_genes_on_two_chromosomes(tmp_path):
    rows = [
        (GENES[0], "NC_000001.11", 500, 600),  # RefSeq accession of chr1
        (GENES[1], "chrUn_KI270302v1", 1, 100),  # unplaced contig
        (GENES[2], "GL000220.1", 1, 100),  # scaffold
        (GENES[3], "chr1_KI270706v1_random", 1, 100),
        (GENES[4], "Y", 2000, 2100),  # a pseudo-autosomal gene: on Y ...
        (GENES[4], "X", 2000, 2100),  # ... and on X, listed second
        (GENES[5], "1", 100, 200),
        (GENES[6], "NC_012920.1", 10, 20),  # RefSeq mitochondrion
        (GENES[7], "MT", 5, 8),
    ]
    genes = _annotation(tmp_path, rows)
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    counts_frame().to_csv(matrix)
    sheet_frame().to_csv(sheet, index=False)
    assert normalize(matrix, sheet, tmp_path / "out")[0] == 0
    code, lines = order_loci(
        tmp_path / "out" / "normalized.parquet", genes, tmp_path / "loci", "ensembl_id"
    )
    assert code == 0, lines
    loci = pd.read_parquet(tmp_path / "loci" / "loci.parquet")
    placed = loci[loci["placed"]]
    assert placed[["gene_id", "chrom"]].values.tolist() == [
        [GENES[5], "chr1"],
        [GENES[0], "chr1"],
        [GENES[4], "chrX"],  # the first placement in natural order, whatever the file order
        [GENES[7], "chrM"],
        [GENES[6], "chrM"],
    ]
    assert sorted(loci.loc[~loci["placed"], "gene_id"]) == GENES[1:4], "scaffolds: unplaced"
    stats = json.loads((tmp_path / "loci" / "loci.json").read_text())
    assert stats["n_unplaced"] == 3


def test_gtf_without_gene_records_is_refused(tmp_path):
    gtf = tmp_path / "tx.gtf.gz"
    with gzip.open(gtf, "wt") as handle:
        handle.write('1\tsrc\ttranscript\t1\t10\t.\t+\t.\tgene_id "ENSG00000000001";\n')
        handle.write('1\tsrc\texon\t1\t10\t.\t+\t.\tgene_id "ENSG00000000001";\n')
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    counts_frame().to_csv(matrix)
    sheet_frame().to_csv(sheet, index=False)
    assert normalize(matrix, sheet, tmp_path / "out")[0] == 0
    assert_refused(
        order_loci(tmp_path / "out" / "normalized.parquet", gtf, tmp_path / "loci", "gene_id"),
        tmp_path / "loci",
        "tx.gtf.gz",
        "no 'gene' records",
    )


# -- the sample sheet -----------------------------------------------------------------------


def test_numeric_batches_are_categories_not_numbers(tmp_path):
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    counts_frame().to_csv(matrix)
    # "1" and "01" are two batches; 2 and 2.0 as well: nothing is parsed as a number.
    batches = ["1", "01", "2", "2.0"] * 2
    sheet.write_text(
        "sample_id,batch\n" + "".join(f"{s},{b}\n" for s, b in zip(SAMPLES, batches, strict=True))
    )
    code, lines = normalize(matrix, sheet, tmp_path / "out")
    assert code == 0, lines
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["samples_per_batch"] == {"01": 2, "1": 2, "2": 2, "2.0": 2}
    samples = pd.read_csv(
        tmp_path / "out" / "samples.tsv", sep="\t", dtype=str, keep_default_na=False
    )
    assert samples["batch"].tolist() == batches


HOSTILE_LABELS = [
    "T cells, CD4+",
    'the "good" ones',
    "it's",
    "Zellen äöü – 細胞 – 🧬",
    "<script>alert('x')</script>",
    "a\tb",
    "NA",
    "  padded  ",
    "=1+2",
]


def test_labels_with_commas_quotes_unicode_and_html_round_trip(tmp_path):
    matrix, sheet = tmp_path / "m.csv", tmp_path / "s.csv"
    counts_frame().to_csv(matrix)
    labels = (HOSTILE_LABELS * 2)[: len(SAMPLES)]
    sheet_frame(label=labels).to_csv(sheet, index=False)
    assert read_sample_sheet(sheet)["label"].tolist() == labels
    code, lines = normalize(matrix, sheet, tmp_path / "out", "--label-key", "label")
    assert code == 0, lines
    out = tmp_path / "out"
    samples = pd.read_csv(out / "samples.tsv", sep="\t", dtype=str, keep_default_na=False)
    # Every character survives but the spaces around a value, removed with a warning.
    labels = [label.strip() for label in labels]
    assert samples["label"].tolist() == labels
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert set(stats["samples_per_label"]) == set(labels)
    # What train, correct and the baselines read back is the same.
    from locusformer.io.samples import read_batches, read_sample_table

    assert read_sample_table(out / "samples.tsv")["label"].tolist() == labels
    read = read_batches(out / "samples.tsv", "label", pd.Index(SAMPLES))
    assert read["label"].tolist() == labels


# -- broken files -------------------------------------------------------------------------------


def _broken(tmp_path, name: str, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def _gzip_truncated(text: str) -> bytes:
    data = gzip.compress(text.encode())
    return data[: len(data) * 2 // 3]


BROKEN = {
    "truncated gzip": (
        "m.csv.gz",
        _gzip_truncated(counts_frame().to_csv()),
        "corrupt or truncated",
    ),
    "not gzip at all": ("m.csv.gz", b"gene,s0\nENSG1,1\n", "corrupt or truncated"),
    "latin-1 bytes": ("m.csv", "gene,s0\nGÈNE,1\n".encode("latin-1"), "utf-8"),
    "a separator at the end of data lines only": (
        "m.csv",
        counts_frame().to_csv().replace("\n", ",\n").replace(",\n", "\n", 1).encode(),
        "one field more than the header",
    ),
    "an empty gene id": ("m.csv", b"gene,s0,s1\n,1,2\nENSG1,3,4\n", "empty gene id in data row 1"),
    "an empty sample id": ("m.csv", b"gene,s0,,s2\nENSG1,1,2,3\n", "empty sample id in the header"),
    "a missing value": ("m.csv", b"gene,s0,s1\nENSG1,1,\nENSG2,3,4\n", "non-finite value"),
    "a binary file": ("m.csv", bytes(range(256)) * 4, "m.csv"),
    "nothing but a header": ("m.tsv", b"gene\ts0\ts1\n", "no genes or no samples"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_matrices_are_refused_in_one_line(tmp_path, case):
    name, content, fragment = BROKEN[case]
    matrix = _broken(tmp_path, name, content)
    sheet = tmp_path / "s.csv"
    sheet_frame().to_csv(sheet, index=False)
    assert_refused(normalize(matrix, sheet, tmp_path / "out"), tmp_path / "out", name, fragment)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "file is empty"),
        (b"sample_id,batch\n", "no rows"),
        (b'sample_id,batch\ns0,"b1\n', "s.csv"),
        (b"sample_id,batch\ns0,b1\ns0,b2\n", "duplicate sample ids: 's0'"),
        (b"sample_id,batch\n,b1\n", "s.csv"),
        (b"\xff\xfes\x00", "s.csv"),
    ],
)
def test_broken_sheets_are_refused_in_one_line(tmp_path, content, fragment):
    matrix = tmp_path / "m.csv"
    counts_frame().to_csv(matrix)
    sheet = _broken(tmp_path, "s.csv", content)
    assert_refused(normalize(matrix, sheet, tmp_path / "out"), tmp_path / "out", fragment)


def test_annotation_edge_cases_are_read_or_refused(tmp_path):
    # A gene on two chromosomes in a BED file, ids in mixed case, a track line.
    bed = tmp_path / "genes.bed"
    bed.write_text("track name=genes\nchr2\t99\t200\tTp53\nchr1\t9\t20\tTP53\nchrUn_x\t0\t5\tB\n")
    frame = read_annotation(bed, "name")
    loci, stats = order_loci_frame(["TP53", "B"], frame, "symbol")
    assert loci[["gene_id", "chrom", "start"]].values.tolist()[0] == ["TP53", "chr1", 10]
    assert stats["n_unplaced"] == 1


# -- the real process: one line on stderr, exit 2 -----------------------------------------------


@pytest.mark.parametrize("case", ["truncated gzip", "an empty gene id"])
def test_the_command_itself_prints_one_line(tmp_path, case):
    name, content, fragment = BROKEN[case]
    matrix = _broken(tmp_path, name, content)
    sheet = tmp_path / "s.csv"
    sheet_frame().to_csv(sheet, index=False)
    out = tmp_path / "out"
    from robustness_cli import normalize_argv

    result = subprocess.run(
        [sys.executable, "-m", "locusformer", *normalize_argv(matrix, sheet, out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and fragment in lines[0] and str(matrix) in lines[0], lines
    assert not out.exists()


# -- silent changes to the user's data (issue 40) ---------------------------------------------


def test_spaces_around_a_batch_value_are_removed_with_a_warning(tmp_path, caplog):
    # "b1 " is batch b1 to whoever wrote it: it must not become a third batch.
    batches = [f"{b} " if i == 0 else b for i, b in enumerate(BATCHES)]
    counts_frame().to_csv(tmp_path / "m.csv")
    sheet_frame(batch=batches).to_csv(tmp_path / "s.csv", index=False)
    code, lines = normalize(tmp_path / "m.csv", tmp_path / "s.csv", tmp_path / "out")
    assert code == 0, lines
    table = pd.read_csv(tmp_path / "out" / "samples.tsv", sep="\t", dtype=str)
    assert sorted(table["batch"].unique()) == ["b1", "b2"]
    assert "leading or trailing spaces, removed" in caplog.text and "'b1 '" in caplog.text


@pytest.mark.parametrize(
    ("rows", "fragment"),
    [
        ([("chr1", "-5", "10")], "start -5, end 10"),
        ([("chr1", "500", "100")], "start 500, end 100"),
        ([("chr1", "five", "ten")], "start and end are not numbers"),
    ],
    ids=["negative start", "end before start", "not numbers"],
)
def test_annotation_records_that_are_not_spans_are_refused(tmp_path, rows, fragment):
    counts_frame().to_csv(tmp_path / "m.csv")
    sheet_frame().to_csv(tmp_path / "s.csv", index=False)
    assert normalize(tmp_path / "m.csv", tmp_path / "s.csv", tmp_path)[0] == 0
    bad = [(GENES[0], *rows[0])] if "numbers" not in fragment else [(g, *rows[0]) for g in GENES]
    good = [(g, "chr1", str(1000 * (i + 1)), str(1000 * (i + 1) + 10)) for i, g in enumerate(GENES)]
    genes = _annotation(tmp_path, bad + good[len(bad) :])
    out = tmp_path / "loci"
    assert_refused(order_loci(tmp_path / "normalized.parquet", genes, out, "ensembl_id"), out,
                   "genes.tsv", fragment)  # fmt: skip


def test_a_bed_row_ending_before_it_starts_is_refused(tmp_path):
    counts_frame().to_csv(tmp_path / "m.csv")
    sheet_frame().to_csv(tmp_path / "s.csv", index=False)
    assert normalize(tmp_path / "m.csv", tmp_path / "s.csv", tmp_path)[0] == 0
    bed = tmp_path / "genes.bed"
    lines = [f"chr1\t{1000 * (i + 1)}\t{1000 * (i + 1) + 10}\t{g}" for i, g in enumerate(GENES)]
    lines[3] = f"chr1\t900\t100\t{GENES[3]}"
    bed.write_text("\n".join(lines) + "\n")
    out = tmp_path / "loci"
    assert_refused(order_loci(tmp_path / "normalized.parquet", bed, out, "ensembl_id"), out,
                   "genes.bed", "not spans on the genome")  # fmt: skip


def test_a_tsv_named_csv_is_refused_with_the_right_name(tmp_path):
    counts_frame().to_csv(tmp_path / "m.csv", sep="\t")
    sheet_frame().to_csv(tmp_path / "s.csv", index=False)
    out = tmp_path / "out"
    assert_refused(normalize(tmp_path / "m.csv", tmp_path / "s.csv", out), out,
                   "m.csv", "tab-separated", "rename it to end in .tsv")  # fmt: skip


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--target-sum", "0", "must be > 0"),
        ("--target-sum", "-5", "must be > 0"),
        ("--target-sum", "nan", "must be a finite number"),
        ("--target-sum", "inf", "must be a finite number"),
        ("--hvg-max-samples", "0", "must be a whole number >= 1"),
        ("--min-samples", "0", "must be a whole number >= 1"),
    ],
)
def test_nonsense_normalize_options_are_refused_in_one_line(tmp_path, option, value, fragment):
    counts_frame().to_csv(tmp_path / "m.csv")
    sheet_frame().to_csv(tmp_path / "s.csv", index=False)
    out = tmp_path / "out"
    result = normalize(tmp_path / "m.csv", tmp_path / "s.csv", out, option, value)
    assert_refused(result, out, option.removeprefix("--").replace("-", "_"), fragment)


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--batch-depth", "inf", "batch_depth: must be a finite number"),
        ("--mean-log-expression", "60", "settings reach log-means near"),
        ("--group-effect", "500", "settings reach log-means near"),
        ("--batch-shift", "nan", "batch_shift: must be a finite number"),
    ],
)
def test_simulate_options_out_of_range_are_one_line(tmp_path, option, value, fragment):
    out = tmp_path / "out"
    argv = [
        "simulate", option, value, "--n-samples", "50", "--n-genes", "40",
        "--out-expression", out / "e.h5ad", "--out-samples", out / "s.tsv",
    ]  # fmt: skip
    assert_refused(run_cli(argv), out, fragment)
