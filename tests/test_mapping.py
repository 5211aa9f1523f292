"""Mapping new data onto a trained model: genes, known batches, new batches, frozen reference."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from locusformer.errors import InputError
from locusformer.infer.correct import correct
from locusformer.infer.mapping import MIN_SHARED_LOCI, align_genes, map_query
from locusformer.simulate.datasets import simulate
from locusformer.train.loop import train_corrector

MODEL = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=6, decoder_hidden=32)
# The input's clusters off: these tests check the mapping's mechanics on a 6-epoch toy
# reference, on which adaptation brings the new batch nearer its groups at seed 0 only;
# mapping onto a model trained with them is measured on CellBench (notes of 2026-12-05).
TRAIN = dict(max_epochs=6, batch_size=16, adversary_rampup_epochs=2, input_clusters=0)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained():
    """A model trained on batches 0 and 1 of three; batch 2 is the query's new batch."""
    sim = simulate(n_samples=180, n_loci=48, n_batches=3, batch_shift=2.0, seed=5)
    labels = np.array([f"b{b}" for b in sim.batch])
    ref = labels != "b2"
    torch.set_num_threads(1)
    model, _ = train_corrector(
        sim.X[ref], labels[ref].tolist(), sim.loci, MODEL, TRAIN, seed=0, device="cpu",
        progress=False,
    )  # fmt: skip
    return sim, labels, model


def test_align_genes_fills_missing_loci_with_the_reference_mean_and_ignores_extra(trained):
    sim, _, model = trained
    genes = model.gene_ids
    frame = pd.DataFrame(sim.X[:5], columns=genes)
    frame = frame.drop(columns=genes[:3]).assign(extra_gene=1.0)[::-1]  # columns reordered
    frame = frame[frame.columns[::-1]]
    X, match = align_genes(frame, model)
    assert X.shape == (5, len(genes)) and match.n_present == len(genes) - 3
    assert match.missing == genes[:3] and match.n_extra == 1
    mean = model.module.gene_mean.numpy()
    np.testing.assert_array_equal(X[:, :3], np.broadcast_to(mean[:3], (5, 3)))
    np.testing.assert_array_equal(X[:, 3:], sim.X[:5][::-1, 3:])


def test_align_genes_refuses_a_query_with_too_few_of_the_model_loci(trained):
    sim, _, model = trained
    keep = int(len(model.gene_ids) * MIN_SHARED_LOCI) - 1
    frame = pd.DataFrame(sim.X[:4, :keep], columns=model.gene_ids[:keep])
    with pytest.raises(InputError, match=r"query matrix: measures \d+ of the model's 48 loci"):
        align_genes(frame, model)


def test_known_batches_are_corrected_as_correct_does(trained):
    sim, labels, model = trained
    ref = labels != "b2"
    mapped = map_query(model, sim.X[ref], labels[ref], device="cpu")
    c, z = correct(model, sim.X[ref], labels[ref].tolist(), device="cpu")
    np.testing.assert_array_equal(mapped.corrected, c)
    np.testing.assert_array_equal(mapped.latent, z)
    assert mapped.new_batches == [] and not mapped.adapted


def test_new_batches_map_zero_shot_and_adapted_without_moving_the_reference(trained):
    sim, labels, model = trained
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    ref_before = correct(model, sim.X[labels != "b2"], labels[labels != "b2"].tolist())
    zero = map_query(model, sim.X, labels, device="cpu")
    adapted = map_query(model, sim.X, labels, adapt_epochs=30, seed=0, device="cpu")
    assert zero.new_batches == ["b2"] and adapted.adapted and not zero.adapted
    after = model.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # bitwise: frozen
    assert all(p.requires_grad for p in model.module.parameters())  # flags restored
    ref_after = correct(model, sim.X[labels != "b2"], labels[labels != "b2"].tolist())
    for a, b in zip(ref_before, ref_after, strict=True):
        np.testing.assert_array_equal(a, b)
    known = labels != "b2"
    np.testing.assert_array_equal(adapted.corrected[known], ref_before[0])
    assert adapted.history[-1]["loss"] < adapted.history[0]["loss"]

    # The adapted new batch sits closer to the reference cells of its own group.
    def gap(result) -> float:
        z, groups = result.latent, sim.group
        distances = []
        for g in np.unique(groups):
            new = z[(labels == "b2") & (groups == g)].mean(0)
            old = z[known & (groups == g)].mean(0)
            distances.append(np.linalg.norm(new - old) / np.linalg.norm(z[known].std(0)))
        return float(np.mean(distances))

    assert gap(adapted) < gap(zero)


