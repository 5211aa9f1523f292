"""The large-data path: matrices read and written in chunks of rows give what reading them
whole gives."""

from __future__ import annotations

import contextlib
import gc
import json
import tempfile
import weakref
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scanpy as sc
import torch
from conftest import ANNOTATION
from scipy import sparse

import locusformer.infer.correct
import locusformer.io.h5ad
import locusformer.io.parquet
import locusformer.steps.correct
import locusformer.steps.outputs
import locusformer.train.data
from locusformer.cli.main import main
from locusformer.errors import InputError
from locusformer.infer.correct import attention_map
from locusformer.io.expression import open_expression
from locusformer.io.parquet import iter_matrix_parquet, read_matrix_parquet, write_matrix_parquet
from locusformer.model.files import save_model
from locusformer.pp.normalize import NormalizeParams, normalize, plan_normalization
from locusformer.simulate.datasets import simulate
from locusformer.steps.attention import run_attention
from locusformer.steps.correct import run_correct
from locusformer.steps.train import run_train
from locusformer.train.loop import train_corrector

N_SAMPLES, N_GENES = 90, 40


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks and row groups of 7 rows (of 40 genes): every step goes through many."""
    monkeypatch.setattr(locusformer.io.parquet, "CHUNK_VALUES", 7 * N_GENES)
    monkeypatch.setattr(locusformer.io.parquet, "ROW_GROUP_BYTES", 4 * 7 * N_GENES)


def _counts(seed: int = 0) -> ad.AnnData:
    rng = np.random.default_rng(seed)
    counts = rng.poisson(2.0, size=(N_SAMPLES, N_GENES)).astype(np.float32)
    counts[:, :8] *= rng.integers(0, 6, size=(N_SAMPLES, 8))  # some far more variable genes
    counts[:88, 39] = 0  # expressed in two samples only: filtered
    counts[np.arange(N_SAMPLES), rng.integers(0, 8, N_SAMPLES)] += 1  # no empty sample
    obs = pd.DataFrame(
        {"batch": pd.Categorical(["b1", "b2", "b3"] * (N_SAMPLES // 3))},
        index=pd.Index([f"s{i:03d}" for i in range(N_SAMPLES)], name="sample_id"),
    )
    return ad.AnnData(X=counts, obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(40)]))


def _reference(adata: ad.AnnData, n_top_genes: int) -> ad.AnnData:
    """What normalize did before it worked in chunks: scanpy on the whole matrix."""
    expressed = np.asarray((adata.X > 0).sum(axis=0)).ravel() >= 3
    ref = adata[:, expressed].copy()
    sc.pp.normalize_total(ref, target_sum=1e4)
    sc.pp.log1p(ref)
    table = sc.pp.highly_variable_genes(
        ref, n_top_genes=n_top_genes, batch_key="batch", flavor="seurat", inplace=False
    )
    return ref[:, table["highly_variable"].to_numpy()]


@pytest.mark.parametrize("stored", ["dense", "sparse"])
def test_chunked_normalize_equals_scanpy_on_the_whole_matrix(small_chunks, stored):
    adata = _counts()
    if stored == "sparse":
        adata.X = sparse.csr_matrix(adata.X)
    out, stats = normalize(adata, "counts", "batch", NormalizeParams(n_top_genes=12))
    reference = _reference(adata, 12)
    assert out.var_names.tolist() == reference.var_names.tolist()
    expected = reference.X.toarray() if sparse.issparse(reference.X) else reference.X
    np.testing.assert_allclose(out.X, expected, rtol=1e-6, atol=1e-6)
    assert stats["genes_dropped"] == {"not_expressed": 1, "not_highly_variable": 27}
    assert stats["hvg_samples"] == N_SAMPLES


def _normalize_cli(matrix, sheet, out, *extra) -> None:
    argv = [
        "normalize", "--expression", matrix, "--samples", sheet, "--batch-key", "batch",
        "--value-type", "counts", "--n-top-genes", "12",
        "--out-matrix", out / "normalized.parquet", "--out-counts", out / "counts.parquet",
        "--out-samples", out / "samples.tsv", "--out-stats", out / "stats.json", *extra,
    ]  # fmt: skip
    assert main([str(a) for a in argv]) == 0


@pytest.mark.parametrize("stored", ["dense", "sparse", "csc"])
def test_an_h5ad_on_disk_gives_what_the_same_matrix_as_csv_gives(tmp_path, small_chunks, stored):
    adata = _counts()
    sheet = tmp_path / "s.tsv"
    adata.obs.to_csv(sheet, sep="\t")
    pd.DataFrame(adata.X.T, index=adata.var_names, columns=adata.obs_names).to_csv(
        tmp_path / "m.csv"
    )
    kept = adata.copy()
    kept.obs = pd.DataFrame(index=adata.obs_names)
    convert = {"dense": np.asarray, "sparse": sparse.csr_matrix, "csc": sparse.csc_matrix}
    kept.X = convert[stored](kept.X)
    kept.write_h5ad(tmp_path / "m.h5ad")
    _normalize_cli(tmp_path / "m.csv", sheet, tmp_path / "csv")
    _normalize_cli(tmp_path / "m.h5ad", sheet, tmp_path / "h5ad")
    for name in ("normalized.parquet", "counts.parquet"):
        a = read_matrix_parquet(tmp_path / "csv" / name)
        b = read_matrix_parquet(tmp_path / "h5ad" / name)
        pd.testing.assert_frame_equal(a, b, rtol=1e-6, atol=1e-6)
    reference = _reference(adata, 12)
    assert a.columns.tolist() == reference.var_names.tolist()
    stats = [json.loads((tmp_path / d / "stats.json").read_text()) for d in ("csv", "h5ad")]
    assert stats[0] == stats[1]


def test_highly_variable_genes_are_ranked_on_a_seeded_subsample(tmp_path, small_chunks):
    adata = _counts()
    params = NormalizeParams(n_top_genes=12, hvg_max_samples=30, seed=5)
    out, stats = normalize(adata, "counts", "batch", params)
    assert stats["hvg_samples"] == 30 and out.n_obs == N_SAMPLES
    rows = np.sort(np.random.default_rng(5).choice(N_SAMPLES, size=30, replace=False))
    assert out.var_names.tolist() == _reference(adata[rows].copy(), 12).var_names.tolist()
    again, _ = normalize(adata, "counts", "batch", params)
    assert again.var_names.tolist() == out.var_names.tolist()


def test_a_non_finite_value_in_a_late_chunk_names_its_row(tmp_path, small_chunks):
    adata = _counts()
    adata.X[75, 3] = np.nan
    adata.obs = pd.DataFrame(index=adata.obs_names)
    adata.X = sparse.csr_matrix(adata.X)
    adata.write_h5ad(tmp_path / "m.h5ad")
    obs = _counts().obs
    with open_expression(tmp_path / "m.h5ad") as source:
        with pytest.raises(InputError, match=r"non-finite value .* at row 76"):
            plan_normalization(source, obs, "counts", "batch", NormalizeParams())


def test_an_h5ad_is_read_chunk_by_chunk_never_whole(tmp_path, small_chunks, monkeypatch):
    adata = _counts()
    adata.obs = pd.DataFrame(index=adata.obs_names)
    adata.X = sparse.csr_matrix(adata.X)
    adata.write_h5ad(tmp_path / "m.h5ad")
    sizes = []
    with open_expression(tmp_path / "m.h5ad") as source:
        read = source._chunk
        source._chunk = lambda a, b: sizes.append(b - a) or read(a, b)
        plan = plan_normalization(source, _counts().obs, "counts", "batch", NormalizeParams())
        list(plan.chunks(source))
    assert max(sizes) == 7 and sum(sizes) == 3 * N_SAMPLES  # three passes, 7 rows at a time


def test_parquet_matrices_are_written_and_read_in_row_groups(tmp_path, small_chunks):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(N_SAMPLES, N_GENES)).astype(np.float32)
    ids = pd.Index([f"s{i}" for i in range(N_SAMPLES)])
    genes = pd.Index([f"g{j}" for j in range(N_GENES)])
    path = tmp_path / "m.parquet"
    write_matrix_parquet(path, values, ids, genes)
    assert pq.ParquetFile(path).metadata.num_row_groups == 13  # ceil(90 / 7)
    whole = read_matrix_parquet(path)
    np.testing.assert_array_equal(whole.to_numpy(), values)
    assert whole.index.tolist() == ids.tolist() and whole.columns.tolist() == genes.tolist()
    picked = ["g5", "g1", "g30"]
    blocks = list(iter_matrix_parquet(path, columns=picked))
    assert max(len(b) for b in blocks) <= 7 * N_GENES // 3 + 1
    joined = pd.concat(blocks)
    pd.testing.assert_frame_equal(joined, whole[picked])
    with pytest.raises(InputError, match="lacks gene column"):
        next(iter_matrix_parquet(path, columns=["nope"]))


def test_narrow_matrices_are_written_in_row_groups_of_bounded_rows(tmp_path, monkeypatch):
    # A latent of a few columns would fit a million rows in one row group's bytes: held
    # whole, with their ids, until the end. The row cap writes it as it comes.
    monkeypatch.setattr(locusformer.io.parquet, "ROW_GROUP_ROWS", 100)
    values = np.arange(250 * 3, dtype=np.float32).reshape(250, 3)
    path = tmp_path / "latent.parquet"
    write_matrix_parquet(
        path, values, pd.Index([f"s{i}" for i in range(250)]), pd.Index(list("abc"))
    )
    metadata = pq.ParquetFile(path).metadata
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [
        100,
        100,
        50,
    ]
    np.testing.assert_array_equal(read_matrix_parquet(path).to_numpy(), values)


def test_dense_columns_are_byte_stream_split_sparse_ones_plain_none_a_dictionary(tmp_path):
    rng = np.random.default_rng(0)
    n = 8192
    dense = rng.normal(size=n).astype(np.float32)
    # Log-expression: each sample's library size makes its values its own.
    library = rng.uniform(500, 5000, n)
    sparse_log = np.where(
        rng.random(n) < 0.8, 0, np.log1p(rng.integers(1, 50, n) / library * 1e4)
    ).astype(np.float32)
    path = tmp_path / "m.parquet"
    values = np.column_stack([dense, sparse_log])
    write_matrix_parquet(path, values, pd.Index([f"s{i}" for i in range(n)]), pd.Index(["d", "s"]))
    group = pq.ParquetFile(path).metadata.row_group(0)
    chunks = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    # Dense: the float encoding, which zstd compresses below the raw floats (plain or a
    # dictionary that overflows write them at or above it).
    assert "BYTE_STREAM_SPLIT" in chunks["d"].encodings
    assert chunks["d"].total_compressed_size < 0.97 * dense.nbytes
    # Sparse: plain, whose runs of zeros zstd takes far below raw.
    assert "BYTE_STREAM_SPLIT" not in chunks["s"].encodings
    assert chunks["s"].total_compressed_size < 0.4 * sparse_log.nbytes
    for chunk in chunks.values():
        assert "RLE_DICTIONARY" not in chunk.encodings and "PLAIN_DICTIONARY" not in chunk.encodings
    np.testing.assert_array_equal(read_matrix_parquet(path).to_numpy(), values)


def test_order_loci_reorders_block_by_block(tmp_path, small_chunks, annotation_table):
    placed = annotation_table[annotation_table["ensembl_id"] != ""].drop_duplicates("ensembl_id")
    genes = placed["ensembl_id"].sample(N_GENES, random_state=1).tolist()
    rng = np.random.default_rng(2)
    values = rng.normal(size=(N_SAMPLES, N_GENES)).astype(np.float32)
    ids = pd.Index([f"s{i}" for i in range(N_SAMPLES)])
    write_matrix_parquet(tmp_path / "normalized.parquet", values, ids, pd.Index(genes))

    def order(matrix, out):
        argv = [
            "order-loci", "--matrix", matrix,
            "--genes", ANNOTATION, "--gene-id", "ensembl_id",
            "--out-loci", out / "loci.parquet", "--out-matrix", out / "ordered.parquet",
            "--out-stats", out / "loci.json",
        ]  # fmt: skip
        return main([str(a) for a in argv])

    assert order(tmp_path / "normalized.parquet", tmp_path) == 0
    loci = pd.read_parquet(tmp_path / "loci.parquet")
    ordered = read_matrix_parquet(tmp_path / "ordered.parquet")
    whole = read_matrix_parquet(tmp_path / "normalized.parquet")
    assert sorted(loci["gene_id"]) == sorted(genes) and loci["gene_id"].tolist() != genes
    pd.testing.assert_frame_equal(ordered, whole[loci["gene_id"].tolist()])
    assert pq.ParquetFile(tmp_path / "ordered.parquet").metadata.num_row_groups > 1

    # A sample id repeated in a later block is refused, and nothing is written.
    dup = ids.tolist()
    dup[80] = "s3"
    write_matrix_parquet(tmp_path / "dup.parquet", values, pd.Index(dup), pd.Index(genes))
    out = tmp_path / "out"
    assert order(tmp_path / "dup.parquet", out) == 2
    assert not out.exists() or not any(out.iterdir())


@pytest.fixture(scope="module")
def tiny_model():
    sim = simulate(n_samples=60, n_loci=50, n_batches=2, seed=1)
    labels = [f"b{b}" for b in sim.batch]
    config = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)
    torch.set_num_threads(1)
    model, _ = train_corrector(
        sim.X, labels, sim.loci, config, {"max_epochs": 1}, seed=0, device="cpu", progress=False
    )
    return sim, labels, model


def test_correct_streams_blocks_into_all_three_outputs(tmp_path, tiny_model, monkeypatch):
    sim, labels, model = tiny_model
    monkeypatch.setattr(locusformer.steps.correct, "BLOCK_VALUES", 9 * 50)  # blocks of 9 rows
    ids = pd.Index([f"c{i}" for i in range(len(sim.X))], name="sample_id")
    write_matrix_parquet(tmp_path / "ordered.parquet", sim.X, ids, sim.loci["gene_id"])
    pd.DataFrame({"sample_id": ids, "batch": labels, "group": sim.group}).to_csv(
        tmp_path / "samples.tsv", sep="\t", index=False
    )
    save_model(model, tmp_path / "model.pt", tmp_path / "model.json")
    blocks = []
    whole_correct = locusformer.infer.correct.correct

    def spy(model, X, *args, **kwargs):
        blocks.append(len(X))
        return whole_correct(model, X, *args, **kwargs)

    monkeypatch.setattr(locusformer.steps.correct, "correct", spy)
    out = tmp_path / "out"
    run_correct(
        tmp_path / "ordered.parquet", tmp_path / "samples.tsv", "batch",
        tmp_path / "model.pt", tmp_path / "model.json",
        out / "corrected.parquet", out / "latent.parquet", out / "locusformer.h5ad",
        chunk_size=4, device="cpu",
    )  # fmt: skip
    assert max(blocks) == 9 and sum(blocks) == len(sim.X)

    expected, latent = whole_correct(model, sim.X, labels, chunk_size=4, device="cpu")
    # Chunks of 4 within blocks of 9 are not those of the whole: float rounding differs.
    close = {"rtol": 1e-6, "atol": 1e-6}
    corrected = read_matrix_parquet(out / "corrected.parquet")
    np.testing.assert_allclose(corrected.to_numpy(), expected, **close)
    assert corrected.index.equals(ids) and corrected.columns.tolist() == model.gene_ids
    z = read_matrix_parquet(out / "latent.parquet")
    np.testing.assert_allclose(z.to_numpy(), latent, **close)
    assert z.columns.tolist() == [f"latent_{i}" for i in range(4)]

    h5ad = ad.read_h5ad(out / "locusformer.h5ad")
    np.testing.assert_array_equal(h5ad.X, sim.X)
    np.testing.assert_array_equal(h5ad.layers["corrected"], corrected.to_numpy())
    np.testing.assert_array_equal(h5ad.obsm["X_locusformer"], z.to_numpy())
    assert h5ad.obs_names.tolist() == ids.tolist() and h5ad.obs["batch"].tolist() == labels
    assert h5ad.var_names.tolist() == model.gene_ids
    assert h5ad.var["chrom"].tolist() == sim.loci["chrom"].astype(str).tolist()
    assert sorted(p.name for p in out.iterdir()) == [
        "corrected.parquet", "latent.parquet", "locusformer.h5ad"
    ]  # fmt: skip


def test_the_h5ad_writer_lets_the_sample_table_go_once_obs_is_written(tmp_path):
    # The writer lives through correct's whole loop; a table kept in its frame would hold
    # every sample's id and labels until the end (0.1 GB at 1M samples).
    samples = pd.DataFrame(
        {"batch": ["b1", "b2", "b1"]}, index=pd.Index(["s1", "s2", "s3"], name="sample_id")
    )
    table = weakref.ref(samples)
    genes = pd.Index(["g1", "g2"])
    with locusformer.io.h5ad.h5ad_writer(tmp_path / "x.h5ad", samples, genes, None, 1) as write:
        del samples
        gc.collect()
        assert table() is None
        values = np.arange(6, dtype=np.float32).reshape(3, 2)
        write(slice(0, 3), values, values + 1, values[:, :1])
    h5ad = ad.read_h5ad(tmp_path / "x.h5ad")
    assert h5ad.obs["batch"].tolist() == ["b1", "b2", "b1"]
    np.testing.assert_array_equal(h5ad.layers["corrected"], values + 1)


def test_the_h5ad_writer_leaves_the_callers_table_as_it_was(tmp_path):
    samples = pd.DataFrame({"batch": ["b1", "b2"]}, index=pd.Index([1, 2], name="id"))
    with locusformer.io.h5ad.h5ad_writer(tmp_path / "x.h5ad", samples, pd.Index(["g"]), None, 1):
        pass
    assert samples["batch"].dtype == object and samples.index.tolist() == [1, 2]
    assert samples.index.name == "id"


@pytest.mark.parametrize("where", ["reader", "writer"])
def test_correct_fails_whole_when_a_late_block_fails(tmp_path, tiny_model, monkeypatch, where):
    """Reading, the model and writing overlap; an error in either thread still surfaces
    as itself, and no output appears."""
    sim, labels, model = tiny_model
    monkeypatch.setattr(locusformer.steps.correct, "BLOCK_VALUES", 9 * 50)  # blocks of 9 rows
    ids = [f"c{i}" for i in range(len(sim.X))]
    ordered = tmp_path / "ordered.parquet"
    write_matrix_parquet(ordered, sim.X, pd.Index(ids), sim.loci["gene_id"])
    pd.DataFrame({"sample_id": ids, "batch": labels}).to_csv(
        tmp_path / "samples.tsv", sep="\t", index=False
    )
    save_model(model, tmp_path / "model.pt", tmp_path / "model.json")
    if where == "reader":
        real_reader = locusformer.steps.correct.iter_matrix_parquet

        def failing_reader(path, *args, **kwargs):
            for i, block in enumerate(real_reader(path, *args, **kwargs)):
                if i == 4:
                    raise InputError(path, "cannot read ordered matrix: corrupt page")
                yield block

        monkeypatch.setattr(locusformer.steps.correct, "iter_matrix_parquet", failing_reader)
    if where == "writer":
        real = locusformer.steps.outputs.h5ad_writer

        @contextlib.contextmanager
        def failing(*args, **kwargs):
            with real(*args, **kwargs) as write:

                def write_or_fail(rows, *blocks):
                    if rows.start == 36:  # one block in the middle
                        raise OSError("No space left on device")
                    write(rows, *blocks)

                yield write_or_fail

        monkeypatch.setattr(locusformer.steps.outputs, "h5ad_writer", failing)
    out = tmp_path / "out"
    expected = (InputError, "corrupt page") if where == "reader" else (OSError, "No space left")
    with pytest.raises(expected[0], match=expected[1]):
        run_correct(
            ordered, tmp_path / "samples.tsv", "batch", tmp_path / "model.pt",
            tmp_path / "model.json", out / "corrected.parquet", out / "latent.parquet",
            out / "locusformer.h5ad", chunk_size=4, device="cpu",
        )  # fmt: skip
    assert not out.exists() or not any(out.iterdir())


def test_correct_refuses_an_unknown_batch_before_writing(tmp_path, tiny_model):
    sim, labels, model = tiny_model
    ids = pd.Index([f"c{i}" for i in range(len(sim.X))], name="sample_id")
    write_matrix_parquet(tmp_path / "ordered.parquet", sim.X, ids, sim.loci["gene_id"])
    labels = ["b9", *labels[1:]]
    pd.DataFrame({"sample_id": ids, "batch": labels}).to_csv(
        tmp_path / "samples.tsv", sep="\t", index=False
    )
    save_model(model, tmp_path / "model.pt", tmp_path / "model.json")
    out = tmp_path / "out"
    with pytest.raises(InputError, match="not seen in training: 'b9'"):
        run_correct(
            tmp_path / "ordered.parquet", tmp_path / "samples.tsv", "batch",
            tmp_path / "model.pt", tmp_path / "model.json",
            out / "c.parquet", out / "z.parquet", out / "x.h5ad", device="cpu",
        )  # fmt: skip
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.parametrize("how", ["always", "auto with little memory"])
def test_training_from_disk_gives_what_training_in_memory_gives(tmp_path, monkeypatch, how):
    sim = simulate(n_samples=48, n_loci=40, n_batches=2, seed=3)
    ids = pd.Index([f"c{i}" for i in range(len(sim.X))], name="sample_id")
    write_matrix_parquet(tmp_path / "ordered.parquet", sim.X, ids, sim.loci["gene_id"])
    sim.loci.to_parquet(tmp_path / "loci.parquet")
    pd.DataFrame({"sample_id": ids, "batch": [f"b{b}" for b in sim.batch]}).to_csv(
        tmp_path / "samples.tsv", sep="\t", index=False
    )
    monkeypatch.setattr(locusformer.io.parquet, "CHUNK_VALUES", 5 * 40)  # stats over many blocks
    made = []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    torch.set_num_threads(1)

    def train(mode: str, out: Path):
        params = {
            "model": dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4),
            "train": {"max_epochs": 3, "batch_size": 8, "data_on_disk": mode},
        }
        model = run_train(
            tmp_path / "ordered.parquet", tmp_path / "loci.parquet", tmp_path / "samples.tsv",
            "batch", params, out / "model.pt", out / "model.json", out / "history.tsv",
            out / "ckpt.pt", seed=7, device="cpu", progress=False,
        )  # fmt: skip
        return model.module.state_dict(), pd.read_csv(out / "history.tsv", sep="\t")

    memory_state, memory_history = train("never", tmp_path / "memory")
    assert made == []
    if how == "always":
        disk_state, disk_history = train("always", tmp_path / "disk")
    else:
        monkeypatch.setattr(locusformer.train.data, "available_memory", lambda: 2 * 48 * 40 * 4)
        disk_state, disk_history = train("auto", tmp_path / "disk")
    assert len(made) == 1 and Path(made[0]).parent == tmp_path / "disk"
    assert not Path(made[0]).exists(), "the memory map is removed after training"
    for name, value in memory_state.items():
        torch.testing.assert_close(disk_state[name], value, rtol=1e-5, atol=1e-5)
    columns = [c for c in memory_history.columns if c != "seconds"]
    pd.testing.assert_frame_equal(disk_history[columns], memory_history[columns], rtol=1e-5)


def test_the_attention_map_reads_only_the_samples_it_averages(tmp_path, tiny_model, monkeypatch):
    sim, labels, model = tiny_model
    monkeypatch.setattr(locusformer.io.parquet, "CHUNK_VALUES", 9 * 50)
    ids = pd.Index([f"c{i}" for i in range(len(sim.X))], name="sample_id")
    write_matrix_parquet(tmp_path / "ordered.parquet", sim.X, ids, sim.loci["gene_id"])
    pd.DataFrame({"sample_id": ids, "batch": labels}).to_csv(
        tmp_path / "samples.tsv", sep="\t", index=False
    )
    save_model(model, tmp_path / "model.pt", tmp_path / "model.json")
    run_attention(
        tmp_path / "ordered.parquet", None, tmp_path / "samples.tsv", "batch",
        tmp_path / "model.pt", tmp_path / "model.json", tmp_path / "attn.npz",
        device="cpu", max_samples=13,
    )  # fmt: skip
    expected = attention_map(model, sim.X, labels, max_samples=13)
    with np.load(tmp_path / "attn.npz") as saved:
        np.testing.assert_allclose(saved["attention"], expected, rtol=1e-6, atol=1e-7)


def test_row_groups_after_the_first_read_back_through_pandas_as_written(tmp_path, small_chunks):
    # Later row groups are built from arrow arrays under the first group's schema, not
    # through pandas: the file must still be the frame written, index and all, for any
    # parquet reader.
    rng = np.random.default_rng(1)
    values = rng.normal(size=(N_SAMPLES, N_GENES)).astype(np.float32)
    values[values < 0.3] = 0  # plain columns beside byte-stream-split ones
    frame = pd.DataFrame(
        values,
        index=pd.Index([f"s{i}" for i in range(N_SAMPLES)], name="sample_id"),
        columns=[f"g{j}" for j in range(N_GENES)],
    )
    path = tmp_path / "m.parquet"
    write_matrix_parquet(path, values, frame.index, frame.columns)
    assert pq.ParquetFile(path).metadata.num_row_groups == 13
    pd.testing.assert_frame_equal(pd.read_parquet(path), frame)
    expected = pa.Table.from_pandas(frame, preserve_index=True).schema
    assert pq.read_schema(path).equals(expected, check_metadata=True)
