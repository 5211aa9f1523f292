from __future__ import annotations

import gzip

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from scipy import sparse

from locusformer.errors import InputError
from locusformer.io.annotation import read_annotation
from locusformer.io.expression import read_expression, read_sample_sheet

GENES = pd.Index(["ENSG1", "ENSG2", "ENSG3"], name="gene_id")
SAMPLES = ["a", "b"]
VALUES = np.array([[1.0, 0.0], [2.5, 3.0], [0.0, 7.0]])


def _frame() -> pd.DataFrame:
    return pd.DataFrame(VALUES, index=GENES, columns=SAMPLES)


def _assert_matrix(adata: ad.AnnData) -> None:
    assert list(adata.obs_names) == SAMPLES
    assert list(adata.var_names) == list(GENES)
    x = adata.X.toarray() if sparse.issparse(adata.X) else adata.X
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x, VALUES.T.astype(np.float32))


@pytest.mark.parametrize("name", ["m.csv", "m.tsv", "m.csv.gz", "m.tsv.gz", "m.txt"])
def test_text_matrices_are_read_genes_by_samples(tmp_path, name):
    path = tmp_path / name
    sep = "," if ".csv" in name else "\t"
    _frame().to_csv(path, sep=sep)
    _assert_matrix(read_expression(path))


def test_r_style_header_without_a_gene_column_name(tmp_path):
    # write.csv(..., row.names=TRUE) leaves the header one field short, as in CellBench.
    path = tmp_path / "m.csv"
    path.write_text('"a","b"\n"ENSG1",1,0\n"ENSG2",2.5,3\n"ENSG3",0,7\n')
    _assert_matrix(read_expression(path))


def test_parquet_with_gene_column_or_index(tmp_path):
    _frame().to_parquet(tmp_path / "indexed.parquet")
    _frame().reset_index().to_parquet(tmp_path / "column.parquet", index=False)
    _assert_matrix(read_expression(tmp_path / "indexed.parquet"))
    _assert_matrix(read_expression(tmp_path / "column.parquet"))


def test_h5ad_dense_sparse_and_layer(tmp_path):
    obs = pd.DataFrame(index=SAMPLES)
    var = pd.DataFrame(index=list(GENES))
    dense = ad.AnnData(X=VALUES.T.astype(np.float32), obs=obs, var=var)
    dense.layers["raw"] = VALUES.T.astype(np.float32)
    dense.X = np.zeros_like(dense.X)
    dense.write_h5ad(tmp_path / "dense.h5ad")
    _assert_matrix(read_expression(tmp_path / "dense.h5ad", layer="raw"))

    packed = ad.AnnData(X=sparse.csr_matrix(VALUES.T.astype(np.float32)), obs=obs, var=var)
    packed.write_h5ad(tmp_path / "sparse.h5ad")
    adata = read_expression(tmp_path / "sparse.h5ad")
    assert sparse.issparse(adata.X), "sparse input stays sparse until genes are selected"
    _assert_matrix(adata)

    with pytest.raises(InputError, match="layer 'counts' not found"):
        read_expression(tmp_path / "dense.h5ad", layer="counts")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("gene,a,b\nENSG1,1,x\n", "non-numeric value 'x' in sample column 'b'"),
        ("gene,a,b\nENSG1,1,NaN\n", "non-finite value"),
        ("gene,a,b\nENSG1,1,inf\n", "non-finite value"),
        ("gene,a,b\nENSG1,1,2\nENSG1,3,4\n", "duplicate gene ids: 'ENSG1'"),
        ("gene,a,a\nENSG1,1,2\n", "duplicate sample ids"),
        ("gene,a,b\n", "no genes or no samples"),
        ("", "file is empty"),
        ('gene,a,b\nENSG1,1,2,3,4\n"unclosed\n', "cannot parse table"),
    ],
)
def test_malformed_matrices_are_refused_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(InputError, match=problem) as info:
        read_expression(path)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_truncated_gzip_is_refused(tmp_path):
    path = tmp_path / "m.csv.gz"
    _frame().to_csv(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="corrupt or truncated"):
        read_expression(path)


def test_unsupported_or_missing_files(tmp_path):
    with pytest.raises(InputError, match="unsupported file type"):
        read_expression(tmp_path / "m.xlsx")
    with pytest.raises(InputError, match="file not found"):
        read_expression(tmp_path / "absent.csv")
    (tmp_path / "broken.h5ad").write_bytes(b"not hdf5")
    with pytest.raises(InputError, match="cannot read h5ad"):
        read_expression(tmp_path / "broken.h5ad")


def test_sample_sheet_id_column_choice(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("\ufeffcell,batch,sample_id\nx,1,a\ny,2,b\n")
    sheet = read_sample_sheet(path)
    assert list(sheet.index) == ["a", "b"]
    assert sheet["batch"].tolist() == ["1", "2"], "batches stay strings, even when numeric"
    assert list(read_sample_sheet(path, sample_column="cell").index) == ["x", "y"]
    path.write_text("id,batch\na,1\na,2\n")
    with pytest.raises(InputError, match="duplicate sample ids"):
        read_sample_sheet(path)


def test_annotation_table_gtf_and_bed(tmp_path):
    table = tmp_path / "genes.tsv"
    table.write_text("symbol\tchrom\tstart\tend\nTP53\tchr17\t7661779\t7687538\nNOPE\tchr1\t\t\n")
    frame = read_annotation(table, "symbol")
    assert frame.to_dict("records") == [
        {"gene_id": "TP53", "chrom": "chr17", "start": 7661779, "end": 7687538}
    ]
    gtf = tmp_path / "genes.gtf.gz"
    with gzip.open(gtf, "wt") as handle:
        handle.write("#!genome-build GRCh38\n")
        handle.write(
            '17\tensembl\tgene\t7661779\t7687538\t.\t-\t.\tgene_id "ENSG00000141510.17"; '
            'gene_name "TP53";\n'
        )
        handle.write('17\tensembl\ttranscript\t7661779\t7687538\t.\t-\t.\tgene_id "X";\n')
    frame = read_annotation(gtf, "gene_name")
    assert frame[["gene_id", "chrom", "start"]].values.tolist() == [["TP53", "17", 7661779]]
    bed = tmp_path / "genes.bed"
    bed.write_text("chr17\t7661778\t7687538\tTP53\t0\t-\n")
    assert read_annotation(bed, "name")["start"].tolist() == [7661779], "BED starts are 0-based"


def test_gtf_without_gene_records_is_refused(tmp_path):
    gtf = tmp_path / "tx.gtf"
    gtf.write_text('1\tsrc\texon\t1\t10\t.\t+\t.\tgene_id "A";\n')
    with pytest.raises(InputError, match="no 'gene' records"):
        read_annotation(gtf, "gene_id")


def test_annotation_without_the_id_column_is_refused(tmp_path):
    table = tmp_path / "genes.tsv"
    table.write_text("symbol\tchrom\tstart\tend\nTP53\tchr17\t1\t2\n")
    with pytest.raises(InputError, match="lacks column"):
        read_annotation(table, "ensembl_id")