def test_mapping_is_reproducible_for_a_seed(trained):
    sim, labels, model = trained
    a = map_query(model, sim.X, labels, adapt_epochs=3, seed=1, device="cpu")
    b = map_query(model, sim.X, labels, adapt_epochs=3, seed=1, device="cpu")
    np.testing.assert_array_equal(a.corrected, b.corrected)


def test_bad_mapping_arguments_are_one_line_errors(trained):
    sim, labels, model = trained
    with pytest.raises(InputError, match="unknown batch 'b9'"):
        map_query(model, sim.X, labels, reference="b9")
    with pytest.raises(InputError, match="3 labels for 180 samples"):
        map_query(model, sim.X, labels[:3])


def test_map_command_writes_outputs_and_a_report_and_refuses_bad_input(trained, tmp_path):
    import json

    import anndata as ad

    from locusformer.cli.main import main
    from locusformer.io.parquet import read_matrix_parquet
    from locusformer.model.files import save_model

    sim, labels, model = trained
    model.record.normalization = {"value_type": "log_expression", "target_sum": 1e4}
    save_model(model, tmp_path / "m.pt", tmp_path / "m.json")
    genes = model.gene_ids
    ids = [f"q{i}" for i in range(len(labels))]
    query = pd.DataFrame(sim.X, index=ids, columns=genes).drop(columns=genes[:2])
    query.T.to_csv(tmp_path / "query.csv")  # genes x samples, as the workflow reads
    pd.DataFrame({"sample_id": ids, "batch": labels}).to_csv(
        tmp_path / "query_samples.tsv", sep="\t", index=False
    )
    out = {k: tmp_path / k for k in ("c.parquet", "z.parquet", "q.h5ad", "report.json")}
    args = [
        "map", "--weights", str(tmp_path / "m.pt"), "--config", str(tmp_path / "m.json"),
        "--expression", str(tmp_path / "query.csv"),
        "--samples", str(tmp_path / "query_samples.tsv"), "--batch-key", "batch",
        "--adapt-epochs", "2", "--out-corrected", str(out["c.parquet"]),
        "--out-latent", str(out["z.parquet"]), "--out-h5ad", str(out["q.h5ad"]),
        "--out-report", str(out["report.json"]),
    ]  # fmt: skip
    assert main(args) == 0
    report = json.loads(out["report.json"].read_text())
    assert report["new_batches"] == ["b2"] and report["adapted"]
    assert report["genes"]["n_missing"] == 2 and report["genes"]["missing_examples"] == genes[:2]
    corrected = read_matrix_parquet(out["c.parquet"], "corrected")
    assert corrected.shape == (len(ids), len(genes)) and corrected.index.tolist() == ids
    h5ad = ad.read_h5ad(out["q.h5ad"])
    assert h5ad.uns["locusformer"]["mapping"]["new_batches"].tolist() == ["b2"]
    np.testing.assert_allclose(h5ad.layers["corrected"], corrected.to_numpy(), rtol=0, atol=0)

    # A query with too few of the model's genes: one line, exit 2, nothing written.
    query.iloc[:, :10].T.to_csv(tmp_path / "few.csv")
    args[args.index(str(tmp_path / "query.csv"))] = str(tmp_path / "few.csv")
    args[args.index(str(out["report.json"]))] = str(tmp_path / "never.json")
    assert main(args) == 2
    assert not (tmp_path / "never.json").exists()


