"""locusformer inspect: the attention traced step by step, and where it turns non-finite."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from locusformer.cli.main import main
from locusformer.infer.trace import trace
from locusformer.io.parquet import write_matrix_parquet
from locusformer.model.config import ModelConfig
from locusformer.model.files import ModelRecord, TrainedModel, save_model
from locusformer.model.layout import build_layout
from locusformer.model.network import LocusFormer
from locusformer.simulate.datasets import simulate

CONFIG = ModelConfig(
    patch_size=4, d_model=16, n_heads=2, n_layers=2, latent_dim=4, decoder_hidden=16,
    discriminator_hidden=8,
)  # fmt: skip
#: log of float32's largest value: exp of more is inf
EXP_OVERFLOW = math.log(torch.finfo(torch.float32).max)


def make_model(seed: int = 0) -> tuple[TrainedModel, np.ndarray]:
    sim = simulate(n_samples=10, n_loci=40, seed=1)
    torch.manual_seed(seed)
    net = LocusFormer(CONFIG, build_layout(sim.loci, CONFIG.patch_size), 2).eval()
    net.set_standardization(sim.X.mean(0), sim.X.std(0))
    record = ModelRecord(["b0", "b1"], gene_ids=sim.loci["gene_id"].tolist(), loci=sim.loci)
    return TrainedModel(net, record), sim.X.astype(np.float32)


def by_step(run: dict, name: str) -> list[dict]:
    return [s for s in run["steps"] if s["step"] == name]


def test_the_trace_of_a_healthy_model(one_thread) -> None:
    model, X = make_model()
    result = trace(model, X[:3])
    T, H, K = model.n_tokens, CONFIG.n_heads, CONFIG.d_model // CONFIG.n_heads
    fp32, bf16 = result["runs"]
    assert (fp32["dtype"], bf16["dtype"]) == ("float32", "bfloat16")
    for run in (fp32, bf16):
        assert run["first_nonfinite"] is None and run["naive_first_nonfinite"] is None
        for name, shape in [("q", [3, T, K]), ("v", [3, T, K]), ("scaled", [3, T, T])]:
            steps = by_step(run, name)
            assert [(s["layer"], s["head"]) for s in steps] == [
                (layer, head) for layer in range(CONFIG.n_layers) for head in range(H)
            ]
            assert all(s["shape"] == shape for s in steps)
        for s in by_step(run, "weights"):
            assert s["rows_sum_to_one"] and 0 <= s["min"] <= s["max"] <= 1
            assert 0 <= s["entropy"]["min"] <= s["entropy"]["max"] <= math.log(T) + 1e-6
        # scaling divides by sqrt(K): the scaled scores' range is the scores' over sqrt(K)
        for raw, scaled in zip(by_step(run, "scores"), by_step(run, "scaled"), strict=True):
            assert scaled["max"] == pytest.approx(raw["max"] / math.sqrt(K), rel=1e-2)
            assert scaled["row_max"]["min"] == pytest.approx(
                raw["row_max"]["min"] / math.sqrt(K), rel=1e-2, abs=1e-2
            )
    # The traced weights are the model's own: its explicit path returns the same ones.
    with torch.no_grad():
        _, weights = model.module.encode(
            model.module.standardize(torch.from_numpy(X[:3])), need_weights=True
        )
    for s in by_step(fp32, "weights"):
        w = weights[s["layer"]][:, s["head"]]
        assert s["min"] == pytest.approx(float(w.min()), abs=1e-6)
        assert s["max"] == pytest.approx(float(w.max()), abs=1e-6)
    assert fp32["trace_vs_module"] < 1e-5  # the explicit trace against the fused path
    diff = result["difference"]
    assert diff["between"] == ["float32", "bfloat16"]
    assert 0 < diff["weights"]["max_abs"] < 0.05  # bf16 rounds, and no more than that
    assert diff["largest"]["max_abs"] >= diff["weights"]["max_abs"]
    assert diff["latent"]["max_abs"] > 0


def test_huge_logits_overflow_the_naive_softmax_not_the_stable_one(one_thread) -> None:
    model, X = make_model()
    D = CONFIG.d_model
    with torch.no_grad():  # W_Q and W_K of layer 0 scaled up: logits of thousands
        model.module.encoder.blocks[0].attn.in_proj.weight[: 2 * D] *= 60.0
    result = trace(model, X[:3], dtypes=("float32",))
    (run,) = result["runs"]
    overflowing = [s for s in by_step(run, "scaled") if s["layer"] == 0 and s["max"] > EXP_OVERFLOW]
    assert overflowing  # the premise: exp of these scaled scores is inf in float32
    first = run["naive_first_nonfinite"]
    assert first == {"layer": 0, "head": overflowing[0]["head"], "step": "naive_exp"}
    naive = [s for s in by_step(run, "naive_weights") if s["layer"] == 0]
    assert any(s["n_nan"] for s in naive) and not all(s["rows_sum_to_one"] for s in naive)
    # The model's softmax (row max subtracted) stays finite, rows summing to 1, and so
    # does everything after it.
    assert run["stable_softmax_finite"] and run["first_nonfinite"] is None
    assert all(s["rows_sum_to_one"] for s in by_step(run, "weights"))
    assert "difference" not in result


def test_the_first_non_finite_step_is_named(one_thread) -> None:
    model, X = make_model()
    D, K = CONFIG.d_model, CONFIG.d_model // CONFIG.n_heads
    with torch.no_grad():  # the K bias of layer 1, head 1
        model.module.encoder.blocks[1].attn.in_proj.bias[D + K] = float("nan")
    (run,) = trace(model, X[:2], dtypes=("float32",))["runs"]
    assert run["first_nonfinite"] == {"layer": 1, "head": 1, "step": "k"}
    assert all(s["n_nan"] == 0 for s in by_step(run, "q"))
    bad = X[:2].copy()
    bad[1, 5] = np.inf
    model, _ = make_model()
    (run,) = trace(model, bad, dtypes=("float32",))["runs"]
    assert run["first_nonfinite"] == {"layer": None, "head": None, "step": "standardized"}


@pytest.fixture
def model_files(tmp_path: Path) -> dict:
    model, X = make_model()
    save_model(model, tmp_path / "model" / "model.pt", tmp_path / "model" / "model.json")
    ids = pd.Index([f"c{i}" for i in range(len(X))], name="sample_id")
    write_matrix_parquet(tmp_path / "ordered.parquet", X, ids, model.gene_ids)
    return {"dir": tmp_path, "model": tmp_path / "model", "matrix": tmp_path / "ordered.parquet"}


def test_inspect_on_the_command_line(model_files: dict, capsys, one_thread) -> None:
    d = model_files
    args = ["inspect", "--model", str(d["model"]), "--matrix", str(d["matrix"])]
    assert main([*args, "--n-samples", "2", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "first non-finite value: none" in text
    assert "largest difference float32 vs bfloat16:" in text
    assert "attention weights: largest difference" in text
    assert text.count("== ") == 2 and "naive_exp" not in text
    sheet = d["dir"] / "sheet.tsv"
    pd.DataFrame({"sample_id": ["c7", "c3", "c9"], "batch": ["b0"] * 3}).to_csv(
        sheet, sep="\t", index=False
    )
    out = d["dir"] / "trace.json"
    picked = [*args, "--samples", str(sheet), "--n-samples", "2", "--json", "--out", str(out)]
    assert main(picked) == 0
    result = json.loads(out.read_text())
    assert result["samples"] == ["c7", "c3"]
    assert result["runs"][0]["steps"][0]["shape"] == [2, 40]
    embedding = result["runs"][0]["steps"][1]
    assert embedding["step"] == "embedding" and result["model"]["head_dim"] == 8
    assert embedding["shape"] == [2, result["model"]["n_tokens"], 16]


def test_a_seed_draws_the_samples_at_random_the_same_each_time(model_files: dict) -> None:
    d = model_files
    args = ["inspect", "--model", str(d["model"]), "--matrix", str(d["matrix"]), "--json"]
    drawn = []
    for seed in (0, 0, 1):
        out = d["dir"] / f"seed{seed}.json"
        assert main([*args, "--n-samples", "3", "--seed", str(seed), "--out", str(out)]) == 0
        drawn.append(json.loads(out.read_text()))
    first, again, other = (r["samples"] for r in drawn)
    assert first == again and first != other and len(set(first)) == 3
    assert first == sorted(first, key=lambda s: int(s[1:]))  # in the matrix's order
    assert drawn[0]["seed"] == 0 and drawn[0]["runs"] == drawn[1]["runs"]
    sheet = d["dir"] / "sheet.tsv"
    pd.DataFrame({"sample_id": ["c7", "c3", "c9", "c1"]}).to_csv(sheet, sep="\t", index=False)
    out, text = d["dir"] / "sheet.json", d["dir"] / "sheet.txt"
    picked = [*args, "--samples", str(sheet), "--n-samples", "2", "--seed", "0"]
    assert main([*picked, "--out", str(out), "--out-text", str(text)]) == 0
    ids = json.loads(out.read_text())["samples"]
    assert len(ids) == 2 and set(ids) <= {"c7", "c3", "c9", "c1"}  # the sheet's, in its order
    assert ids == [i for i in ["c7", "c3", "c9", "c1"] if i in ids]
    assert "first non-finite value: none" in text.read_text() and "2 samples" in text.read_text()


def test_the_drawn_rows_are_read_across_blocks(tmp_path: Path, monkeypatch, one_thread) -> None:
    import pyarrow.parquet as pq

    import locusformer.io.parquet
    from locusformer.infer.trace import read_rows

    model, X = make_model()
    X = np.concatenate([X, X + 1, X + 2])  # 30 samples
    ids = pd.Index([f"c{i}" for i in range(len(X))], name="sample_id")
    monkeypatch.setattr(locusformer.io.parquet, "ROW_GROUP_BYTES", 4 * 7 * X.shape[1])  # 7 rows
    write_matrix_parquet(tmp_path / "m.parquet", X, ids, model.gene_ids)
    assert pq.ParquetFile(tmp_path / "m.parquet").metadata.num_row_groups == 5
    picked, values = read_rows(tmp_path / "m.parquet", model, 6, seed=5)
    rows = [int(i[1:]) for i in picked]
    assert rows == sorted(rows) and len(set(rows)) == 6 and max(rows) >= 7  # past one block
    np.testing.assert_array_equal(values, X[rows])
    first, values = read_rows(tmp_path / "m.parquet", model, 9)  # no seed: the first rows
    assert first == [f"c{i}" for i in range(9)]
    np.testing.assert_array_equal(values, X[:9])


def test_inspect_refuses_bad_input_in_one_line(model_files: dict, capsys) -> None:
    d = model_files
    sheet = d["dir"] / "sheet.tsv"
    pd.DataFrame({"sample_id": ["c1", "nope"]}).to_csv(sheet, sep="\t", index=False)
    model = ["--model", str(d["model"]), "--matrix", str(d["matrix"])]
    runs = {
        "not in": [*model, "--samples", str(sheet)],
        "not a model folder": ["--model", str(d["dir"] / "none"), "--matrix", str(d["matrix"])],
        "must be >= 1": [*model, "--n-samples", "0"],
    }
    for message, args in runs.items():
        assert main(["inspect", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    other = d["dir"] / "other.parquet"
    X = np.zeros((2, 40), dtype=np.float32)
    write_matrix_parquet(other, X, pd.Index(["a", "b"]), [f"g{i}" for i in range(40)])
    assert main(["inspect", "--model", str(d["model"]), "--matrix", str(other)]) == 2
    assert "gene columns differ" in capsys.readouterr().err
