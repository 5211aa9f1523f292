"""Training on several devices: DistributedDataParallel under torchrun, gloo on the CPU.

Two processes on the same global batches must train the model one process trains, up to
floating-point summation order: the shares of each batch are weighted, the batch-statistic
losses see the gathered latents of the whole batch, validation sums are reduced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from locusformer.errors import InputError
from locusformer.io.parquet import write_matrix_parquet
from locusformer.io.tables import write_frame_parquet
from locusformer.model.files import load_model
from locusformer.simulate.datasets import simulate
from locusformer.train.loop import TrainConfig, train_corrector

MODEL = {
    "patch_size": 4,
    "d_model": 16,
    "n_heads": 2,
    "n_layers": 1,
    "latent_dim": 8,
    "decoder_hidden": 32,
    "discriminator_hidden": 16,
    "dropout": 0.0,  # dropout masks differ between processes by design
}
# 96 samples, 9 held out: 87 training rows in global batches of 43, 43 and 1. The shares
# are uneven (22 + 21), and the last batch leaves the second process without a row.
TRAIN = {
    "max_epochs": 4,
    "batch_size": 43,
    "adversary_rampup_epochs": 2,
    "adversary_weight": 0.5,
    "mmd_weight": 0.5,
    "patience": 5,
    "refit_steps": 0,
}


def _inputs(tmp_path: Path) -> Path:
    sim = simulate(n_samples=96, n_loci=60, n_batches=3, seed=3)
    samples = pd.Index([f"s{i:03d}" for i in range(len(sim.X))])
    genes = pd.Index(sim.loci["gene_id"])
    data = tmp_path / "data"
    write_matrix_parquet(data / "ordered.parquet", sim.X, samples, genes)
    write_frame_parquet(data / "loci.parquet", sim.loci)
    sheet = pd.DataFrame({"sample_id": samples, "batch": [f"b{b}" for b in sim.batch]})
    sheet["group"] = [f"g{g}" for g in sim.group]  # protected: the level term is gathered too
    sheet.to_csv(data / "samples.tsv", sep="\t", index=False)
    return data


def _train(data: Path, out: Path, devices: int) -> subprocess.CompletedProcess:
    params = {"model": MODEL, "train": {**TRAIN, "devices": devices}}
    launcher = [sys.executable, "-m", "locusformer"]
    if devices > 1:
        launcher = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(devices), "-m", "locusformer",
        ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [
            *launcher, "train",
            "--matrix", str(data / "ordered.parquet"),
            "--loci", str(data / "loci.parquet"),
            "--samples", str(data / "samples.tsv"),
            "--batch-key", "batch",
            "--protect", "group",
            "--params", json.dumps(params),
            "--seed", "11",
            "--device", "cpu",
            "--checkpoint", str(out / "ckpt.pt"),
            "--out-weights", str(out / "model.pt"),
            "--out-config", str(out / "model.json"),
            "--out-history", str(out / "history.tsv"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )  # fmt: skip


def test_two_processes_train_what_one_process_trains(tmp_path):
    data = _inputs(tmp_path)
    one = _train(data, tmp_path / "one", devices=1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _train(data, tmp_path / "two", devices=2)
    assert two.returncode == 0, two.stderr[-3000:]

    a = load_model(tmp_path / "one" / "model.pt", tmp_path / "one" / "model.json")
    b = load_model(tmp_path / "two" / "model.pt", tmp_path / "two" / "model.json")
    sa, sb = a.module.state_dict(), b.module.state_dict()
    assert sa.keys() == sb.keys()
    diff = {k: (sa[k].float() - sb[k].float()).abs() for k in sa}
    for key, d in diff.items():
        if key.endswith("attn.in_proj.bias"):
            # The key bias has a gradient of exactly 0 (softmax ignores a constant per
            # query), so its float noise, normalized by Adam, is all it learns. Query and
            # value biases are compared.
            q, _, v = d.chunk(3)
            d = torch.cat([q, v])
        assert float(d.max()) < 1e-5, (key, float(d.max()))
    assert any(k.startswith("discriminator.") for k in sa)
    # And the two models compute the same.
    sim = simulate(n_samples=96, n_loci=60, n_batches=3, seed=3)
    x, codes = a.module.standardize(torch.from_numpy(sim.X)), torch.from_numpy(sim.batch)
    with torch.no_grad():
        out_a, out_b = a.module(x, codes), b.module(x, codes)
    for field in ("latent", "recon", "batch_logits"):
        torch.testing.assert_close(
            getattr(out_a, field), getattr(out_b, field), rtol=1e-4, atol=1e-5
        )
    ha = pd.read_csv(tmp_path / "one" / "history.tsv", sep="\t").drop(columns="seconds")
    hb = pd.read_csv(tmp_path / "two" / "history.tsv", sep="\t").drop(columns="seconds")
    assert len(ha) == len(hb) == TRAIN["max_epochs"]
    pd.testing.assert_frame_equal(ha, hb, rtol=1e-4, atol=1e-5)
    assert (ha["train_mmd"] > 0).all() and (ha["train_adversary"] > 0).all()
    # One set of outputs, written by the first process; the checkpoint is the same run's.
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [
        "ckpt.pt",
        "history.tsv",
        "model.json",
        "model.pt",
    ]


def test_several_devices_without_a_launcher_are_refused():
    sim = simulate(n_samples=20, n_loci=16, n_batches=2, seed=0)
    env = {k: os.environ.pop(k) for k in ("WORLD_SIZE", "RANK") if k in os.environ}
    try:
        with pytest.raises(InputError, match="torchrun --nproc-per-node 2"):
            train_corrector(
                sim.X,
                [str(b) for b in sim.batch],
                sim.loci,
                MODEL,
                {**TRAIN, "devices": 2},
                seed=0,
                device="cpu",
                progress=False,
            )
    finally:
        os.environ.update(env)


def test_devices_is_validated_and_left_out_of_the_fingerprint():
    from locusformer.train.loop import fingerprint

    with pytest.raises(InputError, match="devices"):
        TrainConfig.from_dict({"devices": 0})
    sim = simulate(n_samples=20, n_loci=16, n_batches=2, seed=0)
    from locusformer.model.config import ModelConfig

    args = (sim.X, ["a"] * 10 + ["b"] * 10, sim.loci, ModelConfig())
    one = fingerprint(*args, TrainConfig(), 0)
    assert one == fingerprint(*args, TrainConfig(devices=2), 0)
    assert one != fingerprint(*args, TrainConfig(lr=0.01), 0)
    assert np.isfinite(sim.X).all()


def test_the_train_rule_launches_one_process_per_device(tmp_path):
    from workflow_helpers import TINY_CONFIG, _demo_row, _snakemake, _workdir

    config = {**TINY_CONFIG, "training": {**TINY_CONFIG["training"], "devices": 2}}
    config["resources"] = {"train": {"threads": 4}}
    workdir = _workdir(tmp_path, config, [_demo_row("tiny")])
    result = _snakemake(workdir, "-n", "-p", "--cores", "8", "results/tiny/model/model.pt")
    assert result.returncode == 0, result.stdout + result.stderr
    command = next(line for line in result.stdout.splitlines() if " train --matrix" in line)
    assert (
        "OMP_NUM_THREADS=4 python -m torch.distributed.run --standalone --nproc-per-node 2"
        " -m locusformer train" in command
    )
    assert '"devices": 2' in command