def test_an_h5ad_query_maps_without_a_sheet_its_obs_giving_the_batches(trained, tmp_path):
    import json

    import anndata as ad

    from locusformer.cli.main import main
    from locusformer.model.files import save_model

    sim, labels, model = trained
    model.record.normalization = {"value_type": "log_expression", "target_sum": 1e4}
    save_model(model, tmp_path / "m.pt", tmp_path / "m.json")
    ids = pd.Index([f"q{i}" for i in range(len(labels))], name="sample_id")
    obs = pd.DataFrame({"batch": pd.Categorical(labels)}, index=ids)
    ad.AnnData(sim.X, obs=obs, var=pd.DataFrame(index=model.gene_ids)).write_h5ad(
        tmp_path / "query.h5ad"
    )
    report = tmp_path / "report.json"
    args = [
        "map", "--weights", str(tmp_path / "m.pt"), "--config", str(tmp_path / "m.json"),
        "--expression", str(tmp_path / "query.h5ad"), "--batch-key", "batch",
        "--model-name", "reference", "--out-corrected", str(tmp_path / "c.parquet"),
        "--out-latent", str(tmp_path / "z.parquet"), "--out-report", str(report),
    ]  # fmt: skip
    assert main(args) == 0
    record = json.loads(report.read_text())
    assert record["new_batches"] == ["b2"] and record["model"]["name"] == "reference"
    assert record["samples"] == len(ids)


def test_a_query_of_one_new_run_maps(trained, tmp_path):
    import json

    from locusformer.cli.main import main
    from locusformer.model.files import save_model

    sim, labels, model = trained
    model.record.normalization = {"value_type": "log_expression", "target_sum": 1e4}
    save_model(model, tmp_path / "m.pt", tmp_path / "m.json")
    run = labels == "b2"
    ids = [f"r{i}" for i in range(int(run.sum()))]
    pd.DataFrame(sim.X[run], index=ids, columns=model.gene_ids).T.to_csv(tmp_path / "run.csv")
    pd.DataFrame({"sample_id": ids, "batch": "run7"}).to_csv(
        tmp_path / "run.tsv", sep="\t", index=False
    )
    args = [
        "map", "--weights", str(tmp_path / "m.pt"), "--config", str(tmp_path / "m.json"),
        "--expression", str(tmp_path / "run.csv"), "--samples", str(tmp_path / "run.tsv"),
        "--batch-key", "batch", "--out-corrected", str(tmp_path / "c.parquet"),
        "--out-latent", str(tmp_path / "z.parquet"), "--out-report", str(tmp_path / "r.json"),
    ]  # fmt: skip
    assert main(args) == 0
    assert json.loads((tmp_path / "r.json").read_text())["new_batches"] == ["run7"]


def test_new_batches_run_under_the_autocast_that_correct_uses(trained, monkeypatch):
    """On CUDA ``correct`` runs in bf16 autocast; new batches' adaptation and decoding run
    under the same context (they ran in fp32 until the first GPU run showed it)."""
    import locusformer.infer.correct
    import locusformer.infer.mapping

    entered = {"correct": 0, "mapping": 0}

    def recording(module: str):
        def amp(dev: torch.device):
            entered[module] += 1
            return torch.autocast("cpu", dtype=torch.bfloat16)

        return amp

    monkeypatch.setattr(locusformer.infer.correct, "autocast", recording("correct"))
    monkeypatch.setattr(locusformer.infer.mapping, "autocast", recording("mapping"))
    sim, labels, model = trained
    result = map_query(
        model, sim.X, labels, adapt_epochs=3, batch_size=16, chunk_size=25, seed=0, device="cpu"
    )
    n_new, n_known = int((labels == "b2").sum()), int((labels != "b2").sum())
    steps, chunks = 3 * -(-n_new // 16), -(-n_new // 25)
    assert entered == {"correct": -(-n_known // 25), "mapping": steps + chunks}
    assert np.isfinite(result.corrected).all() and result.adapted
